#pragma once

// What a half-precision stage keeps between passes, in 16 bits.

#include <cstdint>
#include <span>
#include <vector>

#include "pipeflow/tensor/gemm.h"
#include "pipeflow/tensor/half.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// A bf16 or fp16 stage keeps the activations a layer saved for its backward,
// and the gradients its W pass reads, as the format's 16 bits between the
// passes (what a mixed-precision framework keeps: half the bytes of fp32),
// and widens back exactly, when a pass starts, those the pass reads. The
// 16-bit copies are charged to the account the tensors were charged to; the
// norms' statistics are never handed to it (they stay fp32).
//
// Each tensor is rounded once: a tensor widened and kept (`retained`) holds
// its bits beside its floats, and packing it again reuses them; a tensor a
// pass does not read stays packed through it; one rounded ahead (for the
// bf16 GEMMs that read it as soon as it is made) is packed from those
// bits. A pass must therefore not write into a tensor it was handed
// widened or rounded ahead (the passes write new tensors).
// For a pass whose GEMMs are bf16, `lend` hands those GEMMs the bits
// themselves (tensor/gemm.h, Bf16Operands): no widening, no rounding again.
//
// A tensor is recognised as the one widened by its allocation (tensor.h),
// not its address: one a pass makes where it freed a widened one (the pool
// hands the block out again) is packed anew from its own values.
//
// The caller names the same tensors, in the same order, every time (a
// saved state's `half_tensors()`); the subsets it passes are pointers into
// them. An empty tensor stays empty. Only float tensors are packed (a double
// stage never computes in half).
//
// Thread safety: as the saved state it belongs to (one thread at a time).
template <class T>
class HalfStash {
 public:
  using Tensors = std::span<BasicTensor<T>* const>;

  // Moves every tensor holding values into 16 bits of `format` (values the
  // format does not hold are rounded to it) and empties it, but for those in
  // `keep`, which are rounded in place and keep their floats: beside their
  // bits where `lend` follows, without them elsewhere. A tensor still as it
  // was widened (or lent) keeps the bits it came from; one the pass emptied
  // loses them. kFp32: nothing is done.
  void pack(ComputeFormat format, Tensors tensors, Allocator allocator, Tensors keep = {}, bool lend_follows = false);
  // Widens `wanted` (of `tensors`) exactly, where packed. The bits of those
  // in `retained` stay for a later pack or lend; the others' are freed. A
  // tensor made in a packed one's place since (no longer empty) keeps its own
  // floats; its bits are dropped.
  void unpack(Tensors tensors, Tensors wanted, Tensors retained, Allocator allocator);
  // Registers with `operands` the bits of every tensor of `lent` (of
  // `tensors`) that has them (one made since it was widened or packed has
  // its own floats: its bits are dropped, and the GEMM rounds its floats).
  // One still packed first gets floats from `allocator` that only stand for
  // its bits (uninitialized and never written: nothing but a bf16 GEMM
  // inside the operands' lifetime may read them). Call it only where the
  // GEMMs are bf16, and keep every lent tensor allocated while `operands`
  // lives (or, a stand-in, free it into a pool nothing else draws from).
  void lend(Tensors tensors, Tensors lent, Allocator allocator, Bf16Operands& operands);
  // Rounds `tensor` (one of `tensors`, just made) to bf16 bits now, while
  // the pass that made it has it in cache, and lends them to `operands`:
  // the bf16 GEMMs that read it next take them, and the pack that ends the
  // pass keeps them rather than rounding the tensor again, out of cache.
  // Its floats stay as computed until that pack, which rounds them where it
  // keeps them. Call it only where the GEMMs are bf16, and write nothing
  // into the tensor after (the passes write new tensors).
  void round_ahead(Tensors tensors, BasicTensor<T>& tensor, Allocator allocator, Bf16Operands& operands);

 private:
  struct Entry {
    Shape shape;
    BasicTensor<std::uint16_t> bits;  // the tensor's values in the format; empty: none held
    std::uint64_t allocation = 0;     // the tensor's allocation while it holds the bits' values; 0: none
    bool floats_rounded = true;       // false: rounded ahead, its floats still as computed
  };
  std::size_t position(Tensors tensors, const BasicTensor<T>* tensor) const;
  ComputeFormat format_ = ComputeFormat::kFp32;
  std::vector<Entry> entries_;  // by position in the tensors packed
};

extern template class HalfStash<float>;
extern template class HalfStash<double>;

}  // namespace pipeflow::nn
