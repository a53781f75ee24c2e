#include "pipeflow/nn/transformer_block.h"

#include <algorithm>
#include <type_traits>

#include "pipeflow/tensor/attention.h"
#include "pipeflow/tensor/gelu.h"
#include "pipeflow/tensor/layernorm.h"
#include "pipeflow/tensor/linear.h"
#include "pipeflow/tensor/panels.h"
#include "pipeflow/tensor/rmsnorm.h"
#include "pipeflow/tensor/rope.h"
#include "pipeflow/tensor/swiglu.h"

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
typename TransformerBlock<T>::Widths TransformerBlock<T>::widths(const LayerShape& shape) const {
  const int parts = tensor_ == nullptr ? 1 : tensor_->size();
  const int hs = shape.c / shape.nh;
  const int heads = shape.nh / parts;
  const int kv_heads = (llama_ ? llama_->kv_heads : shape.nh) / parts;
  return {.heads = heads,
          .kv_heads = kv_heads,
          .hs = hs,
          .attn = heads * hs,
          .kv = kv_heads * hs,
          .qkv = hs * (heads + 2 * kv_heads),
          .ffn = (llama_ ? llama_->ffn : 4 * shape.c) / parts};
}

template <class T>
int TransformerBlock<T>::local_rows(const LayerShape& shape) const {
  return sequence_ ? shape.rows() / tensor_->size() : shape.rows();
}

template <class T>
void TransformerBlock<T>::reduce(T* values, int count, std::string_view what) const {
  if (tensor_ == nullptr) return;
  if constexpr (std::is_same_v<T, float>) {
    tensor_->all_reduce_sum({values, static_cast<std::size_t>(count)}, what);
  }
}

template <class T>
BasicTensor<T> TransformerBlock<T>::whole(BasicTensor<T> part, const LayerShape& shape, Allocator allocator,
                                          std::string_view what) const {
  if (!sequence_) return part;
  auto gathered = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  if constexpr (std::is_same_v<T, float>) {
    gather_sequence(*tensor_, part.data(), gathered.data(), shape.b, shape.t / tensor_->size(), shape.c, what);
  }
  return gathered;
}

template <class T>
BasicTensor<T> TransformerBlock<T>::input_gradient(BasicTensor<T> partial, const LayerShape& shape,
                                                   Allocator allocator, std::string_view what) const {
  if (!sequence_) {
    reduce(partial.data(), static_cast<int>(partial.numel()), what);
    return partial;
  }
  const int ts = shape.t / tensor_->size();
  auto part = BasicTensor<T>::uninitialized({shape.b, ts, shape.c}, allocator);
  if constexpr (std::is_same_v<T, float>) {
    scatter_sequence(*tensor_, partial.data(), part.data(), shape.b, ts, shape.c, what);
  }
  return part;
}

// y (the rank's rows) = the group's sum of `partial` (every row) + b + residual.
template <class T>
void TransformerBlock<T>::finish_row_parallel(T* partial, T* y, const T* b, const T* residual,
                                              const LayerShape& shape, std::string_view what) const {
  const int out = shape.c;
  if (sequence_) {
    if constexpr (std::is_same_v<T, float>) {
      scatter_sequence(*tensor_, partial, y, shape.b, shape.t / tensor_->size(), out, what);
    }
  } else {
    reduce(y, shape.rows() * out, what);
  }
  for (int row = 0; row < local_rows(shape); ++row) {
    T* y_row = y + static_cast<long>(row) * out;
    const T* r_row = residual + static_cast<long>(row) * out;
    for (int j = 0; j < out; ++j) y_row[j] += (b == nullptr ? T(0) : b[j]) + r_row[j];
  }
}

template <class T>
void TransformerBlock<T>::row_linear(T* y, const T* x, const T* w, const T* b, const T* residual, int in,
                                     const LayerShape& shape, Allocator allocator, std::string_view what) const {
  const int n = shape.rows();
  if (tensor_ == nullptr) {
    linear(y, x, w, b, residual, n, in, shape.c);
    return;
  }
  BasicTensor<T> partial;
  if (sequence_) partial = BasicTensor<T>::uninitialized({n, shape.c}, allocator);
  T* into = sequence_ ? partial.data() : y;
  linear(into, x, w, static_cast<const T*>(nullptr), static_cast<const T*>(nullptr), n, in, shape.c);
  finish_row_parallel(into, y, b, residual, shape, what);
}

