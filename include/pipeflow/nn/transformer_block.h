#pragma once

#include "pipeflow/nn/kv_cache.h"
#include "pipeflow/nn/layer_shape.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// One GPT-2 block, pre-LayerNorm:
//   x2 = x + attn.c_proj(attention(attn.c_attn(ln_1(x))))
//   y  = x2 + mlp.c_proj(gelu(mlp.c_fc(ln_2(x2))))
template <class P>  // const T* for weights, T* for their gradients
struct BlockParams {
  P ln_1_weight, ln_1_bias;      // [C], [C]
  P attn_weight, attn_bias;      // attn.c_attn [C, 3C], [3C]
  P attn_proj_weight, attn_proj_bias;  // attn.c_proj [C, C], [C]
  P ln_2_weight, ln_2_bias;      // [C], [C]
  P fc_weight, fc_bias;          // mlp.c_fc [C, 4C], [4C]
  P fc_proj_weight, fc_proj_bias;  // mlp.c_proj [4C, C], [C]
};

// What one micro-batch keeps. After forward (16C + 4 values per token plus
// NH·T attention probabilities): x, ln_1 (+ mean, rstd), qkv, probs, attn_y,
// x2, ln_2 (+ mean, rstd), h, g. After I (20C + 4 per token, all W needs):
// qkv, probs and h are gone; dy, dh, d_ln_2, dx2, dqkv, d_ln_1 are added.
// After W: nothing.
template <class T>
struct BlockSaved {
  BasicTensor<T> x;                             // [B, T, C] block input
  BasicTensor<T> ln_1, ln_1_mean, ln_1_rstd;    // [B, T, C], [B·T], [B·T]
  BasicTensor<T> qkv;                           // [B, T, 3C]
  BasicTensor<T> probs;                         // [B, NH, T, T]
  BasicTensor<T> attn_y;                        // [B, T, C] heads' outputs
  BasicTensor<T> x2;                            // [B, T, C] after the attention residual
  BasicTensor<T> ln_2, ln_2_mean, ln_2_rstd;    // [B, T, C], [B·T], [B·T]
  BasicTensor<T> h;                             // [B, T, 4C] before GELU
  BasicTensor<T> g;                             // [B, T, 4C] after GELU
  BasicTensor<T> dy;                            // [B, T, C] ∂L/∂y
  BasicTensor<T> dh;                            // [B, T, 4C] ∂L/∂h
  BasicTensor<T> d_ln_2;                        // [B, T, C]
  BasicTensor<T> dx2;                           // [B, T, C]
  BasicTensor<T> dqkv;                          // [B, T, 3C]
  BasicTensor<T> d_ln_1;                        // [B, T, C]
};

// Forward / I / W of a block. forward takes x into the saved state and returns
// y; backward_input takes dy, returns dx and keeps exactly what W needs;
// backward_weight adds every weight gradient (accumulating over
// micro-batches) and empties the state. Temporaries come from `allocator`.
//
// Thread safety: const methods; concurrent use needs distinct gradient buffers.
template <class T>
class TransformerBlock {
 public:
  TransformerBlock(BlockParams<const T*> weights, BlockParams<T*> grads) : weights_(weights), grads_(grads) {}

  BasicTensor<T> forward(BlockSaved<T>& saved, BasicTensor<T> x, const LayerShape& shape,
                         Allocator allocator) const;
  BasicTensor<T> backward_input(BlockSaved<T>& saved, BasicTensor<T> dy, const LayerShape& shape,
                                Allocator allocator) const;
  void backward_weight(BlockSaved<T>& saved, const LayerShape& shape) const;

  // Inference: x [1, R, C] holds the new rows of the sequences `rows` names;
  // their keys and values are written into `cache` (block `block`) at each
  // sequence's length, and each row attends to its sequence's cached
  // positions up to its own. Returns y [1, R, C]; keeps nothing else.
  // The caller checks that every sequence stays within the cache's context.
  BasicTensor<T> forward_cached(BasicTensor<T> x, BasicKvCache<T>& cache, int block, const SequenceRows& rows,
                                const LayerShape& shape, Allocator allocator) const;

  // Rearranges the four weight matrices into column panels (panels.h) in
  // place, through `writable`, the same memory as this block's weights (of
  // width c); forward_cached then multiplies by them. forward and the
  // backward must not be called afterwards (BasicStage::pack_for_inference
  // refuses them).
  void pack_weights(const BlockParams<T*>& writable, int c);

 private:
  // The parts of forward around attention, shared with forward_cached:
  // ln_1 and the qkv projection of saved.x; then from saved.attn_y the
  // projection and residual, ln_2 and the MLP with its residual.
  void project_qkv(BlockSaved<T>& saved, const LayerShape& shape, Allocator allocator) const;
  BasicTensor<T> project_and_mlp(BlockSaved<T>& saved, const LayerShape& shape, Allocator allocator) const;
  // linear_forward, or linear_forward_panels once the weights are packed.
  void linear(T* y, const T* x, const T* w, const T* b, const T* residual, int n, int in, int out) const;

  BlockParams<const T*> weights_;
  BlockParams<T*> grads_;
  bool panels_ = false;
};

extern template class TransformerBlock<float>;
extern template class TransformerBlock<double>;

}  // namespace pipeflow::nn
