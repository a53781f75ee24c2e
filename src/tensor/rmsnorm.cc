#include "pipeflow/tensor/rmsnorm.h"

#include <cmath>

#include "vector_math.h"

namespace pipeflow {
namespace {

template <class T>
PIPEFLOW_WIDE_VECTORS void forward_rows(T* __restrict y, T* __restrict rstd, const T* __restrict x,
                                        const T* __restrict w, T epsilon, int n, int c) {
  for (int row = 0; row < n; ++row) {
    const T* x_row = x + static_cast<long>(row) * c;
    T* y_row = y + static_cast<long>(row) * c;
    const T inverse = T(1) / std::sqrt(detail::dot(x_row, x_row, c) / static_cast<T>(c) + epsilon);
    for (int j = 0; j < c; ++j) y_row[j] = x_row[j] * inverse * w[j];
    rstd[row] = inverse;
  }
}

template <class T>
PIPEFLOW_WIDE_VECTORS void backward_input_rows(T* dx, const T* residual, const T* dy, const T* x, const T* rstd,
                                               const T* w, int n, int c) {
  for (int row = 0; row < n; ++row) {
    const T* __restrict dy_row = dy + static_cast<long>(row) * c;
    const T* __restrict x_row = x + static_cast<long>(row) * c;
    T* dx_row = dx + static_cast<long>(row) * c;
    const T* r_row = residual == nullptr ? nullptr : residual + static_cast<long>(row) * c;
    const T inverse = rstd[row];
    T partial[detail::kLanes] = {};
    int j = 0;
    for (; j + detail::kLanes <= c; j += detail::kLanes) {
      for (int lane = 0; lane < detail::kLanes; ++lane) {
        partial[lane] += dy_row[j + lane] * w[j + lane] * (x_row[j + lane] * inverse);
      }
    }
    T gx_sum = 0;
    for (int lane = 0; lane < detail::kLanes; ++lane) gx_sum += partial[lane];
    for (; j < c; ++j) gx_sum += dy_row[j] * w[j] * (x_row[j] * inverse);
    const T gx_mean = gx_sum / static_cast<T>(c);
    for (j = 0; j < c; ++j) {
      const T base = r_row == nullptr ? T(0) : r_row[j];
      dx_row[j] = base + inverse * (dy_row[j] * w[j] - x_row[j] * inverse * gx_mean);
    }
  }
}

template <class T>
PIPEFLOW_WIDE_VECTORS void backward_weight_rows(T* __restrict dw, const T* dy, const T* x, const T* rstd, int n,
                                                int c) {
  for (int row = 0; row < n; ++row) {
    const T* __restrict dy_row = dy + static_cast<long>(row) * c;
    const T* __restrict x_row = x + static_cast<long>(row) * c;
    const T inverse = rstd[row];
    for (int j = 0; j < c; ++j) dw[j] += dy_row[j] * (x_row[j] * inverse);
  }
}

}  // namespace

template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, double epsilon, int n, int c) {
  forward_rows(y, rstd, x, w, static_cast<T>(epsilon), n, c);
}

template <class T>
void rmsnorm_backward_input(T* dx, const T* residual, const T* dy, const T* x, const T* rstd, const T* w, int n,
                            int c) {
  backward_input_rows(dx, residual, dy, x, rstd, w, n, c);
}

template <class T>
void rmsnorm_backward_weight(T* dw, const T* dy, const T* x, const T* rstd, int n, int c) {
  backward_weight_rows(dw, dy, x, rstd, n, c);
}

#define PIPEFLOW_INSTANTIATE(T)                                                                              \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, double, int, int);                           \
  template void rmsnorm_backward_input<T>(T*, const T*, const T*, const T*, const T*, const T*, int, int); \
  template void rmsnorm_backward_weight<T>(T*, const T*, const T*, const T*, int, int);
PIPEFLOW_INSTANTIATE(float)
PIPEFLOW_INSTANTIATE(double)
#undef PIPEFLOW_INSTANTIATE

}  // namespace pipeflow