template <class T>
void TransformerBlock<T>::row_projection(T* y, const T* x, const T* w, const T* residual, int in,
                                         const LayerShape& shape, Allocator allocator, std::string_view what) const {
  const int n = shape.rows();
  if (tensor_ == nullptr) {
    projection_forward(y, shape.c, x, w, residual, n, in, shape.c);
    return;
  }
  BasicTensor<T> partial;
  if (sequence_) partial = BasicTensor<T>::uninitialized({n, shape.c}, allocator);
  T* into = sequence_ ? partial.data() : y;
  projection_forward(into, shape.c, x, w, static_cast<const T*>(nullptr), n, in, shape.c);
  finish_row_parallel(into, y, static_cast<const T*>(nullptr), residual, shape, what);
}

template <class T>
void TransformerBlock<T>::pack_weights(const BlockParams<T*>& writable, const LayerShape& shape) {
  if (panels_ || llama_) return;
  const int c = shape.c;
  const Widths d = widths(shape);
  pack_panels(writable.attn_weight, c, d.qkv);
  pack_panels(writable.attn_proj_weight, d.attn, c);
  pack_panels(writable.fc_weight, c, d.ffn);
  pack_panels(writable.fc_proj_weight, d.ffn, c);
  panels_ = true;
}


// The first norm over the rank's rows of saved.x, its output whole (gathered
// along the sequence under sequence parallelism), and the qkv projection.
template <class T>
void TransformerBlock<T>::project_qkv(BlockSaved<T>& s, const LayerShape& shape, Allocator allocator,
                                      Bf16Operands* ahead) const {
  const int n = shape.rows();
  const int rows = local_rows(shape);
  const int c = shape.c;
  const auto& w = weights_;
  auto make = [&](Shape dims) { return BasicTensor<T>::uninitialized(dims, allocator); };
  BasicTensor<T> normed = make({rows, c});
  s.ln_1_rstd = make({rows});
  const Widths d = widths(shape);
  if (llama_) {
    rmsnorm_forward(normed.data(), s.ln_1_rstd.data(), s.x.data(), w.ln_1_weight, llama_->norm_eps, rows, c);
  } else {
    s.ln_1_mean = make({rows});
    layernorm_forward(normed.data(), s.ln_1_mean.data(), s.ln_1_rstd.data(), s.x.data(), w.ln_1_weight, w.ln_1_bias,
                      rows, c);
  }
  s.ln_1 = whole(std::move(normed), shape, allocator, "the sequence-parallel all-gather of ln_1's output");
  s.ln_1.reshape({shape.b, shape.t, c});
  round_ahead(s, s.ln_1, allocator, ahead);
  s.qkv = make({shape.b, shape.t, d.qkv});
  if (llama_) {
    const T* none = nullptr;
    projection_forward(s.qkv.data(), d.qkv, s.ln_1.data(), w.q_proj, none, n, c, d.attn);
    projection_forward(s.qkv.data() + d.attn, d.qkv, s.ln_1.data(), w.k_proj, none, n, c, d.kv);
    projection_forward(s.qkv.data() + d.attn + d.kv, d.qkv, s.ln_1.data(), w.v_proj, none, n, c, d.kv);
    return;
  }
  linear(s.qkv.data(), s.ln_1.data(), w.attn_weight, w.attn_bias, static_cast<const T*>(nullptr), n, c, d.qkv);
}

