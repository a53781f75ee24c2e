#include "pipeflow/nn/patch_embedding.h"

#include <utility>

#include "pipeflow/tensor/layernorm.h"
#include "pipeflow/tensor/linear.h"

namespace pipeflow::nn {

template <class T>
BasicTensor<T> PatchEmbedding<T>::forward(PatchEmbeddingSaved<T>& saved, const BasicTensor<T>& images,
                                          const LayerShape& shape, Allocator allocator) const {
  const PatchGeometry& g = geometry_;
  const int p = g.patch_size, side = g.patches_per_side(), size = g.image_size, f = g.patch_features();
  const int n = g.patches(), d = shape.c;
  saved.patches = BasicTensor<T>::uninitialized({shape.b, n, f}, allocator);
  T* out = saved.patches.data();
  for (int b = 0; b < shape.b; ++b) {
    for (int patch = 0; patch < n; ++patch) {
      const int row0 = patch / side * p, column0 = patch % side * p;
      for (int channel = 0; channel < g.channels; ++channel) {
        const T* plane = images.data() + (static_cast<long>(b) * g.channels + channel) * size * size;
        for (int dy = 0; dy < p; ++dy) {
          const T* pixels = plane + static_cast<long>(row0 + dy) * size + column0;
          for (int dx = 0; dx < p; ++dx) *out++ = pixels[dx];
        }
      }
    }
  }
  saved.e = BasicTensor<T>::uninitialized({shape.b, shape.t, d}, allocator);
  for (int b = 0; b < shape.b; ++b) {
    T* e = saved.e.data() + static_cast<long>(b) * shape.t * d;
    for (int i = 0; i < d; ++i) e[i] = weights_.class_embedding[i] + weights_.position[i];
    // The patches' positions 1 … N as the residual of the image's product.
    linear_forward(e + d, saved.patches.data() + static_cast<long>(b) * n * f, weights_.weight,
                   static_cast<const T*>(nullptr), weights_.position + d, n, f, d);
  }
  saved.mean = BasicTensor<T>::uninitialized({shape.rows()}, allocator);
  saved.rstd = BasicTensor<T>::uninitialized({shape.rows()}, allocator);
  auto x = BasicTensor<T>::uninitialized({shape.b, shape.t, d}, allocator);
  layernorm_forward(x.data(), saved.mean.data(), saved.rstd.data(), saved.e.data(), weights_.norm_weight,
                    weights_.norm_bias, shape.rows(), d);
  return x;
}

template <class T>
void PatchEmbedding<T>::backward_input(PatchEmbeddingSaved<T>& saved, BasicTensor<T> dx, const LayerShape& shape,
                                       Allocator allocator) const {
  saved.de = BasicTensor<T>::uninitialized(dx.shape(), allocator);
  layernorm_backward_input(saved.de.data(), static_cast<const T*>(nullptr), dx.data(), saved.e.data(),
                           saved.mean.data(), saved.rstd.data(), weights_.norm_weight, shape.rows(), shape.c);
  saved.dx = std::move(dx);
}

template <class T>
void PatchEmbedding<T>::backward_weight(PatchEmbeddingSaved<T>& saved, const LayerShape& shape) const {
  const int n = geometry_.patches(), f = geometry_.patch_features(), d = shape.c;
  layernorm_backward_weight(grads_.norm_weight, grads_.norm_bias, saved.dx.data(), saved.e.data(), saved.mean.data(),
                            saved.rstd.data(), shape.rows(), d);
  const long per_image = static_cast<long>(shape.t) * d;
  for (int b = 0; b < shape.b; ++b) {
    const T* de = saved.de.data() + b * per_image;
    linear_backward_weight(grads_.weight, static_cast<T*>(nullptr), saved.patches.data() + static_cast<long>(b) * n * f,
                           de + d, n, f, d);
    for (int i = 0; i < d; ++i) grads_.class_embedding[i] += de[i];
    for (long i = 0; i < per_image; ++i) grads_.position[i] += de[i];
  }
  saved = {};
}

template class PatchEmbedding<float>;
template class PatchEmbedding<double>;

}  // namespace pipeflow::nn
