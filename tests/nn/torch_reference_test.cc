// pipeflow against PyTorch 1.13 on the same tiny GPT-2: the reference file
// tests/data/gpt2_reference.safetensors is written by
// tools/make_gpt2_reference.py (see there for its contents).

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/batch.h"
#include "pipeflow/nn/gradient_clipping.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/stage.h"
#include "test_support.h"

namespace pipeflow::nn {
namespace {

const SafetensorsFile& reference() {
  static const SafetensorsFile file =
      SafetensorsFile::read(std::string(PIPEFLOW_SOURCE_DIR) + "/tests/data/gpt2_reference.safetensors");
  return file;
}

double metadata_number(const char* key) { return std::stod(reference().metadata(key)); }

using testing::relative_error;

struct Model {
  Stage stage;
  Batch batch;

  Model() : stage(read_config(reference()), all_layers(read_config(reference()))) {
    load_parameters(stage, reference());
    batch = split_sequences(reference().ints("tokens"));
  }

  // Forward and backward of the reference batch; returns the loss.
  double loss_and_gradients() {
    MicrobatchState state;
    stage.forward(state, {.tokens = batch.inputs.clone(), .targets = batch.targets.clone()});
    stage.backward_from_loss(state, 1.0);
    return state.loss();
  }
};

TEST(TorchReference, FileDescribesTheModel) {
  const ModelConfig config = read_config(reference());
  EXPECT_EQ(config, (ModelConfig{.vocab_size = 256, .context = 16, .n_layer = 2, .n_head = 4, .n_embd = 32}));
  EXPECT_EQ(reference().entry("tokens").shape, Shape({4, 17}));
}

TEST(TorchReference, LogitsMatch) {
  Model model;
  const Tensor logits = model.stage.logits(model.batch.inputs);
  const Tensor expected = reference().floats("logits");
  ASSERT_EQ(logits.shape(), expected.shape());
  EXPECT_LT(relative_error(logits.span(), expected.span()), 1e-5);
}

TEST(TorchReference, LossMatchesToOneInAHundredThousand) {
  Model model;
  const double expected = metadata_number("loss");
  EXPECT_NEAR(model.loss_and_gradients(), expected, 1e-5 * expected);
}

TEST(TorchReference, EveryGradientMatchesToOneInAHundredThousandOfItsNorm) {
  Model model;
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
TEST(TorchReference, FiveAdamWStepsGiveTheSameLosses) {
  Model model;
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

}  // namespace
}  // namespace pipeflow::nn
