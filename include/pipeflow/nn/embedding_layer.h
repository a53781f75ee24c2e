#pragma once

#include "pipeflow/nn/layer_shape.h"
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
// Thread safety: const methods; different saved states may be used from
// different threads only if the gradient buffers differ.
template <class T>
class EmbeddingLayer {
 public:
  EmbeddingLayer(EmbeddingParams<const T*> weights, EmbeddingParams<T*> grads)
      : weights_(weights), grads_(grads) {}

  BasicTensor<T> forward(EmbeddingSaved<T>& saved, IntTensor tokens, const LayerShape& shape,
                         Allocator allocator) const;
  void backward_input(EmbeddingSaved<T>& saved, BasicTensor<T> dx) const;
  void backward_weight(EmbeddingSaved<T>& saved, const LayerShape& shape) const;

 private:
  EmbeddingParams<const T*> weights_;
  EmbeddingParams<T*> grads_;
};

extern template class EmbeddingLayer<float>;
extern template class EmbeddingLayer<double>;

}  // namespace pipeflow::nn
