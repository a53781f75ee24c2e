#include "pipeflow/tensor/gelu.h"

#include "vector_math.h"

namespace pipeflow {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;

template <class T>
PIPEFLOW_WIDE_VECTORS void forward_loop(T* __restrict y, const T* __restrict x, int n) {
  const T k = static_cast<T>(kSqrt2OverPi);
  const T a = static_cast<T>(kCubic);
  for (int i = 0; i < n; ++i) {
    const T v = x[i];
    y[i] = T(0.5) * v * (T(1) + detail::tanh(k * (v + a * v * v * v)));
  }
}

// d/dx: (1 + t)/2 + x/2 · (1 − t²) · √(2/π) · (1 + 3·0.044715·x²), t = tanh(...).
template <class T>
PIPEFLOW_WIDE_VECTORS void backward_loop(T* __restrict grad, const T* __restrict x, int n) {
  const T k = static_cast<T>(kSqrt2OverPi);
  const T a = static_cast<T>(kCubic);
  for (int i = 0; i < n; ++i) {
    const T v = x[i];
    const T t = detail::tanh(k * (v + a * v * v * v));
    const T slope = T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * k * (T(1) + T(3) * a * v * v);
    grad[i] *= slope;
  }
}

}  // namespace

template <class T>
void gelu_forward(T* y, const T* x, int n) {
  forward_loop(y, x, n);
}

template <class T>
void gelu_backward(T* grad, const T* x, int n) {
  backward_loop(grad, x, n);
}

template void gelu_forward<float>(float*, const float*, int);
template void gelu_forward<double>(double*, const double*, int);
template void gelu_backward<float>(float*, const float*, int);
template void gelu_backward<double>(double*, const double*, int);

}  // namespace pipeflow
