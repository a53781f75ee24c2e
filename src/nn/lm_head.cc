#include "pipeflow/nn/lm_head.h"

#include "pipeflow/tensor/cross_entropy.h"
#include "pipeflow/tensor/gemm.h"
#include "pipeflow/tensor/layernorm.h"
#include "pipeflow/tensor/rmsnorm.h"

namespace pipeflow::nn {

template <class T>
void LmHead<T>::normalise(HeadSaved<T>& s, const LayerShape& shape, Allocator allocator) const {
  const int n = shape.rows();
  s.ln_f = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  s.ln_f_rstd = BasicTensor<T>::uninitialized({n}, allocator);
  if (rmsnorm_epsilon_) {
    rmsnorm_forward(s.ln_f.data(), s.ln_f_rstd.data(), s.x.data(), weights_.ln_f_weight, *rmsnorm_epsilon_, n,
                    shape.c);
    return;
  }
  s.ln_f_mean = BasicTensor<T>::uninitialized({n}, allocator);
  layernorm_forward(s.ln_f.data(), s.ln_f_mean.data(), s.ln_f_rstd.data(), s.x.data(), weights_.ln_f_weight,
                    weights_.ln_f_bias, n, shape.c);
}

template <class T>
double LmHead<T>::forward(HeadSaved<T>& s, BasicTensor<T> x, const IntTensor& targets, const LayerShape& shape,
                          Allocator allocator) const {
  const int n = shape.rows();
  s.x = std::move(x);
  normalise(s, shape, allocator);
  s.probs = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.v}, allocator);
  gemm<T>(Transpose::kNo, Transpose::kYes, n, shape.v, shape.c, T(1), s.ln_f.data(), shape.c, weights_.matrix,
          shape.c, T(0), s.probs.data(), shape.v);
  const double total = softmax_cross_entropy_forward(s.probs.data(), targets.data(), n, shape.v);
  return total / n;
}

template <class T>
BasicTensor<T> LmHead<T>::backward_input(HeadSaved<T>& s, const IntTensor& targets, double loss_scale,
                                         const LayerShape& shape, Allocator allocator) const {
  const int n = shape.rows();
  softmax_cross_entropy_backward(s.probs.data(), targets.data(), static_cast<T>(loss_scale / n), n, shape.v);
  s.d_ln_f = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  gemm<T>(Transpose::kNo, Transpose::kNo, n, shape.c, shape.v, T(1), s.probs.data(), shape.v, weights_.matrix,
          shape.c, T(0), s.d_ln_f.data(), shape.c);
  auto dx = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  if (rmsnorm_epsilon_) {
    rmsnorm_backward_input(dx.data(), static_cast<const T*>(nullptr), s.d_ln_f.data(), s.x.data(),
                           s.ln_f_rstd.data(), weights_.ln_f_weight, n, shape.c);
    return dx;
  }
  layernorm_backward_input(dx.data(), static_cast<const T*>(nullptr), s.d_ln_f.data(), s.x.data(),
                           s.ln_f_mean.data(), s.ln_f_rstd.data(), weights_.ln_f_weight, n, shape.c);
  return dx;
}

template <class T>
void LmHead<T>::backward_weight(HeadSaved<T>& s, const LayerShape& shape) const {
  const int n = shape.rows();
  gemm<T>(Transpose::kYes, Transpose::kNo, shape.v, shape.c, n, T(1), s.probs.data(), shape.v, s.ln_f.data(),
          shape.c, T(1), grads_.matrix, shape.c);
  if (rmsnorm_epsilon_) {
    rmsnorm_backward_weight(grads_.ln_f_weight, s.d_ln_f.data(), s.x.data(), s.ln_f_rstd.data(), n, shape.c);
  } else {
    layernorm_backward_weight(grads_.ln_f_weight, grads_.ln_f_bias, s.d_ln_f.data(), s.x.data(),
                              s.ln_f_mean.data(), s.ln_f_rstd.data(), n, shape.c);
  }
  s = {};
}

template <class T>
BasicTensor<T> LmHead<T>::logits(const BasicTensor<T>& x, const LayerShape& shape, Allocator allocator) const {
  HeadSaved<T> s;
  s.x = x.clone(allocator);
  normalise(s, shape, allocator);
  auto out = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.v}, allocator);
  gemm<T>(Transpose::kNo, Transpose::kYes, shape.rows(), shape.v, shape.c, T(1), s.ln_f.data(), shape.c,
          weights_.matrix, shape.c, T(0), out.data(), shape.v);
  return out;
}

template class LmHead<float>;
template class LmHead<double>;

}  // namespace pipeflow::nn
