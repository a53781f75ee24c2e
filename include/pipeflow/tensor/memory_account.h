#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace pipeflow {

// Live and peak bytes held by one owner: a pipeline stage's activations, its
// weights and optimizer state, a test. Every tensor made with an Allocator
// that names the account charges its bytes (numel × element size) here on
// creation and releases them when destroyed.
//
// Thread safety: charge and release may be called from any thread at once (a
// buffer made on one worker can be freed by the worker it was sent to); the
// counters are atomic. reset_peak is meant for the owner between steps.
class MemoryAccount {
 public:
  explicit MemoryAccount(std::string name = "") : name_(std::move(name)) {}
  MemoryAccount(const MemoryAccount&) = delete;
  MemoryAccount& operator=(const MemoryAccount&) = delete;

  void charge(std::int64_t bytes);
  void release(std::int64_t bytes);

  std::int64_t live_bytes() const { return live_.load(std::memory_order_relaxed); }
  // The largest live_bytes() seen since construction or the last reset_peak().
  std::int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  // Starts a new peak measurement at the current live bytes.
  void reset_peak() { peak_.store(live_bytes(), std::memory_order_relaxed); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::atomic<std::int64_t> live_{0};
  std::atomic<std::int64_t> peak_{0};
};

}  // namespace pipeflow
