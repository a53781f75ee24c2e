#include "pipeflow/runtime/in_process_transport.h"

#include <algorithm>
#include <thread>

#include "pipeflow/core/error.h"

namespace pipeflow::runtime {
namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Waits until `ready()` (checked with `lock` held) or the deadline; false on
// the deadline. For up to `spin` it polls `version` -- bumped under the lock
// by every change -- without the lock (yielding the core between polls past
// kHandoffPauseSpin), and checks `ready()` again after each change; then it
// sleeps on `changed`. A message that arrives within the spin is taken
// without the sleeping thread's wake-up (docs/RUNTIME.md, Decisions). It may
// pass the deadline by one poll: a yield can last a scheduler slice when
// another thread wants the core.
template <typename Ready>
bool wait_until_ready(std::unique_lock<std::mutex>& lock, std::condition_variable& changed,
                      const std::atomic<std::uint64_t>& version, std::chrono::nanoseconds spin, Deadline deadline,
                      Ready ready) {
  if (ready()) return true;
  if (spin.count() > 0) {
    const Clock::time_point start = Clock::now();
    const Deadline pause_end = std::min(deadline, start + std::min(spin, kHandoffPauseSpin));
    const Deadline spin_end = std::min(deadline, start + spin);
    for (bool moved = true; moved;) {
      const std::uint64_t seen = version.load(std::memory_order_relaxed);
      lock.unlock();
      moved = false;
      for (Clock::time_point now = Clock::now(); !moved && now < spin_end; now = Clock::now()) {
        if (now < pause_end) {
          cpu_relax();
        } else {
          std::this_thread::yield();
        }
        moved = version.load(std::memory_order_relaxed) != seen;
      }
      lock.lock();
      if (ready()) return true;
    }
  }
  return changed.wait_until(lock, deadline, ready);
}

}  // namespace

InProcessTransport::InProcessTransport(std::vector<int> inbox_capacity, std::chrono::nanoseconds spin) : spin_(spin) {
  if (inbox_capacity.empty()) fail("in-process transport: needs at least one rank");
  for (std::size_t r = 0; r < inbox_capacity.size(); ++r) {
    if (inbox_capacity[r] < 1) fail("in-process transport: rank {} inbox capacity {} must be >= 1", r, inbox_capacity[r]);
    auto box = std::make_unique<Inbox>();
    box->slots.resize(static_cast<std::size_t>(inbox_capacity[r]));
    inboxes_.push_back(std::move(box));
  }
  reduction_.values.assign(inbox_capacity.size(), 0.0);
}

InProcessTransport::~InProcessTransport() = default;

InProcessTransport::Inbox& InProcessTransport::inbox(RankId rank) {
  if (rank.value() < 0 || rank.value() >= num_ranks()) {
    fail("in-process transport: rank {} outside [0, {})", rank, num_ranks());
  }
  return *inboxes_[static_cast<std::size_t>(rank.value())];
}

InProcessTransport::Slot* InProcessTransport::find(Inbox& box, const MessageKey& key) {
  for (Slot& slot : box.slots) {
    if (slot.used && slot.key == key) return &slot;
  }
  return nullptr;
}

WaitStatus InProcessTransport::send(const MessageKey& key, Tensor payload, Deadline deadline) {
  Inbox& box = inbox(key.destination);
  std::unique_lock lock(box.mutex);
  const auto has_room = [&] { return aborted() || box.used < static_cast<int>(box.slots.size()); };
  if (!wait_until_ready(lock, box.changed, box.version, spin_, deadline, has_room)) return WaitStatus::kTimedOut;
  if (aborted()) return WaitStatus::kAborted;
  for (Slot& slot : box.slots) {
    if (slot.used) continue;
    slot.used = true;
    slot.key = key;
    slot.payload = std::move(payload);
    break;
  }
  ++box.used;
  box.version.fetch_add(1, std::memory_order_relaxed);
  lock.unlock();
  box.changed.notify_all();
  return WaitStatus::kOk;
}

WaitStatus InProcessTransport::receive(const MessageKey& key, const Shape& /*shape*/, Allocator /*allocator*/,
                                       Deadline deadline, Tensor& out) {
  Inbox& box = inbox(key.destination);
  std::unique_lock lock(box.mutex);
  Slot* slot = nullptr;
  const auto arrived = [&] { return aborted() || (slot = find(box, key)) != nullptr; };
  if (!wait_until_ready(lock, box.changed, box.version, spin_, deadline, arrived)) return WaitStatus::kTimedOut;
  if (aborted()) return WaitStatus::kAborted;
  take(box, *slot, lock, out);
  return WaitStatus::kOk;
}

bool InProcessTransport::try_receive(const MessageKey& key, const Shape&, Allocator, Tensor& out) {
  Inbox& box = inbox(key.destination);
  std::unique_lock lock(box.mutex);
  Slot* slot = find(box, key);
  if (slot == nullptr || aborted()) return false;
  take(box, *slot, lock, out);
  return true;
}

void InProcessTransport::take(Inbox& box, Slot& slot, std::unique_lock<std::mutex>& lock, Tensor& out) {
  out = std::move(slot.payload);
  slot.used = false;
  --box.used;
  box.version.fetch_add(1, std::memory_order_relaxed);
  lock.unlock();
  box.changed.notify_all();  // a sender may wait for the freed slot
}

WaitStatus InProcessTransport::all_reduce_sum(RankId rank, double& value, Deadline deadline) {
  inbox(rank);  // checks the rank
  Reduction& r = reduction_;
  std::unique_lock lock(r.mutex);
  if (aborted()) return WaitStatus::kAborted;
  r.values[static_cast<std::size_t>(rank.value())] = value;
  const std::int64_t generation = r.generation;
  if (++r.arrived == num_ranks()) {
    double sum = 0;
    for (const double v : r.values) sum += v;
    r.result = sum;
    r.arrived = 0;
    ++r.generation;
    r.version.fetch_add(1, std::memory_order_relaxed);
    lock.unlock();
    r.done.notify_all();
    value = sum;
    return WaitStatus::kOk;
  }
  const auto finished = [&] { return aborted() || r.generation != generation; };
  if (!wait_until_ready(lock, r.done, r.version, spin_, deadline, finished)) {
    --r.arrived;
    return WaitStatus::kTimedOut;
  }
  if (r.generation == generation) return WaitStatus::kAborted;
  value = r.result;
  return WaitStatus::kOk;
}

void InProcessTransport::abort() {
  aborted_.store(true, std::memory_order_release);
  for (auto& box : inboxes_) {
    // Taking the lock orders the flag against a waiter's predicate check.
    {
      std::lock_guard lock(box->mutex);
      box->version.fetch_add(1, std::memory_order_relaxed);
    }
    box->changed.notify_all();
  }
  {
    std::lock_guard lock(reduction_.mutex);
    reduction_.version.fetch_add(1, std::memory_order_relaxed);
  }
  reduction_.done.notify_all();
}

void InProcessTransport::reset() {
  for (auto& box : inboxes_) {
    std::lock_guard lock(box->mutex);
    for (Slot& slot : box->slots) {
      slot.used = false;
      slot.payload.reset();
    }
    box->used = 0;
  }
  {
    std::lock_guard lock(reduction_.mutex);
    reduction_.arrived = 0;
  }
  aborted_.store(false, std::memory_order_release);
}

int InProcessTransport::pending(RankId rank) const {
  const Inbox& box = *inboxes_.at(static_cast<std::size_t>(rank.value()));
  std::lock_guard lock(box.mutex);
  return box.used;
}

}  // namespace pipeflow::runtime
