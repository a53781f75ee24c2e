#include "pipeflow/nn/transformer_block.h"

#include "pipeflow/tensor/attention.h"
#include "pipeflow/tensor/gelu.h"
#include "pipeflow/tensor/layernorm.h"
#include "pipeflow/tensor/linear.h"

namespace pipeflow::nn {

template <class T>
BasicTensor<T> TransformerBlock<T>::forward(BlockSaved<T>& s, BasicTensor<T> x, const LayerShape& shape,
                                            Allocator allocator) const {
  const int n = shape.rows();
  const int c = shape.c;
  const auto& w = weights_;
  auto make = [&](Shape dims) { return BasicTensor<T>::uninitialized(dims, allocator); };
  s.x = std::move(x);
  s.ln_1 = make({shape.b, shape.t, c});
  s.ln_1_mean = make({n});
  s.ln_1_rstd = make({n});
  layernorm_forward(s.ln_1.data(), s.ln_1_mean.data(), s.ln_1_rstd.data(), s.x.data(), w.ln_1_weight, w.ln_1_bias,
                    n, c);
  s.qkv = make({shape.b, shape.t, 3 * c});
  linear_forward(s.qkv.data(), s.ln_1.data(), w.attn_weight, w.attn_bias, static_cast<const T*>(nullptr), n, c,
                 3 * c);
  s.probs = make({shape.b, shape.nh, shape.t, shape.t});
  s.attn_y = make({shape.b, shape.t, c});
  attention_forward(s.attn_y.data(), s.probs.data(), s.qkv.data(), shape.b, shape.t, c, shape.nh);
  s.x2 = make({shape.b, shape.t, c});
  linear_forward(s.x2.data(), s.attn_y.data(), w.attn_proj_weight, w.attn_proj_bias, s.x.data(), n, c, c);
  s.ln_2 = make({shape.b, shape.t, c});
  s.ln_2_mean = make({n});
  s.ln_2_rstd = make({n});
  layernorm_forward(s.ln_2.data(), s.ln_2_mean.data(), s.ln_2_rstd.data(), s.x2.data(), w.ln_2_weight,
                    w.ln_2_bias, n, c);
  s.h = make({shape.b, shape.t, 4 * c});
  linear_forward(s.h.data(), s.ln_2.data(), w.fc_weight, w.fc_bias, static_cast<const T*>(nullptr), n, c, 4 * c);
  s.g = make({shape.b, shape.t, 4 * c});
  gelu_forward(s.g.data(), s.h.data(), n * 4 * c);
  auto y = make({shape.b, shape.t, c});
  linear_forward(y.data(), s.g.data(), w.fc_proj_weight, w.fc_proj_bias, s.x2.data(), n, 4 * c, c);
  return y;
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
