#include "pipeflow/tensor/linear.h"

#include <cstring>
#include <type_traits>

#include "pipeflow/tensor/gemm.h"
#include "pipeflow/tensor/panels.h"

namespace pipeflow {
namespace {

// y[n, out] = b (+ residual), what the product then adds onto (0 without either).
template <class T>
void start_with_bias(T* y, const T* b, const T* residual, int n, int out) {
  for (int row = 0; row < n; ++row) {
    T* __restrict y_row = y + static_cast<long>(row) * out;
    const T* __restrict r_row = residual == nullptr ? nullptr : residual + static_cast<long>(row) * out;
    if (r_row != nullptr && b != nullptr) {
      for (int j = 0; j < out; ++j) y_row[j] = r_row[j] + b[j];
    } else if (r_row != nullptr || b != nullptr) {
      std::memcpy(y_row, r_row != nullptr ? r_row : b, sizeof(T) * static_cast<std::size_t>(out));
    } else {
      std::memset(y_row, 0, sizeof(T) * static_cast<std::size_t>(out));
    }
  }
}

}  // namespace

template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, const T* residual, int n, int in, int out) {
  if constexpr (std::is_same_v<T, float>) {
    if (b != nullptr && residual == nullptr) return gemm_bias(n, out, in, x, in, w, out, b, y, out);
  }
  start_with_bias(y, b, residual, n, out);
  gemm<T>(Transpose::kNo, Transpose::kNo, n, out, in, T(1), x, in, w, out, T(1), y, out);
}

template <class T>
void linear_forward_panels(T* y, const T* x, const T* w_panels, const T* b, const T* residual, int n, int in,
                           int out) {
  start_with_bias(y, b, residual, n, out);
  panels_multiply_add(y, x, w_panels, n, in, out);
}

template <class T>
void linear_backward_input(T* dx, const T* dy, const T* w, int n, int in, int out) {
  gemm<T>(Transpose::kNo, Transpose::kYes, n, in, out, T(1), dy, out, w, out, T(0), dx, in);
}

template <class T>
void add_column_sums(T* db, const T* dy, int n, int out) {
  for (int row = 0; row < n; ++row) {
    const T* __restrict dy_row = dy + static_cast<long>(row) * out;
    for (int j = 0; j < out; ++j) db[j] += dy_row[j];
  }
}

template <class T>
void linear_backward_weight(T* dw, T* db, const T* x, const T* dy, int n, int in, int out) {
  gemm<T>(Transpose::kYes, Transpose::kNo, in, out, n, T(1), x, in, dy, out, T(1), dw, out);
  if (db != nullptr) add_column_sums(db, dy, n, out);
}

template <class T>
void projection_forward(T* y, int ldy, const T* x, const T* w, const T* residual, int n, int in, int out) {
  if (residual != nullptr) {
    for (int row = 0; row < n; ++row) {
      std::memcpy(y + static_cast<long>(row) * ldy, residual + static_cast<long>(row) * out,
                  sizeof(T) * static_cast<std::size_t>(out));
    }
  }
  gemm<T>(Transpose::kNo, Transpose::kYes, n, out, in, T(1), x, in, w, in, residual != nullptr ? T(1) : T(0), y, ldy);
}

template <class T>
void projection_backward_input(T* dx, const T* dy, int ldy, const T* w, int n, int in, int out, bool accumulate) {
  gemm<T>(Transpose::kNo, Transpose::kNo, n, in, out, T(1), dy, ldy, w, in, accumulate ? T(1) : T(0), dx, in);
}

template <class T>
void projection_backward_weight(T* dw, const T* x, const T* dy, int ldy, int n, int in, int out) {
  gemm<T>(Transpose::kYes, Transpose::kNo, out, in, n, T(1), dy, ldy, x, in, T(1), dw, in);
}

#define PIPEFLOW_INSTANTIATE(T)                                                                      \
  template void linear_forward<T>(T*, const T*, const T*, const T*, const T*, int, int, int);       \
  template void linear_forward_panels<T>(T*, const T*, const T*, const T*, const T*, int, int, int); \
  template void linear_backward_input<T>(T*, const T*, const T*, int, int, int);                    \
  template void linear_backward_weight<T>(T*, T*, const T*, const T*, int, int, int);               \
  template void add_column_sums<T>(T*, const T*, int, int);                                        \
  template void projection_forward<T>(T*, int, const T*, const T*, const T*, int, int, int);        \
  template void projection_backward_input<T>(T*, const T*, int, const T*, int, int, int, bool);     \
  template void projection_backward_weight<T>(T*, const T*, const T*, int, int, int, int);
PIPEFLOW_INSTANTIATE(float)
PIPEFLOW_INSTANTIATE(double)
#undef PIPEFLOW_INSTANTIATE

}  // namespace pipeflow
