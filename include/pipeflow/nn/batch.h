#pragma once

#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// Next-token prediction data for one (micro-)batch.
struct Batch {
  IntTensor inputs;   // [B, T]
  IntTensor targets;  // [B, T]: targets[b, t] = the token after inputs[b, t]
};

// Error unless tokens is int32 [B, T+1] with B >= 1 and T >= 1.
void check_sequences(const IntTensor& tokens);

// Splits sequences [B, T+1] into inputs [:, :-1] and targets [:, 1:] (after
// check_sequences).
Batch split_sequences(const IntTensor& tokens, Allocator allocator = {});

}  // namespace pipeflow::nn
