#pragma once

namespace pipeflow {

// GELU with GPT-2's tanh approximation (torch's approximate="tanh"):
// gelu(x) = x/2 · (1 + tanh(√(2/π) · (x + 0.044715·x³))).

template <class T>
void gelu_forward(T* y, const T* x, int n);

// In place: grad ← grad ⊙ gelu'(x), turning ∂L/∂y into ∂L/∂x (in place so
// that the loop vectorises without a runtime aliasing check).
template <class T>
void gelu_backward(T* grad, const T* x, int n);

}  // namespace pipeflow
