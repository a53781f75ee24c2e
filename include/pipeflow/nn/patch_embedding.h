#pragma once

#include "pipeflow/nn/layer_shape.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// A vision encoder's first layer (ViT, Dosovitskiy et al. 2021): an image
// [B, channels, H, W] cut into N = (H/p)·(W/p) square patches of p × p
// pixels, row by row; each patch flattened channel by channel, then row by
// row, into F = channels·p·p values (a Conv2d of kernel and stride p with
// weight [D, channels, p, p], transposed), projected to the encoder's width
// D and added to its learned position:
//   x[b, n] = patch(b, n) · weight + bias + position[n].
template <class P>  // const T* for weights, T* for their gradients
struct PatchEmbeddingParams {
  P weight = nullptr;    // [F, D] (Conv1D layout [in, out])
  P bias = nullptr;      // [D]
  P position = nullptr;  // [N, D]
};

// The image's geometry: square images of `image_size` pixels, `channels`
// colour planes, patches of `patch_size`.
struct PatchGeometry {
  int image_size = 16;
  int patch_size = 4;
  int channels = 3;

  int patches_per_side() const { return image_size / patch_size; }
  int patches() const { return patches_per_side() * patches_per_side(); }
  int patch_features() const { return channels * patch_size * patch_size; }
};

// What one micro-batch keeps: the flattened patches (the product's input,
// for W) from forward, ∂L/∂x from I.
template <class T>
struct PatchEmbeddingSaved {
  BasicTensor<T> patches;  // [B, N, F]
  BasicTensor<T> dx;       // [B, N, D]
};

// Forward / I / W. The image is data: I computes no input gradient and only
// keeps ∂L/∂x; W adds the weight, bias and position gradients. shape.t is N,
// shape.c is D.
//
// Thread safety: const methods; concurrent use needs distinct gradient buffers.
template <class T>
class PatchEmbedding {
 public:
  PatchEmbedding(PatchGeometry geometry, PatchEmbeddingParams<const T*> weights, PatchEmbeddingParams<T*> grads)
      : geometry_(geometry), weights_(weights), grads_(grads) {}

  const PatchGeometry& geometry() const { return geometry_; }
  // images [B, channels, H, W]; returns x [B, N, D].
  BasicTensor<T> forward(PatchEmbeddingSaved<T>& saved, const BasicTensor<T>& images, const LayerShape& shape,
                         Allocator allocator) const;
  void backward_input(PatchEmbeddingSaved<T>& saved, BasicTensor<T> dx) const;
  void backward_weight(PatchEmbeddingSaved<T>& saved, const LayerShape& shape) const;

 private:
  PatchGeometry geometry_;
  PatchEmbeddingParams<const T*> weights_;
  PatchEmbeddingParams<T*> grads_;
};

extern template class PatchEmbedding<float>;
extern template class PatchEmbedding<double>;

}  // namespace pipeflow::nn
