#pragma once

namespace pipeflow {

// Causal multi-head self-attention on packed projections, every product an
// sgemm on strided views (one per head, no copies). Dimension letters: b
// sequences, t positions, c = nh · hs features, nh heads of size hs.
//   qkv   [b, t, 3c]: q | k | v, head h in columns h·hs … (h+1)·hs of each
//   probs [b, nh, t, t]: softmax(q kᵀ / √hs) over keys s ≤ query position,
//         exactly 0 above the diagonal
//   y     [b, t, c]: probs · v, heads side by side
// Rows are processed in blocks of kAttentionBlock queries; a block multiplies
// only the keys up to its last query, so masked work is mostly skipped.
inline constexpr int kAttentionBlock = 64;

template <class T>
void attention_forward(T* y, T* probs, const T* qkv, int b, int t, int c, int nh);

// I (attention has no weights): dqkv [b, t, 3c] = ∂L/∂qkv (overwritten) from
// dy [b, t, c]. `scratch` holds t·t elements.
template <class T>
void attention_backward(T* dqkv, T* scratch, const T* dy, const T* probs, const T* qkv, int b, int t, int c,
                        int nh);

// Inference with a key/value cache, one sequence: `rows` new queries at
// positions past … past + rows − 1 attend to the cached keys and values of
// positions 0 … past + rows − 1 (the new rows' own k and v already written
// there), causally. q [rows, ldq] (head h in columns h·hs …), keys and
// values [past + rows, c] with the same head columns, y [rows, c].
// `scores` holds rows · (past + rows) elements. Row by row this computes
// what attention_forward computes for the same positions.
template <class T>
void attention_forward_cached(T* y, T* scores, const T* q, int ldq, const T* keys, const T* values, int rows,
                              int past, int c, int nh);

}  // namespace pipeflow
