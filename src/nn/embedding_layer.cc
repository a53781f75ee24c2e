#include "pipeflow/nn/embedding_layer.h"

#include <algorithm>
#include <type_traits>

#include "pipeflow/tensor/embedding.h"

namespace pipeflow::nn {

template <class T>
std::pair<int, int> EmbeddingLayer<T>::rows(const LayerShape& shape) const {
  const int count = shape.v / tensor_->size();
  return {tensor_->rank() * count, count};
}

template <class T>
BasicTensor<T> EmbeddingLayer<T>::forward(EmbeddingSaved<T>& saved, IntTensor tokens, const LayerShape& shape,
                                          Allocator allocator) const {
  auto x = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  if (tensor_ == nullptr) {
    embedding_forward(x.data(), tokens.data(), weights_.wte, weights_.wpe, shape.b, shape.t, shape.c);
  } else {
    const long c = shape.c;
    lookup_split(x.data(), tokens.data(), shape.rows(), shape);
    if (weights_.wpe != nullptr) {
      for (int i = 0; i < shape.rows(); ++i) {
        const T* position = weights_.wpe + (i % shape.t) * c;
        T* out = x.data() + i * c;
        for (long j = 0; j < c; ++j) out[j] += position[j];
      }
    }
  }
  saved.tokens = std::move(tokens);
  return x;
}

template <class T>
void EmbeddingLayer<T>::lookup_split(T* x, const std::int32_t* tokens, int n, const LayerShape& shape) const {
  if constexpr (std::is_same_v<T, float>) {
    const auto [first, count] = rows(shape);
    const long c = shape.c;
    for (int i = 0; i < n; ++i) {
      const int row = tokens[i] - first;
      T* out = x + i * c;
      if (row >= 0 && row < count) {
        std::copy_n(weights_.wte + row * c, c, out);
      } else {
        std::fill_n(out, c, T(0));
      }
    }
    tensor_->all_reduce_sum({x, static_cast<std::size_t>(n * c)}, "the tensor-parallel all-reduce of the embedding");
  }
}

template <class T>
void EmbeddingLayer<T>::backward_input(EmbeddingSaved<T>& saved, BasicTensor<T> dx) const {
  saved.dx = std::move(dx);
}

template <class T>
void EmbeddingLayer<T>::backward_weight(EmbeddingSaved<T>& saved, const LayerShape& shape) const {
  if (tensor_ == nullptr) {
    embedding_backward_weight(grads_.wte, grads_.wpe, saved.dx.data(), saved.tokens.data(), shape.b, shape.t,
                              shape.c);
    saved = {};
    return;
  }
  const auto [first, count] = rows(shape);
  const long c = shape.c;
  for (int i = 0; i < shape.rows(); ++i) {
    const T* d = saved.dx.data() + i * c;
    const int row = saved.tokens.data()[i] - first;
    if (row >= 0 && row < count) {
      T* g = grads_.wte + row * c;
      for (long j = 0; j < c; ++j) g[j] += d[j];
    }
    if (grads_.wpe != nullptr) {
      T* g = grads_.wpe + (i % shape.t) * c;
      for (long j = 0; j < c; ++j) g[j] += d[j];
    }
  }
  saved = {};
}

template class EmbeddingLayer<float>;
template class EmbeddingLayer<double>;

}  // namespace pipeflow::nn
