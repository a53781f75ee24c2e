#pragma once

#include <span>
#include <string_view>

namespace pipeflow::nn {

// The ranks that split one stage's layers between them (Megatron-LM's
// tensor parallelism), as the layers see them: every member calls each
// collective, in the same order, with the same count; `what` names the
// collective in an error (the runtime implements it over its rank group,
// with a deadline). A member's result has the same bits on every member, so
// the replicated tensors (the norms, the biases after a row-parallel
// product) stay identical without being exchanged.
class TensorGroup {
 public:
  virtual ~TensorGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // The members' `values` summed, in place.
  virtual void all_reduce_sum(std::span<float> values, std::string_view what) = 0;
  // The members' `values` element by element at their largest, in place.
  virtual void all_reduce_max(std::span<float> values, std::string_view what) = 0;
  // Every member's `mine` (the same count on each) into `all`, member k's
  // at k · mine.size().
  virtual void all_gather(std::span<const float> mine, std::span<float> all, std::string_view what) = 0;
};

}  // namespace pipeflow::nn
