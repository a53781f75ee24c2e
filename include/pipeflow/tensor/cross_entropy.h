#pragma once

#include <cstdint>

namespace pipeflow {

// Softmax cross-entropy over a vocabulary of v logits per row, n rows, fused.

// probs[n, v] = softmax(logits) (probs may be logits: in place); returns the
// sum over rows of −log softmax(logits)[target], in double, accumulated in row
// order. Computed as log Σ exp(l − max) − (l[target] − max), never log(p).
template <class T>
double softmax_cross_entropy_forward(T* probs, const T* logits, const std::int32_t* targets, int n, int v);

// dlogits = scale · (probs − onehot(target)); dlogits may be probs. For the
// mean loss over n rows, scale = 1/n.
template <class T>
void softmax_cross_entropy_backward(T* dlogits, const T* probs, const std::int32_t* targets, T scale, int n, int v);

}  // namespace pipeflow
