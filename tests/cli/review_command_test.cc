// pipeflow review: findings, exit status, --json, and bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

std::string write_config(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/run.json";
  std::ofstream(path) << text;
  return path;
}

// GPT-2 124M on 2 A100s, 16 micro-batches, balanced: no finding.
constexpr const char* kGood = R"({"model": "gpt2-124m", "hardware": "a100-80g", "seq_length": 1024,
  "bf16": {"enabled": true}, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16,
  "pipeline": {"stages": 2, "partition_method": "balanced"}})";

TEST(ReviewCommand, AGoodRunHasNoFindingAndExitsZero) {
  const std::string dir = make_temp_dir();
  const CommandResult r = run_pipeflow("review --config " + write_config(dir, kGood));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("review: 0 errors, 0 warnings, 0 notes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not checked: batch past the noise scale: give --noise-scale"), std::string::npos) << r.out;
}

TEST(ReviewCommand, ZeroTwoWithAPipelineIsAnErrorFindingAndExitStatusOne) {
  const std::string dir = make_temp_dir();
  const std::string config = write_config(dir, kGood);
  const CommandResult r = run_pipeflow("review --config " + config + " --zero 2 --data-parallel 2");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.out.find("error zero-pipeline: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fix: zero_optimization.stage 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("review: 1 error, 0 warnings, 0 notes"), std::string::npos) << r.out;
}

TEST(ReviewCommand, JsonGivesTheFindingsAsObjects) {
  const std::string dir = make_temp_dir();
  const CommandResult r =
      run_pipeflow("review --config " + write_config(dir, kGood) + " --global-batch 512 --noise-scale 256 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  ASSERT_EQ(json["findings"].size(), 1u) << r.out;
  const nlohmann::json& f = json["findings"][0];
  EXPECT_EQ(f["severity"], "warning");
  EXPECT_EQ(f["check"], "noise-scale");
  EXPECT_EQ(f["value"], 512);
  EXPECT_EQ(f["limit"], 256);
  EXPECT_NE(f["fix"].get<std::string>().find("train_batch_size 256"), std::string::npos);
  EXPECT_EQ(json["warnings"], 1);
}

TEST(ReviewCommand, BadInputNamesTheFlagTheValueTheRuleAndTheFix) {
  const std::string dir = make_temp_dir();
  const std::string config = write_config(dir, kGood);
  const CommandResult missing = run_pipeflow("review");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err,
            "pipeflow: error: --config is required: the run configuration to review (pipeflow keys or DeepSpeed's "
            "JSON), e.g. pipeflow review --config examples/train_1f1b_2stage.json\n");
  const CommandResult absent = run_pipeflow("review --config " + dir + "/none.json");
  EXPECT_EQ(absent.exit_code, 1);
  EXPECT_NE(absent.err.find(dir + "/none.json"), std::string::npos) << absent.err;
  const CommandResult noise = run_pipeflow("review --config " + config + " --noise-scale abc");
  EXPECT_EQ(noise.exit_code, 1);
  EXPECT_EQ(noise.err,
            "pipeflow: error: --noise-scale \"abc\": must be a positive number of sequences (B_simple, the gradient "
            "noise scale that pipeflow train writes into metrics.jsonl), e.g. --noise-scale 512\n");
  EXPECT_NE(run_pipeflow("review --config " + config + " --noise-scale -3").err.find("--noise-scale \"-3\": must be"),
            std::string::npos);
  EXPECT_NE(run_pipeflow("review --config " + config + " --base-lr 1e-3").err.find(
                "--base-lr given alone: the learning-rate check needs both --base-batch and --base-lr"),
            std::string::npos);
}

TEST(ReviewCommand, TheExamplesHaveNoErrorFinding) {
  for (const char* example : {"examples/train_1f1b_2stage.json", "examples/simulate/gpt3-175b-megatron.json",
                              "examples/analyze/case_study.json"}) {
    const CommandResult r = run_pipeflow(std::string("review --config ") + example, PIPEFLOW_SOURCE_DIR);
    EXPECT_EQ(r.exit_code, 0) << example << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("review: 0 errors"), std::string::npos) << r.out;
  }
}

TEST(ReviewCommand, TrainPrintsTheReviewsWarningsAndRuns) {
  const std::string dir = make_temp_dir();
  // 2 pipeline ranks, 2 micro-batches: a bubble of 1/3 on a uniform cut.
  const std::string config = write_config(dir, R"({"model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_ctx": 32},
    "steps": 1, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
    "pipeline": {"stages": 2}, "out_dir": ")" + dir + R"(/out"})");
  const CommandResult r = run_pipeflow("train --config " + config);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("review: warning bubble: pipeline bubble "), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("trained 1 step"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace pipeflow::testing
