// pipeflow init and pipeflow grad, end to end: files a user would exchange
// with another implementation, checked against the PyTorch reference file.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../nn/test_support.h"
#include "pipeflow/core/file.h"
#include "pipeflow/nn/model_file.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

const std::string kReference = std::string(PIPEFLOW_SOURCE_DIR) + "/tests/data/gpt2_reference.safetensors";

TEST(InitCommand, WritesGpt2InitialWeightsWithTheShapeInTheMetadata) {
  const std::string dir = make_temp_dir();
  const CommandResult result =
      run_pipeflow("init --layers 2 --heads 4 --width 32 --context 16 --seed 7 --out " + dir + "/w.safetensors");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "wrote " + dir +
                            "/w.safetensors: GPT-2, 2 layers, width 32, 4 heads, context 16, vocabulary 256: 34176 "
                            "parameters (seed 7)\n");
  const auto file = nn::SafetensorsFile::read(dir + "/w.safetensors");
  const nn::ModelConfig config = nn::read_config(file);
  EXPECT_EQ(config, (nn::ModelConfig{.vocab_size = 256, .context = 16, .n_layer = 2, .n_head = 4, .n_embd = 32}));
  EXPECT_EQ(file.names().size(), 28u);
  EXPECT_EQ(file.entry("h.1.attn.c_attn.weight").shape, Shape({32, 96}));
  // The same values the library initialises, and the same bytes for the same seed.
  nn::Stage model(config, nn::all_layers(config));
  model.init_parameters(7);
  const Tensor wte = file.floats("wte.weight");
  EXPECT_TRUE(std::equal(wte.span().begin(), wte.span().end(), model.parameter("wte.weight").begin()));
  ASSERT_EQ(run_pipeflow("init --layers 2 --heads 4 --width 32 --context 16 --seed 7 --out " + dir + "/again.safetensors")
                .exit_code,
            0);
  EXPECT_EQ(read_file(dir + "/w.safetensors"), read_file(dir + "/again.safetensors"));
}

// A Llama in Hugging Face's names and layout, the config in the metadata;
// the parameter count is the formula's: V·C + L·(2C + 2C² + 2C·KV·hs + 3C·F) + C.
TEST(InitCommand, WritesALlamaThatTrainAndGenerateRead) {
  const std::string dir = make_temp_dir();
  const CommandResult result = run_pipeflow("init --arch llama --layers 2 --heads 4 --kv-heads 1 --width 32 "
                                            "--context 16 --untied --out " +
                                            dir + "/w.safetensors");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  // F = 8·32/3 rounded up to 16 = 96; KV·hs = 8.
  const std::int64_t expected = 2 * 256 * 32 + 2 * (2 * 32 + 2 * 32 * 32 + 2 * 32 * 8 + 3 * 32 * 96) + 32;
  EXPECT_EQ(result.out, "wrote " + dir +
                            "/w.safetensors: Llama, 2 layers, width 32, 4 heads (1 key/value), MLP 96, context 16, "
                            "vocabulary 256, rope_theta 10000, rms_norm_eps 1e-05, untied head: " +
                            std::to_string(expected) + " parameters (seed 0)\n");
  const auto file = nn::SafetensorsFile::read(dir + "/w.safetensors");
  const nn::ModelConfig config = nn::read_config(file);
  EXPECT_TRUE(config.llama());
  EXPECT_EQ(config.kv_heads(), 1);
  EXPECT_FALSE(config.tied_embeddings);
  EXPECT_EQ(file.entry("model.layers.1.self_attn.k_proj.weight").shape, Shape({8, 32}));
  EXPECT_EQ(file.entry("model.layers.0.mlp.down_proj.weight").shape, Shape({32, 96}));
  EXPECT_EQ(file.entry("lm_head.weight").shape, Shape({256, 32}));
  EXPECT_EQ(file.names().size(), 2u + 2 * 9 + 1);

  write_file_atomic(dir + "/run.json", R"({"steps": 2, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "pipeline": {"stages": 2}, "out_dir": ")" + dir + R"(/out"})");
  const CommandResult trained = run_pipeflow("train --config " + dir + "/run.json --weights " + dir + "/w.safetensors");
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  EXPECT_NE(trained.err.find("pipeflow train: Llama, 2 layers"), std::string::npos) << trained.err;
  const CommandResult generated = run_pipeflow("generate --weights " + dir +
                                               "/out/weights.safetensors --prompt hello --max-new-tokens 4 --stages 2");
  EXPECT_EQ(generated.exit_code, 0) << generated.err;
  EXPECT_EQ(run_pipeflow("init --layers 2 --heads 4 --kv-heads 1 --width 32 --context 16 --out " + dir + "/g.st").err,
            "pipeflow: error: --kv-heads, --intermediate, --rope-theta, --norm-eps and --untied shape a Llama: add "
            "--arch llama, or leave them out for GPT-2\n");
}