template <class T>
BasicTensor<T> TransformerBlock<T>::project_and_mlp(BlockSaved<T>& s, const LayerShape& shape, Allocator allocator,
                                                    Bf16Operands* ahead) const {
  const int n = shape.rows();
  const int rows = local_rows(shape);
  const int c = shape.c;
  const int ts = rows / shape.b;  // the rank's positions of each sequence
  const auto& w = weights_;
  auto make = [&](Shape dims) { return BasicTensor<T>::uninitialized(dims, allocator); };
  const Widths d = widths(shape);
  const int f = d.ffn;
  s.x2 = make({shape.b, ts, c});
  BasicTensor<T> normed = make({rows, c});
  s.ln_2_rstd = make({rows});
  auto y = make({shape.b, ts, c});
  if (llama_) {
    const T* none = nullptr;
    row_projection(s.x2.data(), s.attn_y.data(), w.o_proj, s.x.data(), d.attn, shape, allocator,
                   "the tensor-parallel all-reduce of the attention's output");
    rmsnorm_forward(normed.data(), s.ln_2_rstd.data(), s.x2.data(), w.ln_2_weight, llama_->norm_eps, rows, c);
    s.ln_2 = whole(std::move(normed), shape, allocator, "the sequence-parallel all-gather of ln_2's output");
    round_ahead(s, s.ln_2, allocator, ahead);
    s.h = make({shape.b, shape.t, 2 * f});
    projection_forward(s.h.data(), 2 * f, s.ln_2.data(), w.gate_proj, none, n, c, f);
    projection_forward(s.h.data() + f, 2 * f, s.ln_2.data(), w.up_proj, none, n, c, f);
    s.g = make({shape.b, shape.t, f});
    swiglu_forward(s.g.data(), s.h.data(), n, f);
    round_ahead(s, s.g, allocator, ahead);
    row_projection(y.data(), s.g.data(), w.down_proj, s.x2.data(), f, shape, allocator,
                   "the tensor-parallel all-reduce of the MLP's output");
    return y;
  }
  row_linear(s.x2.data(), s.attn_y.data(), w.attn_proj_weight, w.attn_proj_bias, s.x.data(), d.attn, shape, allocator,
             "the tensor-parallel all-reduce of the attention's output");
  s.ln_2_mean = make({rows});
  layernorm_forward(normed.data(), s.ln_2_mean.data(), s.ln_2_rstd.data(), s.x2.data(), w.ln_2_weight, w.ln_2_bias,
                    rows, c);
  s.ln_2 = whole(std::move(normed), shape, allocator, "the sequence-parallel all-gather of ln_2's output");
  round_ahead(s, s.ln_2, allocator, ahead);
  s.h = make({shape.b, shape.t, f});
  linear(s.h.data(), s.ln_2.data(), w.fc_weight, w.fc_bias, static_cast<const T*>(nullptr), n, c, f);
  s.g = make({shape.b, shape.t, f});
  gelu_forward(s.g.data(), s.h.data(), n * f);
  round_ahead(s, s.g, allocator, ahead);
  row_linear(y.data(), s.g.data(), w.fc_proj_weight, w.fc_proj_bias, s.x2.data(), f, shape, allocator,
             "the tensor-parallel all-reduce of the MLP's output");
  return y;
}

template <class T>
BasicTensor<T> TransformerBlock<T>::forward(BlockSaved<T>& s, BasicTensor<T> x, const LayerShape& shape,
                                            Allocator allocator, RoundAhead rounding) const {
  const Widths d = widths(shape);
  Bf16Operands operands;
  Bf16Operands* ahead = rounding == RoundAhead::kYes ? &operands : nullptr;
  s.x = std::move(x);
  project_qkv(s, shape, allocator, ahead);
  if (llama_) {
    for (int seq = 0; seq < shape.b; ++seq) {
      rotate(s.qkv.data() + static_cast<long>(seq) * shape.t * d.qkv, shape.t, 0, shape);
    }
  }
  round_ahead(s, s.qkv, allocator, ahead);
  s.probs = BasicTensor<T>::uninitialized({shape.b, d.heads, shape.t, shape.t}, allocator);
  s.attn_y = BasicTensor<T>::uninitialized({shape.b, shape.t, d.attn}, allocator);
  attention_forward(s.attn_y.data(), s.probs.data(), s.qkv.data(), shape.b, shape.t, d.attn, d.heads, d.kv_heads,
                    causal_);
  round_ahead(s, s.attn_y, allocator, ahead);
  return project_and_mlp(s, shape, allocator, ahead);
}

template <class T>
void TransformerBlock<T>::round_ahead(BlockSaved<T>& s, BasicTensor<T>& tensor, Allocator allocator,
                                      Bf16Operands* ahead) const {
  if (ahead != nullptr) s.stash.round_ahead(s.half_tensors(), tensor, allocator, *ahead);
}

template <class T>
void TransformerBlock<T>::rotate(T* qkv, int rows, int first_position, const LayerShape& shape) const {
  const Widths d = widths(shape);
  rope_rotate(qkv, d.qkv, rows, first_position, d.heads, d.hs, llama_->rope_cos, llama_->rope_sin,
              RopeDirection::kForward);
  rope_rotate(qkv + d.attn, d.qkv, rows, first_position, d.kv_heads, d.hs, llama_->rope_cos, llama_->rope_sin,
              RopeDirection::kForward);
}

