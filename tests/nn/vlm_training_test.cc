// The tiny vision-language model trained on generated captioned shapes:
// the loss falls, a frozen encoder stays bit-identical, and greedy captions
// of held-out images name the shape and colour far more often than chance.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/shape_captions.h"
#include "pipeflow/nn/vision_language_model.h"

namespace pipeflow::nn {
namespace {

// 16 × 16 images in 4 × 4 patches: 16 image tokens of width 32 (17
// positions in the encoder, the class token first), one ViT block; a GPT-2
// of 2 blocks, width 32, over bytes; 16 + 18 positions.
VlmConfig tiny_vlm() {
  return {.vision = {.geometry = {.image_size = ShapeCaptions::kImageSize, .patch_size = 4, .channels = 3},
                     .width = 32,
                     .heads = 4,
                     .layers = 1},
          .text = {.vocab_size = 256, .context = 40, .n_layer = 2, .n_head = 4, .n_embd = 32}};
}

constexpr int kMicrobatch = 32;
// Colour is learned in tens of steps; shape comes later, mostly between
// steps 300 and 500 (measured, held-out captions right of 64: 7, 14, 13,
// 38, 46, 53 after 100 … 600 steps; every colour right from 300).
constexpr int kCaptionSteps = 300;

struct TrainingRun {
  std::vector<double> losses;  // per step, mean over its micro-batch
};

// Adam steps of one micro-batch each on the whole model.
TrainingRun train(VlmStage& model, int steps, double lr) {
  const ShapeCaptions data(1);
  AdamW optimizer(model, {.lr = lr, .weight_decay = 0.0});
  TrainingRun run;
  for (int step = 0; step < steps; ++step) {
    model.zero_gradients();
    auto batch = data.batch(Split::kTrain, step, 0, kMicrobatch);
    VlmState state;
    model.forward(state, {.images = std::move(batch.images),
                          .tokens = std::move(batch.tokens),
                          .targets = std::move(batch.targets)});
    run.losses.push_back(state.loss());
    model.backward_from_loss(state, 1.0);
    optimizer.step(lr);
  }
  return run;
}

double mean(const std::vector<double>& values, std::size_t first, std::size_t last) {
  double total = 0;
  for (std::size_t i = first; i < last; ++i) total += values[i];
  return total / static_cast<double>(last - first);
}

TEST(VlmTraining, LossFalls) {
  VlmStage model(tiny_vlm(), {0, tiny_vlm().pipeline_layers()});
  model.init_parameters(3);
  const TrainingRun run = train(model, 60, 3e-3);
  // Bytes start near uniform: ln 256 = 5.55. The caption's bytes but the
  // colour's and the shape's are fixed by the ones before them.
  EXPECT_NEAR(run.losses.front(), std::log(256.0), 0.2);
  EXPECT_LT(mean(run.losses, 50, 60), 1.5);
}

// A frozen encoder: its tensors are outside the trained layout (no
// gradient, no moments) and keep their bits; the projector and the LM train
// from the same initial values (the first loss is the trained model's, bit for bit).
TEST(VlmTraining, FrozenEncoderKeepsItsBitsAndHasNoOptimizerState) {
  const VlmConfig config = tiny_vlm();
  VlmStage trained(config, {0, config.pipeline_layers()});
  VlmStage frozen(config, {0, config.pipeline_layers()}, {.freeze_vision = true});
  trained.init_parameters(3);
  frozen.init_parameters(3);
  // The patch weight, class embedding, 16 + 1 positions, pre-LayerNorm; one block.
  const std::int64_t encoder = 48 * 32 + 32 + 17 * 32 + 2 * 32 + (12 * 32 * 32 + 13 * 32);
  EXPECT_EQ(frozen.layout().find("vision.embeddings.patch_embedding.weight"), nullptr);
  EXPECT_NE(frozen.frozen_layout().find("vision.h.0.attn.c_attn.weight"), nullptr);
  std::int64_t frozen_elements = 0;
  for (const ParameterInfo& info : frozen.frozen_layout().entries()) frozen_elements += info.numel();
  EXPECT_EQ(frozen_elements, encoder);
  const std::vector<float> before(frozen.frozen_parameters().begin(), frozen.frozen_parameters().end());
  const TrainingRun a = train(trained, 30, 3e-3);
  const TrainingRun b = train(frozen, 30, 3e-3);
  EXPECT_EQ(a.losses.front(), b.losses.front());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), frozen.frozen_parameters().begin()));
  EXPECT_LT(mean(b.losses, 25, 30), mean(b.losses, 0, 5) - 2.0);
  EXPECT_EQ(AdamW(frozen, {}).exp_avg().size(), static_cast<std::size_t>(frozen.layout().total()));
  EXPECT_LE(frozen.layout().total() + encoder, trained.layout().total());
}

