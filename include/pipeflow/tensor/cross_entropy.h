#pragma once

#include <cstdint>

namespace pipeflow {

// Softmax cross-entropy over a vocabulary of v logits per row, n rows, fused
// and in place (one buffer turns from logits into probabilities into
// gradients, so the loops vectorise without aliasing checks).

// logits[n, v] ← softmax(logits); returns the sum over rows of
// −log softmax(logits)[target], in double, accumulated in row order, computed
// as log Σ exp(l − max) − (l[target] − max), never as log(p).
template <class T>
double softmax_cross_entropy_forward(T* logits, const std::int32_t* targets, int n, int v);

// probs[n, v] ← scale · (probs − onehot(target)): ∂(scale · Σ loss)/∂logits.
// For the mean loss over n rows, scale = 1/n.
template <class T>
void softmax_cross_entropy_backward(T* probs, const std::int32_t* targets, T scale, int n, int v);

}  // namespace pipeflow
