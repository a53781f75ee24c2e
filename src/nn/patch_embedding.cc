#include "pipeflow/nn/patch_embedding.h"

#include <utility>

#include "pipeflow/tensor/linear.h"

namespace pipeflow::nn {

template <class T>
BasicTensor<T> PatchEmbedding<T>::forward(PatchEmbeddingSaved<T>& saved, const BasicTensor<T>& images,
                                          const LayerShape& shape, Allocator allocator) const {
  const PatchGeometry& g = geometry_;
  const int p = g.patch_size, side = g.patches_per_side(), size = g.image_size, f = g.patch_features();
  saved.patches = BasicTensor<T>::uninitialized({shape.b, shape.t, f}, allocator);
  T* out = saved.patches.data();
  for (int b = 0; b < shape.b; ++b) {
    for (int n = 0; n < shape.t; ++n) {
      const int row0 = n / side * p, column0 = n % side * p;
      for (int channel = 0; channel < g.channels; ++channel) {
        const T* plane = images.data() + (static_cast<long>(b) * g.channels + channel) * size * size;
        for (int dy = 0; dy < p; ++dy) {
          const T* pixels = plane + static_cast<long>(row0 + dy) * size + column0;
          for (int dx = 0; dx < p; ++dx) *out++ = pixels[dx];
        }
      }
    }
  }
  auto x = BasicTensor<T>::uninitialized({shape.b, shape.t, shape.c}, allocator);
  // The position table as the residual of each sequence's product.
  for (int b = 0; b < shape.b; ++b) {
    const long rows = static_cast<long>(b) * shape.t;
    linear_forward(x.data() + rows * shape.c, saved.patches.data() + rows * f, weights_.weight, weights_.bias,
                   weights_.position, shape.t, f, shape.c);
  }
  return x;
}

template <class T>
void PatchEmbedding<T>::backward_input(PatchEmbeddingSaved<T>& saved, BasicTensor<T> dx) const {
  saved.dx = std::move(dx);
}

template <class T>
void PatchEmbedding<T>::backward_weight(PatchEmbeddingSaved<T>& saved, const LayerShape& shape) const {
  const int f = geometry_.patch_features();
  linear_backward_weight(grads_.weight, grads_.bias, saved.patches.data(), saved.dx.data(), shape.rows(), f,
                         shape.c);
  const long per_image = static_cast<long>(shape.t) * shape.c;
  for (int b = 0; b < shape.b; ++b) {
    const T* d = saved.dx.data() + b * per_image;
    for (long i = 0; i < per_image; ++i) grads_.position[i] += d[i];
  }
  saved = {};
}

template class PatchEmbedding<float>;
template class PatchEmbedding<double>;

}  // namespace pipeflow::nn
