#include "pipeflow/tensor/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "pipeflow/core/error.h"
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

// Sequences one batched product covers: as many as keep a row block's
// scores for every head (nh · rows · t floats) within kScoresPerBatch, a
// quarter of this machine's 1 MiB L2 a core (the softmax reads them back),
// at least one. The forward batches so in every precision (a batch of gemm
// calls under fp32 is those calls, in another order); the backward as many
// as its scratch holds.
constexpr long kScoresPerBatch = long{1} << 16;

long scores_per_sequence(int t, int nh) { return static_cast<long>(nh) * std::min(t, kAttentionBlock) * t; }

int sequences_per_batch(int b, int t, int nh) {
  return static_cast<int>(std::clamp<long>(kScoresPerBatch / scores_per_sequence(t, nh), 1, std::max(b, 1)));
}

}  // namespace

// Under bf16, where a batch is one oneDNN matmul, a batch's scratch; under
// fp32, where a larger batch is no faster, one sequence's (the smallest).
long attention_backward_scratch(int b, int t, int nh) {
  if (b <= 0 || t <= 0 || nh <= 0) return 0;
  const int sequences = current_gemm_precision() == GemmPrecision::kBf16 ? sequences_per_batch(b, t, nh) : 1;
  return sequences * scores_per_sequence(t, nh);
}

// Each product is batched over a grid of sequences × key/value heads × the
// query heads that share one (their key and value matrices repeated: stride 0).
template <class T>
void attention_forward(T* y, T* probs, const T* qkv, int b, int t, int c, int nh, int kv, bool causal) {
  const int hs = c / nh;
  const long w = static_cast<long>(nh + 2 * kv) * hs;
  const int group = nh / kv;
  const long tt = static_cast<long>(t) * t;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  if (b <= 0 || t <= 0) return;
  const int chunk = sequences_per_batch(b, t, nh);
  for (int seq0 = 0; seq0 < b; seq0 += chunk) {
    const int seqs = std::min(chunk, b - seq0);
    const T* q = qkv + static_cast<long>(seq0) * t * w;
    const T* k = q + c;
    const T* v = k + static_cast<long>(kv) * hs;
    T* p = probs + static_cast<long>(seq0) * nh * tt;
    T* out = y + static_cast<long>(seq0) * t * c;
    const GemmBatch scores{{seqs, kv, group}, {t * w, group * hs, hs}, {t * w, hs, 0}, {nh * tt, group * tt, tt}};
    const GemmBatch mix{{seqs, kv, group}, {nh * tt, group * tt, tt}, {t * w, hs, 0}, {t * c, group * hs, hs}};
    for (int first = 0; first < t; first += kAttentionBlock) {
      const int rows = std::min(kAttentionBlock, t - first);
      const int keys = causal ? first + rows : t;
      T* p_block = p + static_cast<long>(first) * t;
      gemm_batched<T>(scores, Transpose::kNo, Transpose::kYes, rows, keys, hs, scale, q + first * w,
                      static_cast<int>(w), k, static_cast<int>(w), T(0), p_block, t);
      for (long head = 0; head < static_cast<long>(seqs) * nh; ++head) {
        for (int row = first; row < first + rows; ++row) {
          softmax_row(p + head * tt + static_cast<long>(row) * t, causal ? row + 1 : t, t);
        }
      }
      gemm_batched<T>(mix, Transpose::kNo, Transpose::kNo, rows, hs, keys, T(1), p_block, t, v, static_cast<int>(w),
                      T(0), out + static_cast<long>(first) * c, c);
    }
  }
}

