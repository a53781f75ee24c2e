#include "pipeflow/nn/transformer_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "pipeflow/nn/parameter_layout.h"
#include "test_support.h"

namespace pipeflow::nn {
namespace {

using testing::random_activation;

const ModelConfig kConfig{.vocab_size = 32, .context = 16, .n_layer = 1, .n_head = 2, .n_embd = 16};
const LayerShape kShape{.b = 2, .t = 12, .c = 16, .nh = 2, .v = 32};
const char* const kMatrices[] = {"h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight", "h.0.mlp.c_fc.weight",
                                 "h.0.mlp.c_proj.weight"};

struct Gradients {
  std::vector<float> after_input;  // as I left them
  std::vector<float> after_weight;
};

// One micro-batch through a GPT-2 block: forward, I with the weight
// products placed as asked, W.
Gradients one_block(const ParameterLayout& layout, const std::vector<float>& values, WeightProducts products) {
  std::vector<float> grads(static_cast<std::size_t>(layout.total()), 0.0f);
  const TransformerBlock<float> block(gpt2_block_params<const float*>(layout, "h.0.", values.data()),
                                      gpt2_block_params<float*>(layout, "h.0.", grads.data()));
  BlockSaved<float> saved;
  (void)block.forward(saved, random_activation(kShape.b, kShape.t, kShape.c, 5), kShape, {});
  (void)block.backward_input(saved, random_activation(kShape.b, kShape.t, kShape.c, 6), kShape, {},
                             RoundAhead::kNo, products);
  Gradients out{grads, {}};
  block.backward_weight(saved, kShape);
  out.after_weight = grads;
  return out;
}

std::span<const float> of(const ParameterLayout& layout, const std::vector<float>& buffer, const std::string& name) {
  const ParameterInfo& info = layout.at(name);
  return std::span(buffer).subspan(static_cast<std::size_t>(info.offset), static_cast<std::size_t>(info.numel()));
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

bool all_zero(std::span<const float> values) {
  for (const float v : values) {
    if (v != 0.0f) return false;
  }
  return true;
}

// What a fused backward asks of a block (kBesideInput): I adds the four
// matrices' gradients, exactly what W would add, and leaves the biases' and
// norms' to W; after W every gradient has the bits of a W that adds them
// all (kInWeightPass, what a zero-bubble schedule's split W does).
TEST(TransformerBlock, WeightProductsBesideInputAddTheMatricesGradientsInIWithTheSameBits) {
  const ParameterLayout layout(kConfig, {1, 2});
  std::vector<float> values(static_cast<std::size_t>(layout.total()));
  init_parameters(layout, kConfig, 42, std::span(values));
  const Gradients in_weight_pass = one_block(layout, values, WeightProducts::kInWeightPass);
  const Gradients beside_input = one_block(layout, values, WeightProducts::kBesideInput);

  EXPECT_TRUE(all_zero(in_weight_pass.after_input)) << "I must not touch weight gradients in W's placement";
  for (const ParameterInfo& info : layout.entries()) {
    SCOPED_TRACE(info.name);
    const bool matrix = std::find(std::begin(kMatrices), std::end(kMatrices), info.name) != std::end(kMatrices);
    const auto after_input = of(layout, beside_input.after_input, info.name);
    if (matrix) {
      EXPECT_FALSE(all_zero(after_input));
      EXPECT_TRUE(same_bits(after_input, of(layout, in_weight_pass.after_weight, info.name)));
    } else {
      EXPECT_TRUE(all_zero(after_input));
    }
    EXPECT_FALSE(all_zero(of(layout, beside_input.after_weight, info.name)));
  }
  EXPECT_TRUE(same_bits(beside_input.after_weight, in_weight_pass.after_weight));
}

}  // namespace
}  // namespace pipeflow::nn
