// The vision-language model's layers (patch embedding, ViT block, projector,
// the LM's embedding with the image tokens in front, the head on the text
// positions) and the whole model against central differences in double
// precision, through the same BasicVlmStage code the float model runs.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../tensor/finite_difference.h"
#include "pipeflow/nn/vision_language_model.h"
#include "../support/error_of.h"

namespace pipeflow::nn {
namespace {

using DStage = BasicVlmStage<double>;
using DState = BasicVlmState<double>;
using DInput = BasicVlmInput<double>;

constexpr double kTolerance = 1e-6;

// 4 × 4 images in 2 × 2 patches: N = 4 image tokens of width 6 (2 heads),
// projected to the LM's 8; B = 2 sequences of 3 text tokens.
VlmConfig tiny_vlm() {
  return {.vision = {.geometry = {.image_size = 4, .patch_size = 2, .channels = 3}, .width = 6, .heads = 2, .layers = 2},
          .text = {.vocab_size = 11, .context = 8, .n_layer = 2, .n_head = 2, .n_embd = 8}};
}
constexpr int kB = 2, kText = 3;

IntTensor int_tensor(const std::vector<std::int32_t>& values) {
  IntTensor tensor{Shape{kB, kText}};
  std::copy(values.begin(), values.end(), tensor.data());
  return tensor;
}

// The width and positions of the activation a stage starting at `layer` takes.
Shape input_shape(const VlmConfig& config, int layer) { return vlm_activation_shape(config, layer, kB, kText); }

struct Probe {
  DStage& stage;
  std::vector<double> images;
  std::vector<double> activation;
  std::vector<double> r;  // ∂(Σ output ⊙ R)/∂output on a stage without the head

  DInput input() const {
    DInput in;
    const VlmConfig& c = stage.config();
    if (stage.has_images()) {
      const int s = c.vision.geometry.image_size;
      in.images = DoubleTensor({kB, c.vision.geometry.channels, s, s});
      std::copy(images.begin(), images.end(), in.images.data());
    } else {
      in.activation = DoubleTensor(input_shape(c, stage.layers().first));
      std::copy(activation.begin(), activation.end(), in.activation.data());
    }
    if (stage.has_text_embedding()) in.tokens = int_tensor({3, 1, 4, 1, 5, 9});
    if (stage.has_head()) in.targets = int_tensor({1, 4, 10, 5, 9, 2});
    return in;
  }

  double loss() {
    DState state;
    auto out = stage.forward(state, input());
    if (stage.has_head()) return state.loss();
    return testing::dot(out.span(), r);
  }

