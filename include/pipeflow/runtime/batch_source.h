#pragma once

#include <cstdint>

#include "pipeflow/nn/batch.h"
#include "pipeflow/nn/byte_dataset.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::runtime {

// Where the pipeline's micro-batches come from. A step's global batch is a
// fixed sequence of samples; micro-batch j of b samples is samples
// j·b … (j + 1)·b − 1 of it (with data parallelism, replica d's micro-batch j
// will be samples (d·m + j)·b …), so every way of cutting the batch trains on
// the same samples in the same order. The first stage takes the inputs of a
// micro-batch and the last stage its targets, each asking the source itself
// (as DeepSpeed's first and last stages each read the data iterator): no
// targets travel through the pipeline.
//
// Thread safety: batch() is const and may be called from several workers at once.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Samples first … first + count − 1 of optimizer step `step`, inputs and
  // targets [count, T], allocated with `allocator`.
  virtual nn::Batch batch(std::int64_t step, std::int64_t first, int count, Allocator allocator) const = 0;
};

// The training split of a byte-level dataset (sample i of step n is fixed by
// the dataset's seed).
class DatasetSource final : public BatchSource {
 public:
  // The dataset must outlive the source.
  DatasetSource(const nn::ByteDataset& dataset, nn::Split split) : dataset_(&dataset), split_(split) {}
  nn::Batch batch(std::int64_t step, std::int64_t first, int count, Allocator allocator) const override;

 private:
  const nn::ByteDataset* dataset_;
  nn::Split split_;
};

// One fixed global batch of sequences [B, T + 1] (inputs [:, :-1], targets
// [:, 1:]), the same for every step: for `pipeflow grad` and the tests that
// compare a pipelined step with an unpipelined one.
class TokenSource final : public BatchSource {
 public:
  explicit TokenSource(IntTensor sequences);
  nn::Batch batch(std::int64_t step, std::int64_t first, int count, Allocator allocator) const override;
  std::int64_t samples() const { return sequences_.dim(0); }

 private:
  IntTensor sequences_;
};

}  // namespace pipeflow::runtime
