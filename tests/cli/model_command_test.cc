#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

TEST(ModelCommand, JsonListsThePipelineLayersAndTheParameterCount) {
  const CommandResult result = run_pipeflow("model --model gpt2-124m --json");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["parameters"], 124'439'808);
  ASSERT_EQ(json["pipeline_layers"].size(), 14u);
  EXPECT_EQ(json["pipeline_layers"][0]["name"], "embedding");
  EXPECT_EQ(json["pipeline_layers"][13]["name"], "head");
  EXPECT_EQ(json["config"]["sequence"], 1024);
  // 24·s·h² + 4·s²·h for s = 1024, h = 768.
  EXPECT_EQ(json["pipeline_layers"][1]["forward_flops"], 24.0 * 1024 * 768 * 768 + 4.0 * 1024 * 1024 * 768);
}

TEST(ModelCommand, TableShowsEveryLayerAndTheTotal) {
  const CommandResult result = run_pipeflow("model --model gpt3-175b --tp 8 --sequence-parallel --recompute selective");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("parameters: 174604259328 (174.60B)"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("block.95"), std::string::npos);
  EXPECT_NE(result.out.find("b=1 s=2048 t=8 sp recompute=selective"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("\ntotal "), std::string::npos);
}

TEST(ModelCommand, ReadsAHuggingFaceConfig) {
  const std::string config = std::string(PIPEFLOW_SOURCE_DIR) + "/tests/data/hf/llama-3-8b/config.json";
  const CommandResult result = run_pipeflow("model --json --seq 128 --model " + config);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(nlohmann::json::parse(result.out)["parameters"], 8'030'261'248);
}

TEST(ModelCommand, UnknownModelFailsWithOneLine) {
  const CommandResult result = run_pipeflow("model --model gpt5");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err.rfind("pipeflow: error: unknown model \"gpt5\": use one of gpt2-124m,", 0), 0u) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1);
}

TEST(PartitionCommand, BalancedGivesTheHeadItsOwnStage) {
  const CommandResult result = run_pipeflow("partition --model gpt2-124m --stages 4 --method balanced --json");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["boundaries"], nlohmann::json::parse("[0, 5, 9, 13, 14]"));
  EXPECT_EQ(json["stages"][3]["layers"], nlohmann::json::parse(R"(["head"])"));
  const CommandResult uniform = run_pipeflow("partition --model gpt2-124m --stages 4 --partition uniform --json");
  EXPECT_GT(nlohmann::json::parse(uniform.out)["max_stage_seconds"].get<double>(),
            json["max_stage_seconds"].get<double>());
}

TEST(PartitionCommand, TablePrintsRangesAndTheSlowestStage) {
  const CommandResult result = run_pipeflow("partition --model gpt-tiny --stages 2 --method uniform --hardware cpu");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("[0, 3)"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("embedding .. block.1"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("slowest stage: "), std::string::npos) << result.out;
}

TEST(PartitionCommand, TooManyStagesIsAnError) {
  const CommandResult result = run_pipeflow("partition --model gpt-tiny --stages 7");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err,
            "pipeflow: error: 7 stages for 6 pipeline layers: every stage needs at least one layer; use at most 6 "
            "stages\n");
}

}  // namespace
}  // namespace pipeflow::testing
