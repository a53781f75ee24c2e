#include "pipeflow/runtime/rank_threads.h"

#include <pthread.h>
#include <sched.h>

namespace pipeflow::runtime {

std::vector<int> usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

namespace {

bool pin(std::thread& thread, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(thread.native_handle(), sizeof set, &set) == 0;
}

}  // namespace

RankThreads::RankThreads(int ranks) {
  const std::vector<int> cpus = usable_cpus();
  const bool enough_cores = static_cast<int>(cpus.size()) >= ranks;
  bool all_pinned = enough_cores;
  threads_.reserve(static_cast<std::size_t>(ranks));
  try {
    for (int r = 0; r < ranks; ++r) {
      threads_.emplace_back(&RankThreads::serve, this, r);
      if (enough_cores) all_pinned = pin(threads_.back(), cpus[static_cast<std::size_t>(r)]) && all_pinned;
    }
  } catch (...) {
    stop();
    throw;
  }
  pinned_ = all_pinned;
}

RankThreads::~RankThreads() { stop(); }

void RankThreads::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
}

void RankThreads::run(const std::function<void(int)>& job) {
  std::unique_lock lock(mutex_);
  job_ = &job;
  running_ = size();
  ++generation_;
  lock.unlock();
  work_.notify_all();
  lock.lock();
  finished_.wait(lock, [&] { return running_ == 0; });
  job_ = nullptr;
}

void RankThreads::serve(int rank) {
  std::int64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    const std::function<void(int)>& job = *job_;
    lock.unlock();
    job(rank);
    lock.lock();
    if (--running_ == 0) finished_.notify_one();
  }
}

}  // namespace pipeflow::runtime
