#include "pipeflow/nn/transformer_block.h"

#include <algorithm>

#include "pipeflow/tensor/attention.h"
#include "pipeflow/tensor/gelu.h"
#include "pipeflow/tensor/layernorm.h"
#include "pipeflow/tensor/linear.h"
#include "pipeflow/tensor/panels.h"

namespace pipeflow::nn {

template <class T>
void TransformerBlock<T>::linear(T* y, const T* x, const T* w, const T* b, const T* residual, int n, int in,
                                 int out) const {
  if (panels_) {
    linear_forward_panels(y, x, w, b, residual, n, in, out);
  } else {
    linear_forward(y, x, w, b, residual, n, in, out);
  }
}

template <class T>
void TransformerBlock<T>::pack_weights(const BlockParams<T*>& writable, int c) {
  if (panels_) return;
  pack_panels(writable.attn_weight, c, 3 * c);
  pack_panels(writable.attn_proj_weight, c, c);
  pack_panels(writable.fc_weight, c, 4 * c);
  pack_panels(writable.fc_proj_weight, 4 * c, c);
  panels_ = true;
}

template <class T>
void TransformerBlock<T>::project_qkv(BlockSaved<T>& s, const LayerShape& shape, Allocator allocator) const {
  const int n = shape.rows();
  const int c = shape.c;
  const auto& w = weights_;
  auto make = [&](Shape dims) { return BasicTensor<T>::uninitialized(dims, allocator); };
  s.ln_1 = make({shape.b, shape.t, c});
  s.ln_1_mean = make({n});
  s.ln_1_rstd = make({n});
  layernorm_forward(s.ln_1.data(), s.ln_1_mean.data(), s.ln_1_rstd.data(), s.x.data(), w.ln_1_weight, w.ln_1_bias,
                    n, c);
  s.qkv = make({shape.b, shape.t, 3 * c});
  linear(s.qkv.data(), s.ln_1.data(), w.attn_weight, w.attn_bias, static_cast<const T*>(nullptr), n, c,
                 3 * c);
}

template <class T>
BasicTensor<T> TransformerBlock<T>::project_and_mlp(BlockSaved<T>& s, const LayerShape& shape,
                                                    Allocator allocator) const {
  const int n = shape.rows();
  const int c = shape.c;
  const auto& w = weights_;
  auto make = [&](Shape dims) { return BasicTensor<T>::uninitialized(dims, allocator); };
  s.x2 = make({shape.b, shape.t, c});
  linear(s.x2.data(), s.attn_y.data(), w.attn_proj_weight, w.attn_proj_bias, s.x.data(), n, c, c);
  s.ln_2 = make({shape.b, shape.t, c});
  s.ln_2_mean = make({n});
  s.ln_2_rstd = make({n});
  layernorm_forward(s.ln_2.data(), s.ln_2_mean.data(), s.ln_2_rstd.data(), s.x2.data(), w.ln_2_weight,
                    w.ln_2_bias, n, c);
  s.h = make({shape.b, shape.t, 4 * c});
  linear(s.h.data(), s.ln_2.data(), w.fc_weight, w.fc_bias, static_cast<const T*>(nullptr), n, c, 4 * c);
  s.g = make({shape.b, shape.t, 4 * c});
  gelu_forward(s.g.data(), s.h.data(), n * 4 * c);
  auto y = make({shape.b, shape.t, c});
  linear(y.data(), s.g.data(), w.fc_proj_weight, w.fc_proj_bias, s.x2.data(), n, 4 * c, c);
  return y;
}

template <class T>
BasicTensor<T> TransformerBlock<T>::forward(BlockSaved<T>& s, BasicTensor<T> x, const LayerShape& shape,
                                            Allocator allocator) const {
  s.x = std::move(x);
  project_qkv(s, shape, allocator);
  s.probs = BasicTensor<T>::uninitialized({shape.b, shape.nh, shape.t, shape.t}, allocator);
  s.attn_y = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  attention_forward(s.attn_y.data(), s.probs.data(), s.qkv.data(), shape.b, shape.t, shape.c, shape.nh);
  return project_and_mlp(s, shape, allocator);
}

template <class T>
BasicTensor<T> TransformerBlock<T>::forward_cached(BasicTensor<T> x, BasicKvCache<T>& cache, int block,
                                                   const SequenceRows& rows, const LayerShape& shape,
                                                   Allocator allocator) const {
  const int c = shape.c;
  BlockSaved<T> s;
  s.x = std::move(x);
  project_qkv(s, shape, allocator);
  s.attn_y = BasicTensor<T>::uninitialized({shape.b, shape.t, c}, allocator);
  int row = 0;
  for (std::size_t i = 0; i < rows.counts.size(); ++i) {
    const int sequence = rows.first + static_cast<int>(i);
    const int count = rows.counts[i];
    const int past = cache.length(sequence);
    T* keys = cache.keys(block, sequence);
    T* values = cache.values(block, sequence);
    const T* qkv = s.qkv.data() + static_cast<long>(row) * 3 * c;
    for (int r = 0; r < count; ++r) {
      const T* k = qkv + static_cast<long>(r) * 3 * c + c;
      std::copy(k, k + c, keys + static_cast<long>(past + r) * c);
      std::copy(k + c, k + 2 * c, values + static_cast<long>(past + r) * c);
    }
    auto scores = BasicTensor<T>::uninitialized({count, past + count}, allocator);
    attention_forward_cached(s.attn_y.data() + static_cast<long>(row) * c, scores.data(), qkv, 3 * c, keys, values,
                             count, past, c, shape.nh);
    row += count;
  }
  return project_and_mlp(s, shape, allocator);
}

template <class T>
BasicTensor<T> TransformerBlock<T>::backward_input(BlockSaved<T>& s, BasicTensor<T> dy, const LayerShape& shape,
                                                   Allocator allocator) const {
  const int n = shape.rows();
  const int c = shape.c;
  const auto& w = weights_;
  auto make = [&](Shape dims) { return BasicTensor<T>::uninitialized(dims, allocator); };
  s.dy = std::move(dy);
  s.dh = make({shape.b, shape.t, 4 * c});
  linear_backward_input(s.dh.data(), s.dy.data(), w.fc_proj_weight, n, 4 * c, c);
  gelu_backward(s.dh.data(), s.h.data(), n * 4 * c);
  s.h.reset();
  s.d_ln_2 = make({shape.b, shape.t, c});
  linear_backward_input(s.d_ln_2.data(), s.dh.data(), w.fc_weight, n, c, 4 * c);
  s.dx2 = make({shape.b, shape.t, c});
  layernorm_backward_input(s.dx2.data(), s.dy.data(), s.d_ln_2.data(), s.x2.data(), s.ln_2_mean.data(),
                           s.ln_2_rstd.data(), w.ln_2_weight, n, c);
  {
    auto d_attn_y = make({shape.b, shape.t, c});
    linear_backward_input(d_attn_y.data(), s.dx2.data(), w.attn_proj_weight, n, c, c);
    auto scratch = make({shape.t, shape.t});
    s.dqkv = make({shape.b, shape.t, 3 * c});
    attention_backward(s.dqkv.data(), scratch.data(), d_attn_y.data(), s.probs.data(), s.qkv.data(), shape.b,
                       shape.t, c, shape.nh);
  }
  s.probs.reset();
  s.qkv.reset();
  s.d_ln_1 = make({shape.b, shape.t, c});
  linear_backward_input(s.d_ln_1.data(), s.dqkv.data(), w.attn_weight, n, c, 3 * c);
  auto dx = make({shape.b, shape.t, c});
  layernorm_backward_input(dx.data(), s.dx2.data(), s.d_ln_1.data(), s.x.data(), s.ln_1_mean.data(),
                           s.ln_1_rstd.data(), w.ln_1_weight, n, c);
  return dx;
}

template <class T>
void TransformerBlock<T>::backward_weight(BlockSaved<T>& s, const LayerShape& shape) const {
  const int n = shape.rows();
  const int c = shape.c;
  const auto& g = grads_;
  linear_backward_weight(g.fc_proj_weight, g.fc_proj_bias, s.g.data(), s.dy.data(), n, 4 * c, c);
  linear_backward_weight(g.fc_weight, g.fc_bias, s.ln_2.data(), s.dh.data(), n, c, 4 * c);
  layernorm_backward_weight(g.ln_2_weight, g.ln_2_bias, s.d_ln_2.data(), s.x2.data(), s.ln_2_mean.data(),
                            s.ln_2_rstd.data(), n, c);
  linear_backward_weight(g.attn_proj_weight, g.attn_proj_bias, s.attn_y.data(), s.dx2.data(), n, c, c);
  linear_backward_weight(g.attn_weight, g.attn_bias, s.ln_1.data(), s.dqkv.data(), n, c, 3 * c);
  layernorm_backward_weight(g.ln_1_weight, g.ln_1_bias, s.d_ln_1.data(), s.x.data(), s.ln_1_mean.data(),
                            s.ln_1_rstd.data(), n, c);
  s = {};
}

template class TransformerBlock<float>;
template class TransformerBlock<double>;

}  // namespace pipeflow::nn
