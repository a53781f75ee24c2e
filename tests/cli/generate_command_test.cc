// pipeflow generate, end to end: the tokens the pipeline prints are the
// library's unpipelined, uncached generation from the same weights file.

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipeflow/core/file.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/sampling.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

class GenerateCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir();
    weights_ = dir_ + "/w.safetensors";
    ASSERT_EQ(run_pipeflow("init --layers 3 --heads 2 --width 32 --context 32 --seed 3 --out " + weights_).exit_code,
              0);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<std::int32_t> expected(const std::string& prompt, int new_tokens) const {
    const auto file = nn::SafetensorsFile::read(weights_);
    const nn::GptConfig config = nn::read_config(file);
    nn::Stage model(config, nn::all_layers(config));
    nn::load_parameters(model, file);
    return nn::generate(model, nn::encode_text(prompt), {.new_tokens = new_tokens});
  }

  std::string dir_;
  std::string weights_;
};

TEST_F(GenerateCommand, JsonHoldsTheUnpipelinedTokensAndTheStageFigures) {
  write_file_atomic(dir_ + "/prompts.txt", "hello\n\nthe cat\n");
  const CommandResult result = run_pipeflow("generate --weights " + weights_ + " --prompts " + dir_ +
                                            "/prompts.txt --stages 2 --microbatches 2 --max-new-tokens 8 --json");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto json = nlohmann::json::parse(result.out);
  EXPECT_GT(json["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(json["time_to_first_token_s"].get<double>(), 0);
  ASSERT_EQ(json["stages"].size(), 2U);
  std::int64_t kv_bytes = 0;
  for (const auto& stage : json["stages"]) {
    EXPECT_GE(stage["busy_share"].get<double>(), 0);
    EXPECT_LE(stage["busy_share"].get<double>(), 1);
    kv_bytes += stage["kv_cache_bytes"].get<std::int64_t>();
  }
  // 2 · 3 layers · 32 features · 4 bytes · 32 positions · 3 prompts over both stages.
  EXPECT_EQ(kv_bytes, 2 * 3 * 32 * 4 * 32 * 3);
  ASSERT_EQ(json["outputs"].size(), 3U);
  const std::vector<std::string> prompts = {"hello", "", "the cat"};
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(json["outputs"][i]["prompt"], prompts[i]);
    // The empty prompt starts from a newline.
    EXPECT_EQ(json["outputs"][i]["tokens"].get<std::vector<std::int32_t>>(), expected(prompts[i], 8)) << i;
  }
}

TEST_F(GenerateCommand, TextStreamsThePromptAndContinuationOnTheFirstLine) {
  const CommandResult result =
      run_pipeflow("generate --weights " + weights_ + " --prompt hello --stages 3 --partition uniform "
                   "--max-new-tokens 6");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::vector<std::string> lines;
  for (std::size_t begin = 0; begin < result.out.size();) {
    const std::size_t end = result.out.find('\n', begin);
    lines.push_back(result.out.substr(begin, end - begin));
    begin = end + 1;
  }
  // The text, tokens/s, time to first token, one line per stage.
  ASSERT_EQ(lines.size(), 3U + 3U) << result.out;
  EXPECT_TRUE(lines[0].starts_with("hello")) << lines[0];
  EXPECT_GE(lines[0].size(), 5U + 6U);
  EXPECT_TRUE(lines[1].starts_with("tokens/s ")) << lines[1];
  EXPECT_NE(lines[1].find("(6 new tokens for 1 prompt in "), std::string::npos) << lines[1];
  EXPECT_TRUE(lines[2].starts_with("time to first token ")) << lines[2];
  // Uniform: 5 pipeline layers in 3 stages of 2, 2, 1.
  EXPECT_TRUE(lines[3].starts_with("stage 0 (embedding..block.0): busy ")) << lines[3];
  EXPECT_TRUE(lines[4].starts_with("stage 1 (block.1..block.2): busy ")) << lines[4];
  // 2 · 2 blocks · 32 features · 4 bytes · 32 positions.
  EXPECT_TRUE(lines[4].ends_with(", kv cache 16.0 KiB")) << lines[4];
  EXPECT_TRUE(lines[5].starts_with("stage 2 (head..head): busy ")) << lines[5];
  EXPECT_TRUE(lines[5].ends_with(", kv cache 0 B")) << lines[5];
}

TEST_F(GenerateCommand, BadInputIsAnErrorNamingTheRule) {
  const std::string base = "generate --weights " + weights_ + " --max-new-tokens 4 ";
  const CommandResult long_prompt = run_pipeflow(base + "--prompt " + std::string(33, 'a'));
  EXPECT_EQ(long_prompt.exit_code, 1);
  EXPECT_EQ(long_prompt.err, "pipeflow: error: prompt 0 has 33 tokens, longer than the model's context of 32: "
                             "shorten it\n");
  EXPECT_EQ(long_prompt.out, "");
  const CommandResult neither = run_pipeflow(base);
  EXPECT_EQ(neither.exit_code, 1);
  EXPECT_EQ(neither.err, "pipeflow: error: generate needs --prompt TEXT or --prompts FILE (one prompt a line)\n");
  EXPECT_NE(run_pipeflow(base + "--prompt a --prompts x.txt").exit_code, 0);
  const CommandResult top_p = run_pipeflow(base + "--prompt a --temperature 1 --top-p 0");
  EXPECT_EQ(top_p.err, "pipeflow: error: --top-p 0: must lie in (0, 1] (1 keeps every token)\n");
  EXPECT_EQ(run_pipeflow(base + "--prompt a --seed -1").err,
            "pipeflow: error: --seed: seed -1 is negative: give an integer >= 0 (run with --help for the options)\n");
  const std::string small = dir_ + "/small.safetensors";
  ASSERT_EQ(run_pipeflow("init --layers 1 --heads 2 --width 16 --context 16 --vocab 64 --out " + small).exit_code, 0);
  const CommandResult vocab = run_pipeflow("generate --weights " + small + " --prompt hi --max-new-tokens 2");
  EXPECT_EQ(vocab.exit_code, 1);
  EXPECT_EQ(vocab.err, "pipeflow: error: prompt 0: token 104 at position 0 is outside the vocabulary [0, 64) of the "
                       "model\n");
}

}  // namespace
}  // namespace pipeflow::testing
