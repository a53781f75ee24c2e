#pragma once

namespace pipeflow {

// Self-attention on packed projections, causal unless `causal` is false (a
// vision encoder's, where every position sees every other), every product a
// GEMM on strided views (no copies), batched over heads and sequences
// (gemm_batched). Dimension letters: b sequences,
// t positions, c = nh · hs features, nh query heads of size hs, kv key/value
// heads (kv = nh: multi-head attention; kv < nh, dividing nh: grouped-query
// attention, query head h reads key/value head h / (nh / kv)); w = (nh + 2·kv)·hs.
//   qkv   [b, t, w]: q (nh·hs) | k (kv·hs) | v (kv·hs), head h in columns
//         h·hs … (h+1)·hs of its part (w = 3c when kv = nh)
//   probs [b, nh, t, t]: softmax(q kᵀ / √hs) over keys s ≤ query position,
//         exactly 0 above the diagonal (over every key when not causal)
//   y     [b, t, c]: probs · v, heads side by side
// Rows are processed in blocks of kAttentionBlock queries; a block multiplies
// only the keys up to its last query, so masked work is mostly skipped.
inline constexpr int kAttentionBlock = 64;

template <class T>
void attention_forward(T* y, T* probs, const T* qkv, int b, int t, int c, int nh, int kv, bool causal = true);

// I (attention has no weights): dqkv [b, t, w] = ∂L/∂qkv (overwritten) from
// dy [b, t, c]. `scratch` holds scratch_size elements, at least one
// sequence's row-block scores for every head (nh · min(t, kAttentionBlock)
// · t); each batched product covers as many sequences as it holds.
// attention_backward_scratch(b, t, nh) is the size this thread's GEMM
// precision batches best: under bf16 a batch of sequences' (up to 2^16
// elements, or one sequence's where that is more), under fp32 one
// sequence's.
long attention_backward_scratch(int b, int t, int nh);
template <class T>
void attention_backward(T* dqkv, T* scratch, long scratch_size, const T* dy, const T* probs, const T* qkv, int b,
                        int t, int c, int nh, int kv, bool causal = true);

// Inference with a key/value cache, one sequence: `rows` new queries at
// positions past … past + rows − 1 attend to the cached keys and values of
// positions 0 … past + rows − 1 (the new rows' own k and v already written
// there), causally. q [rows, ldq] (head h in columns h·hs …), keys and
// values [past + rows, kv·hs] with the key/value heads' columns, y [rows, c].
// `scores` holds rows · (past + rows) elements. Row by row this computes
// what attention_forward computes for the same positions.
template <class T>
void attention_forward_cached(T* y, T* scores, const T* q, int ldq, const T* keys, const T* values, int rows,
                              int past, int c, int nh, int kv);

}  // namespace pipeflow
