// Each pipeline layer's backward (and the whole model's) against central
// differences in double precision, through the same Stage code the runtime
// uses (BasicStage<double>).

#include <gtest/gtest.h>

#include <vector>

#include "../tensor/finite_difference.h"
#include "pipeflow/nn/stage.h"

namespace pipeflow::nn {
namespace {

using DStage = BasicStage<double>;
using DState = BasicMicrobatchState<double>;
using DInput = BasicStageInput<double>;

constexpr double kTolerance = 1e-6;

ModelConfig tiny_config() { return {.vocab_size = 11, .context = 6, .n_layer = 2, .n_head = 2, .n_embd = 8}; }

// Llama with 4 query heads of size 4 on `kv_heads` key/value heads, an MLP of
// 12, Llama 3 scaling that blends one of the two frequencies (1: wavelength
// 6.3, between 8/4 and 8/1) and stretches the other (0.1: 63 > 8).
ModelConfig tiny_llama(int kv_heads, bool tied) {
  return {.family = Family::kLlama,
          .vocab_size = 11,
          .context = 6,
          .n_layer = 2,
          .n_head = 4,
          .n_embd = 16,
          .n_kv_head = kv_heads,
          .intermediate = 12,
          .rope_theta = 100,
          .rope_scaling = {.factor = 4, .low_freq_factor = 1, .high_freq_factor = 4, .original_context = 8},
          .norm_eps = 1e-5,
          .tied_embeddings = tied};
}

IntTensor int_tensor(std::initializer_list<std::int64_t> shape, const std::vector<std::int32_t>& values) {
  IntTensor tensor{Shape(shape)};
  std::copy(values.begin(), values.end(), tensor.data());
  return tensor;
}

// B = 2 sequences of T = 5 positions.
const std::vector<std::int32_t> kTokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
const std::vector<std::int32_t> kTargets = {1, 4, 1, 5, 9, 2, 6, 5, 3, 10};

// Random parameters (not GPT-2's init: larger, so every path has a visible
// gradient, LayerNorm gains away from 1).
void randomise(DStage& stage, std::uint64_t seed) {
  auto values = stage.parameters();
  testing::fill_normal(values, seed, 0.3);
}

DInput make_input(const DStage& stage, const std::vector<double>& activation) {
  DInput input;
  if (stage.has_embedding()) {
    input.tokens = int_tensor({2, 5}, kTokens);
  } else {
    input.activation = DoubleTensor({2, 5, stage.config().n_embd});
    std::copy(activation.begin(), activation.end(), input.activation.data());
  }
  if (stage.has_head()) input.targets = int_tensor({2, 5}, kTargets);
  return input;
}

// The scalar the check differentiates: the loss on a head stage, else
// Σ output ⊙ R for a fixed random R (so ∂/∂output = R).
struct Probe {
  DStage& stage;
  std::vector<double> activation;  // the input of a stage without the embedding
  std::vector<double> r;

  double loss() {
    DState state;
    auto out = stage.forward(state, make_input(stage, activation));
    if (stage.has_head()) return state.loss();
    return testing::dot(out.span(), r);
  }

  // Analytic gradients: parameters into the stage, the input's returned.
  std::vector<double> backward() {
    stage.zero_gradients();
    DState state;
    auto out = stage.forward(state, make_input(stage, activation));
    DoubleTensor grad_input;
    if (stage.has_head()) {
      grad_input = stage.backward_from_loss(state, 1.0);
    } else {
      DoubleTensor dy(out.shape());
      std::copy(r.begin(), r.end(), dy.data());
      grad_input = stage.backward(state, std::move(dy));
    }
    return {grad_input.span().begin(), grad_input.span().end()};
  }
};

void expect_gradients_match(LayerRange range, const ModelConfig& config = tiny_config()) {
  DStage stage(config, range);
  randomise(stage, 7);
  const std::size_t activation_size = 2 * 5 * config.n_embd;
  Probe probe{stage, testing::normal_vector(activation_size, 8), testing::normal_vector(activation_size, 9)};
  const std::vector<double> grad_input = probe.backward();
  const std::vector<double> grads(stage.gradients().begin(), stage.gradients().end());
  for (const ParameterInfo& info : stage.layout().entries()) {
    auto values = stage.parameter(info.name);
    const std::span<const double> analytic(grads.data() + info.offset, static_cast<std::size_t>(info.numel()));
    EXPECT_LT(testing::relative_gradient_error(values, analytic, [&] { return probe.loss(); }), kTolerance)
        << info.name;
  }
  if (!stage.has_embedding()) {
    EXPECT_LT(testing::relative_gradient_error(probe.activation, grad_input, [&] { return probe.loss(); }),
              kTolerance)
        << "input activation";
  }
}

TEST(StageGradient, EmbeddingLayerMatchesFiniteDifferences) { expect_gradients_match({0, 1}); }

TEST(StageGradient, TransformerBlockMatchesFiniteDifferences) { expect_gradients_match({1, 2}); }

TEST(StageGradient, HeadLayerMatchesFiniteDifferences) { expect_gradients_match({3, 4}); }

TEST(StageGradient, WholeModelMatchesFiniteDifferences) { expect_gradients_match({0, 4}); }

TEST(StageGradient, LlamaLayersMatchFiniteDifferences) {
  for (const int kv_heads : {1, 2, 4}) {
    for (const bool tied : {false, true}) {
      SCOPED_TRACE(::testing::Message() << kv_heads << " key/value heads, " << (tied ? "tied" : "untied"));
      const ModelConfig config = tiny_llama(kv_heads, tied);
      expect_gradients_match({1, 2}, config);  // a block
      expect_gradients_match({3, 4}, config);  // the head (its own copy of the tied embedding)
      expect_gradients_match({0, 4}, config);  // the whole model
    }
  }
}

TEST(StageGradient, TwoBlocksWithRecomputeMatchFiniteDifferences) {
  const ModelConfig config = tiny_config();
  DStage stage(config, {1, 4}, {.recompute_interval = 2});
  randomise(stage, 17);
  Probe probe{stage, testing::normal_vector(80, 18), {}};
  const std::vector<double> grad_input = probe.backward();
  EXPECT_LT(testing::relative_gradient_error(probe.activation, grad_input, [&] { return probe.loss(); }), kTolerance);
}

}  // namespace
}  // namespace pipeflow::nn
