// pipeflow against PyTorch 1.13 on the same tiny models: a GPT-2
// (tests/data/gpt2_reference.safetensors, float32, written by
// tools/make_gpt2_reference.py) and a Llama with grouped-query attention,
// Llama 3 rope scaling and an untied head (tests/data/llama_reference.safetensors,
// float64, written by tools/make_llama_reference.py); see there for the
// contents. Every test runs on both files.

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/batch.h"
#include "pipeflow/nn/gradient_clipping.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/stage.h"
#include "test_support.h"

namespace pipeflow::nn {
namespace {

const SafetensorsFile& read_reference(const std::string& name) {
  static std::map<std::string, SafetensorsFile> files;
  auto found = files.find(name);
  if (found == files.end()) {
    found = files.emplace(name, SafetensorsFile::read(std::string(PIPEFLOW_SOURCE_DIR) + "/tests/data/" + name)).first;
  }
  return found->second;
}

using testing::relative_error;

class TorchReference : public ::testing::TestWithParam<std::string> {
 protected:
  const SafetensorsFile& reference() const { return read_reference(GetParam()); }
  double metadata_number(const char* key) const { return std::stod(reference().metadata(key)); }
};

struct Model {
  Stage stage;
  Batch batch;

  explicit Model(const SafetensorsFile& reference)
      : stage(read_config(reference), all_layers(read_config(reference))) {
    load_parameters(stage, reference);
    batch = split_sequences(reference.ints("tokens"));
  }

  // Forward and backward of the reference batch; returns the loss.
  double loss_and_gradients() {
    MicrobatchState state;
    stage.forward(state, {.tokens = batch.inputs.clone(), .targets = batch.targets.clone()});
    stage.backward_from_loss(state, 1.0);
    return state.loss();
  }
};

TEST(TorchReferenceFiles, DescribeTheirModels) {
  const ModelConfig gpt2 = read_config(read_reference("gpt2_reference.safetensors"));
  EXPECT_EQ(gpt2, (ModelConfig{.vocab_size = 256, .context = 16, .n_layer = 2, .n_head = 4, .n_embd = 32}));
  const ModelConfig llama = read_config(read_reference("llama_reference.safetensors"));
  EXPECT_EQ(llama, (ModelConfig{.family = Family::kLlama,
                                .vocab_size = 256,
                                .context = 16,
                                .n_layer = 2,
                                .n_head = 4,
                                .n_embd = 32,
                                .n_kv_head = 2,
                                .intermediate = 48,
                                .rope_theta = 10000,
                                .rope_scaling = {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                                                 .original_context = 16},
                                .norm_eps = 1e-5,
                                .tied_embeddings = false}));
  for (const char* name : {"gpt2_reference.safetensors", "llama_reference.safetensors"}) {
    EXPECT_EQ(read_reference(name).entry("tokens").shape, Shape({4, 17})) << name;
  }
}

TEST_P(TorchReference, LogitsMatch) {
  Model model(reference());
  const Tensor logits = model.stage.logits(model.batch.inputs);
  const Tensor expected = reference().floats("logits");
  ASSERT_EQ(logits.shape(), expected.shape());
  EXPECT_LT(relative_error(logits.span(), expected.span()), 1e-5);
}

TEST_P(TorchReference, LossMatchesToOneInAHundredThousand) {
  Model model(reference());
  const double expected = metadata_number("loss");
  EXPECT_NEAR(model.loss_and_gradients(), expected, 1e-5 * expected);
}

TEST_P(TorchReference, EveryGradientMatchesToOneInAHundredThousandOfItsNorm) {
  Model model(reference());
  model.loss_and_gradients();
  for (const ParameterInfo& info : model.stage.layout().entries()) {
    const Tensor expected = reference().floats("grad." + info.name);
    ASSERT_EQ(expected.shape(), info.shape) << info.name;
    const double error = relative_error(model.stage.gradient(info.name), expected.span());
    EXPECT_LT(error, 1e-5) << info.name;
  }
}

// The reference's training loop: per step zero the gradients, forward,
// backward, clip to the global norm, AdamW with constant lr.
TEST_P(TorchReference, FiveAdamWStepsGiveTheSameLosses) {
  Model model(reference());
  const AdamWOptions options{.lr = metadata_number("adamw_lr"),
                                .betas = {metadata_number("adamw_beta1"), metadata_number("adamw_beta2")},
                                .eps = metadata_number("adamw_eps"),
                                .weight_decay = metadata_number("adamw_weight_decay")};
  const double max_norm = metadata_number("adamw_grad_clip");
  AdamW optimizer(model.stage, options);
  const Tensor expected = reference().floats("losses");
  const int steps = static_cast<int>(metadata_number("steps"));
  ASSERT_EQ(expected.numel(), steps + 1);
  for (int step = 0; step <= steps; ++step) {
    model.stage.zero_gradients();
    const double loss = model.loss_and_gradients();
    EXPECT_NEAR(loss, expected[step], 1e-5) << "loss before step " << step + 1;
    if (step == steps) break;
    const double norm = std::sqrt(model.stage.gradient_square_sum());
    const double coefficient = clip_coefficient(norm, max_norm);
    if (coefficient < 1) model.stage.scale_gradients(coefficient);
    optimizer.step(options.lr);
  }
  EXPECT_EQ(optimizer.steps(), steps);
}

INSTANTIATE_TEST_SUITE_P(Models, TorchReference,
                         ::testing::Values("gpt2_reference.safetensors", "llama_reference.safetensors"),
                         [](const auto& param) { return param.param.substr(0, param.param.find('_')); });

}  // namespace
}  // namespace pipeflow::nn
