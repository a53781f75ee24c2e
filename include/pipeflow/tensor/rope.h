#pragma once

namespace pipeflow {

// Rotary position embedding as Llama applies it (Hugging Face's rotate_half
// pairing): within each head of size hs, feature i < hs/2 and feature
// i + hs/2 are turned together by the angle p·f_i at position p:
//   x'_i        = x_i · cos − x_{i+hs/2} · sin
//   x'_{i+hs/2} = x_{i+hs/2} · cos + x_i · sin
// The tables hold cos(p·f_i) and sin(p·f_i) as [positions, hs/2], computed
// in double from the frequencies f (nn chooses them: θ^(−2i/hs), with Llama
// 3's scaling).
template <class T>
void rope_table(T* cos_table, T* sin_table, const double* frequencies, int positions, int half);

enum class RopeDirection { kForward, kInverse };

// In place: rows r = 0 … rows − 1 of x (row stride ld) hold `heads` heads of
// hs features side by side and sit at positions first_position + r. kForward
// turns them by +p·f (what attention's q and k get); kInverse by −p·f,
// which is the backward: a rotation's transpose is its inverse, so
// ∂L/∂x = R(−p·f) · ∂L/∂x'.
template <class T>
void rope_rotate(T* x, int ld, int rows, int first_position, int heads, int hs, const T* cos_table,
                 const T* sin_table, RopeDirection direction);

}  // namespace pipeflow
