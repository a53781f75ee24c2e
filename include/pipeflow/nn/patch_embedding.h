#pragma once

#include "pipeflow/nn/layer_shape.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// A CLIP vision tower's embeddings (Radford et al. 2021; transformers'
// CLIPVisionEmbeddings and the pre_layrnorm after them): an image
// [B, channels, H, W] cut into N = (H/p)·(W/p) square patches of p × p
// pixels, row by row; each patch flattened channel by channel, then row by
// row, into F = channels·p·p values and projected to the encoder's width D
// without a bias (a Conv2d of kernel and stride p, weight [D, channels, p, p]
// transposed, bias=False as CLIP's); a learned class embedding takes position
// 0 in front of the patches, each of the N + 1 positions adds its learned
// row, and CLIP's pre-LayerNorm (GPT-2's LayerNorm, eps 1e-5) follows:
//   e[b, 0]     = class_embedding + position[0]
//   e[b, 1 + n] = patch(b, n) · weight + position[1 + n]
//   x[b, t]     = LayerNorm(e[b, t]) · norm_weight + norm_bias
template <class P>  // const T* for weights, T* for their gradients
struct PatchEmbeddingParams {
  P weight = nullptr;           // [F, D] (Conv1D layout [in, out])
  P class_embedding = nullptr;  // [D]
  P position = nullptr;         // [N + 1, D]
  P norm_weight = nullptr;      // [D]
  P norm_bias = nullptr;        // [D]
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

// What one micro-batch keeps: from forward the flattened patches (the
// product's input, for W), the norm's input e and its statistics; from I
// ∂L/∂x and ∂L/∂e.
template <class T>
struct PatchEmbeddingSaved {
  BasicTensor<T> patches;     // [B, N, F]
  BasicTensor<T> e;           // [B, N + 1, D]
  BasicTensor<T> mean, rstd;  // [B·(N + 1)]
  BasicTensor<T> dx;          // [B, N + 1, D]
  BasicTensor<T> de;          // [B, N + 1, D]
};

// Forward / I / W. The image is data: I computes no input gradient, only
// ∂L/∂e through the norm; W adds the weight, class, position and norm
// gradients. shape.t is N + 1, shape.c is D.
//
// Thread safety: const methods; concurrent use needs distinct gradient buffers.
template <class T>
class PatchEmbedding {
 public:
  PatchEmbedding(PatchGeometry geometry, PatchEmbeddingParams<const T*> weights, PatchEmbeddingParams<T*> grads)
      : geometry_(geometry), weights_(weights), grads_(grads) {}

  const PatchGeometry& geometry() const { return geometry_; }
  // images [B, channels, H, W]; returns x [B, N + 1, D], the class token first.
  BasicTensor<T> forward(PatchEmbeddingSaved<T>& saved, const BasicTensor<T>& images, const LayerShape& shape,
                         Allocator allocator) const;
  void backward_input(PatchEmbeddingSaved<T>& saved, BasicTensor<T> dx, const LayerShape& shape,
                      Allocator allocator) const;
  void backward_weight(PatchEmbeddingSaved<T>& saved, const LayerShape& shape) const;

 private:
  PatchGeometry geometry_;
  PatchEmbeddingParams<const T*> weights_;
  PatchEmbeddingParams<T*> grads_;
};

extern template class PatchEmbedding<float>;
extern template class PatchEmbedding<double>;

}  // namespace pipeflow::nn
