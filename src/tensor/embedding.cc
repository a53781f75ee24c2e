#include "pipeflow/tensor/embedding.h"

namespace pipeflow {

template <class T>
void embedding_forward(T* x, const std::int32_t* tokens, const T* wte, const T* wpe, int b, int t, int c) {
  for (int seq = 0; seq < b; ++seq) {
    for (int pos = 0; pos < t; ++pos) {
      const long row = static_cast<long>(seq) * t + pos;
      T* __restrict out = x + row * c;
      const T* __restrict token = wte + static_cast<long>(tokens[row]) * c;
      if (wpe == nullptr) {
        for (int j = 0; j < c; ++j) out[j] = token[j];
        continue;
      }
      const T* __restrict position = wpe + static_cast<long>(pos) * c;
      for (int j = 0; j < c; ++j) out[j] = token[j] + position[j];
    }
  }
}

template <class T>
void embedding_backward_weight(T* dwte, T* dwpe, const T* dx, const std::int32_t* tokens, int b, int t, int c) {
  for (int seq = 0; seq < b; ++seq) {
    for (int pos = 0; pos < t; ++pos) {
      const long row = static_cast<long>(seq) * t + pos;
      const T* __restrict grad = dx + row * c;
      T* __restrict token = dwte + static_cast<long>(tokens[row]) * c;
      if (dwpe == nullptr) {
        for (int j = 0; j < c; ++j) token[j] += grad[j];
        continue;
      }
      T* __restrict position = dwpe + static_cast<long>(pos) * c;
      for (int j = 0; j < c; ++j) {
        token[j] += grad[j];
        position[j] += grad[j];
      }
    }
  }
}

template void embedding_forward<float>(float*, const std::int32_t*, const float*, const float*, int, int, int);
template void embedding_forward<double>(double*, const std::int32_t*, const double*, const double*, int, int, int);
template void embedding_backward_weight<float>(float*, float*, const float*, const std::int32_t*, int, int, int);
template void embedding_backward_weight<double>(double*, double*, const double*, const std::int32_t*, int, int,
                                                int);

}  // namespace pipeflow
