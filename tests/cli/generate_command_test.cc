// pipeflow generate, end to end: the tokens the pipeline prints are the
// library's unpipelined, uncached generation from the same weights file, in
// one process and under mpirun (one stage per process, rank 0 alone
// printing); and generate and grad read a sharded checkpoint folder (as
// train under mpirun writes it) as --weights.

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

std::vector<std::vector<std::int32_t>> tokens_of(const std::string& json_text) {
  const nlohmann::json json = nlohmann::json::parse(json_text);
  std::vector<std::vector<std::int32_t>> tokens;
  for (const auto& output : json.at("outputs")) {
    tokens.push_back(output["tokens"].get<std::vector<std::int32_t>>());
  }
  return tokens;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  for (std::size_t begin = 0; begin < text.size();) {
    const std::size_t end = text.find('\n', begin);
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

class GenerateCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir();
    weights_ = dir_ + "/w.safetensors";
    ASSERT_EQ(run_pipeflow("init --layers 3 --heads 2 --width 32 --context 32 --seed 3 --out " + weights_).exit_code,
              0);
  }

  std::vector<std::int32_t> expected(const std::string& prompt, int new_tokens) const {
    const auto file = nn::SafetensorsFile::read(weights_);
    const nn::ModelConfig config = nn::read_config(file);
    nn::Stage model(config, nn::all_layers(config));
    nn::load_parameters(model, file);
    return nn::generate(model, nn::encode_text(prompt), {.new_tokens = new_tokens});
  }

  // Four prompts, one of them empty.
  std::string prompts_file() const {
    const std::string path = dir_ + "/four.txt";
    write_file_atomic(path, "hello\n\nthe cat\nab\n");
    return path;
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
  // The decode alone: 3 prompts' 7 tokens after their first, after the first tokens.
  const double decode_rate =
      3 * 7 / (json["seconds"].get<double>() - json["time_to_first_token_s"].get<double>());
  EXPECT_NEAR(json["decode_tokens_per_s"].get<double>(), decode_rate, 1e-9 * decode_rate);
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
  const std::vector<std::string> lines = lines_of(result.out);
  // The text, tokens/s, time to first token, one line per stage.
  ASSERT_EQ(lines.size(), 3U + 3U) << result.out;
  EXPECT_TRUE(lines[0].starts_with("hello")) << lines[0];
  EXPECT_GE(lines[0].size(), 5U + 6U);
  EXPECT_TRUE(lines[1].starts_with("tokens/s ")) << lines[1];
  EXPECT_NE(lines[1].find("(6 new tokens for 1 prompt in "), std::string::npos) << lines[1];
  EXPECT_TRUE(lines[2].starts_with("time to first token ")) << lines[2];
  EXPECT_NE(lines[2].find(", then decode at "), std::string::npos) << lines[2];
  // Uniform: 5 pipeline layers in 3 stages of 2, 2, 1.
  EXPECT_TRUE(lines[3].starts_with("stage 0 (embedding..block.0): busy ")) << lines[3];
  EXPECT_TRUE(lines[4].starts_with("stage 1 (block.1..block.2): busy ")) << lines[4];
  // 2 · 2 blocks · 32 features · 4 bytes · 32 positions.
  EXPECT_TRUE(lines[4].ends_with(", kv cache 16.0 KiB")) << lines[4];
  EXPECT_TRUE(lines[5].starts_with("stage 2 (head..head): busy ")) << lines[5];
  EXPECT_TRUE(lines[5].ends_with(", kv cache 0 B")) << lines[5];
}

// A Llama checkpoint as Hugging Face publishes it (tests/data/hf/
// tiny-llama-bf16: BF16 tensors, no pipeflow metadata, config.json beside:
// grouped-query attention with one key/value head, Llama 3 rope scaling,
// tied embeddings; written by tools/make_hf_llama_checkpoint.py) loads as
// it is, one file or sharded (the same tensors in two shards and
// model.safetensors.index.json, given as the folder or as the index), and
// greedy decoding on 1 and 3 stages gives the tokens PyTorch computed in
// float64 from the same bf16 weights.
TEST_F(GenerateCommand, AHuggingFaceLlamaCheckpointLoadsAsItIsAndDecodesAsPyTorch) {
  const std::string data = std::string(PIPEFLOW_SOURCE_DIR) + "/tests/data/hf/";
  const nlohmann::json expected = nlohmann::json::parse(read_file(data + "tiny-llama-bf16/expected.json"));
  const auto want = expected.at("new_tokens").get<std::vector<std::int32_t>>();
  for (const std::string& weights :
       {data + "tiny-llama-bf16/model.safetensors", data + "tiny-llama-bf16-sharded",
        data + "tiny-llama-bf16-sharded/model.safetensors.index.json"}) {
    for (const int stages : {1, 3}) {
      const CommandResult result = run_pipeflow(
          "generate --weights " + weights + " --prompt '" + expected.at("prompt").get<std::string>() +
          "' --max-new-tokens " + std::to_string(want.size()) + " --stages " + std::to_string(stages) + " --json");
      ASSERT_EQ(result.exit_code, 0) << weights << "\n" << result.err;
      EXPECT_EQ(tokens_of(result.out), std::vector<std::vector<std::int32_t>>{want}) << weights << ", " << stages
                                                                                      << " stages";
    }
  }
}

// --bf16 under mpirun: the activations cross between the processes in 16
// bits, the sampled tokens as exact ids. A vocabulary of 512 makes ids past
// 256, the largest run of integers bf16 holds, so a token narrowed to bf16
// on its way back to the first stage would change the continuation.
TEST_F(GenerateCommand, InBf16UnderMpirunTheTokensAreTheInProcessRunsAndIdsPast256Survive) {
  const std::string wide_vocab = dir_ + "/v512.safetensors";
  ASSERT_EQ(run_pipeflow("init --layers 2 --heads 2 --width 32 --context 32 --vocab 512 --seed 5 --out " +
                         wide_vocab)
                .exit_code,
            0);
  const std::string base = "generate --weights " + wide_vocab + " --prompts " + prompts_file() +
                           " --max-new-tokens 12 --microbatches 2 --bf16 --json";
  const CommandResult threads = run_pipeflow(base + " --stages 2");
  ASSERT_EQ(threads.exit_code, 0) << threads.err;
  EXPECT_EQ(nlohmann::json::parse(threads.out)["precision"], "bf16");
  const auto expected = tokens_of(threads.out);
  bool past_256 = false;
  for (const auto& tokens : expected) {
    for (const std::int32_t token : tokens) past_256 = past_256 || (token > 256 && token % 2 == 1);
  }
  ASSERT_TRUE(past_256) << "no odd id past 256 to lose in bf16: pick another seed";
  const CommandResult mpi = run_mpirun(2, base);
  ASSERT_EQ(mpi.exit_code, 0) << mpi.err;
  EXPECT_EQ(tokens_of(mpi.out), expected);
  const CommandResult text = run_pipeflow("generate --weights " + wide_vocab + " --prompt hi --max-new-tokens 2 --fp16");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find(" micro-batch, in fp16)\n"), std::string::npos) << text.out;
  EXPECT_NE(run_pipeflow("generate --weights " + wide_vocab + " --prompt hi --max-new-tokens 2 --fp16 --bf16").exit_code,
            0);
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
  for (const std::string bad : {"-1", "1.5", "abc"}) {
    EXPECT_EQ(run_pipeflow(base + "--prompt a --prefill-chunk " + bad).err,
              "pipeflow: error: --prefill-chunk: " + bad +
                  " is not an integer >= 0 (tokens of a prompt each prefill chunk carries through the stages, at "
                  "most 9 digits; 0: the whole prompt in one piece): give e.g. --prefill-chunk 128, or 0 (run with "
                  "--help for the options)\n")
        << bad;
  }
  const std::string small = dir_ + "/small.safetensors";
  ASSERT_EQ(run_pipeflow("init --layers 1 --heads 2 --width 16 --context 16 --vocab 64 --out " + small).exit_code, 0);
  const CommandResult vocab = run_pipeflow("generate --weights " + small + " --prompt hi --max-new-tokens 2");
  EXPECT_EQ(vocab.exit_code, 1);
  EXPECT_EQ(vocab.err, "pipeflow: error: prompt 0: token 104 at position 0 is outside the vocabulary [0, 64) of the "
                       "model\n");
}