template <class T>
BasicTensor<T> TransformerBlock<T>::forward_cached(BasicTensor<T> x, BasicKvCache<T>& cache, int block,
                                                   const SequenceRows& rows, const LayerShape& shape,
                                                   Allocator allocator) const {
  const Widths d = widths(shape);
  const int a = d.attn;
  const int width = d.qkv;
  const int kv = d.kv;
  BlockSaved<T> s;
  s.x = std::move(x);
  project_qkv(s, shape, allocator, nullptr);
  s.attn_y = BasicTensor<T>::uninitialized({shape.b, shape.t, a}, allocator);
  int row = 0;
  for (std::size_t i = 0; i < rows.counts.size(); ++i) {
    const int sequence = rows.first + static_cast<int>(i);
    const int count = rows.counts[i];
    const int past = cache.length(sequence);
    T* keys = cache.keys(block, sequence);
    T* values = cache.values(block, sequence);
    T* qkv = s.qkv.data() + static_cast<long>(row) * width;
    if (llama_) rotate(qkv, count, past, shape);
    for (int r = 0; r < count; ++r) {
      const T* k = qkv + static_cast<long>(r) * width + a;
      std::copy(k, k + kv, keys + static_cast<long>(past + r) * kv);
      std::copy(k + kv, k + 2 * kv, values + static_cast<long>(past + r) * kv);
    }
    auto scores = BasicTensor<T>::uninitialized({count, past + count}, allocator);
    attention_forward_cached(s.attn_y.data() + static_cast<long>(row) * a, scores.data(), qkv, width, keys, values,
                             count, past, a, d.heads, d.kv_heads);
    row += count;
  }
  return project_and_mlp(s, shape, allocator, nullptr);
}

template <class T>
BasicTensor<T> TransformerBlock<T>::backward_input(BlockSaved<T>& s, BasicTensor<T> dy, const LayerShape& shape,
                                                   Allocator allocator, RoundAhead rounding) const {
  const int n = shape.rows();
  const int rows = local_rows(shape);
  const int c = shape.c;
  const auto& w = weights_;
  auto make = [&](Shape dims) { return BasicTensor<T>::uninitialized(dims, allocator); };
  Bf16Operands operands;
  Bf16Operands* ahead = rounding == RoundAhead::kYes ? &operands : nullptr;
  s.dy = std::move(dy);
  if (sequence_) s.dy_whole = whole(s.dy.clone(allocator), shape, allocator, "the sequence-parallel all-gather of dy");
  round_ahead(s, sequence_ ? s.dy_whole : s.dy, allocator, ahead);
  if (llama_) return llama_backward_input(s, shape, allocator, ahead);
  const Widths d = widths(shape);
  const int f = d.ffn;
  const T* dy_whole = sequence_ ? s.dy_whole.data() : s.dy.data();
  s.dh = make({shape.b, shape.t, f});
  linear_backward_input(s.dh.data(), dy_whole, w.fc_proj_weight, n, f, c);
  gelu_backward(s.dh.data(), s.h.data(), n * f);
  s.h.reset();
  round_ahead(s, s.dh, allocator, ahead);
  {
    auto partial = make({n, c});
    linear_backward_input(partial.data(), s.dh.data(), w.fc_weight, n, c, f);
    s.d_ln_2 = input_gradient(std::move(partial), shape, allocator,
                              "the tensor-parallel all-reduce of the MLP's input gradient");
  }
  s.dx2 = make({rows, c});
  layernorm_backward_input(s.dx2.data(), s.dy.data(), s.d_ln_2.data(), s.x2.data(), s.ln_2_mean.data(),
                           s.ln_2_rstd.data(), w.ln_2_weight, rows, c);
  if (sequence_) {
    s.dx2_whole = whole(s.dx2.clone(allocator), shape, allocator, "the sequence-parallel all-gather of dx2");
  }
  {
    auto d_attn_y = make({shape.b, shape.t, d.attn});
    linear_backward_input(d_attn_y.data(), sequence_ ? s.dx2_whole.data() : s.dx2.data(), w.attn_proj_weight, n,
                          d.attn, c);
    auto scratch = make({attention_backward_scratch(shape.b, shape.t, d.heads)});
    s.dqkv = make({shape.b, shape.t, d.qkv});
    attention_backward(s.dqkv.data(), scratch.data(), scratch.numel(), d_attn_y.data(), s.probs.data(),
                       s.qkv.data(), shape.b, shape.t, d.attn, d.heads, d.heads, causal_);
  }
  s.probs.reset();
  s.qkv.reset();
  round_ahead(s, s.dqkv, allocator, ahead);
  {
    auto partial = make({n, c});
    linear_backward_input(partial.data(), s.dqkv.data(), w.attn_weight, n, c, d.qkv);
    s.d_ln_1 = input_gradient(std::move(partial), shape, allocator,
                              "the tensor-parallel all-reduce of the attention's input gradient");
  }
  auto dx = make({shape.b, rows / shape.b, c});
  layernorm_backward_input(dx.data(), s.dx2.data(), s.d_ln_1.data(), s.x.data(), s.ln_1_mean.data(),
                           s.ln_1_rstd.data(), w.ln_1_weight, rows, c);
  return dx;
}

