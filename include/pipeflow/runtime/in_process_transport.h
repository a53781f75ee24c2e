#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "pipeflow/runtime/transport.h"

namespace pipeflow::runtime {

// How long the engine's waits for a message poll before they sleep when
// every rank has a core of its own (docs/RUNTIME.md, Decisions: measured
// against 0 µs-5 ms). The first kHandoffPauseSpin of it polls with the
// CPU's pause hint only; after that each poll also yields the core, so a
// thread of another process that wants it gets it while the wait goes on.
inline constexpr std::chrono::nanoseconds kHandoffSpin = std::chrono::milliseconds(1);
inline constexpr std::chrono::nanoseconds kHandoffPauseSpin = std::chrono::microseconds(50);

// The transport between worker threads of one process. Each rank has an
// inbox: a fixed array of message slots (its capacity), guarded by one mutex
// and condition variable. send moves the payload tensor into a free slot of
// the destination's inbox and wakes its owner; receive takes it out by key.
// The tensor itself travels -- no copy -- and when the receiver frees it,
// its block goes back to the sending stage's buffer pool, which hands it out
// again for the next message: in steady state no message allocates (neither
// slots nor buffers).
//
// Capacity bounds how many posted-but-unreceived messages one destination
// holds; a send to a full inbox waits for a slot (until its deadline). The
// engine sizes each inbox for every message a step sends it, so sends never
// wait there.
//
// Thread safety: as Transport.
class InProcessTransport final : public Transport {
 public:
  // `inbox_capacity[r]`: message slots of rank r's inbox (each >= 1).
  // `spin`: how long a wait polls before it sleeps on the condition variable
  // (0: sleeps at once; past kHandoffPauseSpin each poll yields). Spinning
  // saves the wake-up of a sleeping thread when the message comes soon, and
  // is worth it only when every rank has a core of its own: otherwise the
  // spinner takes the core its sender needs.
  explicit InProcessTransport(std::vector<int> inbox_capacity, std::chrono::nanoseconds spin = {});
  ~InProcessTransport() override;
  InProcessTransport(const InProcessTransport&) = delete;
  InProcessTransport& operator=(const InProcessTransport&) = delete;

  WaitStatus send(const MessageKey& key, Tensor payload, Deadline deadline) override;
  WaitStatus receive(const MessageKey& key, const Shape& shape, Allocator allocator, Deadline deadline,
                     Tensor& out) override;
  bool try_receive(const MessageKey& key, const Shape& shape, Allocator allocator, Tensor& out) override;
  WaitStatus all_reduce_sum(RankId rank, double& value, Deadline deadline) override;
  // A sent message sits in its destination's inbox: nothing to wait for.
  WaitStatus complete_sends(RankId, Deadline) override { return aborted() ? WaitStatus::kAborted : WaitStatus::kOk; }
  void abort() override;
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }
  void reset() override;

  int num_ranks() const { return static_cast<int>(inboxes_.size()); }
  // Messages posted to rank's inbox and not yet received.
  int pending(RankId rank) const;

 private:
  struct Slot {
    bool used = false;
    MessageKey key;
    Tensor payload;
  };
  struct Inbox {
    mutable std::mutex mutex;
    std::condition_variable changed;
    std::vector<Slot> slots;
    int used = 0;
    std::atomic<std::uint64_t> version{0};  // bumped under the mutex by every change
  };
  // The all-reduce: a generation barrier over all ranks.
  struct Reduction {
    std::mutex mutex;
    std::condition_variable done;
    std::vector<double> values;
    int arrived = 0;
    std::int64_t generation = 0;
    double result = 0;
    std::atomic<std::uint64_t> version{0};  // bumped under the mutex by every change
  };

  Inbox& inbox(RankId rank);
  static Slot* find(Inbox& box, const MessageKey& key);
  // Moves the slot's payload to `out`, frees the slot, unlocks and wakes the box's waiters.
  static void take(Inbox& box, Slot& slot, std::unique_lock<std::mutex>& lock, Tensor& out);

  std::vector<std::unique_ptr<Inbox>> inboxes_;
  Reduction reduction_;
  std::chrono::nanoseconds spin_;
  std::atomic<bool> aborted_{false};
};

}  // namespace pipeflow::runtime
