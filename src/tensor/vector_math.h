#pragma once

// Elementwise math and reductions written so that GCC vectorises them without
// -ffast-math: exp by range reduction and a polynomial (no libm call),
// reductions with 16 independent partial sums (a fixed order, so results are
// reproducible). The double versions call libm: they serve the
// finite-difference tests, where accuracy matters and speed does not.
//
// Where the build targets AVX-512 (-march=native on such a CPU), the softmax
// pieces (max, exponentiate, dot), GELU (gelu.cc) and LayerNorm's input
// gradient (layernorm.cc) are written with its
// intrinsics instead: GCC vectorises exp_approx's clamps and NaN test into
// masked copies of the whole polynomial and divide, and leaves a row's last
// n mod 16 elements to scalar code, which on a causal softmax row (32 keys
// on average at 64 positions) costs about as much as the vector part. The
// AVX-512 versions take the tail in one masked vector; element i goes to lane
// i mod 16 in both, and the lanes are added in order, so where n is a
// multiple of 16 the two give the same bits (exp up to where exp_approx
// clamps), elsewhere results within rounding of each other.

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

// Elementwise kernels prefer 512-bit vectors where the target has them: GCC
// defaults to 256 bits for -march=native on AVX-512 CPUs, which halves the
// throughput of exp-heavy loops on cores with two 512-bit FMA units.
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

inline constexpr int kLanes = 16;

#if defined(__AVX512F__)
inline constexpr __mmask16 kWholeVector = 0xFFFF;

// The lanes of a row's last, partial vector (remaining < kLanes): the low
// `remaining` bits.
inline __mmask16 tail_mask(int remaining) { return static_cast<__mmask16>((1u << remaining) - 1u); }

// Loads and stores masked only where the mask leaves lanes out: a masked
// load or store of memory not in cache runs at a third to a half of a plain
// one's rate on AMD Zen 5 (bench/elementwise_kernels.cc's cold figures), and
// a training step's elementwise kernels read activations stored long before.
inline __m512 load16(const float* p, __mmask16 m, __m512 fill = _mm512_setzero_ps()) {
  return m == kWholeVector ? _mm512_loadu_ps(p) : _mm512_mask_loadu_ps(fill, m, p);
}

inline void store16(float* p, __mmask16 m, __m512 v) {
  if (m == kWholeVector) {
    _mm512_storeu_ps(p, v);
  } else {
    _mm512_mask_storeu_ps(p, m, v);
  }
}

// body(i, mask) for the vectors of n floats in order: the whole ones with
// kWholeVector (load16 and store16 become plain loads and stores there once
// inlined), then the last, partial one with its tail_mask.
template <class Body>
__attribute__((always_inline)) inline void for_each_vector(int n, Body&& body) {
  int i = 0;
  for (; i <= n - kLanes; i += kLanes) body(i, kWholeVector);
  if (i < n) body(i, tail_mask(n - i));
}

// exp_approx for 16 floats: the same reduction and polynomial (n by the same
// 1.5·2^23 rounding, which GCC contracts into one FMA in exp_approx as here),
// so the same bits on [−87, 88]; outside it x is clamped to [−104, 89] and
// vscalefps applies 2^n, giving 0 below the subnormals and +inf above
// FLT_MAX where exp_approx stops at e^−87 and e^88. vmaxps and vminps return
// their second operand where either is NaN, so NaN stays NaN. (Masked forms
// with every lane set: GCC 12's unmasked ones pass an uninitialised vector
// that -Wmaybe-uninitialized reports.)
inline __m512 exp16(__m512 x) {
  const __m512 round = _mm512_set1_ps(12582912.0f);
  x = _mm512_mask_max_ps(x, kWholeVector, _mm512_set1_ps(-104.0f), x);
  x = _mm512_mask_min_ps(x, kWholeVector, _mm512_set1_ps(89.0f), x);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), round), round);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145751953125f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_mask_scalef_ps(p, kWholeVector, p, n);
}

// The lanes added in order, as the generic reductions add their partial sums.
inline float sum_lanes(__m512 v) {
  alignas(64) float lanes[kLanes];
  _mm512_store_ps(lanes, v);
  float total = 0;
  for (int j = 0; j < kLanes; ++j) total += lanes[j];
  return total;
}

inline float dot16(const float* x, const float* y, int n) {
  __m512 acc = _mm512_setzero_ps();
  for_each_vector(n, [&](int i, __mmask16 m) { acc = _mm512_fmadd_ps(load16(x + i, m), load16(y + i, m), acc); });
  return sum_lanes(acc);
}

inline float max16(const float* x, int n) {
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 best = lowest;
  for_each_vector(n, [&](int i, __mmask16 m) {
    best = _mm512_mask_max_ps(best, kWholeVector, best, load16(x + i, m, lowest));
  });
  alignas(64) float lanes[kLanes];
  _mm512_store_ps(lanes, best);
  float top = lanes[0];
  for (int j = 1; j < kLanes; ++j) top = top > lanes[j] ? top : lanes[j];
  return top;
}

inline float exponentiate16(float* x, float shift, int n) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  for_each_vector(n, [&](int i, __mmask16 m) {
    const __m512 e = exp16(_mm512_sub_ps(load16(x + i, m), s));
    store16(x + i, m, e);
    acc = _mm512_mask_add_ps(acc, m, acc, e);
  });
  return sum_lanes(acc);
}
#endif

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
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) return dot16(x, y, n);
#endif
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
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) return max16(x, n);
#endif
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
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) return exponentiate16(x, shift, n);
#endif
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
