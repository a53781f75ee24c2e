#pragma once

// Small deterministic inputs and helpers for the nn tests.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/random.h"
#include "pipeflow/tensor/tensor.h"

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

// ‖a − b‖₂ / ‖b‖₂ in double (‖a − b‖₂ when b is zero): how the PyTorch
// reference comparisons measure a tensor's error. a and b index like arrays
// and b has size().
template <class A, class B>
double relative_error(const A& a, const B& b) {
  double diff = 0;
  double norm = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The message of the pipeflow::Error that f throws, or "(no error)".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

}  // namespace pipeflow::nn::testing