// LoRA on a model trained 30 steps: the first LoRA step's loss is the base
// model's (B starts at zero), the base keeps its bits, the adapters move
// and the loss keeps falling.
TEST(VlmTraining, LoraTrainsAdaptersOnly) {
  const VlmConfig config = tiny_vlm();
  VlmStage base(config, {0, config.pipeline_layers()});
  base.init_parameters(3);
  train(base, 30, 3e-3);
  VlmStage lora(config, {0, config.pipeline_layers()}, {.lora = LoraOptions{.r = 4, .alpha = 8}});
  lora.init_parameters(5);
  lora.copy_parameters_from(base);
  EXPECT_EQ(lora.layout().find("h.0.attn.c_attn.weight"), nullptr);
  ASSERT_NE(lora.layout().find("h.1.attn.c_attn.lora_B"), nullptr);
  // Trained: the encoder, the projector, and per block A [32, 4] and B [4, 96].
  std::int64_t adapters = 0;
  for (const ParameterInfo& info : lora.layout().entries()) {
    if (info.name.find(".lora_") != std::string::npos) adapters += info.numel();
  }
  EXPECT_EQ(adapters, 2 * (32 * 4 + 4 * 96));
  const std::vector<float> frozen(lora.frozen_parameters().begin(), lora.frozen_parameters().end());
  const ShapeCaptions data(1);
  auto batch = data.batch(Split::kTrain, 0, 0, kMicrobatch);
  VlmState state;
  base.forward(state, {.images = batch.images.clone(), .tokens = batch.tokens.clone(), .targets = batch.targets.clone()});
  const double base_loss = state.loss();
  const TrainingRun run = train(lora, 30, 3e-3);
  EXPECT_EQ(run.losses.front(), base_loss);
  EXPECT_TRUE(std::equal(frozen.begin(), frozen.end(), lora.frozen_parameters().begin()));
  const auto b = lora.parameter("h.1.attn.c_attn.lora_B");
  EXPECT_GT(*std::max_element(b.begin(), b.end()), 0.0f);
  EXPECT_LT(mean(run.losses, 25, 30), mean(run.losses, 0, 5));
}

// Cut after the LM's embedding, the tied wte's two halves summed: the two
// stages' Σg² (the head's copy of wte left out) is the whole model's.
TEST(VlmTraining, SplitStagesGiveTheWholeModelsGradientNorm) {
  const VlmConfig config = tiny_vlm();
  const int cut = config.embedding_layer() + 1;
  VlmStage whole(config, {0, config.pipeline_layers()});
  VlmStage first(config, {0, cut}, {.name = "stage 0"});
  VlmStage last(config, {cut, config.pipeline_layers()}, {.name = "stage 1"});
  whole.init_parameters(3);
  first.copy_parameters_from(whole);
  last.copy_parameters_from(whole);
  ASSERT_TRUE(first.needs_tied_reduction() && last.needs_tied_reduction());
  const ShapeCaptions data(1);
  auto batch = data.batch(Split::kTrain, 0, 0, 4);
  VlmState s, s0, s1;
  whole.zero_gradients();
  first.zero_gradients();
  last.zero_gradients();
  whole.forward(s, {.images = batch.images.clone(), .tokens = batch.tokens.clone(), .targets = batch.targets.clone()});
  whole.backward_from_loss(s, 1.0);
  auto x = first.forward(s0, {.images = std::move(batch.images), .tokens = std::move(batch.tokens)});
  last.forward(s1, {.activation = std::move(x), .targets = std::move(batch.targets)});
  EXPECT_EQ(s1.loss(), s.loss());
  first.backward(s0, last.backward_from_loss(s1, 1.0));
  const std::vector<float> a(first.tied_gradient().begin(), first.tied_gradient().end());
  const std::vector<float> b(last.tied_gradient().begin(), last.tied_gradient().end());
  first.add_tied_gradient(b);
  last.add_tied_gradient(a);
  const double expected = whole.gradient_square_sum();
  EXPECT_NEAR(first.gradient_square_sum() + last.gradient_square_sum(), expected, 1e-5 * expected);
  EXPECT_GT(last.gradient_square_sum(), 0.0);
}

