#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace pipeflow {

// Recycles 64-byte aligned blocks by exact size, so that a training step that
// repeats the shapes of the step before it allocates nothing from the system:
// a block given back is handed out again to the next request of its size.
// Blocks of 64 KiB and more are mapped from the kernel (mmap), apart from the
// malloc heap (buffer_pool.cc says why); trim() unmaps them.
//
// Ownership: the pool owns the blocks it caches; a block handed out belongs to
// its user until given back. The pool must outlive every block it handed out;
// destroying it with blocks outstanding is a bug and aborts the program.
//
// Thread safety: acquire and give_back may be called from any thread (a
// tensor made by one worker is often freed by another); one mutex guards it.
class BufferPool {
 public:
  static constexpr std::size_t kAlignment = 64;

  BufferPool() = default;
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A block of `bytes` (a positive multiple of kAlignment), aligned to
  // kAlignment; fail_allocation when the system has none.
  void* acquire(std::size_t bytes);
  // Returns a block acquired with the same `bytes`.
  void give_back(void* block, std::size_t bytes);

  // Blocks obtained from the system so far (a steady state adds none).
  std::int64_t system_allocations() const;
  // Bytes cached (given back and not handed out again).
  std::size_t cached_bytes() const;
  // Returns every cached block to the system.
  void trim();

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::int64_t system_allocations_ = 0;
  std::int64_t outstanding_ = 0;
  std::size_t cached_bytes_ = 0;
};

// Throws Error: out of memory for a block of `bytes`, what to make smaller.
[[noreturn]] void fail_allocation(std::size_t bytes);

}  // namespace pipeflow
