#pragma once

#include <utility>

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
  BasicTensor<T> dx;  // [B, T, C] ∂L/∂x, from I, for W
};

// Forward / I / W of the embedding. The embedding has no input gradient: I
// only keeps ∂L/∂x, and W scatters it into dwte and dwpe. Tokens must lie in
// [0, V) (the stage checks).
//
// Split over a tensor-parallel group (vocabulary-parallel, as Megatron-LM's
// VocabParallelEmbedding): wte holds the rank's rows [rank · V/size, …); a
// token's row comes from the rank that holds it (the others add zeros, so
// the all-reduced x has the bits of the whole table's), then wpe is added.
//
// Thread safety: const methods; different saved states may be used from
// different threads only if the gradient buffers differ.
template <class T>
class EmbeddingLayer {
 public:
  EmbeddingLayer(EmbeddingParams<const T*> weights, EmbeddingParams<T*> grads, TensorGroup* tensor = nullptr)
      : weights_(weights), grads_(grads), tensor_(tensor) {}

  BasicTensor<T> forward(EmbeddingSaved<T>& saved, IntTensor tokens, const LayerShape& shape,
                         Allocator allocator) const;
  // Split over a group: x[i] = wte[tokens[i]] for `rows` tokens, each row
  // from the rank holding it (all-reduced), without wpe.
  void lookup_split(T* x, const std::int32_t* tokens, int rows, const LayerShape& shape) const;
  void backward_input(EmbeddingSaved<T>& saved, BasicTensor<T> dx) const;
  void backward_weight(EmbeddingSaved<T>& saved, const LayerShape& shape) const;

 private:
  // The rank's first vocabulary row and how many it holds.
  std::pair<int, int> rows(const LayerShape& shape) const;

  EmbeddingParams<const T*> weights_;
  EmbeddingParams<T*> grads_;
  TensorGroup* tensor_ = nullptr;
};

extern template class EmbeddingLayer<float>;
extern template class EmbeddingLayer<double>;

}  // namespace pipeflow::nn
