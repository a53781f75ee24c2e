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
  if (tensor_ == nullptr) {
    auto x = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
    embedding_forward(x.data(), tokens.data(), weights_.wte, weights_.wpe, shape.b, shape.t, shape.c);
    saved.tokens = std::move(tokens);
    return x;
  }
  if (!sequence_) {
    auto x = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
    lookup_split(x.data(), tokens.data(), shape.rows(), shape);
    add_positions(x.data(), shape.b, shape.t, 0, shape.c);
    saved.tokens = std::move(tokens);
    return x;
  }
  const int ts = shape.t / tensor_->size();
  auto partial = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  auto x = BasicTensor<T>::uninitialized({shape.b, ts, shape.c}, allocator);
  lookup_rows(partial.data(), tokens.data(), shape.rows(), shape);
  if constexpr (std::is_same_v<T, float>) {
    scatter_sequence(*tensor_, partial.data(), x.data(), shape.b, ts, shape.c,
                     "the sequence-parallel reduce-scatter of the embedding");
  }
  add_positions(x.data(), shape.b, ts, tensor_->rank() * ts, shape.c);
  saved.tokens = std::move(tokens);
  return x;
}

template <class T>
void EmbeddingLayer<T>::lookup_rows(T* x, const std::int32_t* tokens, int n, const LayerShape& shape) const {
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
}

template <class T>
void EmbeddingLayer<T>::add_positions(T* x, int b, int t, int first, int c) const {
  if (weights_.wpe == nullptr) return;
  for (int seq = 0; seq < b; ++seq) {
    for (int p = 0; p < t; ++p) {
      const T* position = weights_.wpe + static_cast<long>(first + p) * c;
      T* out = x + (static_cast<long>(seq) * t + p) * c;
      for (int j = 0; j < c; ++j) out[j] += position[j];
    }
  }
}

template <class T>
void EmbeddingLayer<T>::lookup_split(T* x, const std::int32_t* tokens, int n, const LayerShape& shape) const {
  lookup_rows(x, tokens, n, shape);
  if constexpr (std::is_same_v<T, float>) {
    tensor_->all_reduce_sum({x, static_cast<std::size_t>(n) * static_cast<std::size_t>(shape.c)},
                            "the tensor-parallel all-reduce of the embedding");
  }
}

template <class T>
void EmbeddingLayer<T>::backward_input(EmbeddingSaved<T>& saved, BasicTensor<T> dx, const LayerShape& shape,
                                       Allocator allocator) const {
  saved.dx = std::move(dx);
  if (!sequence_) return;
  saved.dx_whole = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  if constexpr (std::is_same_v<T, float>) {
    gather_sequence(*tensor_, saved.dx.data(), saved.dx_whole.data(), shape.b, shape.t / tensor_->size(), shape.c,
                    "the sequence-parallel all-gather of the embedding's gradient");
  }
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
  const T* dx = sequence_ ? saved.dx_whole.data() : saved.dx.data();
  for (int i = 0; i < shape.rows(); ++i) {
    const T* d = dx + i * c;
    const int row = saved.tokens.data()[i] - first;
    if (row >= 0 && row < count) {
      T* g = grads_.wte + row * c;
      for (long j = 0; j < c; ++j) g[j] += d[j];
    }
  }
  if (grads_.wpe != nullptr) {  // the rank's positions under sequence parallelism
    const int ts = sequence_ ? shape.t / tensor_->size() : shape.t;
    const int first_position = sequence_ ? tensor_->rank() * ts : 0;
    for (int i = 0; i < shape.b * ts; ++i) {
      const T* d = saved.dx.data() + i * c;
      T* g = grads_.wpe + (first_position + i % ts) * c;
      for (long j = 0; j < c; ++j) g[j] += d[j];
    }
  }
  saved = {};
}

template class EmbeddingLayer<float>;
template class EmbeddingLayer<double>;

}  // namespace pipeflow::nn
