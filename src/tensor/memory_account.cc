#include "pipeflow/tensor/memory_account.h"

namespace pipeflow {

void MemoryAccount::charge(std::int64_t bytes) {
  const std::int64_t live = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::int64_t peak = peak_.load(std::memory_order_relaxed);
  while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

void MemoryAccount::release(std::int64_t bytes) { live_.fetch_sub(bytes, std::memory_order_relaxed); }

}  // namespace pipeflow
