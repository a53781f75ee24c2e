#pragma once

#include <array>
#include <optional>
#include <string_view>

#include "pipeflow/nn/half_stash.h"
#include "pipeflow/nn/kv_cache.h"
#include "pipeflow/nn/layer_shape.h"
#include "pipeflow/nn/tensor_group.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// One pre-norm decoder block, GPT-2's or Llama's:
//   GPT-2: x2 = x + attn.c_proj(attention(attn.c_attn(ln_1(x))))
//          y  = x2 + mlp.c_proj(gelu(mlp.c_fc(ln_2(x2))))
//   Llama: x2 = x + o_proj(attention(rope(q_proj, k_proj, v_proj of input_layernorm(x))))
//          y  = x2 + down_proj(silu(gate_proj(n)) ⊙ up_proj(n)), n = post_attention_layernorm(x2)
// with RMSNorm, grouped-query attention and no biases. A vision encoder's
// (ViT's) block is GPT-2's without the causal mask.
template <class P>  // const T* for weights, T* for their gradients
struct BlockParams {
  // Both: the two norms' gains [C] (Llama: input_layernorm, post_attention_layernorm).
  P ln_1_weight = nullptr, ln_2_weight = nullptr;
  // GPT-2 (Conv1D layout [in, out]); null in a Llama block.
  P ln_1_bias = nullptr, ln_2_bias = nullptr;        // [C]
  P attn_weight = nullptr, attn_bias = nullptr;      // attn.c_attn [C, 3C], [3C]
  P attn_proj_weight = nullptr, attn_proj_bias = nullptr;  // attn.c_proj [C, C], [C]
  P fc_weight = nullptr, fc_bias = nullptr;          // mlp.c_fc [C, 4C], [4C]
  P fc_proj_weight = nullptr, fc_proj_bias = nullptr;  // mlp.c_proj [4C, C], [C]
  // Llama (nn.Linear layout [out, in]); null in a GPT-2 block.
  P q_proj = nullptr, k_proj = nullptr, v_proj = nullptr;  // [NH·hs, C], [KV·hs, C], [KV·hs, C]
  P o_proj = nullptr;                                      // [C, C]
  P gate_proj = nullptr, up_proj = nullptr;                // [F, C], [F, C]
  P down_proj = nullptr;                                   // [C, F]
};

// What a Llama block needs beside its weights; the stage's blocks share the
// rotation tables.
template <class T>
struct LlamaConstants {
  int kv_heads = 0;
  int ffn = 0;
  double norm_eps = 1e-5;
  const T* rope_cos = nullptr;  // [context, hs/2] (tensor/rope.h)
  const T* rope_sin = nullptr;
};

// What one micro-batch keeps, W = (NH + 2·KV)·hs. GPT-2 after forward (16C +
// 4 values per token plus NH·T attention probabilities): x, ln_1 (+ mean,
// rstd), qkv, probs, attn_y, x2, ln_2 (+ mean, rstd), h, g. After I (20C + 4
// per token, all W needs): qkv, probs and h are gone; dy, dh, d_ln_2, dx2,
// dqkv, d_ln_1 are added. After W: nothing. Llama keeps the same tensors
// without the means, h and dh being gate | up [B, T, 2F] and g the gated
// product [B, T, F].
template <class T>
struct BlockSaved {
  BasicTensor<T> x;                             // [B, T, C] block input
  BasicTensor<T> ln_1, ln_1_mean, ln_1_rstd;    // [B, T, C], [B·T], [B·T]
  BasicTensor<T> qkv;                           // [B, T, W] (Llama: q and k rotated)
  BasicTensor<T> probs;                         // [B, NH, T, T]
  BasicTensor<T> attn_y;                        // [B, T, C] heads' outputs
  BasicTensor<T> x2;                            // [B, T, C] after the attention residual
  BasicTensor<T> ln_2, ln_2_mean, ln_2_rstd;    // [B, T, C], [B·T], [B·T]
  BasicTensor<T> h;                             // [B, T, 4C] before GELU; Llama [B, T, 2F] gate | up
  BasicTensor<T> g;                             // [B, T, 4C] after GELU; Llama [B, T, F]
  BasicTensor<T> dy;                            // [B, T, C] ∂L/∂y
  // Sequence parallelism: dy and dx2 gathered whole (x, x2, dy, dx2, the
  // norms' statistics, d_ln_1 and d_ln_2 hold the rank's positions; ln_1
  // and ln_2 are gathered whole in F).
  BasicTensor<T> dy_whole, dx2_whole;
  BasicTensor<T> dh;                            // ∂L/∂h
  BasicTensor<T> d_ln_2;                        // [B, T, C]
  BasicTensor<T> dx2;                           // [B, T, C]
  BasicTensor<T> dqkv;                          // [B, T, W] (Llama: before the rotation)
  BasicTensor<T> d_ln_1;                        // [B, T, C]

