#include "pipeflow/nn/projector.h"

#include <algorithm>
#include <utility>

#include "pipeflow/tensor/gelu.h"
#include "pipeflow/tensor/linear.h"

namespace pipeflow::nn {

template <class T>
BasicTensor<T> Projector<T>::forward(ProjectorSaved<T>& saved, BasicTensor<T> x, Allocator allocator) const {
  const int n = static_cast<int>(x.dim(0) * x.dim(1));
  const Shape out_shape{x.dim(0), x.dim(1), out_};
  saved.h = BasicTensor<T>::uninitialized(out_shape, allocator);
  saved.g = BasicTensor<T>::uninitialized(out_shape, allocator);
  auto y = BasicTensor<T>::uninitialized(out_shape, allocator);
  linear_forward(saved.h.data(), x.data(), weights_.fc1_weight, weights_.fc1_bias, static_cast<const T*>(nullptr), n,
                 in_, out_);
  gelu_forward(saved.g.data(), saved.h.data(), n * out_);
  linear_forward(y.data(), saved.g.data(), weights_.fc2_weight, weights_.fc2_bias, static_cast<const T*>(nullptr), n,
                 out_, out_);
  saved.x = std::move(x);
  return y;
}

template <class T>
BasicTensor<T> Projector<T>::backward_input(ProjectorSaved<T>& saved, BasicTensor<T> dy, Allocator allocator) const {
  const int n = static_cast<int>(dy.dim(0) * dy.dim(1));
  auto dg = BasicTensor<T>::uninitialized(dy.shape(), allocator);
  linear_backward_input(dg.data(), dy.data(), weights_.fc2_weight, n, out_, out_);
  gelu_backward(dg.data(), saved.h.data(), n * out_);  // dg is now ∂L/∂h
  saved.h = std::move(dg);
  auto dx = BasicTensor<T>::uninitialized(saved.x.shape(), allocator);
  linear_backward_input(dx.data(), saved.h.data(), weights_.fc1_weight, n, in_, out_);
  saved.dy = std::move(dy);
  return dx;
}

template <class T>
void Projector<T>::backward_weight(ProjectorSaved<T>& saved) const {
  const int n = static_cast<int>(saved.dy.dim(0) * saved.dy.dim(1));
  linear_backward_weight(grads_.fc2_weight, grads_.fc2_bias, saved.g.data(), saved.dy.data(), n, out_, out_);
  linear_backward_weight(grads_.fc1_weight, grads_.fc1_bias, saved.x.data(), saved.h.data(), n, in_, out_);
  saved = {};
}

template class Projector<float>;
template class Projector<double>;

}  // namespace pipeflow::nn
