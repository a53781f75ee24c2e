#include "pipeflow/nn/batch.h"

#include <algorithm>

#include "pipeflow/core/error.h"

namespace pipeflow::nn {

void check_sequences(const IntTensor& tokens) {
  if (tokens.shape().rank() != 2 || tokens.dim(0) < 1 || tokens.dim(1) < 2) {
    fail("token sequences must be an int32 tensor [B, T+1] with B >= 1 and T >= 1, got {}",
         tokens.shape().to_string());
  }
}

Batch split_sequences(const IntTensor& tokens, Allocator allocator) {
  check_sequences(tokens);
  const std::int64_t b = tokens.dim(0);
  const std::int64_t t = tokens.dim(1) - 1;
  Batch batch{IntTensor::uninitialized({b, t}, allocator), IntTensor::uninitialized({b, t}, allocator)};
  for (std::int64_t row = 0; row < b; ++row) {
    const std::int32_t* sequence = tokens.data() + row * (t + 1);
    std::copy(sequence, sequence + t, batch.inputs.data() + row * t);
    std::copy(sequence + 1, sequence + t + 1, batch.targets.data() + row * t);
  }
  return batch;
}

}  // namespace pipeflow::nn