// Under sequence parallelism the weight matrices take the whole gradients
// (gathered in I), the biases after a row-parallel product and the norms
// the rank's rows: their gradients are partial sums, which the engine adds
// over the group before the update.
template <class T>
void TransformerBlock<T>::backward_weight(BlockSaved<T>& s, const LayerShape& shape) const {
  const int n = shape.rows();
  const int rows = local_rows(shape);
  const int c = shape.c;
  const auto& g = grads_;
  if (llama_) {
    llama_backward_weight(s, shape);
    return;
  }
  const Widths d = widths(shape);
  const T* dy_whole = sequence_ ? s.dy_whole.data() : s.dy.data();
  const T* dx2_whole = sequence_ ? s.dx2_whole.data() : s.dx2.data();
  linear_backward_weight(g.fc_proj_weight, static_cast<T*>(nullptr), s.g.data(), dy_whole, n, d.ffn, c);
  add_column_sums(g.fc_proj_bias, s.dy.data(), rows, c);
  linear_backward_weight(g.fc_weight, g.fc_bias, s.ln_2.data(), s.dh.data(), n, c, d.ffn);
  layernorm_backward_weight(g.ln_2_weight, g.ln_2_bias, s.d_ln_2.data(), s.x2.data(), s.ln_2_mean.data(),
                            s.ln_2_rstd.data(), rows, c);
  linear_backward_weight(g.attn_proj_weight, static_cast<T*>(nullptr), s.attn_y.data(), dx2_whole, n, d.attn, c);
  add_column_sums(g.attn_proj_bias, s.dx2.data(), rows, c);
  linear_backward_weight(g.attn_weight, g.attn_bias, s.ln_1.data(), s.dqkv.data(), n, c, d.qkv);
  layernorm_backward_weight(g.ln_1_weight, g.ln_1_bias, s.d_ln_1.data(), s.x.data(), s.ln_1_mean.data(),
                            s.ln_1_rstd.data(), rows, c);
  s = {};
}

