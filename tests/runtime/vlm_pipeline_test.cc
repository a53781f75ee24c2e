// The tiny vision-language model through 2 and 4 pipeline stages (threads)
// with the existing schedules: the same losses as the unpipelined run.

#include "pipeflow/runtime/vlm_pipeline.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "pipeflow/schedule/generators.h"

namespace pipeflow::runtime {
namespace {

// 16 × 16 images in 8 × 8 patches (4 image tokens of width 16, 2 ViT
// blocks), a projector to the LM's 16, a GPT-2 of 2 blocks: 8 pipeline
// layers (vision.patch_embedding, vision.block.0, vision.block.1, projector, embedding, block.0,
// block.1, head), 4 + 18 positions.
nn::VlmConfig small_vlm() {
  return {.vision = {.geometry = {.image_size = nn::ShapeCaptions::kImageSize, .patch_size = 8, .channels = 3},
                     .width = 16,
                     .heads = 2,
                     .layers = 2},
          .text = {.vocab_size = 256, .context = 24, .n_layer = 2, .n_head = 2, .n_embd = 16}};
}

std::vector<double> train(const std::vector<nn::LayerRange>& stages, const Schedule& schedule, int steps,
                          const nn::VlmStageOptions& options = {}) {
  VlmPipeline pipeline(small_vlm(), stages, schedule, 2, options, {.lr = 1e-2, .weight_decay = 0.01});
  pipeline.init_parameters(11);
  const nn::ShapeCaptions data(4);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) losses.push_back(pipeline.step(data, step, 1e-2).loss);
  return losses;
}

void expect_losses_equal(const std::vector<double>& expected, const std::vector<double>& actual) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-5 * expected[i]) << i;
}

constexpr int kSteps = 4, kMicrobatches = 4;

// Cut inside the encoder, at the projector and inside the LM: every kind of
// message (vision width, LM width with and without the text) crosses a boundary.
TEST(VlmPipeline, TwoAndFourStagesGiveTheUnpipelinedLosses) {
  const int layers = small_vlm().pipeline_layers();
  const auto whole = train({{0, layers}}, make_gpipe(1, kMicrobatches), kSteps);
  EXPECT_LT(whole.back(), whole.front());
  const std::vector<nn::LayerRange> two = {{0, 4}, {4, layers}};              // the text joins on stage 1
  const std::vector<nn::LayerRange> four = {{0, 2}, {2, 4}, {4, 6}, {6, layers}};
  for (const char* name : {"gpipe", "1f1b", "zb-h1"}) {
    SCOPED_TRACE(name);
    expect_losses_equal(whole, train(two, make_schedule(name, 2, kMicrobatches), kSteps));
    expect_losses_equal(whole, train(four, make_schedule(name, 4, kMicrobatches), kSteps));
  }
}

// A frozen encoder (no gradient crosses into stages 0 and 1) and LoRA on
// the LM, through 4 stages, against their unpipelined runs.
TEST(VlmPipeline, FrozenEncoderAndLoraGiveTheUnpipelinedLosses) {
  const int layers = small_vlm().pipeline_layers();
  const std::vector<nn::LayerRange> four = {{0, 2}, {2, 4}, {4, 6}, {6, layers}};
  for (const nn::VlmStageOptions& options :
       {nn::VlmStageOptions{.freeze_vision = true}, nn::VlmStageOptions{.lora = nn::LoraOptions{.r = 2, .alpha = 4}}}) {
    SCOPED_TRACE(options.lora ? "lora" : "frozen encoder");
    const auto whole = train({{0, layers}}, make_gpipe(1, kMicrobatches), kSteps, options);
    EXPECT_LT(whole.back(), whole.front());
    expect_losses_equal(whole, train(four, make_1f1b(4, kMicrobatches), kSteps, options));
    expect_losses_equal(whole, train(four, make_schedule("zb-h1", 4, kMicrobatches), kSteps, options));
  }
}

}  // namespace
}  // namespace pipeflow::runtime
