#include "pipeflow/tensor/cross_entropy.h"

#include <cmath>

#include "vector_math.h"

namespace pipeflow {
namespace {

// Returns Σ exp(l − top) and leaves exp(l − top) in l.
template <class T>
PIPEFLOW_WIDE_VECTORS T exponentiate(T* __restrict l, T top, int v) {
  T partial[detail::kLanes] = {};
  int j = 0;
  for (; j + detail::kLanes <= v; j += detail::kLanes) {
    for (int lane = 0; lane < detail::kLanes; ++lane) {
      const T e = detail::exp(l[j + lane] - top);
      l[j + lane] = e;
      partial[lane] += e;
    }
  }
  T total = 0;
  for (int lane = 0; lane < detail::kLanes; ++lane) total += partial[lane];
  for (; j < v; ++j) {
    l[j] = detail::exp(l[j] - top);
    total += l[j];
  }
  return total;
}

}  // namespace

template <class T>
double softmax_cross_entropy_forward(T* logits, const std::int32_t* targets, int n, int v) {
  double loss = 0;
  for (int row = 0; row < n; ++row) {
    T* __restrict l = logits + static_cast<long>(row) * v;
    const T top = detail::max(l, v);
    const T target_logit = l[targets[row]];
    const T total = exponentiate(l, top, v);
    const T inverse = T(1) / total;
    for (int j = 0; j < v; ++j) l[j] *= inverse;
    loss += std::log(static_cast<double>(total)) - static_cast<double>(target_logit - top);
  }
  return loss;
}

template <class T>
void softmax_cross_entropy_backward(T* probs, const std::int32_t* targets, T scale, int n, int v) {
  for (int row = 0; row < n; ++row) {
    T* __restrict p = probs + static_cast<long>(row) * v;
    for (int j = 0; j < v; ++j) p[j] *= scale;
    p[targets[row]] -= scale;
  }
}

template double softmax_cross_entropy_forward<float>(float*, const std::int32_t*, int, int);
template double softmax_cross_entropy_forward<double>(double*, const std::int32_t*, int, int);
template void softmax_cross_entropy_backward<float>(float*, const std::int32_t*, float, int, int);
template void softmax_cross_entropy_backward<double>(double*, const std::int32_t*, double, int, int);

}  // namespace pipeflow
