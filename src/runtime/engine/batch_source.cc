#include "pipeflow/runtime/batch_source.h"

#include <algorithm>

#include "pipeflow/core/error.h"

namespace pipeflow::runtime {

nn::Batch DatasetSource::batch(std::int64_t step, std::int64_t first, int count, Allocator allocator) const {
  return dataset_->batch(split_, step, first, count, allocator);
}

TokenSource::TokenSource(IntTensor sequences) : sequences_(std::move(sequences)) {
  if (sequences_.shape().rank() != 2 || sequences_.dim(1) < 2) {
    fail("token sequences must be an int32 tensor [B, T+1] with T >= 1, got {}", sequences_.shape().to_string());
  }
}

nn::Batch TokenSource::batch(std::int64_t /*step*/, std::int64_t first, int count, Allocator allocator) const {
  if (first < 0 || count < 1 || first + count > samples()) {
    fail("batch of {} sequences asks for samples {}..{}, beyond the {} given", samples(), first, first + count - 1,
         samples());
  }
  const std::int64_t t = sequences_.dim(1) - 1;
  nn::Batch batch{IntTensor::uninitialized({count, t}, allocator), IntTensor::uninitialized({count, t}, allocator)};
  for (int row = 0; row < count; ++row) {
    const std::int32_t* sequence = sequences_.data() + (first + row) * (t + 1);
    std::copy(sequence, sequence + t, batch.inputs.data() + row * t);
    std::copy(sequence + 1, sequence + t + 1, batch.targets.data() + row * t);
  }
  return batch;
}

}  // namespace pipeflow::runtime
