#include "pipeflow/nn/embedding_layer.h"

#include "pipeflow/tensor/embedding.h"

namespace pipeflow::nn {

template <class T>
BasicTensor<T> EmbeddingLayer<T>::forward(EmbeddingSaved<T>& saved, IntTensor tokens, const LayerShape& shape,
                                          Allocator allocator) const {
  auto x = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  embedding_forward(x.data(), tokens.data(), weights_.wte, weights_.wpe, shape.b, shape.t, shape.c);
  saved.tokens = std::move(tokens);
  return x;
}

template <class T>
void EmbeddingLayer<T>::backward_input(EmbeddingSaved<T>& saved, BasicTensor<T> dx) const {
  saved.dx = std::move(dx);
}

template <class T>
void EmbeddingLayer<T>::backward_weight(EmbeddingSaved<T>& saved, const LayerShape& shape) const {
  embedding_backward_weight(grads_.wte, grads_.wpe, saved.dx.data(), saved.tokens.data(), shape.b, shape.t,
                            shape.c);
  saved = {};
}

template class EmbeddingLayer<float>;
template class EmbeddingLayer<double>;

}  // namespace pipeflow::nn
