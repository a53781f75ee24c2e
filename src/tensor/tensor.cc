#include "pipeflow/tensor/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <sys/mman.h>

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

// A block of its own (not from a pool). One of at least a huge page (2 MiB:
// weights, gradients, optimizer moments, key/value caches) starts on a
// huge-page boundary and asks Linux for transparent huge pages before it is
// first touched (madvise: Debian's kernels give them only to who asks). A
// product streaming the weights from memory then misses the TLB once per
// 2 MiB instead of once per 4 KiB: the decode product of 4-32 rows by 50 MB
// of weights ran 1.18-1.38x faster (bench/panels_product.sh). The advice is
// only advice: where the kernel declines it, the block works the same.
void* allocate_unpooled(std::size_t size) {
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  if (size < kHugePage) return std::aligned_alloc(BufferPool::kAlignment, size);
  void* block = nullptr;
  if (posix_memalign(&block, kHugePage, size) != 0) return nullptr;
#ifdef MADV_HUGEPAGE
  madvise(block, size / kHugePage * kHugePage, MADV_HUGEPAGE);
#endif
  return block;
}

// One count for the process (tensors move between threads); relaxed: the
// numbers need only differ.
std::uint64_t next_allocation() {
  static std::atomic<std::uint64_t> allocations{0};
  return allocations.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace

template <class T>
BasicTensor<T>::BasicTensor(const Shape& shape, Allocator allocator) : BasicTensor(shape, allocator, true) {}

template <class T>
BasicTensor<T> BasicTensor<T>::uninitialized(const Shape& shape, Allocator allocator) {
  return BasicTensor(shape, allocator, false);
}

template <class T>
BasicTensor<T>::BasicTensor(const Shape& shape, Allocator allocator, bool zero)
    : shape_(shape), pool_(allocator.pool), account_(allocator.account) {
  if (shape.numel() == 0) {
    account_ = nullptr;
    return;
  }
  const std::size_t size = block_bytes();
  void* block = pool_ != nullptr ? pool_->acquire(size) : allocate_unpooled(size);
  if (block == nullptr) fail_allocation(size);
  data_ = static_cast<T*>(block);
  allocation_ = next_allocation();
  if (zero) std::memset(data_, 0, size);
  if (account_ != nullptr) account_->charge(bytes());
}

template <class T>
BasicTensor<T>& BasicTensor<T>::operator=(BasicTensor&& other) noexcept {
  if (this != &other) {
    reset();
    steal(other);
  }
  return *this;
}

template <class T>
void BasicTensor<T>::steal(BasicTensor& other) noexcept {
  shape_ = other.shape_;
  data_ = std::exchange(other.data_, nullptr);
  allocation_ = std::exchange(other.allocation_, 0);
  pool_ = std::exchange(other.pool_, nullptr);
  account_ = std::exchange(other.account_, nullptr);
  other.shape_ = Shape();
}

template <class T>
std::size_t BasicTensor<T>::block_bytes() const {
  const std::size_t size = static_cast<std::size_t>(shape_.numel()) * sizeof(T);
  return (size + BufferPool::kAlignment - 1) / BufferPool::kAlignment * BufferPool::kAlignment;
}

template <class T>
void BasicTensor<T>::reset() {
  if (data_ != nullptr) {
    if (account_ != nullptr) account_->release(bytes());
    if (pool_ != nullptr) {
      pool_->give_back(data_, block_bytes());
    } else {
      std::free(data_);
    }
  }
  data_ = nullptr;
  allocation_ = 0;
  pool_ = nullptr;
  account_ = nullptr;
  shape_ = Shape();
}

template <class T>
BasicTensor<T> BasicTensor<T>::clone(Allocator allocator) const {
  BasicTensor copy(shape_, allocator, false);
  if (!empty()) std::memcpy(copy.data_, data_, static_cast<std::size_t>(bytes()));
  return copy;
}

template <class T>
void BasicTensor<T>::reshape(const Shape& shape) {
  if (shape.numel() != shape_.numel()) {
    fail("internal: cannot reshape {} to {}: element counts differ", shape_.to_string(), shape.to_string());
  }
  shape_ = shape;
}

template <class T>
void BasicTensor<T>::charge_to(MemoryAccount* account) {
  if (empty() || account == account_) return;
  if (account_ != nullptr) account_->release(bytes());
  account_ = account;
  if (account_ != nullptr) account_->charge(bytes());
}

template class BasicTensor<float>;
template class BasicTensor<double>;
template class BasicTensor<std::int32_t>;
template class BasicTensor<std::uint16_t>;

}  // namespace pipeflow
