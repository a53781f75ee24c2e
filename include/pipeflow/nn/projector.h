#pragma once

#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// LLaVA-1.5's projector from the vision encoder's width Dv to the language
// model's C: y = fc2(gelu(fc1(x))), fc1 [Dv, C], fc2 [C, C] (Conv1D layout
// [in, out]), both biased; GELU with GPT-2's tanh approximation.
template <class P>  // const T* for weights, T* for their gradients
struct ProjectorParams {
  P fc1_weight = nullptr, fc1_bias = nullptr;  // [Dv, C], [C]
  P fc2_weight = nullptr, fc2_bias = nullptr;  // [C, C], [C]
};

// What one micro-batch keeps. After forward: x, h (before GELU), g (after).
// After I: h has become ∂L/∂h (in place) and dy is added; W reads x, g, h
// and dy. After W: nothing.
template <class T>
struct ProjectorSaved {
  BasicTensor<T> x;   // [n, Dv]
  BasicTensor<T> h;   // [n, C]: fc1's output, then its gradient
  BasicTensor<T> g;   // [n, C]
  BasicTensor<T> dy;  // [n, C]
};

// Forward / I / W over n = B·N rows (the image tokens of a micro-batch).
//
// Thread safety: const methods; concurrent use needs distinct gradient buffers.
template <class T>
class Projector {
 public:
  Projector(int in, int out, ProjectorParams<const T*> weights, ProjectorParams<T*> grads)
      : in_(in), out_(out), weights_(weights), grads_(grads) {}

  // x [B, N, Dv] → y [B, N, C].
  BasicTensor<T> forward(ProjectorSaved<T>& saved, BasicTensor<T> x, Allocator allocator) const;
  // dy [B, N, C] → dx [B, N, Dv].
  BasicTensor<T> backward_input(ProjectorSaved<T>& saved, BasicTensor<T> dy, Allocator allocator) const;
  void backward_weight(ProjectorSaved<T>& saved) const;

 private:
  int in_, out_;
  ProjectorParams<const T*> weights_;
  ProjectorParams<T*> grads_;
};

extern template class Projector<float>;
extern template class Projector<double>;

}  // namespace pipeflow::nn
