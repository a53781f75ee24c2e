#pragma once

namespace pipeflow {

// RMSNorm over the last dimension c of n rows, as Llama (Hugging Face's
// LlamaRMSNorm): y = x / √(mean(x²) + ε) · w. Outputs must not alias inputs
// (except as said below).

// Saves per row the reciprocal root mean square rstd = 1/√(mean(x²) + ε).
template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, double epsilon, int n, int c);

// I: dx = residual + ∂L/∂x (residual may be dx itself, or null). With
// x̂ = x·rstd and g = dy ⊙ w: ∂L/∂x = rstd · (g − x̂ · mean(g ⊙ x̂)).
template <class T>
void rmsnorm_backward_input(T* dx, const T* residual, const T* dy, const T* x, const T* rstd, const T* w, int n,
                            int c);

// W, accumulating: dw += Σ_rows dy ⊙ x̂.
template <class T>
void rmsnorm_backward_weight(T* dw, const T* dy, const T* x, const T* rstd, int n, int c);

}  // namespace pipeflow
