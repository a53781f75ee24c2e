#include "pipeflow/tensor/rope.h"

#include <cmath>

namespace pipeflow {

template <class T>
void rope_table(T* cos_table, T* sin_table, const double* frequencies, int positions, int half) {
  for (int p = 0; p < positions; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * frequencies[i];
      cos_table[static_cast<long>(p) * half + i] = static_cast<T>(std::cos(angle));
      sin_table[static_cast<long>(p) * half + i] = static_cast<T>(std::sin(angle));
    }
  }
}

template <class T>
void rope_rotate(T* x, int ld, int rows, int first_position, int heads, int hs, const T* cos_table,
                 const T* sin_table, RopeDirection direction) {
  const int half = hs / 2;
  const T sign = direction == RopeDirection::kForward ? T(1) : T(-1);
  for (int r = 0; r < rows; ++r) {
    const long position = first_position + r;
    const T* __restrict c = cos_table + position * half;
    const T* __restrict s = sin_table + position * half;
    for (int head = 0; head < heads; ++head) {
      T* __restrict low = x + static_cast<long>(r) * ld + static_cast<long>(head) * hs;
      T* __restrict high = low + half;
      for (int i = 0; i < half; ++i) {
        const T a = low[i];
        const T b = high[i];
        const T turn = sign * s[i];
        low[i] = a * c[i] - b * turn;
        high[i] = b * c[i] + a * turn;
      }
    }
  }
}

#define PIPEFLOW_INSTANTIATE(T)                                                 \
  template void rope_table<T>(T*, T*, const double*, int, int);                \
  template void rope_rotate<T>(T*, int, int, int, int, int, const T*, const T*, \
                               RopeDirection);
PIPEFLOW_INSTANTIATE(float)
PIPEFLOW_INSTANTIATE(double)
#undef PIPEFLOW_INSTANTIATE

}  // namespace pipeflow