// Llama's I: the same order as GPT-2's, through RMSNorm, SwiGLU and the
// rotation (undone on ∂q and ∂k before their projections' backward).
template <class T>
BasicTensor<T> TransformerBlock<T>::llama_backward_input(BlockSaved<T>& s, const LayerShape& shape,
                                                         Allocator allocator, Bf16Operands* ahead) const {
  const int n = shape.rows();
  const int rows = local_rows(shape);
  const int c = shape.c;
  const Widths d = widths(shape);
  const int f = d.ffn;
  const int kv = d.kv;
  const int width = d.qkv;
  const auto& w = weights_;
  auto make = [&](Shape dims) { return BasicTensor<T>::uninitialized(dims, allocator); };
  {
    auto da = make({shape.b, shape.t, f});
    projection_backward_input(da.data(), sequence_ ? s.dy_whole.data() : s.dy.data(), c, w.down_proj, n, f, c, false);
    s.dh = make({shape.b, shape.t, 2 * f});
    swiglu_backward(s.dh.data(), da.data(), s.h.data(), n, f);
  }
  s.h.reset();
  round_ahead(s, s.dh, allocator, ahead);
  {
    auto partial = make({n, c});
    projection_backward_input(partial.data(), s.dh.data(), 2 * f, w.gate_proj, n, c, f, false);
    projection_backward_input(partial.data(), s.dh.data() + f, 2 * f, w.up_proj, n, c, f, true);
    s.d_ln_2 = input_gradient(std::move(partial), shape, allocator,
                              "the tensor-parallel all-reduce of the MLP's input gradient");
  }
  s.dx2 = make({rows, c});
  rmsnorm_backward_input(s.dx2.data(), s.dy.data(), s.d_ln_2.data(), s.x2.data(), s.ln_2_rstd.data(), w.ln_2_weight,
                         rows, c);
  if (sequence_) {
    s.dx2_whole = whole(s.dx2.clone(allocator), shape, allocator, "the sequence-parallel all-gather of dx2");
  }
  {
    auto d_attn_y = make({shape.b, shape.t, d.attn});
    projection_backward_input(d_attn_y.data(), sequence_ ? s.dx2_whole.data() : s.dx2.data(), c, w.o_proj, n, d.attn,
                              c, false);
    auto scratch = make({attention_backward_scratch(shape.b, shape.t, d.heads)});
    s.dqkv = make({shape.b, shape.t, width});
    attention_backward(s.dqkv.data(), scratch.data(), scratch.numel(), d_attn_y.data(), s.probs.data(),
                       s.qkv.data(), shape.b, shape.t, d.attn, d.heads, d.kv_heads, causal_);
  }
  s.probs.reset();
  s.qkv.reset();
  for (int seq = 0; seq < shape.b; ++seq) {
    T* dqkv = s.dqkv.data() + static_cast<long>(seq) * shape.t * width;
    rope_rotate(dqkv, width, shape.t, 0, d.heads, d.hs, llama_->rope_cos, llama_->rope_sin, RopeDirection::kInverse);
    rope_rotate(dqkv + d.attn, width, shape.t, 0, d.kv_heads, d.hs, llama_->rope_cos, llama_->rope_sin,
                RopeDirection::kInverse);
  }
  round_ahead(s, s.dqkv, allocator, ahead);
  {
    auto partial = make({n, c});
    projection_backward_input(partial.data(), s.dqkv.data(), width, w.q_proj, n, c, d.attn, false);
    projection_backward_input(partial.data(), s.dqkv.data() + d.attn, width, w.k_proj, n, c, kv, true);
    projection_backward_input(partial.data(), s.dqkv.data() + d.attn + kv, width, w.v_proj, n, c, kv, true);
    s.d_ln_1 = input_gradient(std::move(partial), shape, allocator,
                              "the tensor-parallel all-reduce of the attention's input gradient");
  }
  auto dx = make({shape.b, rows / shape.b, c});
  rmsnorm_backward_input(dx.data(), s.dx2.data(), s.d_ln_1.data(), s.x.data(), s.ln_1_rstd.data(), w.ln_1_weight,
                         rows, c);
  return dx;
}

template <class T>
void TransformerBlock<T>::llama_backward_weight(BlockSaved<T>& s, const LayerShape& shape) const {
  const int n = shape.rows();
  const int rows = local_rows(shape);
  const int c = shape.c;
  const Widths d = widths(shape);
  const int f = d.ffn;
  const int kv = d.kv;
  const int width = d.qkv;
  const auto& g = grads_;
  projection_backward_weight(g.down_proj, s.g.data(), sequence_ ? s.dy_whole.data() : s.dy.data(), c, n, f, c);
  projection_backward_weight(g.gate_proj, s.ln_2.data(), s.dh.data(), 2 * f, n, c, f);
  projection_backward_weight(g.up_proj, s.ln_2.data(), s.dh.data() + f, 2 * f, n, c, f);
  rmsnorm_backward_weight(g.ln_2_weight, s.d_ln_2.data(), s.x2.data(), s.ln_2_rstd.data(), rows, c);
  projection_backward_weight(g.o_proj, s.attn_y.data(), sequence_ ? s.dx2_whole.data() : s.dx2.data(), c, n, d.attn,
                             c);
  projection_backward_weight(g.q_proj, s.ln_1.data(), s.dqkv.data(), width, n, c, d.attn);
  projection_backward_weight(g.k_proj, s.ln_1.data(), s.dqkv.data() + d.attn, width, n, c, kv);
  projection_backward_weight(g.v_proj, s.ln_1.data(), s.dqkv.data() + d.attn + kv, width, n, c, kv);
  rmsnorm_backward_weight(g.ln_1_weight, s.d_ln_1.data(), s.x.data(), s.ln_1_rstd.data(), rows, c);
  s = {};
}

template class TransformerBlock<float>;
template class TransformerBlock<double>;

}  // namespace pipeflow::nn
