#include "pipeflow/tensor/cross_entropy.h"

#include <cmath>

#include "vector_math.h"

namespace pipeflow {

template <class T>
double softmax_cross_entropy_forward(T* probs, const T* logits, const std::int32_t* targets, int n, int v) {
  double loss = 0;
  for (int row = 0; row < n; ++row) {
    const T* l = logits + static_cast<long>(row) * v;
    T* p = probs + static_cast<long>(row) * v;
    const T top = detail::max(l, v);
    const T target_logit = l[targets[row]];
    for (int j = 0; j < v; ++j) p[j] = detail::exp(l[j] - top);
    const T total = detail::sum(p, v);
    const T inverse = T(1) / total;
    for (int j = 0; j < v; ++j) p[j] *= inverse;
    loss += std::log(static_cast<double>(total)) - static_cast<double>(target_logit - top);
  }
  return loss;
}

template <class T>
void softmax_cross_entropy_backward(T* dlogits, const T* probs, const std::int32_t* targets, T scale, int n, int v) {
  for (int row = 0; row < n; ++row) {
    const T* p = probs + static_cast<long>(row) * v;
    T* d = dlogits + static_cast<long>(row) * v;
    for (int j = 0; j < v; ++j) d[j] = scale * p[j];
    d[targets[row]] -= scale;
  }
}

template double softmax_cross_entropy_forward<float>(float*, const float*, const std::int32_t*, int, int);
template double softmax_cross_entropy_forward<double>(double*, const double*, const std::int32_t*, int, int);
template void softmax_cross_entropy_backward<float>(float*, const float*, const std::int32_t*, float, int, int);
template void softmax_cross_entropy_backward<double>(double*, const double*, const std::int32_t*, double, int, int);

}  // namespace pipeflow
