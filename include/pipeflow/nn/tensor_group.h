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
  // The members' `values` (size · mine.size() each) summed, member k's part
  // (from k · mine.size()) into its `mine`; `values` is left unspecified.
  virtual void reduce_scatter(std::span<float> values, std::span<float> mine, std::string_view what) = 0;
};

// Megatron-LM's sequence parallelism keeps an activation [b, t, c] split
// along the sequence between layers: member k holds positions
// [k · t/size, (k + 1) · t/size) of every sequence, [b, t/size, c].

// The whole [b, size · ts, c] from every member's part [b, ts, c].
void gather_sequence(TensorGroup& group, const float* part, float* whole, int b, int ts, int c,
                     std::string_view what);
// The members' `whole` [b, size · ts, c] summed, this member's positions
// into `part` [b, ts, c]; `whole` is left unspecified.
void scatter_sequence(TensorGroup& group, float* whole, float* part, int b, int ts, int c, std::string_view what);

}  // namespace pipeflow::nn
