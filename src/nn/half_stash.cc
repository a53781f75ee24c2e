#include "pipeflow/nn/half_stash.h"

#include <algorithm>
#include <type_traits>

#include "pipeflow/core/error.h"

namespace pipeflow::nn {

template <class T>
std::size_t HalfStash<T>::position(Tensors tensors, const BasicTensor<T>* tensor) const {
  const auto found = std::find(tensors.begin(), tensors.end(), tensor);
  if (found == tensors.end()) fail("internal: a tensor not among the stashed ones");
  return static_cast<std::size_t>(found - tensors.begin());
}

template <class T>
void HalfStash<T>::pack(ComputeFormat format, Tensors tensors, Allocator allocator, Tensors keep, bool lend_follows) {
  if (format == ComputeFormat::kFp32) return;
  if constexpr (!std::is_same_v<T, float>) {
    fail("internal: only float stages keep tensors in {}", to_string(format));
  } else {
    if (!entries_.empty() && entries_.size() != tensors.size()) {
      fail("internal: {} tensors packed, {} before", tensors.size(), entries_.size());
    }
    format_ = format;
    entries_.resize(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      BasicTensor<T>& tensor = *tensors[i];
      Entry& entry = entries_[i];
      const bool kept = std::find(keep.begin(), keep.end(), &tensor) != keep.end();
      if (tensor.empty()) {
        if (entry.allocation != 0) entry = {};  // widened, then emptied by the pass
        continue;
      }
      // Values that the bits held do not stand for yet: a tensor other than
      // the one widened from them (made where it was freed: same address).
      const bool fresh =
          entry.bits.empty() || entry.allocation != tensor.allocation() || !(entry.shape == tensor.shape());
      if (kept && !lend_follows) {  // floats alone, in the format
        if (fresh || !entry.floats_rounded) round_to_format(format, tensor.data(), tensor.numel());
        entry = {};
        continue;
      }
      if (fresh) {
        entry.shape = tensor.shape();
        entry.bits = BasicTensor<std::uint16_t>::uninitialized(Shape{tensor.numel()}, allocator);
        to_half_bits(format, tensor.data(), entry.bits.data(), tensor.numel());
        if (kept) from_half_bits(format, entry.bits.data(), tensor.data(), tensor.numel());
      } else if (kept && !entry.floats_rounded) {  // rounded ahead: its floats as computed until now
        from_half_bits(format, entry.bits.data(), tensor.data(), tensor.numel());
      }
      entry.floats_rounded = true;  // kept: rounded; else the floats go
      if (kept) {
        entry.allocation = tensor.allocation();
      } else {
        entry.allocation = 0;
        tensor.reset();
      }
    }
  }
}

template <class T>
void HalfStash<T>::unpack(Tensors tensors, Tensors wanted, Tensors retained, Allocator allocator) {
  if (entries_.empty()) return;
  if (tensors.size() != entries_.size()) {
    fail("internal: {} tensors unpacked, {} packed", tensors.size(), entries_.size());
  }
  if constexpr (std::is_same_v<T, float>) {
    for (BasicTensor<T>* tensor : wanted) {
      Entry& entry = entries_[position(tensors, tensor)];
      if (entry.bits.empty()) continue;  // never packed
      if (entry.allocation == 0 && !tensor->empty()) {  // made since it was packed: its own floats count
        entry = {};
        continue;
      }
      if (entry.allocation == 0) {
        BasicTensor<T> widened = BasicTensor<T>::uninitialized(entry.shape, allocator);
        from_half_bits(format_, entry.bits.data(), widened.data(), widened.numel());
        *tensor = std::move(widened);
        entry.allocation = tensor->allocation();
      }
      if (std::find(retained.begin(), retained.end(), tensor) == retained.end()) entry = {};
    }
  }
}

template <class T>
void HalfStash<T>::lend(Tensors tensors, Tensors lent, Allocator allocator, Bf16Operands& operands) {
  if (entries_.empty()) return;
  if (tensors.size() != entries_.size()) {
    fail("internal: {} tensors lent, {} packed", tensors.size(), entries_.size());
  }
  if constexpr (std::is_same_v<T, float>) {
    if (format_ != ComputeFormat::kBf16) fail("internal: only bf16 bits are lent to bf16 GEMMs");
    for (BasicTensor<T>* lent_tensor : lent) {
      Entry& entry = entries_[position(tensors, lent_tensor)];
      if (entry.bits.empty()) continue;
      BasicTensor<T>& tensor = *lent_tensor;
      if (entry.allocation == 0 && !tensor.empty()) {  // made since it was packed: its own floats count
        entry = {};
        continue;
      }
      if (entry.allocation == 0) {  // still packed: floats that stand for the bits
        tensor = BasicTensor<T>::uninitialized(entry.shape, allocator);
        entry.allocation = tensor.allocation();
      } else if (entry.allocation != tensor.allocation()) {  // made since it was widened: its own floats count
        entry = {};
        continue;
      }
      operands.add(tensor.data(), entry.bits.span());
    }
  }
}

template <class T>
void HalfStash<T>::round_ahead(Tensors tensors, BasicTensor<T>& tensor, Allocator allocator,
                               Bf16Operands& operands) {
  if constexpr (!std::is_same_v<T, float>) {
    fail("internal: only float stages round tensors to bf16");
  } else {
    if (entries_.empty()) entries_.resize(tensors.size());
    if (entries_.size() != tensors.size()) {
      fail("internal: {} tensors rounded ahead, {} packed", tensors.size(), entries_.size());
    }
    if (format_ == ComputeFormat::kFp16) fail("internal: a tensor rounded ahead to bf16 beside fp16 ones");
    format_ = ComputeFormat::kBf16;
    Entry& entry = entries_[position(tensors, &tensor)];
    entry.shape = tensor.shape();
    entry.bits = BasicTensor<std::uint16_t>::uninitialized(Shape{tensor.numel()}, allocator);
    to_half_bits(ComputeFormat::kBf16, tensor.data(), entry.bits.data(), tensor.numel());
    entry.allocation = tensor.allocation();
    entry.floats_rounded = false;
    operands.add(tensor.data(), entry.bits.span());
  }
}

template class HalfStash<float>;
template class HalfStash<double>;

}  // namespace pipeflow::nn
