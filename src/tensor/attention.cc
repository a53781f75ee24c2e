#include "pipeflow/tensor/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "pipeflow/tensor/gemm.h"
#include "vector_math.h"

namespace pipeflow {
namespace {

// A score row holds scaled scores for its visible keys 0 … keys − 1; turns
// them into probabilities in place (max-subtracted, so exp never overflows)
// and zeroes keys … t−1.
template <class T>
PIPEFLOW_WIDE_VECTORS void softmax_row(T* __restrict p, int keys, int t) {
  const T top = detail::max(p, keys);
  const T total = detail::exponentiate(p, top, keys);
  const T inverse = T(1) / total;
  for (int j = 0; j < keys; ++j) p[j] *= inverse;
  std::memset(p + keys, 0, sizeof(T) * static_cast<std::size_t>(t - keys));
}

// ds = p ⊙ (dp − Σ_s p·dp) · scale, in place over dp, for keys 0 … keys − 1.
template <class T>
PIPEFLOW_WIDE_VECTORS void softmax_backward_row(T* __restrict dp, const T* __restrict p, int keys, T scale) {
  const T inner = detail::dot(p, dp, keys);
  for (int j = 0; j < keys; ++j) dp[j] = p[j] * (dp[j] - inner) * scale;
}

}  // namespace

template <class T>
void attention_forward(T* y, T* probs, const T* qkv, int b, int t, int c, int nh, int kv, bool causal) {
  const int hs = c / nh;
  const int w = (nh + 2 * kv) * hs;
  const int group = nh / kv;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int seq = 0; seq < b; ++seq) {
    for (int head = 0; head < nh; ++head) {
      const T* q = qkv + static_cast<long>(seq) * t * w + head * hs;
      const T* k = qkv + static_cast<long>(seq) * t * w + c + head / group * hs;
      const T* v = k + kv * hs;
      T* p = probs + (static_cast<long>(seq) * nh + head) * t * t;
      T* out = y + static_cast<long>(seq) * t * c + head * hs;
      for (int first = 0; first < t; first += kAttentionBlock) {
        const int rows = std::min(kAttentionBlock, t - first);
        const int keys = causal ? first + rows : t;
        T* p_block = p + static_cast<long>(first) * t;
        gemm<T>(Transpose::kNo, Transpose::kYes, rows, keys, hs, scale, q + static_cast<long>(first) * w, w, k, w,
                T(0), p_block, t);
        for (int row = first; row < first + rows; ++row) {
          softmax_row(p + static_cast<long>(row) * t, causal ? row + 1 : t, t);
        }
        gemm<T>(Transpose::kNo, Transpose::kNo, rows, hs, keys, T(1), p_block, t, v, w, T(0),
                out + static_cast<long>(first) * c, c);
      }
    }
  }
}

// Per head, row blocks last to first: the last block touches every key (every
// block does without the mask), so in
// the first query head of a key/value group it initialises dk and dv (beta 0);
// the earlier blocks, and the group's other heads, add to them.
template <class T>
void attention_backward(T* dqkv, T* scratch, const T* dy, const T* probs, const T* qkv, int b, int t, int c,
                        int nh, int kv, bool causal) {
  const int hs = c / nh;
  const int w = (nh + 2 * kv) * hs;
  const int group = nh / kv;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const int last_block_start = (t - 1) / kAttentionBlock * kAttentionBlock;
  // Under bf16 GEMMs each head's output gradient and ds are read by two
  // products: rounded once, here and below, not by each (the bits, half
  // dy's bytes and one ds block's, live for the call, as the GEMMs'
  // own rounding scratch does, outside the activations' account).
  std::vector<std::uint16_t> dy_bits, ds_bits;
  Bf16Operands dy_rounded;
  if constexpr (std::is_same_v<T, float>) round_for_gemms(dy, b * t, c, c, dy_bits, dy_rounded);
  for (int seq = 0; seq < b; ++seq) {
    for (int head = 0; head < nh; ++head) {
      const long row0 = static_cast<long>(seq) * t * w;
      const long kv_offset = row0 + c + static_cast<long>(head / group) * hs;
      const T* q = qkv + row0 + head * hs;
      const T* k = qkv + kv_offset;
      const T* v = k + kv * hs;
      T* dq = dqkv + row0 + head * hs;
      T* dk = dqkv + kv_offset;
      T* dv = dk + kv * hs;
      const T* p = probs + (static_cast<long>(seq) * nh + head) * t * t;
      const T* d_out = dy + static_cast<long>(seq) * t * c + head * hs;
      for (int first = last_block_start; first >= 0; first -= kAttentionBlock) {
        const int rows = std::min(kAttentionBlock, t - first);
        const int keys = causal ? first + rows : t;
        const T beta = first == last_block_start && head % group == 0 ? T(0) : T(1);
        const T* p_block = p + static_cast<long>(first) * t;
        const T* dy_block = d_out + static_cast<long>(first) * c;
        T* ds = scratch;
        gemm<T>(Transpose::kNo, Transpose::kYes, rows, keys, hs, T(1), dy_block, c, v, w, T(0), ds, t);
        gemm<T>(Transpose::kYes, Transpose::kNo, keys, hs, rows, T(1), p_block, t, dy_block, c, beta, dv, w);
        for (int row = 0; row < rows; ++row) {
          const int visible = causal ? first + row + 1 : t;
          softmax_backward_row(ds + static_cast<long>(row) * t, p_block + static_cast<long>(row) * t, visible, scale);
          std::fill(ds + static_cast<long>(row) * t + visible, ds + static_cast<long>(row) * t + keys, T(0));
        }
        Bf16Operands ds_rounded;
        if constexpr (std::is_same_v<T, float>) round_for_gemms(ds, rows, keys, t, ds_bits, ds_rounded);
        gemm<T>(Transpose::kNo, Transpose::kNo, rows, hs, keys, T(1), ds, t, k, w, T(0),
                dq + static_cast<long>(first) * w, w);
        gemm<T>(Transpose::kYes, Transpose::kNo, keys, hs, rows, T(1), ds, t, q + static_cast<long>(first) * w, w,
                beta, dk, w);
      }
    }
  }
}

template <class T>
void attention_forward_cached(T* y, T* scores, const T* q, int ldq, const T* keys, const T* values, int rows,
                              int past, int c, int nh, int kv) {
  const int hs = c / nh;
  const int width = kv * hs;
  const int group = nh / kv;
  const int total = past + rows;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int head = 0; head < nh; ++head) {
    const int kv_column = head / group * hs;
    gemm<T>(Transpose::kNo, Transpose::kYes, rows, total, hs, scale, q + head * hs, ldq, keys + kv_column, width,
            T(0), scores, total);
    for (int row = 0; row < rows; ++row) softmax_row(scores + static_cast<long>(row) * total, past + row + 1, total);
    gemm<T>(Transpose::kNo, Transpose::kNo, rows, hs, total, T(1), scores, total, values + kv_column, width, T(0),
            y + head * hs, c);
  }
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int, int, bool);
template void attention_forward<double>(double*, double*, const double*, int, int, int, int, int, bool);
template void attention_forward_cached<float>(float*, float*, const float*, int, const float*, const float*, int,
                                              int, int, int, int);
template void attention_forward_cached<double>(double*, double*, const double*, int, const double*, const double*,
                                               int, int, int, int, int);
template void attention_backward<float>(float*, float*, const float*, const float*, const float*, int, int, int,
                                        int, int, bool);
template void attention_backward<double>(double*, double*, const double*, const double*, const double*, int, int,
                                         int, int, int, bool);

}  // namespace pipeflow
