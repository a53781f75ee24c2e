#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "pipeflow/core/file.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

const std::string kLlava = std::string(PIPEFLOW_SOURCE_DIR) + "/tests/data/hf/llava-1.5-7b/config.json";

// LLaVA-1.5-7B fine-tuned on 8 A100s, 4 stages × 2 replicas, sequences of
// 576 image and 1472 text tokens.
const std::string kSimulate = "simulate --model " + kLlava +
                              " --hardware a100-80g --devices 8 --pp 4 --dp 2 --micro-batch 1 --global-batch 32 "
                              "--seq 2048 --bf16 --partition balanced --json";

double peak(const nlohmann::json& json) {
  double most = 0;
  for (const auto& rank : json["ranks"]) most = std::max(most, rank["peak_memory_bytes"].get<double>());
  return most;
}

TEST(VisionLanguageCommand, SimulateReadsLlavaAndAFrozenTowerCostsLess) {
  const CommandResult trained = run_pipeflow(kSimulate);
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const CommandResult frozen = run_pipeflow(kSimulate + " --freeze '[\"vision.*\"]'");
  ASSERT_EQ(frozen.exit_code, 0) << frozen.err;
  const nlohmann::json a = nlohmann::json::parse(trained.out);
  const nlohmann::json b = nlohmann::json::parse(frozen.out);
  ASSERT_EQ(a["stages"].size(), 4u);
  // Balanced: stage 0 holds the whole tower (patch embedding, 23 blocks, projector) and the first LM layers.
  EXPECT_EQ(a["stages"][0]["first_layer"], 0) << a["stages"][0];
  EXPECT_GT(a["stages"][0]["end_layer"].get<int>(), 25) << a["stages"][0];
  EXPECT_LT(b["step_time_s"].get<double>(), a["step_time_s"].get<double>());
  EXPECT_LE(peak(b), peak(a));
  // The text report names the tower's layers in its partition.
  const CommandResult text = run_pipeflow("simulate --model " + kLlava +
                                          " --hardware a100-80g --devices 4 --pp 4 --micro-batch 1 --global-batch 8 --seq 2048 --bf16");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("vision.patch_embedding.."), std::string::npos) << text.out;
}

TEST(VisionLanguageCommand, PlanFindsALayoutForLlavaWithItsTowerFrozen) {
  const CommandResult r = run_pipeflow("plan --model " + kLlava +
                                       " --hardware a100-80g --devices 8 --global-batch 32 --seq 2048 --top 1 "
                                       "--freeze '[\"vision.*\"]' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  ASSERT_FALSE(json["candidates"].empty()) << r.out;
  EXPECT_GT(json["candidates"][0]["tokens_per_s"].get<double>(), 0);
}

TEST(VisionLanguageCommand, ModelShowsTheTowerAndTrainRefusesIt) {
  const CommandResult model = run_pipeflow("model --model " + kLlava + " --seq 2048");
  ASSERT_EQ(model.exit_code, 0) << model.err;
  EXPECT_NE(model.out.find("vision tower: 23 layers run, hidden 1024, heads 16, ffn 4096, 336 px in 14 px patches, "
                           "576 tokens per image into the language model (1 per sequence of 2048)"),
            std::string::npos)
      << model.out;
  EXPECT_NE(model.out.find("parameters: 7050828800"), std::string::npos) << model.out;
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/llava.json", R"({"model": ")" + kLlava + R"(", "steps": 1, "seq_length": 600})");
  write_file_atomic(dir + "/frozen.json", R"({"model": "gpt-tiny", "steps": 1, "freeze": ["head"]})");
  const CommandResult train = run_pipeflow("train --config llava.json --out-dir out", dir);
  EXPECT_NE(train.exit_code, 0);
  EXPECT_NE(train.err.find("is a vision-language model: pipeflow train runs language models"), std::string::npos)
      << train.err;
  const CommandResult frozen = run_pipeflow("train --config frozen.json --out-dir out", dir);
  EXPECT_NE(frozen.exit_code, 0);
  EXPECT_NE(frozen.err.find("freeze / lora: pipeflow train trains every weight"), std::string::npos) << frozen.err;
}

}  // namespace
}  // namespace pipeflow::testing
