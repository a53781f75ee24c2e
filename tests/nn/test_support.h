#pragma once

// Small deterministic inputs and helpers for the nn tests.

#include <cstdint>

#include "pipeflow/nn/random.h"
#include "pipeflow/tensor/tensor.h"
#include "../support/error_of.h"
#include "../support/relative_error.h"

namespace pipeflow::nn::testing {

// [b, t] tokens uniform in [0, vocab), from a seed.
inline IntTensor random_tokens(int b, int t, int vocab, std::uint64_t seed) {
  IntTensor tokens{Shape{b, t}};
  Rng rng(seed);
  for (std::int64_t i = 0; i < tokens.numel(); ++i) tokens[i] = static_cast<std::int32_t>(rng.below(vocab));
  return tokens;
}

// [b, t, c] values N(0, 1), from a seed.
inline Tensor random_activation(int b, int t, int c, std::uint64_t seed) {
  Tensor x{Shape{b, t, c}};
  Rng rng(seed);
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(rng.normal());
  return x;
}

using pipeflow::testing::error_of;
using pipeflow::testing::max_relative_error;
using pipeflow::testing::relative_error;

}  // namespace pipeflow::nn::testing