// A 24-byte prompt in chunks of 5 (not a multiple) through 1, 2 and 3 stages
// gives the unchunked prefill's tokens, in one process and under mpirun.
const char* const kChunkedPrompt = " --prompt 'the quick brown fox jump' --max-new-tokens 8 --json ";

TEST_F(GenerateCommand, ChunkedPrefillGivesTheUnchunkedTokens) {
  const std::string base = "generate --weights " + weights_ + kChunkedPrompt;
  const CommandResult whole = run_pipeflow(base + "--prefill-chunk 0");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  for (const int stages : {1, 2, 3}) {
    const CommandResult chunked = run_pipeflow(base + "--prefill-chunk 5 --stages " + std::to_string(stages));
    ASSERT_EQ(chunked.exit_code, 0) << chunked.err;
    EXPECT_EQ(tokens_of(chunked.out), tokens_of(whole.out)) << stages << " stages";
    EXPECT_EQ(nlohmann::json::parse(chunked.out).at("prefill_chunk"), 5);
  }
}

TEST_F(GenerateCommand, UnderMpirunChunkedPrefillGivesTheUnchunkedTokens) {
  const std::string base = "generate --weights " + weights_ + kChunkedPrompt;
  const CommandResult whole = run_pipeflow(base + "--prefill-chunk 0");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  for (const int processes : {2, 3}) {
    const CommandResult chunked = run_mpirun(processes, base + "--prefill-chunk 5");
    ASSERT_EQ(chunked.exit_code, 0) << chunked.err;
    EXPECT_EQ(tokens_of(chunked.out), tokens_of(whole.out)) << processes << " processes";
  }
}

