#pragma once

namespace pipeflow {

// LayerNorm over the last dimension c of n rows, as GPT-2 (and
// torch.nn.LayerNorm): y = (x − μ) / √(σ² + ε) · w + b with the biased
// variance σ² and ε = 1e-5. Outputs must not alias inputs.
inline constexpr double kLayerNormEpsilon = 1e-5;

// Saves per row the mean μ and the reciprocal standard deviation 1/√(σ² + ε).
template <class T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int n, int c);

// I: dx = residual + ∂L/∂x, which fuses the gradient arriving around a
// pre-LN residual connection into the same pass (residual may be dx itself
// to accumulate, or null for dx = ∂L/∂x). With x̂ = (x − μ)·rstd, g = dy ⊙ w:
// ∂L/∂x = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)).
template <class T>
void layernorm_backward_input(T* dx, const T* residual, const T* dy, const T* x, const T* mean, const T* rstd,
                              const T* w, int n, int c);

// W, accumulating: dw += Σ_rows dy ⊙ x̂, db += Σ_rows dy.
template <class T>
void layernorm_backward_weight(T* dw, T* db, const T* dy, const T* x, const T* mean, const T* rstd, int n, int c);

}  // namespace pipeflow
