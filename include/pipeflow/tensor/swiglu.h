#pragma once

namespace pipeflow {

// Llama's gated MLP activation: gu [n, 2f] holds per row the gate projection
// then the up projection; a [n, f] = silu(gate) ⊙ up, silu(z) = z·σ(z).
template <class T>
void swiglu_forward(T* a, const T* gu, int n, int f);

// dgu [n, 2f] = ∂L/∂(gate | up) from da [n, f] = ∂L/∂a (overwrites dgu):
// ∂gate = da ⊙ up ⊙ σ(g)·(1 + g·(1 − σ(g))), ∂up = da ⊙ silu(g).
template <class T>
void swiglu_backward(T* dgu, const T* da, const T* gu, int n, int f);

}  // namespace pipeflow
