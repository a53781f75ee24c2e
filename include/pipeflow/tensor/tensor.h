#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "pipeflow/tensor/buffer_pool.h"
#include "pipeflow/tensor/memory_account.h"
#include "pipeflow/tensor/shape.h"

namespace pipeflow {

// Where a tensor's bytes come from and whom they are charged to. Both are
// optional: no pool means the system allocator, no account means uncounted.
// Both must outlive the tensors made with them.
struct Allocator {
  BufferPool* pool = nullptr;
  MemoryAccount* account = nullptr;
};

// A dense row-major tensor of T (float, double, std::int32_t or std::uint16_t) that owns its
// storage: 64-byte aligned, from the allocator's pool when it has one,
// charged to its account for as long as the tensor lives. Move-only; clone()
// copies. A default-constructed tensor is empty (rank 0, no storage).
//
// Thread safety: a tensor is used by one thread at a time; it may be moved to
// and destroyed on another thread (pool and account are thread-safe).
template <class T>
class BasicTensor {
 public:
  BasicTensor() = default;
  // Zero-filled.
  explicit BasicTensor(const Shape& shape, Allocator allocator = {});
  // Contents undefined: for outputs that a kernel overwrites completely.
  static BasicTensor uninitialized(const Shape& shape, Allocator allocator = {});

  ~BasicTensor() { reset(); }
  BasicTensor(BasicTensor&& other) noexcept { steal(other); }
  BasicTensor& operator=(BasicTensor&& other) noexcept;
  BasicTensor(const BasicTensor&) = delete;
  BasicTensor& operator=(const BasicTensor&) = delete;

  BasicTensor clone(Allocator allocator = {}) const;
  // Frees the storage; the tensor becomes empty.
  void reset();

  bool empty() const { return data_ == nullptr; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int axis) const { return shape_[axis]; }
  std::int64_t numel() const { return data_ == nullptr ? 0 : shape_.numel(); }
  // The bytes charged: numel() × sizeof(T).
  std::int64_t bytes() const { return numel() * static_cast<std::int64_t>(sizeof(T)); }

  // Which of the process's allocations holds the data: a number no other
  // allocation had or will have (0: empty). A block the pool hands out again
  // is a new allocation, so a tensor made at the address of a freed one is
  // told apart from it (nn/half_stash.h recognises the tensors it widened).
  // Moves carry it; reshape keeps it.
  std::uint64_t allocation() const { return allocation_; }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::span<T> span() { return {data_, static_cast<std::size_t>(numel())}; }
  std::span<const T> span() const { return {data_, static_cast<std::size_t>(numel())}; }
  T& operator[](std::int64_t i) { return data_[i]; }
  const T& operator[](std::int64_t i) const { return data_[i]; }

  // Same elements, new shape with the same numel (throws Error otherwise).
  void reshape(const Shape& shape);
  // Moves the charge for this tensor's bytes to `account` (nullptr: uncounted),
  // e.g. when a stage takes ownership of an activation another stage made.
  void charge_to(MemoryAccount* account);
  MemoryAccount* account() const { return account_; }

 private:
  BasicTensor(const Shape& shape, Allocator allocator, bool zero);
  void steal(BasicTensor& other) noexcept;
  std::size_t block_bytes() const;

  Shape shape_;
  T* data_ = nullptr;
  std::uint64_t allocation_ = 0;
  BufferPool* pool_ = nullptr;
  MemoryAccount* account_ = nullptr;
};

using Tensor = BasicTensor<float>;
using DoubleTensor = BasicTensor<double>;
using IntTensor = BasicTensor<std::int32_t>;

extern template class BasicTensor<float>;
extern template class BasicTensor<double>;
extern template class BasicTensor<std::int32_t>;
extern template class BasicTensor<std::uint16_t>;  // a half-precision value's bits (nn/half_stash.h)

}  // namespace pipeflow
