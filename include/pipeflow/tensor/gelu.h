#pragma once

namespace pipeflow {

// GELU with GPT-2's tanh approximation (torch's approximate="tanh"):
// gelu(x) = x/2 · (1 + tanh(√(2/π) · (x + 0.044715·x³))).

template <class T>
void gelu_forward(T* y, const T* x, int n);

// dx = dy ⊙ gelu'(x); dx may be dy (in place).
template <class T>
void gelu_backward(T* dx, const T* dy, const T* x, int n);

}  // namespace pipeflow
