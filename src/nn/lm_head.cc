#include "pipeflow/nn/lm_head.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "pipeflow/tensor/cross_entropy.h"
#include "pipeflow/tensor/gemm.h"
#include "pipeflow/tensor/layernorm.h"
#include "pipeflow/tensor/rmsnorm.h"

namespace pipeflow::nn {

template <class T>
void LmHead<T>::normalise(HeadSaved<T>& s, const LayerShape& shape, Allocator allocator) const {
  const int n = local_rows(shape);
  auto normed = BasicTensor<T>::uninitialized({n, shape.c}, allocator);
  s.ln_f_rstd = BasicTensor<T>::uninitialized({n}, allocator);
  if (rmsnorm_epsilon_) {
    rmsnorm_forward(normed.data(), s.ln_f_rstd.data(), s.x.data(), weights_.ln_f_weight, *rmsnorm_epsilon_, n,
                    shape.c);
  } else {
    s.ln_f_mean = BasicTensor<T>::uninitialized({n}, allocator);
    layernorm_forward(normed.data(), s.ln_f_mean.data(), s.ln_f_rstd.data(), s.x.data(), weights_.ln_f_weight,
                      weights_.ln_f_bias, n, shape.c);
  }
  if (!sequence_) {
    s.ln_f = std::move(normed);
    return;
  }
  s.ln_f = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  if constexpr (std::is_same_v<T, float>) {
    gather_sequence(*tensor_, normed.data(), s.ln_f.data(), shape.b, shape.t / tensor_->size(), shape.c,
                    "the sequence-parallel all-gather of ln_f's output");
  }
}

template <class T>
double LmHead<T>::vocab_parallel_forward(T* logits, const std::int32_t* targets, const LayerShape& shape) const {
  const int n = shape.rows();
  const int v = vocab(shape);
  const int first = first_column(shape);
  if constexpr (!std::is_same_v<T, float>) {
    return 0;  // the stage refuses a split double head
  } else {
    std::vector<float> largest(static_cast<std::size_t>(n), -std::numeric_limits<float>::infinity());
    for (int row = 0; row < n; ++row) {
      const T* l = logits + static_cast<long>(row) * v;
      for (int j = 0; j < v; ++j) largest[row] = std::max(largest[row], l[j]);
    }
    tensor_->all_reduce_max(largest, "the tensor-parallel all-reduce of the logits' row maxima");
    // Each row's Σ exp(l − max) over the rank's columns, then its target's l − max (0 off this rank).
    std::vector<float> sums(2 * static_cast<std::size_t>(n), 0.0f);
    for (int row = 0; row < n; ++row) {
      T* l = logits + static_cast<long>(row) * v;
      const int column = targets[row] - first;
      if (column >= 0 && column < v) sums[n + row] = l[column] - largest[row];
      double sum = 0;
      for (int j = 0; j < v; ++j) {
        l[j] = std::exp(l[j] - largest[row]);
        sum += l[j];
      }
      sums[row] = static_cast<float>(sum);
    }
    tensor_->all_reduce_sum(sums, "the tensor-parallel all-reduce of the softmax's sums");
    double total = 0;
    for (int row = 0; row < n; ++row) {
      total += std::log(static_cast<double>(sums[row])) - sums[n + row];
      T* p = logits + static_cast<long>(row) * v;
      const float scale = 1.0f / sums[row];
      for (int j = 0; j < v; ++j) p[j] *= scale;
    }
    return total;
  }
}

template <class T>
double LmHead<T>::forward(HeadSaved<T>& s, BasicTensor<T> x, const IntTensor& targets, const LayerShape& shape,
                          Allocator allocator) const {
  const int n = shape.rows();
  s.x = std::move(x);
  normalise(s, shape, allocator);
  const int v = vocab(shape);
  s.probs = BasicTensor<T>::uninitialized({shape.b, shape.t, v}, allocator);
  gemm<T>(Transpose::kNo, Transpose::kYes, n, v, shape.c, T(1), s.ln_f.data(), shape.c, weights_.matrix, shape.c,
          T(0), s.probs.data(), v);
  const double total = tensor_ == nullptr ? softmax_cross_entropy_forward(s.probs.data(), targets.data(), n, v)
                                          : vocab_parallel_forward(s.probs.data(), targets.data(), shape);
  return total / n;
}

template <class T>
BasicTensor<T> LmHead<T>::backward_input(HeadSaved<T>& s, const IntTensor& targets, double loss_scale,
                                         const LayerShape& shape, Allocator allocator) const {
  const int n = shape.rows();
  const int v = vocab(shape);
  if (tensor_ == nullptr) {
    softmax_cross_entropy_backward(s.probs.data(), targets.data(), static_cast<T>(loss_scale / n), n, v);
  } else {
    const T scale = static_cast<T>(loss_scale / n);
    const int first = first_column(shape);
    for (int row = 0; row < n; ++row) {
      T* p = s.probs.data() + static_cast<long>(row) * v;
      const int column = targets.data()[row] - first;
      if (column >= 0 && column < v) p[column] -= T(1);
      for (int j = 0; j < v; ++j) p[j] *= scale;
    }
  }
  const int rows = local_rows(shape);
  s.d_ln_f = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  gemm<T>(Transpose::kNo, Transpose::kNo, n, shape.c, v, T(1), s.probs.data(), v, weights_.matrix, shape.c, T(0),
          s.d_ln_f.data(), shape.c);
  if constexpr (std::is_same_v<T, float>) {
    if (sequence_) {
      auto part = BasicTensor<T>::uninitialized({shape.b, rows / shape.b, shape.c}, allocator);
      scatter_sequence(*tensor_, s.d_ln_f.data(), part.data(), shape.b, rows / shape.b, shape.c,
                       "the sequence-parallel reduce-scatter of the LM head's input gradient");
      s.d_ln_f = std::move(part);
    } else if (tensor_ != nullptr) {
      tensor_->all_reduce_sum(s.d_ln_f.span(), "the tensor-parallel all-reduce of the LM head's input gradient");
    }
  }
  auto dx = BasicTensor<T>::uninitialized({shape.b, rows / shape.b, shape.c}, allocator);
  if (rmsnorm_epsilon_) {
    rmsnorm_backward_input(dx.data(), static_cast<const T*>(nullptr), s.d_ln_f.data(), s.x.data(),
                           s.ln_f_rstd.data(), weights_.ln_f_weight, rows, shape.c);
    return dx;
  }
  layernorm_backward_input(dx.data(), static_cast<const T*>(nullptr), s.d_ln_f.data(), s.x.data(),
                           s.ln_f_mean.data(), s.ln_f_rstd.data(), weights_.ln_f_weight, rows, shape.c);
  return dx;
}

template <class T>
void LmHead<T>::backward_weight(HeadSaved<T>& s, const LayerShape& shape) const {
  const int n = shape.rows();
  const int v = vocab(shape);
  gemm<T>(Transpose::kYes, Transpose::kNo, v, shape.c, n, T(1), s.probs.data(), v, s.ln_f.data(), shape.c, T(1),
          grads_.matrix, shape.c);
  const int rows = local_rows(shape);
  if (rmsnorm_epsilon_) {
    rmsnorm_backward_weight(grads_.ln_f_weight, s.d_ln_f.data(), s.x.data(), s.ln_f_rstd.data(), rows, shape.c);
  } else {
    layernorm_backward_weight(grads_.ln_f_weight, grads_.ln_f_bias, s.d_ln_f.data(), s.x.data(),
                              s.ln_f_mean.data(), s.ln_f_rstd.data(), rows, shape.c);
  }
  s = {};
}

template <class T>
BasicTensor<T> LmHead<T>::logits(const BasicTensor<T>& x, const LayerShape& shape, Allocator allocator) const {
  HeadSaved<T> s;
  s.x = x.clone(allocator);
  normalise(s, shape, allocator);
  const int v = vocab(shape);
  auto out = BasicTensor<T>::uninitialized({shape.b, shape.t, v}, allocator);
  gemm<T>(Transpose::kNo, Transpose::kYes, shape.rows(), v, shape.c, T(1), s.ln_f.data(), shape.c, weights_.matrix,
          shape.c, T(0), out.data(), v);
  if constexpr (std::is_same_v<T, float>) {
    if (tensor_ != nullptr) {  // every rank's columns: [members][rows][v] laid out as [rows][V]
      const int members = tensor_->size();
      std::vector<float> all(static_cast<std::size_t>(out.numel()) * static_cast<std::size_t>(members));
      tensor_->all_gather(out.span(), all, "the tensor-parallel all-gather of the logits");
      auto whole = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.v}, allocator);
      for (int k = 0; k < members; ++k) {
        for (int row = 0; row < shape.rows(); ++row) {
          const float* from = all.data() + (static_cast<long>(k) * shape.rows() + row) * v;
          std::copy_n(from, v, whole.data() + static_cast<long>(row) * shape.v + static_cast<long>(k) * v);
        }
      }
      return whole;
    }
  }
  return out;
}

template class LmHead<float>;
template class LmHead<double>;

}  // namespace pipeflow::nn
