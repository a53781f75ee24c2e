#pragma once

#include <cstdint>

namespace pipeflow {

// Token plus position embedding: x[b, t, c] = wte[token[b, t]] + wpe[t]
// (wte[token[b, t]] alone when wpe is null, as with rotary positions).
// Tokens must be valid rows of wte (callers check the range).
template <class T>
void embedding_forward(T* x, const std::int32_t* tokens, const T* wte, const T* wpe, int b, int t, int c);

// W (the embedding has no input gradient), accumulating:
// dwte[token[b, t]] += dx[b, t], dwpe[t] += dx[b, t] (unless dwpe is null).
template <class T>
void embedding_backward_weight(T* dwte, T* dwpe, const T* dx, const std::int32_t* tokens, int b, int t, int c);

}  // namespace pipeflow