// The held-out loss of 4 micro-batches of 4 samples is the loss of the 16
// samples forwarded at once (a mean of equal-size means), yet holds the
// activations of one micro-batch: the peak of 1 micro-batch, a quarter of
// the whole batch's (each layer's saved tensors scale with the samples).
TEST(VlmTraining, HeldOutLossHoldsOneMicroBatchAtATime) {
  VlmStage model(tiny_vlm(), {0, tiny_vlm().pipeline_layers()});
  model.init_parameters(2);
  const ShapeCaptions data(1);
  model.activation_memory().reset_peak();
  held_out_loss(model, data, 1, 4);
  const std::int64_t one = model.activation_memory().peak_bytes();
  model.activation_memory().reset_peak();
  const double loss = held_out_loss(model, data, 4, 4);
  EXPECT_EQ(model.activation_memory().peak_bytes(), one);
  model.activation_memory().reset_peak();
  auto batch = data.batch(Split::kValidation, 0, 0, 16, model.allocator());
  VlmState state;
  model.forward(state, {.images = std::move(batch.images),
                        .tokens = std::move(batch.tokens),
                        .targets = std::move(batch.targets)});
  EXPECT_NEAR(loss, state.loss(), 1e-6 * state.loss());
  EXPECT_GT(model.activation_memory().peak_bytes(), 3 * one);
}

// After training, greedy captions of held-out images (the validation
// stream): how often they name the right colour and shape (chance 1/16).
TEST(VlmTraining, CaptionsHeldOutImages) {
  VlmStage model(tiny_vlm(), {0, tiny_vlm().pipeline_layers()});
  model.init_parameters(3);
  train(model, kCaptionSteps, 3e-3);
  const ShapeCaptions data(1);
  constexpr int kImages = 64;
  const CaptionScore score = score_captions(model, data, kImages);
  auto batch = data.batch(Split::kValidation, 0, 0, kImages);
  const auto captions = greedy_captions(model, batch.images, ShapeCaptions::kStartToken, ShapeCaptions::kCaptionBytes);
  int colours = 0;
  for (int i = 0; i < kImages; ++i) {
    const auto s = data.sample(Split::kValidation, 0, i);
    colours += captions[static_cast<std::size_t>(i)].find(ShapeCaptions::kColours[static_cast<std::size_t>(s.colour)]) != std::string::npos;
  }
  std::printf("held-out captions: %d/%d right (colour %d); e.g. \"%s\" for \"%s\"\n", score.right, kImages, colours,
              score.generated.c_str(), score.expected.c_str());
  EXPECT_EQ(score.images, kImages);
  EXPECT_EQ(score.expected, ShapeCaptions::caption(data.sample(Split::kValidation, 0, 0)));
  EXPECT_EQ(score.generated, captions[0]);
  // Chance is 4 of 64 (1/16); a model blind to the image names the colour
  // right a quarter of the time. Measured: 13 right, 64 colours.
  EXPECT_GE(score.right, 10);
  EXPECT_GE(colours, 56);
}

}  // namespace
}  // namespace pipeflow::nn
