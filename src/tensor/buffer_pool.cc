#include "pipeflow/tensor/buffer_pool.h"

#include <cstdio>
#include <cstdlib>

#include <sys/mman.h>

#include "pipeflow/core/error.h"
#include "pipeflow/core/sanitizers.h"

namespace pipeflow {
namespace {

// Blocks of 64 KiB and more come straight from the kernel (mmap), not from
// malloc. The malloc heap of a thread is where a step's other allocations
// churn, oneDNN's per-call packing buffers above all (gemm.cc keeps that
// heap warm); pool blocks carved from it in the first step would leave the
// churn of the next ones to grow the heap onto fresh pages (make run's
// 2-stage model: 131-134 page faults in each of steps 1 to 3 with its
// blocks in the heap, none after). Under AddressSanitizer every block comes
// from its malloc, which checks the bounds of what it hands out.
constexpr std::size_t kMappedBlock = std::size_t{64} << 10;

bool mapped(std::size_t bytes) { return !kAddressSanitizer && bytes >= kMappedBlock; }

void* allocate_block(std::size_t bytes) {
  if (!mapped(bytes)) return std::aligned_alloc(BufferPool::kAlignment, bytes);
  void* block = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return block == MAP_FAILED ? nullptr : block;
}

void free_block(void* block, std::size_t bytes) {
  if (mapped(bytes)) {
    munmap(block, bytes);
  } else {
    std::free(block);
  }
}

}  // namespace

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
  void* block = allocate_block(bytes);
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
    for (void* block : blocks) free_block(block, bytes);
    blocks.clear();
  }
  cached_bytes_ = 0;
}

}  // namespace pipeflow
