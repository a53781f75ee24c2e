#pragma once

// What a half-precision stage keeps between passes, in 16 bits.

#include <cstdint>
#include <span>
#include <vector>

#include "pipeflow/tensor/half.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// A bf16 or fp16 stage keeps the activations a layer saved for its backward,
// and the gradients its W pass reads, as the format's 16 bits between the
// passes (what a mixed-precision framework keeps: half the bytes of fp32),
// and widens them back exactly when the pass that reads them starts. The
// 16-bit copies are charged to the account the tensors were charged to; the
// norms' statistics are never handed to it (they stay fp32).
//
// The caller names the same tensors, in the same order, to pack and to
// unpack (a saved state's `half_tensors()`); an empty tensor stays empty.
// Only float tensors are packed (a double stage never computes in half).
//
// Thread safety: as the saved state it belongs to (one thread at a time).
template <class T>
class HalfStash {
 public:
  // Moves every tensor into 16 bits of `format` (values the format does not
  // hold are rounded to it); each becomes empty. kFp32: nothing is done.
  void pack(ComputeFormat format, std::span<BasicTensor<T>* const> tensors, Allocator allocator);
  // The tensors back as they were packed, widened exactly; the stash becomes
  // empty. Nothing packed: nothing is done.
  void unpack(std::span<BasicTensor<T>* const> tensors, Allocator allocator);
  bool empty() const { return packed_.empty(); }

 private:
  struct Packed {
    Shape shape;                       // rank 0: the tensor was empty
    BasicTensor<std::uint16_t> bits;  // its values in the format
  };
  ComputeFormat format_ = ComputeFormat::kFp32;
  std::vector<Packed> packed_;  // by position in the tensors packed
};

extern template class HalfStash<float>;
extern template class HalfStash<double>;

}  // namespace pipeflow::nn
