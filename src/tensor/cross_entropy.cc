#include "pipeflow/tensor/cross_entropy.h"

#include <cmath>

#include "vector_math.h"

namespace pipeflow {
template <class T>
double softmax_cross_entropy_forward(T* logits, const std::int32_t* targets, int n, int v) {
  double loss = 0;
  for (int row = 0; row < n; ++row) {
    T* __restrict l = logits + static_cast<long>(row) * v;
    const T top = detail::max(l, v);
    const T target_logit = l[targets[row]];
    const T total = detail::exponentiate(l, top, v);
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