// Row blocks last to first: the last block touches every key (every block
// does without the mask), so in the first query head of a key/value group it
// initialises dk and dv (beta 0); the earlier blocks, and the group's other
// heads, add to them (one product per query head of a group: they share dk
// and dv). ds for a block's rows, every head of a batch of sequences, is
// scratch [seqs, nh, rows, t].
template <class T>
void attention_backward(T* dqkv, T* scratch, long scratch_size, const T* dy, const T* probs, const T* qkv, int b,
                        int t, int c, int nh, int kv, bool causal) {
  if (b <= 0 || t <= 0) return;
  if (scratch_size < scores_per_sequence(t, nh)) {
    fail("internal: attention_backward's scratch holds {} elements, fewer than one sequence's {} (t {}, {} heads): "
         "size it by attention_backward_scratch",
         scratch_size, scores_per_sequence(t, nh), t, nh);
  }
  const int hs = c / nh;
  const long w = static_cast<long>(nh + 2 * kv) * hs;
  const int group = nh / kv;
  const long tt = static_cast<long>(t) * t;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const int last_block_start = (t - 1) / kAttentionBlock * kAttentionBlock;
  const int chunk = static_cast<int>(std::min<long>(b, scratch_size / scores_per_sequence(t, nh)));
  // Under bf16 GEMMs the output gradient and ds are each read by two
  // products: rounded once, here and below, not by each (the bits, half
  // dy's bytes and one scratch's, live for the call, as the GEMMs' own
  // rounding scratch does, outside the activations' account).
  Bf16Scratch dy_bits, ds_bits;
  Bf16Operands dy_rounded;
  if constexpr (std::is_same_v<T, float>) round_for_gemms(dy, b * t, c, c, dy_bits, dy_rounded);
  for (int seq0 = 0; seq0 < b; seq0 += chunk) {
    const int seqs = std::min(chunk, b - seq0);
    const long row0 = static_cast<long>(seq0) * t * w;
    const T* q = qkv + row0;
    const T* k = q + c;
    const T* v = k + static_cast<long>(kv) * hs;
    T* dq = dqkv + row0;
    T* dk = dq + c;
    T* dv = dk + static_cast<long>(kv) * hs;
    const T* p = probs + static_cast<long>(seq0) * nh * tt;
    const T* d_out = dy + static_cast<long>(seq0) * t * c;
    for (int first = last_block_start; first >= 0; first -= kAttentionBlock) {
      const int rows = std::min(kAttentionBlock, t - first);
      const int keys = causal ? first + rows : t;
      const long ds_head = static_cast<long>(rows) * t;
      const T* p_block = p + static_cast<long>(first) * t;
      const T* dy_block = d_out + static_cast<long>(first) * c;
      const GemmBatch every_head{
          {seqs, kv, group}, {t * c, group * hs, hs}, {t * w, hs, 0}, {nh * ds_head, group * ds_head, ds_head}};
      gemm_batched<T>(every_head, Transpose::kNo, Transpose::kYes, rows, keys, hs, T(1), dy_block, c, v,
                      static_cast<int>(w), T(0), scratch, t);
      const GemmBatch values_of_a_member{
          {seqs, kv, 1}, {nh * tt, group * tt, 0}, {t * c, group * hs, 0}, {t * w, hs, 0}};
      for (int member = 0; member < group; ++member) {
        const T beta = first == last_block_start && member == 0 ? T(0) : T(1);
        gemm_batched<T>(values_of_a_member, Transpose::kYes, Transpose::kNo, keys, hs, rows, T(1),
                        p_block + member * tt, t, dy_block + member * hs, c, beta, dv, static_cast<int>(w));
      }
      for (long head = 0; head < static_cast<long>(seqs) * nh; ++head) {
        for (int row = 0; row < rows; ++row) {
          const int visible = causal ? first + row + 1 : t;
          T* ds = scratch + head * ds_head + static_cast<long>(row) * t;
          softmax_backward_row(ds, p_block + head * tt + static_cast<long>(row) * t, visible, scale);
          std::fill(ds + visible, ds + keys, T(0));
        }
      }
      Bf16Operands ds_rounded;
      if constexpr (std::is_same_v<T, float>) round_for_gemms(scratch, seqs * nh * rows, keys, t, ds_bits, ds_rounded);
      const GemmBatch queries{
          {seqs, kv, group}, {nh * ds_head, group * ds_head, ds_head}, {t * w, hs, 0}, {t * w, group * hs, hs}};
      gemm_batched<T>(queries, Transpose::kNo, Transpose::kNo, rows, hs, keys, T(1), scratch, t, k,
                      static_cast<int>(w), T(0), dq + first * w, static_cast<int>(w));
      const GemmBatch keys_of_a_member{
          {seqs, kv, 1}, {nh * ds_head, group * ds_head, 0}, {t * w, group * hs, 0}, {t * w, hs, 0}};
      for (int member = 0; member < group; ++member) {
        const T beta = first == last_block_start && member == 0 ? T(0) : T(1);
        gemm_batched<T>(keys_of_a_member, Transpose::kYes, Transpose::kNo, keys, hs, rows, T(1),
                        scratch + member * ds_head, t, q + first * w + member * hs, static_cast<int>(w), beta, dk,
                        static_cast<int>(w));
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
template void attention_backward<float>(float*, float*, long, const float*, const float*, const float*, int, int, int,
                                        int, int, bool);
template void attention_backward<double>(double*, double*, long, const double*, const double*, const double*, int, int,
                                         int, int, int, bool);

}  // namespace pipeflow