TEST(InitCommand, AnImpossibleShapeIsAOneLineError) {
  const std::string dir = make_temp_dir();
  const CommandResult result =
      run_pipeflow("init --layers 2 --heads 3 --width 32 --context 16 --out " + dir + "/w.safetensors");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err,
            "pipeflow: error: model n_embd = 32 is not a multiple of n_head = 3: every head needs n_embd / n_head "
            "features\n");
  EXPECT_FALSE(std::filesystem::exists(dir + "/w.safetensors"));
  const CommandResult negative =
      run_pipeflow("init --layers 2 --heads 2 --width 32 --context 16 --seed -1 --out " + dir + "/w.safetensors");
  EXPECT_NE(negative.exit_code, 0);
  EXPECT_EQ(negative.err, "pipeflow: error: --seed: seed -1 is negative: give an integer >= 0 (run with --help for "
                          "the options)\n");
  EXPECT_FALSE(std::filesystem::exists(dir + "/w.safetensors"));
}

// The reference file holds weights, tokens [B, T+1] and PyTorch's gradients
// (grad.<name>), so it serves as both --weights and --batch.
TEST(GradCommand, ComputesPyTorchsLossAndGradientsOfTheReferenceBatch) {
  const std::string dir = make_temp_dir();
  const CommandResult result =
      run_pipeflow("grad --weights " + kReference + " --batch " + kReference + " --out " + dir + "/g.safetensors");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto reference = nn::SafetensorsFile::read(kReference);
  const double expected_loss = std::stod(reference.metadata("loss"));
  ASSERT_EQ(result.out.rfind("loss ", 0), 0u) << result.out;
  EXPECT_NEAR(std::stod(result.out.substr(5)), expected_loss, 1e-5 * expected_loss);
  EXPECT_NE(result.out.find("over 4 sequences of 16 tokens"), std::string::npos) << result.out;

  const auto grads = nn::SafetensorsFile::read(dir + "/g.safetensors");
  EXPECT_NEAR(std::stod(grads.metadata("loss")), expected_loss, 1e-5 * expected_loss);
  EXPECT_EQ(grads.names().size(), 28u);
  for (const std::string& name : grads.names()) {
    EXPECT_LT(nn::testing::relative_error(grads.floats(name).span(), reference.floats("grad." + name).span()), 1e-5)
        << name;
  }
}

// Runs grad on a fresh 1-layer model (context 4) with the given batch file
// (empty: the weights file itself); returns the result and the directory.
CommandResult grad_on_tiny_model(const std::string& batch, std::string& dir) {
  dir = make_temp_dir();
  const std::string weights = dir + "/w.safetensors";
  EXPECT_EQ(run_pipeflow("init --layers 1 --heads 1 --width 8 --context 4 --out " + weights).exit_code, 0);
  return run_pipeflow("grad --weights " + weights + " --batch " + (batch.empty() ? weights : batch) + " --out " + dir +
                      "/g.safetensors");
}

TEST(GradCommand, ABatchWithoutTokensNamesTheFile) {
  std::string dir;
  const CommandResult result = grad_on_tiny_model("", dir);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err, "pipeflow: error: " + dir + "/w.safetensors: no tensor tokens in the file (16 tensors)\n");
}

TEST(GradCommand, SequencesLongerThanTheContextAreRejected) {
  std::string dir;
  const CommandResult result = grad_on_tiny_model(kReference, dir);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err,
            "pipeflow: error: model (embedding..head): sequence length 16 exceeds the model's context of 4\n");
}

TEST(GradCommand, TokensThatAreNotSequencesAreRejectedWithOrWithoutASchedule) {
  const std::string dir = make_temp_dir();
  ASSERT_EQ(run_pipeflow("init --layers 1 --heads 1 --width 8 --context 4 --out " + dir + "/w.safetensors").exit_code,
            0);
  nn::SafetensorsWriter batch;
  const std::vector<std::int32_t> flat(36, 1);
  batch.add("tokens", flat, {36});
  batch.write(dir + "/flat.safetensors");
  for (const std::string layout : {"", " --schedule 1f1b --stages 2 --microbatches 2"}) {
    const CommandResult result = run_pipeflow("grad --weights " + dir + "/w.safetensors --batch " + dir +
                                              "/flat.safetensors --out " + dir + "/g.safetensors" + layout);
    EXPECT_EQ(result.exit_code, 1) << layout;
    EXPECT_EQ(result.err,
              "pipeflow: error: token sequences must be an int32 tensor [B, T+1] with B >= 1 and T >= 1, got "
              "[36]\n")
        << layout;
  }
}

}  // namespace
}  // namespace pipeflow::testing
