#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "pipeflow/nn/half_stash.h"
#include "pipeflow/nn/layer_shape.h"
#include "pipeflow/nn/tensor_group.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// The last pipeline layer: the final norm (GPT-2's LayerNorm ln_f, Llama's
// RMSNorm model.norm), logits = norm(x) · matrixᵀ, mean softmax cross-entropy
// over the B·T positions of the micro-batch.
template <class P>  // const T* for weights, T* for their gradients
struct HeadParams {
  P ln_f_weight = nullptr;  // [C]
  P ln_f_bias = nullptr;    // [C]; null with RMSNorm
  P matrix = nullptr;       // [V, C]: the tied token embedding, or Llama's lm_head.weight
};

// What one micro-batch keeps. After forward: x, ln_f (+ mean with LayerNorm, rstd), probs.
// After I: probs has become ∂L/∂logits (in place) and d_ln_f is added; W needs
// all of them. After W: nothing.
template <class T>
struct HeadSaved {
  // Sequence parallelism: x, the statistics and d_ln_f hold the rank's
  // positions, ln_f is gathered whole.
  BasicTensor<T> x;                          // [B, T, C]
  BasicTensor<T> ln_f, ln_f_mean, ln_f_rstd;  // [B, T, C], [B·T], [B·T]
  BasicTensor<T> probs;                      // [B, T, V] softmax, then ∂L/∂logits
  BasicTensor<T> d_ln_f;                     // [B, T, C]

  // In bf16/fp16, between passes: x, ln_f and d_ln_f in 16 bits (the
  // statistics and the probabilities stay fp32, as the loss does).
  std::array<BasicTensor<T>*, 3> half_tensors() { return {&x, &ln_f, &d_ln_f}; }
  // Of those, what I reads (ln_f stays packed through it; I's GEMM reads
  // none of them), and what W reads other than as a GEMM operand (ln_f: a
  // bf16 GEMM takes its 16 bits).
  std::array<BasicTensor<T>*, 1> input_pass_reads() { return {&x}; }
  std::array<BasicTensor<T>*, 0> input_pass_gemm_reads() { return {}; }
  std::array<BasicTensor<T>*, 2> weight_pass_reads() { return {&x, &d_ln_f}; }
  HalfStash<T> stash;
};

// Forward / I / W of the head. Targets must lie in [0, V) (the stage checks).
//
// Split over a tensor-parallel group (vocabulary-parallel, as Megatron-LM's
// output layer and vocab_parallel_cross_entropy): the matrix holds the
// rank's rows [rank · V/size, …), so each rank computes its columns of the
// logits; the cross-entropy all-reduces each row's largest logit, then its
// sum of exponentials with the target's logit (held by one rank), and I
// all-reduces the gradient of the norm's output; logits() all-gathers every
// rank's columns. With sequence parallelism x is the rank's positions: the
// norm's output is all-gathered along the sequence before the product and
// its gradient reduce-scattered (ln_f's gradient then the rank's part).
//
// Thread safety: const methods; concurrent use needs distinct gradient buffers.
template <class T>
class LmHead {
 public:
  // With LayerNorm; with RMSNorm of ε = rmsnorm_epsilon when it is given.
  LmHead(HeadParams<const T*> weights, HeadParams<T*> grads, std::optional<double> rmsnorm_epsilon = std::nullopt,
         TensorGroup* tensor = nullptr, bool sequence_parallel = false)
      : weights_(weights), grads_(grads), rmsnorm_epsilon_(rmsnorm_epsilon), tensor_(tensor),
        sequence_(tensor != nullptr && sequence_parallel) {}

  // Returns the mean cross-entropy of the micro-batch.
  double forward(HeadSaved<T>& saved, BasicTensor<T> x, const IntTensor& targets, const LayerShape& shape,
                 Allocator allocator) const;
  // The gradient starts at loss_scale · (mean loss): returns ∂(loss_scale · loss)/∂x.
  BasicTensor<T> backward_input(HeadSaved<T>& saved, const IntTensor& targets, double loss_scale,
                                const LayerShape& shape, Allocator allocator) const;
  void backward_weight(HeadSaved<T>& saved, const LayerShape& shape) const;

  // Inference: logits [B, T, V] of x, nothing saved.
  BasicTensor<T> logits(const BasicTensor<T>& x, const LayerShape& shape, Allocator allocator) const;
  // Points the head at another copy of the same weights (as TransformerBlock's).
  void read_weights_from(HeadParams<const T*> weights) { weights_ = weights; }

 private:
  // ln_f of saved.x's rows, made whole (gathered along the sequence).
  void normalise(HeadSaved<T>& saved, const LayerShape& shape, Allocator allocator) const;
  int local_rows(const LayerShape& shape) const { return sequence_ ? shape.rows() / tensor_->size() : shape.rows(); }
  // The vocabulary columns this rank computes, and the first one's index.
  int vocab(const LayerShape& shape) const { return tensor_ == nullptr ? shape.v : shape.v / tensor_->size(); }
  int first_column(const LayerShape& shape) const { return tensor_ == nullptr ? 0 : tensor_->rank() * vocab(shape); }
  // The split cross-entropy: logits [n, vocab] in place into the
  // probabilities; returns the rows' summed loss (the same on every rank).
  double vocab_parallel_forward(T* logits, const std::int32_t* targets, const LayerShape& shape) const;

  HeadParams<const T*> weights_;
  HeadParams<T*> grads_;
  std::optional<double> rmsnorm_epsilon_;
  TensorGroup* tensor_ = nullptr;
  bool sequence_ = false;
};

extern template class LmHead<float>;
extern template class LmHead<double>;

}  // namespace pipeflow::nn