  // In bf16/fp16, between passes: every tensor above but the norms'
  // statistics, in 16 bits (half_stash.h).
  std::array<BasicTensor<T>*, 17> half_tensors() {
    return {&x, &ln_1, &qkv, &probs, &attn_y, &x2, &ln_2, &h, &g, &dy, &dy_whole, &dx2_whole, &dh, &d_ln_2, &dx2,
            &dqkv, &d_ln_1};
  }
  // Of those, what I reads other than as a GEMM operand (widened for it;
  // the others stay packed through it), what I reads only as GEMM operands
  // (qkv, the attention's: lent to bf16 GEMMs as its 16 bits, widened for
  // fp32 ones), and what W reads other than as a GEMM operand (widened for
  // it; a bf16 GEMM takes the others, the MLP's and the attention's inputs,
  // as their 16 bits): the norms' inputs and gradients, and the gradients
  // whose column sums are GPT-2's biases' (a Llama's W multiplies dy, dx2,
  // dh and dqkv only, but they are widened for it too).
  std::array<BasicTensor<T>*, 4> input_pass_reads() { return {&x, &probs, &x2, &h}; }
  std::array<BasicTensor<T>*, 1> input_pass_gemm_reads() { return {&qkv}; }
  std::array<BasicTensor<T>*, 8> weight_pass_reads() { return {&x, &x2, &dy, &dx2, &d_ln_2, &d_ln_1, &dh, &dqkv}; }
  HalfStash<T> stash;
};

// Whether a training pass rounds ahead, for its bf16 GEMMs and the stash
// that keeps what it saved (HalfStash::round_ahead): kYes only where the
// stage's GEMMs are bf16 and it packs the layer's saved tensors right after
// the pass (not in a checkpointed forward or a recompute, whose tensors are
// dropped or held whole through the segment).
enum class RoundAhead { kNo, kYes };

// Forward / I / W of a block. forward takes x into the saved state and returns
// y; backward_input takes dy, returns dx and keeps exactly what W needs;
// backward_weight adds every weight gradient (accumulating over
// micro-batches) and empties the state. Temporaries come from `allocator`.
//
// Split over a tensor-parallel group (Megatron-LM's scheme; the weights are
// the rank's parts, ParameterLayout): the rank computes its heads and its
// columns of the MLP; the attention's and the MLP's output products each end
// in an all-reduce before the bias and the residual, and in I the gradients
// of the two norms' outputs are all-reduced. W exchanges nothing, so the I/W
// split of the zero-bubble schedules holds. float blocks only.
//
// With sequence parallelism (Megatron-LM's, beside tensor parallelism) the
// block's input and output are the rank's positions of each sequence
// [B, T/size, C] (LayerShape keeps the whole T): the norms run on them, their
// outputs are all-gathered along the sequence before the column-parallel
// products, and the row-parallel products end in a reduce-scatter along the
// sequence instead of the all-reduce; I all-gathers dy and dx2 and
// reduce-scatters the norms' input gradients. The norms' and the
// row-parallel biases' gradients are then the rank's rows' part only: the
// engine sums them over the group.
//
// Thread safety: const methods; concurrent use needs distinct gradient buffers.
template <class T>
class TransformerBlock {
 public:
  // A GPT-2 block, or a Llama block when `llama` is given; split over
  // `tensor` when it is not null. Not `causal`: every position attends to
  // every other (a ViT block); forward_cached is then meaningless.
  TransformerBlock(BlockParams<const T*> weights, BlockParams<T*> grads,
                   std::optional<LlamaConstants<T>> llama = std::nullopt, TensorGroup* tensor = nullptr,
                   bool sequence_parallel = false, bool causal = true)
      : weights_(weights), grads_(grads), llama_(llama), tensor_(tensor),
        sequence_(tensor != nullptr && sequence_parallel), causal_(causal) {}

  BasicTensor<T> forward(BlockSaved<T>& saved, BasicTensor<T> x, const LayerShape& shape, Allocator allocator,
                         RoundAhead rounding = RoundAhead::kNo) const;
  BasicTensor<T> backward_input(BlockSaved<T>& saved, BasicTensor<T> dy, const LayerShape& shape,
                                Allocator allocator, RoundAhead rounding = RoundAhead::kNo) const;
  void backward_weight(BlockSaved<T>& saved, const LayerShape& shape) const;

  // Points the block at another copy of the same weights (a half-precision
  // stage widens each layer's weights into a window before its pass).
  void read_weights_from(BlockParams<const T*> weights) { weights_ = weights; }