// Greedy: 2 and 4 processes, 1 and 2 groups of sequences, give the tokens of
// one stage in one process, which are the library's generation without a
// cache (nn::generate), for every prompt; sampled, 3 processes give those of
// one stage.
TEST_F(GenerateCommand, UnderMpirunEveryLayoutGivesTheUnpipelinedTokens) {
  const std::string base =
      "generate --weights " + weights_ + " --prompts " + prompts_file() + " --max-new-tokens 10 --json";
  const CommandResult unpipelined = run_pipeflow(base);
  ASSERT_EQ(unpipelined.exit_code, 0) << unpipelined.err;
  const auto expected = tokens_of(unpipelined.out);
  const std::vector<std::string> prompts = {"hello", "", "the cat", "ab"};
  ASSERT_EQ(expected.size(), prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(expected[i], this->expected(prompts[i], 10)) << i;
  for (const int processes : {2, 4}) {
    // Every stage's layers and cache as the same stages in one process have them.
    const CommandResult threads = run_pipeflow(base + " --stages " + std::to_string(processes));
    ASSERT_EQ(threads.exit_code, 0) << threads.err;
    const auto in_process = nlohmann::json::parse(threads.out);
    for (const int microbatches : {1, 2}) {
      const CommandResult result =
          run_mpirun(processes, base + " --microbatches " + std::to_string(microbatches));
      ASSERT_EQ(result.exit_code, 0) << "np " << processes << ", M " << microbatches << "\n" << result.err;
      // Rank 0 alone prints: one JSON object.
      const auto json = nlohmann::json::parse(result.out);
      EXPECT_EQ(tokens_of(result.out), expected) << "np " << processes << ", M " << microbatches;
      ASSERT_EQ(json["stages"].size(), static_cast<std::size_t>(processes));
      for (std::size_t r = 0; r < json["stages"].size(); ++r) {
        auto stage = json["stages"][r];
        auto same = in_process["stages"][r];
        EXPECT_GT(stage["busy_share"].get<double>(), 0) << r;
        EXPECT_LE(stage["busy_share"].get<double>(), 1) << r;
        stage.erase("busy_share");
        same.erase("busy_share");
        EXPECT_EQ(stage, same) << r;
      }
      EXPECT_GT(json["time_to_first_token_s"].get<double>(), 0);
      EXPECT_EQ(json["new_tokens"].get<int>(), 40);
    }
  }
  // Sampled: each prompt's own generator on the last stage, wherever that runs.
  const std::string sampled = base + " --temperature 0.8 --top-k 20 --seed 3";
  const CommandResult one = run_pipeflow(sampled);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const CommandResult three = run_mpirun(3, sampled + " --microbatches 3");
  ASSERT_EQ(three.exit_code, 0) << three.err;
  EXPECT_EQ(tokens_of(three.out), tokens_of(one.out));
  EXPECT_NE(tokens_of(one.out), expected);
}

// Tensor parallelism: tp 2 x pp 2 under mpirun (4 processes) and in threads,
// greedy and sampled, gives the tokens of one rank; a model that does not
// split is refused naming the field.
TEST_F(GenerateCommand, TensorParallelStagesGiveOneRanksTokens) {
  const std::string base =
      "generate --weights " + weights_ + " --prompts " + prompts_file() + " --max-new-tokens 10 --json";
  for (const std::string& sampling : {std::string(), std::string(" --temperature 0.8 --top-k 20 --seed 3")}) {
    const CommandResult one = run_pipeflow(base + sampling);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    const CommandResult threads = run_pipeflow(base + sampling + " --stages 2 --tp 2 --microbatches 2");
    ASSERT_EQ(threads.exit_code, 0) << threads.err;
    EXPECT_EQ(tokens_of(threads.out), tokens_of(one.out)) << sampling;
    const CommandResult processes = run_mpirun(4, base + sampling + " --tp 2");
    ASSERT_EQ(processes.exit_code, 0) << processes.err;
    EXPECT_EQ(tokens_of(processes.out), tokens_of(one.out)) << sampling;
    EXPECT_EQ(nlohmann::json::parse(processes.out)["stages"].size(), 2U);
  }
  const CommandResult odd = run_pipeflow(base + " --tp 3");
  EXPECT_EQ(odd.exit_code, 1);
  EXPECT_NE(odd.err.find("tensor_parallel = 3: the model's n_head"), std::string::npos) << odd.err;
}

TEST_F(GenerateCommand, UnderMpirunOnePromptStreamsOnRankZeroAlone) {
  const std::string args = "generate --weights " + weights_ + " --prompt hello --max-new-tokens 6 --partition uniform";
  const CommandResult in_process = run_pipeflow(args + " --stages 2");
  ASSERT_EQ(in_process.exit_code, 0) << in_process.err;
  const CommandResult result = run_mpirun(2, args);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> lines = lines_of(result.out);
  // The text, tokens/s, time to first token, one line per stage: once.
  ASSERT_EQ(lines.size(), 3U + 2U) << result.out;
  EXPECT_EQ(lines[0], lines_of(in_process.out)[0]);
  EXPECT_NE(lines[1].find("(6 new tokens for 1 prompt in "), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("; 2 stages, 1 micro-batch)"), std::string::npos) << lines[1];
  // Uniform: 5 pipeline layers in 2 stages of 3 and 2.
  EXPECT_TRUE(lines[3].starts_with("stage 0 (embedding..block.1): busy ")) << lines[3];
  // 2 · 2 blocks · 32 features · 4 bytes · 32 positions.
  EXPECT_TRUE(lines[3].ends_with(", kv cache 16.0 KiB")) << lines[3];
  EXPECT_TRUE(lines[4].starts_with("stage 1 (block.2..head): busy ")) << lines[4];
  EXPECT_TRUE(lines[4].ends_with(", kv cache 8.00 KiB")) << lines[4];
}

TEST_F(GenerateCommand, UnderMpirunABadPromptOrStageCountEndsTheJobWithTheError) {
  const CommandResult long_prompt =
      run_mpirun(2, "generate --weights " + weights_ + " --max-new-tokens 4 --prompt " + std::string(33, 'a'));
  EXPECT_NE(long_prompt.exit_code, 0);
  EXPECT_NE(long_prompt.err.find("pipeflow: error in MPI process "), std::string::npos) << long_prompt.err;
  EXPECT_NE(long_prompt.err.find("prompt 0 has 33 tokens, longer than the model's context of 32: shorten it"),
            std::string::npos)
      << long_prompt.err;
  EXPECT_EQ(long_prompt.out, "");
  const CommandResult stages = run_mpirun(2, "generate --weights " + weights_ + " --prompt a --max-new-tokens 2 "
                                             "--stages 3");
  EXPECT_NE(stages.exit_code, 0);
  EXPECT_NE(stages.err.find("--stages 3 and mpirun -np 2: under mpirun each process runs one stage; give --stages 2 "
                            "or leave it out"),
            std::string::npos)
      << stages.err;
}

// train under mpirun (pp 2) writes its checkpoint as a folder of shards and
// an index; generate and grad read the folder, or its index, as the whole
// weights file of the same step.
TEST_F(GenerateCommand, AShardedCheckpointFolderIsWeights) {
  const std::string out = dir_ + "/run";
  const std::string config = dir_ + "/run.json";
  write_file_atomic(config, R"({
  "model": {"n_layer": 3, "n_head": 2, "n_embd": 32, "n_ctx": 32, "vocab_size": 256},
  "train_batch_size": 4,
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
  "pipeline": {"stages": 2, "schedule": "1f1b", "partition_method": "uniform"},
  "steps": 2,
  "eval_interval": 0,
  "seed": 5,
  "checkpoint": {"interval": 2},
  "out_dir": ")" + out + R"("
})");
  const CommandResult trained = run_mpirun(2, "train --config " + config);
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const std::string folder = out + "/checkpoints/step_2";
  ASSERT_TRUE(std::filesystem::exists(folder + "/model.safetensors.index.json"));
  const std::string base = " --prompts " + prompts_file() + " --max-new-tokens 8 --json";
  const CommandResult whole = run_pipeflow("generate --weights " + out + "/weights.safetensors" + base);
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const auto expected = tokens_of(whole.out);
  for (const std::string& weights : {folder, folder + "/model.safetensors.index.json"}) {
    const CommandResult result = run_pipeflow("generate --weights " + weights + base + " --stages 2");
    ASSERT_EQ(result.exit_code, 0) << weights << "\n" << result.err;
    EXPECT_EQ(tokens_of(result.out), expected) << weights;
  }
  const CommandResult under_mpi = run_mpirun(2, "generate --weights " + folder + base + " --microbatches 2");
  ASSERT_EQ(under_mpi.exit_code, 0) << under_mpi.err;
  EXPECT_EQ(tokens_of(under_mpi.out), expected);

  // grad: the same loss line from the folder as from the file.
  const std::string batch = dir_ + "/batch.safetensors";
  {
    nn::SafetensorsWriter writer;
    std::vector<std::int32_t> tokens(2 * 9);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>((7 * i) % 256);
    writer.add("tokens", tokens, Shape{2, 9});
    writer.write(batch);
  }
  const CommandResult from_file = run_pipeflow("grad --weights " + out + "/weights.safetensors --batch " + batch +
                                               " --out " + dir_ + "/g1.safetensors");
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  const CommandResult from_folder =
      run_pipeflow("grad --weights " + folder + " --batch " + batch + " --out " + dir_ + "/g2.safetensors");
  ASSERT_EQ(from_folder.exit_code, 0) << from_folder.err;
  EXPECT_EQ(lines_of(from_folder.out)[0], lines_of(from_file.out)[0]);
  EXPECT_EQ(read_file(dir_ + "/g1.safetensors"), read_file(dir_ + "/g2.safetensors"));

  // train --weights: a step from the folder ends where a step from the file does.
  for (const std::string name : {"file", "folder"}) {
    const std::string weights = name == "file" ? out + "/weights.safetensors" : folder;
    const CommandResult further = run_pipeflow("train --config " + config + " --steps 1 --out-dir " + dir_ + "/" +
                                               name + " --weights " + weights);
    ASSERT_EQ(further.exit_code, 0) << name << "\n" << further.err;
  }
  EXPECT_EQ(read_file(dir_ + "/folder/weights.safetensors"), read_file(dir_ + "/file/weights.safetensors"));
}

}  // namespace
}  // namespace pipeflow::testing
