#pragma once

#include <array>
#include <utility>

#include "pipeflow/nn/half_stash.h"
#include "pipeflow/nn/layer_shape.h"
#include "pipeflow/nn/tensor_group.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// The first pipeline layer: x = wte[token] + wpe[position] (GPT-2), or
// embed_tokens[token] (Llama: wpe null, positions are rotations in the blocks).
template <class P>  // const T* for weights, T* for their gradients
struct EmbeddingParams {
  P wte;  // [V, C]
  P wpe;  // [context, C]
};

// What one micro-batch keeps between its passes.
template <class T>
struct EmbeddingSaved {
  IntTensor tokens;  // [B, T], from forward
  BasicTensor<T> dx;  // [B, T, C] ∂L/∂x, from I, for W (sequence parallelism: the rank's positions)
  BasicTensor<T> dx_whole;  // sequence parallelism: dx gathered whole, for wte's rows

  // In bf16/fp16, between I and W: dx in 16 bits.
  std::array<BasicTensor<T>*, 2> half_tensors() { return {&dx, &dx_whole}; }
  // I reads none of them (they are I's results); W reads both, not as GEMM
  // operands.
  std::array<BasicTensor<T>*, 0> input_pass_reads() { return {}; }
  std::array<BasicTensor<T>*, 0> input_pass_gemm_reads() { return {}; }
  std::array<BasicTensor<T>*, 2> weight_pass_reads() { return {&dx, &dx_whole}; }
  HalfStash<T> stash;
};

// Forward / I / W of the embedding. The embedding has no input gradient: I
// only keeps ∂L/∂x, and W scatters it into dwte and dwpe. Tokens must lie in
// [0, V) (the stage checks).
//
// Split over a tensor-parallel group (vocabulary-parallel, as Megatron-LM's
// VocabParallelEmbedding): wte holds the rank's rows [rank · V/size, …); a
// token's row comes from the rank that holds it (the others add zeros, so
// the all-reduced x has the bits of the whole table's), then wpe is added.
// With sequence parallelism the sums are reduce-scattered along the sequence
// instead (x is the rank's positions [B, T/size, C], plus their wpe rows),
// and I all-gathers ∂L/∂x for wte's rows; wpe's gradient is then the rank's
// positions' part (the engine sums it over the group).
//
// Thread safety: const methods; different saved states may be used from
// different threads only if the gradient buffers differ.
template <class T>
class EmbeddingLayer {
 public:
  EmbeddingLayer(EmbeddingParams<const T*> weights, EmbeddingParams<T*> grads, TensorGroup* tensor = nullptr,
                 bool sequence_parallel = false)
      : weights_(weights), grads_(grads), tensor_(tensor), sequence_(tensor != nullptr && sequence_parallel) {}

  BasicTensor<T> forward(EmbeddingSaved<T>& saved, IntTensor tokens, const LayerShape& shape,
                         Allocator allocator) const;
  // Split over a group: x[i] = wte[tokens[i]] for `rows` tokens, each row
  // from the rank holding it (all-reduced), without wpe.
  void lookup_split(T* x, const std::int32_t* tokens, int rows, const LayerShape& shape) const;
  void backward_input(EmbeddingSaved<T>& saved, BasicTensor<T> dx, const LayerShape& shape,
                      Allocator allocator) const;
  void backward_weight(EmbeddingSaved<T>& saved, const LayerShape& shape) const;
  // Points the layer at another copy of the same weights (as TransformerBlock's).
  void read_weights_from(EmbeddingParams<const T*> weights) { weights_ = weights; }

 private:
  // The rank's first vocabulary row and how many it holds.
  std::pair<int, int> rows(const LayerShape& shape) const;
  // x[i] = the rank's row of tokens[i], or zeros: its part of the group's sum.
  void lookup_rows(T* x, const std::int32_t* tokens, int n, const LayerShape& shape) const;
  // wpe's rows added: x holds positions first … first + t − 1 of each of b sequences.
  void add_positions(T* x, int b, int t, int first, int c) const;

  EmbeddingParams<const T*> weights_;
  EmbeddingParams<T*> grads_;
  TensorGroup* tensor_ = nullptr;
  bool sequence_ = false;
};

extern template class EmbeddingLayer<float>;
extern template class EmbeddingLayer<double>;

}  // namespace pipeflow::nn
