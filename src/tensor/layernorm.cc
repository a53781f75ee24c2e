#include "pipeflow/tensor/layernorm.h"

#include <cmath>
#include <type_traits>
#include <utility>

#include "vector_math.h"

namespace pipeflow {
namespace {

template <class T>
PIPEFLOW_WIDE_VECTORS void forward_rows(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int n, int c) {
  for (int row = 0; row < n; ++row) {
    const T* __restrict x_row = x + static_cast<long>(row) * c;
    T* __restrict y_row = y + static_cast<long>(row) * c;
    const T mu = detail::sum(x_row, c) / static_cast<T>(c);
    T partial[detail::kLanes] = {};
    int j = 0;
    for (; j + detail::kLanes <= c; j += detail::kLanes) {
      for (int lane = 0; lane < detail::kLanes; ++lane) {
        const T centred = x_row[j + lane] - mu;
        partial[lane] += centred * centred;
      }
    }
    T squares = 0;
    for (int lane = 0; lane < detail::kLanes; ++lane) squares += partial[lane];
    for (; j < c; ++j) squares += (x_row[j] - mu) * (x_row[j] - mu);
    const T inverse = T(1) / std::sqrt(squares / static_cast<T>(c) + static_cast<T>(kLayerNormEpsilon));
    for (j = 0; j < c; ++j) y_row[j] = (x_row[j] - mu) * inverse * w[j] + b[j];
    mean[row] = mu;
    rstd[row] = inverse;
  }
}

template <class T>
PIPEFLOW_WIDE_VECTORS void backward_input_rows(T* dx, const T* residual, const T* dy, const T* x, const T* mean,
                                               const T* rstd, const T* w, int n, int c) {
  for (int row = 0; row < n; ++row) {
    const T* __restrict dy_row = dy + static_cast<long>(row) * c;
    const T* __restrict x_row = x + static_cast<long>(row) * c;
    T* dx_row = dx + static_cast<long>(row) * c;
    const T* r_row = residual == nullptr ? nullptr : residual + static_cast<long>(row) * c;
    const T mu = mean[row];
    const T inverse = rstd[row];
    T g_partial[detail::kLanes] = {};
    T gx_partial[detail::kLanes] = {};
    int j = 0;
    for (; j + detail::kLanes <= c; j += detail::kLanes) {
      for (int lane = 0; lane < detail::kLanes; ++lane) {
        const T g = dy_row[j + lane] * w[j + lane];
        g_partial[lane] += g;
        gx_partial[lane] += g * ((x_row[j + lane] - mu) * inverse);
      }
    }
    T g_sum = 0;
    T gx_sum = 0;
    for (int lane = 0; lane < detail::kLanes; ++lane) {
      g_sum += g_partial[lane];
      gx_sum += gx_partial[lane];
    }
    for (; j < c; ++j) {
      const T g = dy_row[j] * w[j];
      g_sum += g;
      gx_sum += g * ((x_row[j] - mu) * inverse);
    }
    const T g_mean = g_sum / static_cast<T>(c);
    const T gx_mean = gx_sum / static_cast<T>(c);
    for (j = 0; j < c; ++j) {
      const T x_hat = (x_row[j] - mu) * inverse;
      const T base = r_row == nullptr ? T(0) : r_row[j];
      dx_row[j] = base + inverse * (dy_row[j] * w[j] - g_mean - x_hat * gx_mean);
    }
  }
}

template <class T>
PIPEFLOW_WIDE_VECTORS void backward_weight_rows(T* __restrict dw, T* __restrict db, const T* dy, const T* x,
                                                const T* mean, const T* rstd, int n, int c) {
  for (int row = 0; row < n; ++row) {
    const T* __restrict dy_row = dy + static_cast<long>(row) * c;
    const T* __restrict x_row = x + static_cast<long>(row) * c;
    const T mu = mean[row];
    const T inverse = rstd[row];
    for (int j = 0; j < c; ++j) {
      dw[j] += dy_row[j] * ((x_row[j] - mu) * inverse);
      db[j] += dy_row[j];
    }
  }
}

#if defined(__AVX512F__)
// The input gradient 16 columns at a time, the tail in one masked vector:
// GCC's own vectorisation of backward_input_rows (two sets of 16 partial sums
// and the residual's alias checks) spills to the stack and takes about 3
// cycles an element at width 128. (The forward, written the same way, was
// slower than GCC's: it stays generic.)
void backward_input_rows_avx512(float* dx, const float* residual, const float* dy, const float* x, const float* mean,
                                const float* rstd, const float* w, int n, int c) {
  for (int row = 0; row < n; ++row) {
    const long offset = static_cast<long>(row) * c;
    const __m512 mu = _mm512_set1_ps(mean[row]);
    const __m512 inverse = _mm512_set1_ps(rstd[row]);
    __m512 g_sum = _mm512_setzero_ps();
    __m512 gx_sum = _mm512_setzero_ps();
    // (g and x̂ of columns j..j+15: the row's gradient through the weight, and
    // the normalised input)
    const auto g_and_x_hat = [&](int j, __mmask16 m) {
      const __m512 g = _mm512_mul_ps(detail::load16(dy + offset + j, m), detail::load16(w + j, m));
      return std::pair{g, _mm512_mul_ps(_mm512_sub_ps(detail::load16(x + offset + j, m), mu), inverse)};
    };
    detail::for_each_vector(c, [&](int j, __mmask16 m) {
      const auto [g, x_hat] = g_and_x_hat(j, m);
      g_sum = _mm512_add_ps(g_sum, g);
      gx_sum = _mm512_fmadd_ps(g, x_hat, gx_sum);
    });
    const __m512 g_mean = _mm512_set1_ps(detail::sum_lanes(g_sum) / static_cast<float>(c));
    const __m512 gx_mean = _mm512_set1_ps(detail::sum_lanes(gx_sum) / static_cast<float>(c));
    detail::for_each_vector(c, [&](int j, __mmask16 m) {
      const auto [g, x_hat] = g_and_x_hat(j, m);
      const __m512 centred = _mm512_fnmadd_ps(x_hat, gx_mean, _mm512_sub_ps(g, g_mean));
      const __m512 base = residual == nullptr ? _mm512_setzero_ps() : detail::load16(residual + offset + j, m);
      detail::store16(dx + offset + j, m, _mm512_fmadd_ps(inverse, centred, base));
    });
  }
}
#endif

}  // namespace

template <class T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int n, int c) {
  forward_rows(y, mean, rstd, x, w, b, n, c);
}

template <class T>
void layernorm_backward_input(T* dx, const T* residual, const T* dy, const T* x, const T* mean, const T* rstd,
                              const T* w, int n, int c) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) return backward_input_rows_avx512(dx, residual, dy, x, mean, rstd, w, n, c);
#endif
  backward_input_rows(dx, residual, dy, x, mean, rstd, w, n, c);
}

template <class T>
void layernorm_backward_weight(T* dw, T* db, const T* dy, const T* x, const T* mean, const T* rstd, int n, int c) {
  backward_weight_rows(dw, db, dy, x, mean, rstd, n, c);
}

#define PIPEFLOW_INSTANTIATE(T)                                                                           \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int);                \
  template void layernorm_backward_input<T>(T*, const T*, const T*, const T*, const T*, const T*, const T*, int, \
                                            int);                                                            \
  template void layernorm_backward_weight<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);
PIPEFLOW_INSTANTIATE(float)
PIPEFLOW_INSTANTIATE(double)
#undef PIPEFLOW_INSTANTIATE

}  // namespace pipeflow
