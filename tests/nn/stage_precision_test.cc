// A stage computing in bf16 or fp16 (StageOptions::format): the weights it
// multiplies by and every activation and gradient it passes on are exactly
// representable in the format, the fp32 master weights and gradients stay
// fp32, a change of the master weights reaches the next pass, and the
// gradients stay within the format's rounding of the fp32 stage's, whether
// a bf16 stage multiplies in fp32 or through the bf16 matmul.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
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
void expect_half_precision_stage(const ModelConfig& config, ComputeFormat format, double loss_scale, double bound,
                                 Bf16Gemm gemm = Bf16Gemm::kFp32) {
  SCOPED_TRACE(::testing::Message() << to_string(config.family) << " in " << to_string(format) << ", GEMMs "
                                    << to_string(resolve(gemm)));
  Stage reference(config, all_layers(config));
  reference.init_parameters(3);
  Stage front(config, {0, 2}, {.name = "front", .format = format, .bf16_gemm = gemm});
  Stage back(config, {2, config.pipeline_layers()}, {.name = "back", .format = format, .bf16_gemm = gemm});
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
// bf16 0.60% (GPT-2), 0.78% (Llama); fp16 0.081%, 0.10%. Through the bf16
// matmul, which also rounds the operands a layer keeps in fp32 (the norms'
// outputs, the attention probabilities, GELU's output) to bf16 before each
// product: 0.72% (GPT-2), 0.95% (Llama).
TEST(StagePrecision, Bf16AndFp16StagesStayWithinTheirRoundingOfFp32) {
  for (const ModelConfig& config : {kGpt2, kLlama}) {
    expect_half_precision_stage(config, ComputeFormat::kBf16, 1.0, 4 * 0x1p-8, Bf16Gemm::kFp32);
    if (bf16_matmul_available()) {
      expect_half_precision_stage(config, ComputeFormat::kBf16, 1.0, 4 * 0x1p-8, Bf16Gemm::kBf16);
    }
    expect_half_precision_stage(config, ComputeFormat::kFp16, 1024.0, 4 * 0x1p-11);
  }
}

// The two ways a bf16 stage multiplies differ only in the operands that
// stay fp32 inside a layer, which the bf16 matmul rounds: one micro-batch's
// loss and gradients on the two paths agree within 4 unit roundoffs of bf16
// (2^-6 = 1.6%) of each tensor's norm, the bound each keeps to fp32
// (measured worst tensor: 0.66% GPT-2, 0.94% Llama; the losses within
// 3e-5), and each
// path gives the same bits when it runs again. Inference (logits) multiplies
// in fp32 on both.
TEST(StagePrecision, TheBf16MatmulAndTheFp32PathAgreeWithinBf16RoundingAndRepeatTheirBits) {
  if (!bf16_matmul_available()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (AVX2 alone)";
  for (const ModelConfig& config : {kGpt2, kLlama}) {
    SCOPED_TRACE(to_string(config.family));
    const auto run = [&](Bf16Gemm gemm) {
      auto stage = std::make_unique<Stage>(config, all_layers(config),
                                           StageOptions{.format = ComputeFormat::kBf16, .bf16_gemm = gemm});
      stage->init_parameters(3);
      MicrobatchState state;
      stage->forward(state, batch(9));
      stage->backward_from_loss(state, 1.0);
      return std::pair{std::move(stage), state.loss()};
    };
    const auto [fp32, fp32_loss] = run(Bf16Gemm::kFp32);
    const auto [bf16, bf16_loss] = run(Bf16Gemm::kBf16);
    EXPECT_EQ(fp32->gemm_precision(), GemmPrecision::kFp32);
    EXPECT_EQ(bf16->gemm_precision(), GemmPrecision::kBf16);
    EXPECT_NE(bf16_loss, fp32_loss);
    EXPECT_NEAR(bf16_loss, fp32_loss, 4 * 0x1p-8 * fp32_loss);
    double worst = 0;
    for (const ParameterInfo& info : fp32->layout().entries()) {
      const double error = relative_error(bf16->gradient(info.name), fp32->gradient(info.name));
      EXPECT_LT(error, 4 * 0x1p-8) << info.name;
      worst = std::max(worst, error);
    }
    std::printf("%s: bf16 matmul against fp32 path: loss %.3g relative, worst gradient %.3g\n",
                to_string(config.family), std::abs(bf16_loss - fp32_loss) / fp32_loss, worst);
    for (const Bf16Gemm gemm : {Bf16Gemm::kFp32, Bf16Gemm::kBf16}) {
      const auto [first, first_loss] = run(gemm);
      const auto [again, again_loss] = run(gemm);
      EXPECT_EQ(std::bit_cast<std::uint64_t>(first_loss), std::bit_cast<std::uint64_t>(again_loss));
      EXPECT_TRUE(std::ranges::equal(first->gradients(), again->gradients(), [](float x, float y) {
        return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
      }));
    }
    const Tensor fp32_logits = fp32->logits(batch(9).tokens);
    const Tensor bf16_logits = bf16->logits(batch(9).tokens);
    EXPECT_TRUE(std::ranges::equal(fp32_logits.span(), bf16_logits.span()));  // same weights, fp32 GEMMs
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
