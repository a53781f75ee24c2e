#include "pipeflow/tensor/buffer_pool.h"

#include <cstdio>
#include <cstdlib>

#include "pipeflow/core/error.h"

namespace pipeflow {

BufferPool::~BufferPool() {
  if (outstanding_ != 0) {
    std::fprintf(stderr, "pipeflow: internal error: buffer pool destroyed with %lld blocks in use\n",
                 static_cast<long long>(outstanding_));
    std::abort();
  }
  trim();
}

void* BufferPool::acquire(std::size_t bytes) {
  if (bytes == 0 || bytes % kAlignment != 0) fail("internal: pool block of {} bytes is not a multiple of 64", bytes);
  {
    const std::lock_guard lock(mutex_);
    ++outstanding_;
    auto found = free_.find(bytes);
    if (found != free_.end() && !found->second.empty()) {
      void* block = found->second.back();
      found->second.pop_back();
      cached_bytes_ -= bytes;
      return block;
    }
    ++system_allocations_;
  }
  void* block = std::aligned_alloc(kAlignment, bytes);
  if (block == nullptr) {
    {
      const std::lock_guard lock(mutex_);
      --outstanding_;  // nothing was handed out: the pool may still be destroyed
      --system_allocations_;
    }
    fail_allocation(bytes);
  }
  return block;
}

void fail_allocation(std::size_t bytes) {
  fail("out of memory: cannot allocate {} bytes ({:.1f} GiB) for a tensor: use a smaller model, batch or sequence",
       bytes, static_cast<double>(bytes) / static_cast<double>(std::size_t{1} << 30));
}

void BufferPool::give_back(void* block, std::size_t bytes) {
  const std::lock_guard lock(mutex_);
  --outstanding_;
  free_[bytes].push_back(block);
  cached_bytes_ += bytes;
}

std::int64_t BufferPool::system_allocations() const {
  const std::lock_guard lock(mutex_);
  return system_allocations_;
}

std::size_t BufferPool::cached_bytes() const {
  const std::lock_guard lock(mutex_);
  return cached_bytes_;
}

void BufferPool::trim() {
  const std::lock_guard lock(mutex_);
  for (auto& [bytes, blocks] : free_) {
    for (void* block : blocks) std::free(block);
    blocks.clear();
  }
  cached_bytes_ = 0;
}

}  // namespace pipeflow
