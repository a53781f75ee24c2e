#pragma once

// Elementwise math and reductions written so that GCC vectorises them without
// -ffast-math: exp by range reduction and a polynomial (no libm call),
// reductions with 16 independent partial sums (a fixed order, so results are
// reproducible). The double versions call libm: they serve the
// finite-difference tests, where accuracy matters and speed does not.

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

// Elementwise kernels prefer 512-bit vectors where the target has them: GCC
// defaults to 256 bits for -march=native on AVX-512 CPUs, which halves the
// throughput of exp/tanh-heavy loops on cores with two 512-bit FMA units.
// On targets without AVX-512 the preference changes nothing. Such a loop
// must not be inlined into a caller, which would compile it with its own
// (default) preference.
#define PIPEFLOW_WIDE_VECTORS __attribute__((target("prefer-vector-width=512"), noinline))

namespace pipeflow::detail {

// e^x within 2.3e-7 relative for x in [-87, 88] (clamped outside): x = n·ln2 + r
// with |r| <= ln2/2 (ln2 split in a high part exact in float and a low part,
// Cody & Waite), e^r by its degree-6 Taylor polynomial (truncation < 1.3e-7),
// 2^n by writing the exponent bits.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  constexpr float kRound = 12582912.0f;  // 1.5·2^23: adding and subtracting it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = std::fma(n, -0.693145751953125f, x);
  r = std::fma(n, -1.428606765330187045e-06f, r);
  float p = 1.0f / 720.0f;
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  // NaN fails both clamps and reaches here: converting it to an integer is
  // undefined, so it takes 2^0, and the NaN in p is the result.
  const float whole = n == n ? n : 0.0f;
  const std::int32_t exponent = (static_cast<std::int32_t>(whole) + 127) << 23;
  return p * std::bit_cast<float>(exponent);
}

template <class T>
inline T exp(T x) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return exp_approx(x);
  } else {
    return std::exp(x);
  }
}

// tanh(x) = 1 − 2 / (e^{2x} + 1): within 3e-7 absolute, which is what GELU
// needs (its error is x/2 times the error of tanh).
template <class T>
inline T tanh(T x) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return 1.0f - 2.0f / (exp_approx(2.0f * x) + 1.0f);
  } else {
    return std::tanh(x);
  }
}

inline constexpr int kLanes = 16;

template <class T>
inline T sum(const T* x, int n) {
  T partial[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) partial[j] += x[i + j];
  }
  T total = 0;
  for (int j = 0; j < kLanes; ++j) total += partial[j];
  for (; i < n; ++i) total += x[i];
  return total;
}

template <class T>
inline T dot(const T* x, const T* y, int n) {
  T partial[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) partial[j] += x[i + j] * y[i + j];
  }
  T total = 0;
  for (int j = 0; j < kLanes; ++j) total += partial[j];
  for (; i < n; ++i) total += x[i] * y[i];
  return total;
}

template <class T>
inline T max(const T* x, int n) {
  T partial[kLanes];
  for (int j = 0; j < kLanes; ++j) partial[j] = -std::numeric_limits<T>::infinity();
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) partial[j] = partial[j] > x[i + j] ? partial[j] : x[i + j];
  }
  T best = -std::numeric_limits<T>::infinity();
  for (int j = 0; j < kLanes; ++j) best = best > partial[j] ? best : partial[j];
  for (; i < n; ++i) best = best > x[i] ? best : x[i];
  return best;
}

// x ← exp(x − shift), returning Σ exp(x − shift): the middle of a softmax.
template <class T>
PIPEFLOW_WIDE_VECTORS T exponentiate(T* __restrict x, T shift, int n) {
  T partial[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const T e = exp(x[i + j] - shift);
      x[i + j] = e;
      partial[j] += e;
    }
  }
  T total = 0;
  for (int j = 0; j < kLanes; ++j) total += partial[j];
  for (; i < n; ++i) {
    x[i] = exp(x[i] - shift);
    total += x[i];
  }
  return total;
}

}  // namespace pipeflow::detail
