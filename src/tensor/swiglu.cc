#include "pipeflow/tensor/swiglu.h"

#include "vector_math.h"

namespace pipeflow {
namespace {

template <class T>
inline T sigmoid(T z) {
  return T(1) / (T(1) + detail::exp(-z));
}

template <class T>
PIPEFLOW_WIDE_VECTORS void forward_row(T* __restrict a, const T* __restrict gate, const T* __restrict up, int f) {
  for (int j = 0; j < f; ++j) a[j] = gate[j] * sigmoid(gate[j]) * up[j];
}

template <class T>
PIPEFLOW_WIDE_VECTORS void backward_row(T* __restrict d_gate, T* __restrict d_up, const T* __restrict da,
                                        const T* __restrict gate, const T* __restrict up, int f) {
  for (int j = 0; j < f; ++j) {
    const T s = sigmoid(gate[j]);
    d_up[j] = da[j] * gate[j] * s;
    d_gate[j] = da[j] * up[j] * s * (T(1) + gate[j] * (T(1) - s));
  }
}

}  // namespace

template <class T>
void swiglu_forward(T* a, const T* gu, int n, int f) {
  for (int row = 0; row < n; ++row) {
    const T* gate = gu + static_cast<long>(row) * 2 * f;
    forward_row(a + static_cast<long>(row) * f, gate, gate + f, f);
  }
}

template <class T>
void swiglu_backward(T* dgu, const T* da, const T* gu, int n, int f) {
  for (int row = 0; row < n; ++row) {
    const long offset = static_cast<long>(row) * 2 * f;
    backward_row(dgu + offset, dgu + offset + f, da + static_cast<long>(row) * f, gu + offset, gu + offset + f, f);
  }
}

template void swiglu_forward<float>(float*, const float*, int, int);
template void swiglu_forward<double>(double*, const double*, int, int);
template void swiglu_backward<float>(float*, const float*, const float*, int, int);
template void swiglu_backward<double>(double*, const double*, const double*, int, int);

}  // namespace pipeflow