  // Inference: x [1, R, C] holds the new rows of the sequences `rows` names;
  // their keys and values are written into `cache` (block `block`) at each
  // sequence's length, and each row attends to its sequence's cached
  // positions up to its own. Returns y [1, R, C]; keeps nothing else.
  // The caller checks that every sequence stays within the cache's context.
  BasicTensor<T> forward_cached(BasicTensor<T> x, BasicKvCache<T>& cache, int block, const SequenceRows& rows,
                                const LayerShape& shape, Allocator allocator) const;

  // GPT-2: rearranges the four weight matrices (this rank's parts) into
  // column panels (panels.h) in place, through `writable`, the same memory
  // as this block's weights (of the model's width and heads, shape.c and
  // shape.nh); forward_cached then multiplies by them. forward and
  // the backward must not be called afterwards (BasicStage::pack_for_inference
  // refuses them). A Llama block keeps its matrices (its decode goes through
  // sgemm).
  void pack_weights(const BlockParams<T*>& writable, const LayerShape& shape);

 private:
  // The parts of forward around attention, shared with forward_cached:
  // the first norm and the qkv projection of saved.x (not rotated); then from
  // saved.attn_y the output projection and residual, the second norm and the
  // MLP with its residual.
  // `ahead`: as round_ahead's.
  void project_qkv(BlockSaved<T>& saved, const LayerShape& shape, Allocator allocator, Bf16Operands* ahead) const;
  BasicTensor<T> project_and_mlp(BlockSaved<T>& saved, const LayerShape& shape, Allocator allocator,
                                 Bf16Operands* ahead) const;
  // With RoundAhead::kYes the training passes round each tensor they save
  // that their GEMMs read as soon as it is made (HalfStash::round_ahead),
  // lending its bits to `ahead`, which lives for the pass: the GEMMs read
  // those bits and the stash keeps them, where it would otherwise round the
  // tensor a second time, out of cache, after the pass. With `ahead` null
  // (kNo, forward_cached), nothing.
  void round_ahead(BlockSaved<T>& saved, BasicTensor<T>& tensor, Allocator allocator, Bf16Operands* ahead) const;
  // Llama: turns q and k of `rows` rows of qkv at positions first_position … .
  void rotate(T* qkv, int rows, int first_position, const LayerShape& shape) const;
  BasicTensor<T> llama_backward_input(BlockSaved<T>& saved, const LayerShape& shape, Allocator allocator,
                                      Bf16Operands* ahead) const;
  void llama_backward_weight(BlockSaved<T>& saved, const LayerShape& shape) const;
  // linear_forward, or linear_forward_panels once the weights are packed.
  void linear(T* y, const T* x, const T* w, const T* b, const T* residual, int n, int in, int out) const;
  // The widths this rank computes (the whole block's without a group): its
  // query and key/value heads, the head size, q's and k's (or v's) columns,
  // the packed q | k | v row, the MLP's hidden columns.
  struct Widths {
    int heads, kv_heads, hs, attn, kv, qkv, ffn;
  };
  Widths widths(const LayerShape& shape) const;
  // The rows this rank holds between layers: B·T, or B·T/size under
  // sequence parallelism.
  int local_rows(const LayerShape& shape) const;
  // The group's sum of `count` values in place (nothing without a group).
  void reduce(T* values, int count, std::string_view what) const;
  // The rank's rows made whole [B, T, C] (gathered along the sequence), or
  // `part` itself without sequence parallelism.
  BasicTensor<T> whole(BasicTensor<T> part, const LayerShape& shape, Allocator allocator,
                       std::string_view what) const;
  // A norm's input gradient from the group's partial sums over every row:
  // all-reduced, or reduce-scattered to the rank's rows.
  BasicTensor<T> input_gradient(BasicTensor<T> partial, const LayerShape& shape, Allocator allocator,
                                std::string_view what) const;
  // A row-parallel product's end: `partial` (every row; y itself without
  // sequence parallelism) summed over the group into y's rows, then + b
  // (unless null) + residual.
  void finish_row_parallel(T* partial, T* y, const T* b, const T* residual, const LayerShape& shape,
                           std::string_view what) const;
  // y = x · w + b + residual (GPT-2's layout), or x · wᵀ + residual
  // (Llama's), of out = C features, w being a row-parallel part when split.
  void row_linear(T* y, const T* x, const T* w, const T* b, const T* residual, int in, const LayerShape& shape,
                  Allocator allocator, std::string_view what) const;
  void row_projection(T* y, const T* x, const T* w, const T* residual, int in, const LayerShape& shape,
                      Allocator allocator, std::string_view what) const;

  BlockParams<const T*> weights_;
  BlockParams<T*> grads_;
  std::optional<LlamaConstants<T>> llama_;
  TensorGroup* tensor_ = nullptr;
  bool sequence_ = false;
  bool causal_ = true;
  bool panels_ = false;
};

extern template class TransformerBlock<float>;
extern template class TransformerBlock<double>;

}  // namespace pipeflow::nn
