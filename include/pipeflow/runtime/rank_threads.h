#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pipeflow::runtime {

// The CPUs the calling thread may run on (its affinity), in increasing
// order; empty if the system will not say. RankThreads pins rank r to the
// r-th of them.
std::vector<int> usable_cpus();

// One thread per pipeline rank for the life of an engine: the runtime's
// workers (DESIGN.md, Runtime: "workers live for the whole run"). Starting
// threads every step cost tens of µs and, worse, left placement to the
// scheduler, which put two busy ranks on one core for whole steps.
//
// Pinning: with at least as many usable cores (the process's CPU affinity)
// as ranks, thread r is pinned to the r-th usable core; with fewer, no
// thread is pinned and the ranks time-slice as the scheduler decides.
//
// run(job) hands job(r) to thread r for every rank and returns when all
// have returned. A job must not throw: an exception escaping it ends the
// process (std::terminate), so the engine's jobs catch their own errors,
// abort the transport and record the first error for the caller.
//
// Thread safety: one thread owns the object and calls run(); the destructor
// stops and joins every thread.
class RankThreads {
 public:
  // Starts `ranks` threads. Throws (after joining those started) if the
  // system refuses one.
  explicit RankThreads(int ranks);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  void run(const std::function<void(int rank)>& job);

  int size() const { return static_cast<int>(threads_.size()); }
  // Whether each thread is pinned to its own core.
  bool pinned() const { return pinned_; }

 private:
  void serve(int rank);
  void stop();

  std::mutex mutex_;
  std::condition_variable work_;      // a new generation, or stopping
  std::condition_variable finished_;  // the last job of a generation returned
  const std::function<void(int)>* job_ = nullptr;
  std::int64_t generation_ = 0;
  int running_ = 0;
  bool stopping_ = false;
  bool pinned_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace pipeflow::runtime
