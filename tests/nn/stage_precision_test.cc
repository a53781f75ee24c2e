// A stage computing in bf16 or fp16 (StageOptions::format): the weights it
// multiplies by and every activation and gradient it passes on are exactly
// representable in the format, the fp32 master weights and gradients stay
// fp32, a change of the master weights reaches the next pass, and the
// gradients stay within the format's rounding of the fp32 stage's.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "pipeflow/nn/stage.h"
#include "test_support.h"

namespace pipeflow::nn {
namespace {

using testing::random_tokens;
using testing::relative_error;

const ModelConfig kGpt2{.vocab_size = 64, .context = 16, .n_layer = 3, .n_head = 2, .n_embd = 32};
const ModelConfig kLlama{.family = Family::kLlama,
                         .vocab_size = 64,
                         .context = 16,
                         .n_layer = 3,
                         .n_head = 4,
                         .n_embd = 32,
                         .n_kv_head = 2,
                         .intermediate = 48};
constexpr int kB = 2, kT = 16;

StageInput batch(std::uint64_t seed) {
  return {.tokens = random_tokens(kB, kT, 64, seed), .targets = random_tokens(kB, kT, 64, seed + 1)};
}

bool representable(std::span<const float> values, ComputeFormat format) {
  for (const float v : values) {
    const float rounded = format == ComputeFormat::kBf16 ? round_to_bf16(v) : round_to_fp16(v);
    if (!(rounded == v)) return false;
  }
  return true;
}

// The front stage's output and the back stage's input gradient in the
// format; the weight gradients of the whole model within `bound` of fp32's.
void expect_half_precision_stage(const ModelConfig& config, ComputeFormat format, double loss_scale, double bound) {
  SCOPED_TRACE(::testing::Message() << to_string(config.family) << " in " << to_string(format));
  Stage reference(config, all_layers(config));
  reference.init_parameters(3);
  Stage front(config, {0, 2}, {.name = "front", .format = format});
  Stage back(config, {2, config.pipeline_layers()}, {.name = "back", .format = format});
  front.copy_parameters_from(reference);
  back.copy_parameters_from(reference);

  MicrobatchState whole, s0, s1;
  reference.forward(whole, batch(9));
  reference.backward_from_loss(whole, 1.0);
  StageInput input = batch(9);
  Tensor activation = front.forward(s0, {.tokens = std::move(input.tokens)});
  EXPECT_TRUE(representable(activation.span(), format));
  back.forward(s1, {.activation = std::move(activation), .targets = std::move(input.targets)});
  EXPECT_NEAR(s1.loss(), whole.loss(), bound * whole.loss());
  Tensor grad = back.backward_from_loss(s1, loss_scale);
  EXPECT_TRUE(representable(grad.span(), format));
  front.backward(s0, std::move(grad));
  front.scale_gradients(1 / loss_scale);
  back.scale_gradients(1 / loss_scale);
  // The master weights are untouched fp32.
  EXPECT_EQ(relative_error(front.parameter(config.embedding_name()), reference.parameter(config.embedding_name())),
            0.0);
  for (const Stage* stage : {&front, &back}) {
    for (const ParameterInfo& info : stage->layout().entries()) {
      if (info.name == config.embedding_name()) continue;  // tied: a part on each side
      EXPECT_LT(relative_error(stage->gradient(info.name), reference.gradient(info.name)), bound) << info.name;
    }
  }
}

// The bound: 4 unit roundoffs of the format (bf16 2^-8 = 0.39%, fp16 2^-11 =
// 0.049%) of each tensor's norm: every weight and every activation is rounded
// once, and the errors compound over three blocks. Measured (worst tensor):
// bf16 0.60% (GPT-2), 0.78% (Llama); fp16 0.081%, 0.10%.
TEST(StagePrecision, Bf16AndFp16StagesStayWithinTheirRoundingOfFp32) {
  for (const ModelConfig& config : {kGpt2, kLlama}) {
    expect_half_precision_stage(config, ComputeFormat::kBf16, 1.0, 4 * 0x1p-8);
    expect_half_precision_stage(config, ComputeFormat::kFp16, 1024.0, 4 * 0x1p-11);
  }
}

// What a loss scale is for: fp16 overflows past 65504, and a gradient scaled
// that far turns to inf on its way back, where fp32 and bf16 keep it finite.
TEST(StagePrecision, AnFp16GradientScaledPast65504BecomesInfinite) {
  for (const ComputeFormat format : {ComputeFormat::kFp32, ComputeFormat::kBf16, ComputeFormat::kFp16}) {
    Stage stage(kGpt2, all_layers(kGpt2), {.format = format});
    stage.init_parameters(3);
    MicrobatchState state;
    stage.forward(state, batch(9));
    stage.backward_from_loss(state, 0x1p40);
    const bool finite = std::isfinite(stage.gradient_square_sum());
    EXPECT_EQ(finite, format != ComputeFormat::kFp16) << to_string(format);
  }
}

// The rounded copy follows the master weights: after they change (as an
// optimizer step changes them), the next pass computes with the new values,
// as a stage made from them does.
TEST(StagePrecision, TheRoundedWeightsFollowTheMasterWeights) {
  Stage trained(kLlama, all_layers(kLlama), {.format = ComputeFormat::kBf16});
  trained.init_parameters(3);
  MicrobatchState before;
  trained.forward(before, batch(9));
  for (float& w : trained.parameters()) w *= 1.5f;
  Stage fresh(kLlama, all_layers(kLlama), {.format = ComputeFormat::kBf16});
  fresh.copy_parameters_from(trained);
  MicrobatchState after, expected;
  trained.forward(after, batch(9));
  fresh.forward(expected, batch(9));
  EXPECT_NE(after.loss(), before.loss());
  EXPECT_EQ(after.loss(), expected.loss());
}

}  // namespace
}  // namespace pipeflow::nn
