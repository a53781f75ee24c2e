#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "pipeflow/core/file.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

const std::string kSmall = "plan --model gpt3-1.3b --hardware a100-80g --devices 8 --global-batch 32 --seq 2048";

TEST(PlanCommand, ListsTheTopLayoutsAndTheRejections) {
  const CommandResult r = run_pipeflow(kSmall + " --top 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("gpt3-1.3b on 8 × a100-80g, global batch 32 × 2048 tokens: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("#  layout"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n3  tp "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\n4  tp "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memory limit: 0.8 × 80.0 GiB = 64.0 GiB per device\nrejected: "), std::string::npos) << r.out;
}

// The JSON's best layout, written as a pipeflow configuration, simulates to
// the same step time.
TEST(PlanCommand, JsonBestFirstAndTheWrittenConfigSimulatesToTheSameStep) {
  const std::string dir = make_temp_dir();
  const CommandResult r = run_pipeflow(kSmall + " --json --write-config plan.json --deepspeed ds.json --megatron "
                                                "megatron.txt",
                                       dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  ASSERT_FALSE(json["candidates"].empty());
  for (const char* key : {"layout", "step_time_s", "tokens_per_s", "mfu", "tflops_per_device", "bubble_ratio",
                          "zero_bubble_rate", "stage_peak_memory_bytes"}) {
    EXPECT_TRUE(json["candidates"][0].contains(key)) << key;
  }
  for (const char* reason : {"indivisible batch", "schedule constraint", "out of memory"}) {
    EXPECT_TRUE(json["rejected"].contains(reason)) << reason;
  }
  double previous = 0;
  for (const auto& c : json["candidates"]) {
    EXPECT_GE(c["step_time_s"].get<double>(), previous);
    previous = c["step_time_s"].get<double>();
  }
  const CommandResult simulated = run_pipeflow("simulate --config plan.json --json", dir);
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(simulated.out)["step_time_s"].get<double>(),
                   json["candidates"][0]["step_time_s"].get<double>());
  const nlohmann::json deepspeed = nlohmann::json::parse(read_file(dir + "/ds.json"));
  EXPECT_EQ(deepspeed["train_batch_size"], 32);
  EXPECT_NE(read_file(dir + "/megatron.txt").find("--global-batch-size 32"), std::string::npos);
}

// A model given as a file: the written configuration names it by its
// absolute path, so that it simulates from any directory, and `train` runs
// the layout (here 2 data-parallel replicas under MPI) for a step.
TEST(PlanCommand, TheWrittenConfigOfAModelFileRunsFromAnywhereAndTrains) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/tiny.json",
                    R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 256, "n_positions": 64,
                        "attn_pdrop": 0, "resid_pdrop": 0, "embd_pdrop": 0})");
  const CommandResult r = run_pipeflow("plan --model tiny.json --devices 2 --global-batch 4 --seq 32 --json "
                                       "--write-config configs/best.json",
                                       dir, "mkdir configs");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json config = nlohmann::json::parse(read_file(dir + "/configs/best.json"));
  EXPECT_EQ(config["model"], dir + "/tiny.json");
  EXPECT_EQ(config["hardware"], "a100-80g");
  const CommandResult simulated = run_pipeflow("simulate --config " + dir + "/configs/best.json --json", "/");
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(simulated.out)["step_time_s"].get<double>(),
                   nlohmann::json::parse(r.out)["candidates"][0]["step_time_s"].get<double>());
  ASSERT_EQ(config["data_parallel"], 2);  // the best here: what train runs as MPI processes
  const CommandResult trained =
      run_mpirun(2, "train --config " + dir + "/configs/best.json --steps 1 --out-dir " + dir + "/run");
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  EXPECT_NE(read_file_if_exists(dir + "/run/metrics.jsonl"), "");
}

TEST(PlanCommand, NothingFitsExitsNonZeroWithTheCounts) {
  const CommandResult r = run_pipeflow("plan --model gpt3-175b --devices 8 --global-batch 8 --seq 2048");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no layout of gpt3-175b on 8 × a100-80g fits"), std::string::npos) << r.err;
}

TEST(PlanCommand, InferenceListsTheStageCountsThatFitAndWhyOthersDoNot) {
  const CommandResult r =
      run_pipeflow("plan --inference --model llama3-405b --hardware h100 --devices 16 --context 131072");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("llama3-405b on 1 .. 16 × h100: 1 sequence, context 131072 tokens, prompts of 131072 tokens; "
                        "memory limit 0.8 × 80.0 GiB = 64.0 GiB per device\n",
                        0),
            0u)
      << r.out;
  EXPECT_NE(r.out.find("#  stages  micro-batches  time to first token"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("does not fit:\n  1 stage: out of memory: stage 0 needs"), std::string::npos) << r.out;
  const CommandResult json =
      run_pipeflow("plan --inference --model llama3-405b --hardware h100 --devices 16 --context 131072 --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["fitting"].size() + j["rejected"].size(), 16u);
  EXPECT_EQ(j["rejected"][0]["stages"], 1);
  const CommandResult none = run_pipeflow(
      "plan --inference --model llama3-405b --hardware h100 --devices 16 --context 131072 --sequences 8");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.out.find("no stage count fits\ndoes not fit:\n"), std::string::npos) << none.out;
  EXPECT_EQ(none.err, "pipeflow: error: no stage count of 1 .. 16 fits (reasons above): use more --devices, fewer "
                      "--sequences, a shorter --context or a larger --memory-fraction\n");
  const CommandResult training = run_pipeflow("plan --model llama3-8b --devices 8");
  EXPECT_NE(training.exit_code, 0);
  EXPECT_NE(training.err.find("plan needs --global-batch and --seq (or --inference for generation)"),
            std::string::npos)
      << training.err;
}

}  // namespace
}  // namespace pipeflow::testing
