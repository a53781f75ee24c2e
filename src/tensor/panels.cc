#include "pipeflow/tensor/panels.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace pipeflow {
namespace {

// One vector register of T (GCC's vector extension, which Clang shares):
// arithmetic on it is elementwise, and a scalar operand is broadcast.
constexpr int kVectorBytes = kPanelVectorBytes;
template <class T>
struct Vector;
template <>
struct Vector<float> {
  typedef float type __attribute__((vector_size(kVectorBytes)));
};
template <>
struct Vector<double> {
  typedef double type __attribute__((vector_size(kVectorBytes)));
};

template <class V, class T>
V load(const T* from) {
  V v;
  std::memcpy(&v, from, sizeof v);
  return v;
}

template <class V, class T>
void store(T* to, const V& v) {
  std::memcpy(to, &v, sizeof v);
}

// Rows whose sums one full panel keeps in registers at once: 2·R
// accumulators, plus the panel's two vectors and a broadcast, fit the
// target's 32 (AVX-512) or 16 vector registers.
constexpr int kRowBlock = kVectorBytes == 64 ? 8 : 4;

// How far ahead of the panel row being multiplied the stream is fetched
// (software prefetch): 4 KiB, about what a core's memory latency (~100 ns)
// covers at the ~33 GB/s one core reads. At 8 rows (AVX-512) a panel row's
// 16 vector FMAs take 8 cycles at two a cycle, less than its 128 bytes take
// to arrive: the product is bound by how full the core keeps its stream of
// loads, and the hardware prefetcher alone left it waiting on memory: 50 MB
// of weights at 8 rows took 2.60 ms, 1.51 ms with this (docs/PERFORMANCE.md,
// Inference). Past a panel's end it reaches into the next panel, which
// follows in memory.
constexpr long kPrefetchBytes = 4096;

// y[R, width] += x[R, in] · panel[in, width] for a full-width panel;
// `ahead_limit`: the elements from `panel` to the matrix's end, which
// nothing is fetched past.
template <class T, int R>
void full_panel(T* y, int ldy, const T* x, int ldx, const T* panel, int in, long ahead_limit) {
  using V = typename Vector<T>::type;
  constexpr int kLanes = kVectorBytes / static_cast<int>(sizeof(T));
  constexpr long kAhead = kPrefetchBytes / static_cast<long>(sizeof(T));
  V sums[R][2];
  for (int r = 0; r < R; ++r) {
    sums[r][0] = load<V>(y + static_cast<long>(r) * ldy);
    sums[r][1] = load<V>(y + static_cast<long>(r) * ldy + kLanes);
  }
  for (int k = 0; k < in; ++k) {
    const long offset = static_cast<long>(k) * 2 * kLanes;
    const T* row = panel + offset;
    if (offset + kAhead + 2 * kLanes <= ahead_limit) {  // the row's two vectors, 4 KiB on
      __builtin_prefetch(row + kAhead);
      __builtin_prefetch(row + kAhead + kLanes);
    }
    const V left = load<V>(row);
    const V right = load<V>(row + kLanes);
    for (int r = 0; r < R; ++r) {
      const T a = x[static_cast<long>(r) * ldx + k];
      sums[r][0] += a * left;
      sums[r][1] += a * right;
    }
  }
  for (int r = 0; r < R; ++r) {
    store(y + static_cast<long>(r) * ldy, sums[r][0]);
    store(y + static_cast<long>(r) * ldy + kLanes, sums[r][1]);
  }
}

// The rows of one full panel, kRowBlock at a time, then the remainder.
template <class T, int R = kRowBlock>
void full_panel_rows(T* y, int ldy, const T* x, int ldx, const T* panel, int in, int n, long ahead_limit) {
  if constexpr (R > 0) {
    for (; n >= R; n -= R) {
      full_panel<T, R>(y, ldy, x, ldx, panel, in, ahead_limit);
      y += static_cast<long>(R) * ldy;
      x += static_cast<long>(R) * ldx;
    }
    full_panel_rows<T, R - 1>(y, ldy, x, ldx, panel, in, n, ahead_limit);
  }
}

// The last, narrower panel, element by element in the same order.
template <class T>
void narrow_panel(T* y, int ldy, const T* x, int ldx, const T* panel, int in, int width, int n) {
  for (int r = 0; r < n; ++r) {
    T* __restrict y_row = y + static_cast<long>(r) * ldy;
    const T* x_row = x + static_cast<long>(r) * ldx;
    for (int k = 0; k < in; ++k) {
      const T a = x_row[k];
      const T* __restrict p = panel + static_cast<long>(k) * width;
      for (int j = 0; j < width; ++j) y_row[j] += a * p[j];
    }
  }
}

}  // namespace

template <class T>
void pack_panels(T* w, int in, int out) {
  const std::vector<T> rows(w, w + static_cast<long>(in) * out);
  for (int first = 0; first < out; first += panel_width<T>()) {
    const int width = std::min(panel_width<T>(), out - first);
    T* panel = w + static_cast<long>(in) * first;
    for (int k = 0; k < in; ++k) {
      std::copy_n(rows.data() + static_cast<long>(k) * out + first, width, panel + static_cast<long>(k) * width);
    }
  }
}

template <class T>
void panels_multiply_add(T* y, const T* x, const T* panels, int n, int in, int out) {
  for (int first = 0; first < out; first += panel_width<T>()) {
    const T* panel = panels + static_cast<long>(in) * first;
    const int width = out - first;
    if (width >= panel_width<T>()) {
      full_panel_rows<T>(y + first, out, x, in, panel, in, n, static_cast<long>(in) * (out - first));
    } else {
      narrow_panel(y + first, out, x, in, panel, in, width, n);
    }
  }
}

template void pack_panels<float>(float*, int, int);
template void pack_panels<double>(double*, int, int);
template void panels_multiply_add<float>(float*, const float*, const float*, int, int, int);
template void panels_multiply_add<double>(double*, const double*, const double*, int, int, int);

}  // namespace pipeflow
