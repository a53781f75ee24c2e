#include "pipeflow/nn/half_stash.h"

#include <type_traits>

#include "pipeflow/core/error.h"

namespace pipeflow::nn {

template <class T>
void HalfStash<T>::pack(ComputeFormat format, std::span<BasicTensor<T>* const> tensors, Allocator allocator) {
  if (format == ComputeFormat::kFp32) return;
  if constexpr (!std::is_same_v<T, float>) {
    fail("internal: only float stages keep tensors in {}", to_string(format));
  } else {
    if (!packed_.empty()) fail("internal: tensors packed twice without an unpack");
    format_ = format;
    packed_.resize(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      BasicTensor<T>& tensor = *tensors[i];
      if (tensor.empty()) continue;
      Packed& packed = packed_[i];
      packed.shape = tensor.shape();
      packed.bits = BasicTensor<std::uint16_t>::uninitialized(Shape{tensor.numel()}, allocator);
      to_half_bits(format, tensor.data(), packed.bits.data(), tensor.numel());
      tensor.reset();
    }
  }
}

template <class T>
void HalfStash<T>::unpack(std::span<BasicTensor<T>* const> tensors, Allocator allocator) {
  if (packed_.empty()) return;
  if (tensors.size() != packed_.size()) {
    fail("internal: {} tensors unpacked, {} packed", tensors.size(), packed_.size());
  }
  if constexpr (std::is_same_v<T, float>) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      Packed& packed = packed_[i];
      if (packed.bits.empty()) continue;
      BasicTensor<T> tensor = BasicTensor<T>::uninitialized(packed.shape, allocator);
      from_half_bits(format_, packed.bits.data(), tensor.data(), tensor.numel());
      packed.bits.reset();
      *tensors[i] = std::move(tensor);
    }
  }
  packed_.clear();
}

template class HalfStash<float>;
template class HalfStash<double>;

}  // namespace pipeflow::nn
