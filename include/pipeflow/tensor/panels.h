#pragma once

namespace pipeflow {

// A weight matrix w[in, out] rearranged for products with few rows (a
// decode step's one token per sequence): cut into panels of
// panel_width<T>() columns (the last one narrower when out is not a
// multiple), each stored whole, in × width, row after row. A product then
// reads every weight once, in address order, and keeps a block of rows'
// sums in registers, where sgemm would first copy the matrix into its own
// packed layout on every call: at 8 to 16 rows that copy, not the
// arithmetic, bounds sgemm (bench/panels_product.sh: 2.5-5.5x at 4-16 rows).
//
// Every output element is its initial value plus x[r, 0]·w[0, j] + … +
// x[r, in − 1]·w[in − 1, j], added in that order (with fused multiply-adds
// where the target has them), whatever n is and wherever row r falls in it: a row's result does not
// depend on which other rows share the call (a group of sequences in a
// pipelined decode gives the bits it gives alone).

// The build target's vector register, in bytes.
#if defined(__AVX512F__)
inline constexpr int kPanelVectorBytes = 64;
#elif defined(__AVX__)
inline constexpr int kPanelVectorBytes = 32;
#else
inline constexpr int kPanelVectorBytes = 16;
#endif

// Columns per panel: two vector registers of T.
template <class T>
constexpr int panel_width() {
  return 2 * kPanelVectorBytes / static_cast<int>(sizeof(T));
}

// Rearranges w[in, out] into panels in place (the same in · out elements).
template <class T>
void pack_panels(T* w, int in, int out);

// y[n, out] += x[n, in] · w, w in panels (pack_panels).
template <class T>
void panels_multiply_add(T* y, const T* x, const T* panels, int n, int in, int out);

}  // namespace pipeflow