  std::vector<double> backward() {
    stage.zero_gradients();
    DState state;
    auto out = stage.forward(state, input());
    DoubleTensor grad;
    if (stage.has_head()) {
      grad = stage.backward_from_loss(state, 1.0);
    } else {
      DoubleTensor dy(out.shape());
      std::copy(r.begin(), r.end(), dy.data());
      grad = stage.backward(state, std::move(dy));
    }
    return {grad.span().begin(), grad.span().end()};
  }
};

void expect_gradients_match(LayerRange range, VlmStageOptions options = {}) {
  const VlmConfig config = tiny_vlm();
  DStage stage(config, range, options);
  stage.init_parameters(6);  // the frozen tensors
  testing::fill_normal(stage.parameters(), 7, 0.3);
  const int s = config.vision.geometry.image_size;
  const std::size_t out_size =
      range.last == config.pipeline_layers() ? 0 : static_cast<std::size_t>(input_shape(config, range.last).numel());
  Probe probe{stage, testing::normal_vector(static_cast<std::size_t>(kB * 3 * s * s), 8),
              testing::normal_vector(static_cast<std::size_t>(input_shape(config, range.first).numel()), 9),
              testing::normal_vector(out_size, 10)};
  const std::vector<double> grad_input = probe.backward();
  const std::vector<double> grads(stage.gradients().begin(), stage.gradients().end());
  for (const ParameterInfo& info : stage.layout().entries()) {
    const std::span<const double> analytic(grads.data() + info.offset, static_cast<std::size_t>(info.numel()));
    EXPECT_LT(testing::relative_gradient_error(stage.parameter(info.name), analytic, [&] { return probe.loss(); }),
              kTolerance)
        << info.name;
  }
  if (!stage.has_images()) {
    EXPECT_LT(testing::relative_gradient_error(probe.activation, grad_input, [&] { return probe.loss(); }),
              kTolerance)
        << "input activation";
  } else {
    EXPECT_TRUE(grad_input.empty());
  }
}

// The product's input, the flattened patches: patch 1 of a 4 × 4 image in
// 2 × 2 patches is rows 0-1, columns 2-3, channel by channel, row by row.
// The class token at position 0: class_embedding + position[0] =
// (0, 2, 0, 2, …) has mean 1 and variance 1, so the pre-LayerNorm of gain 2
// and bias 0.5 gives ∓2/√(1 + 1e-5) + 0.5; a zero weight leaves the patches'
// positions their constant rows (1), which the norm takes to its bias.
TEST(VlmGradient, PatchesAreCutRowByRowChannelByChannelAfterTheClassToken) {
  const PatchGeometry geometry{.image_size = 4, .patch_size = 2, .channels = 3};
  std::vector<double> weight(12 * 12, 0.0), class_embedding(12), position(5 * 12, 1.0), gain(12, 2.0),
      bias(12, 0.5);
  for (int i = 0; i < 12; ++i) class_embedding[static_cast<std::size_t>(i)] = i % 2 == 0 ? -1 : 1;
  PatchEmbedding<double> patch(geometry,
                               {weight.data(), class_embedding.data(), position.data(), gain.data(), bias.data()}, {});
  DoubleTensor image({1, 3, 4, 4});
  for (int i = 0; i < 48; ++i) image[i] = i;  // channel · 16 + row · 4 + column
  PatchEmbeddingSaved<double> saved;
  const auto x = patch.forward(saved, image, {1, 5, 12, 1, 0}, {});
  const std::vector<double> expected = {2, 3, 6, 7, 18, 19, 22, 23, 34, 35, 38, 39};
  for (int f = 0; f < 12; ++f) EXPECT_EQ(saved.patches[12 + f], expected[static_cast<std::size_t>(f)]) << f;
  EXPECT_EQ(saved.patches[3 * 12], 10);  // patch 3 (bottom right) starts at row 2, column 2
  ASSERT_EQ(x.shape().to_string(), "[1, 5, 12]");
  EXPECT_NEAR(x[0], -2 / std::sqrt(1 + 1e-5) + 0.5, 1e-12);
  EXPECT_NEAR(x[1], 2 / std::sqrt(1 + 1e-5) + 0.5, 1e-12);
  for (int i = 12; i < 5 * 12; ++i) EXPECT_EQ(x[i], 0.5) << i;
}

TEST(VlmGradient, PatchEmbeddingMatchesFiniteDifferences) { expect_gradients_match({0, 1}); }
TEST(VlmGradient, VitBlockMatchesFiniteDifferences) { expect_gradients_match({1, 2}); }
TEST(VlmGradient, ProjectorMatchesFiniteDifferences) { expect_gradients_match({3, 4}); }
TEST(VlmGradient, EmbeddingWithImageTokensMatchesFiniteDifferences) { expect_gradients_match({4, 5}); }
TEST(VlmGradient, HeadOnTextPositionsMatchesFiniteDifferences) { expect_gradients_match({7, 8}); }
TEST(VlmGradient, WholeModelMatchesFiniteDifferences) { expect_gradients_match({0, 8}); }
TEST(VlmGradient, CutAcrossTheTowersMatchesFiniteDifferences) { expect_gradients_match({2, 6}); }

// LoRA's adapters (through the merged weight) and the projector; the
// language model's own tensors frozen.
TEST(VlmGradient, LoraAdaptersMatchFiniteDifferences) {
  expect_gradients_match({4, 6}, {.lora = LoraOptions{.r = 2, .alpha = 3}});
  expect_gradients_match({0, 8}, {.lora = LoraOptions{.r = 2, .alpha = 3}});
}

// A frozen encoder: only the projector and the LM have gradients.
TEST(VlmGradient, FrozenEncoderModelMatchesFiniteDifferences) {
  expect_gradients_match({0, 8}, {.freeze_vision = true});
}

TEST(VlmGradient, BadConfigurationsAndInputsNameTheRule) {
  VlmConfig config = tiny_vlm();
  config.vision.geometry.image_size = 5;
  EXPECT_NE(pipeflow::testing::error_of([&] { config.validate(); }).find("image_size = 5 is not a multiple of patch_size = 2"),
            std::string::npos);
  config = tiny_vlm();
  config.text.context = 4;
  EXPECT_NE(pipeflow::testing::error_of([&] { config.validate(); })
                .find("text.context = 4: the language model's positions must exceed the 4 image tokens"),
            std::string::npos);
  DStage stage(tiny_vlm(), {3, 4});  // the projector takes [B, 4 + 1, 6]: the class token and the patches
  DState state;
  DInput input;
  input.activation = DoubleTensor({2, 4, 6});
  EXPECT_NE(pipeflow::testing::error_of([&] { stage.forward(state, std::move(input)); })
                .find("needs an activation [B, 5, 6] from the previous stage, got [2, 4, 6]"),
            std::string::npos);
  DStage late(tiny_vlm(), {5, 8});  // the LM's blocks take [B, 4 + T_c, 8]
  DInput images_only;
  images_only.activation = DoubleTensor({2, 4, 8});
  images_only.targets = int_tensor({1, 4, 10, 5, 9, 2});
  EXPECT_NE(pipeflow::testing::error_of([&] { late.forward(state, std::move(images_only)); })
                .find("needs an activation [B, 4 + T_c, 8] from the previous stage, got [2, 4, 8]"),
            std::string::npos);
  EXPECT_NE(pipeflow::testing::error_of([&] { DStage(tiny_vlm(), {0, 8}, {.lora = LoraOptions{.r = 0, .alpha = 1}}); })
                .find("lora r = 0"),
            std::string::npos);
}

}  // namespace
}  // namespace pipeflow::nn
