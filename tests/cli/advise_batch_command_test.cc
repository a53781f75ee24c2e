#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "pipeflow/core/file.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

// A metrics.jsonl as pipeflow train writes it: the last measured noise scale is 500 sequences.
class AdviseBatchMetrics : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir();
    write_file_atomic(dir_ + "/metrics.jsonl", R"({"step": 0, "loss": 5.5, "noise_scale": 90}
{"step": 1, "loss": 5.4, "grad_square_small": 3.5, "grad_square_big": 0.5, "noise_scale": 500}
{"step": 2, "loss": 5.3}
)");
  }

  CommandResult advise(long long target, const std::string& metrics = "metrics.jsonl") const {
    return run_pipeflow("advise-batch --base-batch 64 --base-lr 1e-3 --base-warmup 100 --target-batch " +
                            std::to_string(target) + " --metrics " + metrics + " --json",
                        dir_);
  }

  std::string dir_;
};

TEST_F(AdviseBatchMetrics, ATargetPastTheMeasuredNoiseScaleWarnsAndOneBelowDoesNot) {
  const CommandResult past = advise(1024);
  ASSERT_EQ(past.exit_code, 0) << past.err;
  const nlohmann::json above = nlohmann::json::parse(past.out);
  EXPECT_EQ(above["noise_scale"], 500);
  ASSERT_EQ(above["warnings"].size(), 1u) << past.out;
  EXPECT_NE(above["warnings"][0].get<std::string>().find("past the critical batch size (gradient noise scale 500"),
            std::string::npos)
      << past.out;
  EXPECT_DOUBLE_EQ(above["samples_over_minimum"].get<double>(), 1 + 1024.0 / 500);

  const CommandResult within = advise(256);
  ASSERT_EQ(within.exit_code, 0) << within.err;
  const nlohmann::json below = nlohmann::json::parse(within.out);
  EXPECT_TRUE(below["warnings"].empty()) << within.out;
  EXPECT_DOUBLE_EQ(below["samples_over_minimum"].get<double>(), 1 + 256.0 / 500);
}

TEST_F(AdviseBatchMetrics, AMissingFileOrOneWithoutTheKeyFailsNamingBoth) {
  const CommandResult missing = advise(256, "nowhere.jsonl");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("--metrics nowhere.jsonl: "), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("\"noise_scale\""), std::string::npos) << missing.err;

  write_file_atomic(dir_ + "/garbled.jsonl", "{\"step\": 0, \"noise_scale\": 12\n");
  const CommandResult garbled = advise(256, "garbled.jsonl");
  EXPECT_NE(garbled.exit_code, 0);
  EXPECT_NE(garbled.err.find("garbled.jsonl line 1"), std::string::npos) << garbled.err;
  EXPECT_NE(garbled.err.find("\"noise_scale\""), std::string::npos) << garbled.err;

  const CommandResult both = run_pipeflow(
      "advise-batch --base-batch 64 --base-lr 1e-3 --target-batch 128 --noise-scale 9 --metrics metrics.jsonl", dir_);
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("--noise-scale and --metrics metrics.jsonl: give the noise scale one way"),
            std::string::npos)
      << both.err;
}

}  // namespace
}  // namespace pipeflow::testing
