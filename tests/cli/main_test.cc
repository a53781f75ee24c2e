#include <gtest/gtest.h>

#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

TEST(Main, HelpListsTheCommandAndExitsZero) {
  const CommandResult result = run_pipeflow("--help");
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_NE(result.out.find("pipeflow"), std::string::npos);
}

TEST(Main, UnknownSubcommandFailsWithNonZeroExit) {
  const CommandResult result = run_pipeflow("frobnicate");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.err.find("--help"), std::string::npos) << result.err;
}

TEST(Main, ABadOptionValueIsOneLineNamingTheOption) {
  const CommandResult result = run_pipeflow("schedule --schedule 1f1b --stages abc --microbatches 4");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_EQ(result.err, "pipeflow: error: Could not convert: --stages = abc (run with --help for the options)\n");
  const CommandResult missing = run_pipeflow("validate");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_EQ(missing.err, "pipeflow: error: file is required (run with --help for the options)\n");
}

TEST(Main, VersionIsPrinted) {
  const CommandResult result = run_pipeflow("--version");
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_NE(result.out.find("0."), std::string::npos) << result.out;
}

}  // namespace
}  // namespace pipeflow::testing
