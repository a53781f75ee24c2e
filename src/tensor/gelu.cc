#include "pipeflow/tensor/gelu.h"

#include <type_traits>

#include "vector_math.h"

namespace pipeflow {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;

// x/2 · (1 + tanh(u)) = x · σ(2u) = x / (1 + e^{−2u}), u = √(2/π)·(x + 0.044715·x³):
// one exp and one divide, and no 1 + tanh(u) to cancel where u is very negative.
template <class T>
PIPEFLOW_WIDE_VECTORS void forward_loop(T* __restrict y, const T* __restrict x, int n) {
  const T minus_2k = static_cast<T>(-2 * kSqrt2OverPi);
  const T a = static_cast<T>(kCubic);
  for (int i = 0; i < n; ++i) {
    const T v = x[i];
    y[i] = v / (T(1) + detail::exp(minus_2k * (v + a * v * v * v)));
  }
}

// d/dx with s = σ(2u): s + 2·x·s·(1 − s)·√(2/π)·(1 + 3·0.044715·x²), which is
// (1 + t)/2 + x/2 · (1 − t²) · u' with t = tanh(u) = 2s − 1.
template <class T>
PIPEFLOW_WIDE_VECTORS void backward_loop(T* __restrict grad, const T* __restrict x, int n) {
  const T k = static_cast<T>(kSqrt2OverPi);
  const T a = static_cast<T>(kCubic);
  for (int i = 0; i < n; ++i) {
    const T v = x[i];
    const T s = T(1) / (T(1) + detail::exp(T(-2) * k * (v + a * v * v * v)));
    grad[i] *= s + T(2) * v * s * (T(1) - s) * k * (T(1) + T(3) * a * v * v);
  }
}

#if defined(__AVX512F__)
// The same formulas 16 at a time, the tail in one masked vector (vector_math.h
// says why GCC's own vectorisation of the loops above falls short).
struct GeluTerms {
  __m512 v;
  __m512 denominator;  // 1 + e^{−2u} = 1 / σ(2u)
};

inline GeluTerms gelu_terms(__m512 v) {
  const __m512 a = _mm512_set1_ps(static_cast<float>(kCubic));
  const __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(a, v), v), v, v);
  const __m512 e = detail::exp16(_mm512_mul_ps(_mm512_set1_ps(static_cast<float>(-2 * kSqrt2OverPi)), inner));
  return {v, _mm512_add_ps(_mm512_set1_ps(1.0f), e)};
}

void forward_avx512(float* y, const float* x, int n) {
  detail::for_each_vector(n, [&](int i, __mmask16 m) {
    const GeluTerms g = gelu_terms(detail::load16(x + i, m));
    detail::store16(y + i, m, _mm512_div_ps(g.v, g.denominator));
  });
}

void backward_avx512(float* grad, const float* x, int n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 two_k = _mm512_set1_ps(static_cast<float>(2 * kSqrt2OverPi));
  const __m512 three_a = _mm512_set1_ps(static_cast<float>(3 * kCubic));
  detail::for_each_vector(n, [&](int i, __mmask16 m) {
    const GeluTerms g = gelu_terms(detail::load16(x + i, m));
    const __m512 s = _mm512_div_ps(one, g.denominator);
    const __m512 du = _mm512_mul_ps(two_k, _mm512_fmadd_ps(_mm512_mul_ps(three_a, g.v), g.v, one));
    const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(g.v, s), _mm512_sub_ps(one, s));
    const __m512 slope = _mm512_fmadd_ps(ds, du, s);
    detail::store16(grad + i, m, _mm512_mul_ps(detail::load16(grad + i, m), slope));
  });
}
#endif

}  // namespace

template <class T>
void gelu_forward(T* y, const T* x, int n) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) return forward_avx512(y, x, n);
#endif
  forward_loop(y, x, n);
}

template <class T>
void gelu_backward(T* grad, const T* x, int n) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) return backward_avx512(grad, x, n);
#endif
  backward_loop(grad, x, n);
}

template void gelu_forward<float>(float*, const float*, int);
template void gelu_forward<double>(double*, const double*, int);
template void gelu_backward<float>(float*, const float*, int);
template void gelu_backward<double>(double*, const double*, int);

}  // namespace pipeflow
