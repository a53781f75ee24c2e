// The rank group whose ranks are threads of this process: its collectives
// are meetings in shared memory, its transport hands tensors over.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/adamw.h"
#include "pipeflow/runtime/in_process_transport.h"
#include "pipeflow/runtime/rank_group.h"
#include "pipeflow/runtime/rank_threads.h"

namespace pipeflow::runtime {
namespace {

// Where the members of one sub-group meet for a collective. Each member
// posts a pointer to its own data; once all have, each reads what it needs
// from the others' and writes only its own; it returns once every member is
// done reading, so no member's data is changed or freed under a reader.
// Waits end at the deadline (an Error naming the members that did not come)
// or when the group is aborted (RankGroupAborted).
class Meeting {
 public:
  Meeting(std::string name, std::vector<int> world_ranks, const std::atomic<bool>& aborted)
      : name_(std::move(name)), world_ranks_(std::move(world_ranks)), aborted_(&aborted),
        posted_(world_ranks_.size(), nullptr), arrived_(world_ranks_.size(), false) {}

  int size() const { return static_cast<int>(world_ranks_.size()); }

  template <typename Use>
  void meet(int member, const void* mine, Deadline deadline, std::string_view what, Use&& use) {
    std::unique_lock lock(mutex_);
    posted_[static_cast<std::size_t>(member)] = mine;
    arrived_[static_cast<std::size_t>(member)] = true;
    const std::int64_t generation = generation_;
    if (++count_ == size()) {
      count_ = 0;
      ++generation_;
      changed_.notify_all();
    } else {
      wait(lock, deadline, what, [&] { return generation_ != generation; });
    }
    lock.unlock();
    use(std::span<const void* const>(posted_));
    lock.lock();
    if (++done_ == size()) {
      done_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ++generation_;
      changed_.notify_all();
    } else {
      wait(lock, deadline, what, [&] { return generation_ != generation + 1; });
    }
  }

  // Wakes every waiter (the group was aborted).
  void wake() {
    const std::lock_guard lock(mutex_);
    changed_.notify_all();
  }

  // Forgets a meeting left half done by a failed run.
  void reset() {
    const std::lock_guard lock(mutex_);
    count_ = 0;
    done_ = 0;
    generation_ = 0;
    std::fill(arrived_.begin(), arrived_.end(), false);
  }

 private:
  template <typename Ready>
  void wait(std::unique_lock<std::mutex>& lock, Deadline deadline, std::string_view what, Ready ready) {
    const Clock::time_point start = Clock::now();
    const auto stop = [&] { return ready() || aborted_->load(std::memory_order_acquire); };
    if (!changed_.wait_until(lock, deadline, stop)) {
      std::vector<int> missing;
      for (std::size_t k = 0; k < world_ranks_.size(); ++k) {
        if (!arrived_[k]) missing.push_back(world_ranks_[k]);
      }
      fail("timed out after {:.0f} s waiting for {} in {}: world rank{} {} never came (a rank is stuck; raise "
           "--timeout if it is only slow)",
           std::chrono::duration<double>(Clock::now() - start).count(), what, name_, missing.size() == 1 ? "" : "s",
           fmt::join(missing, ", "));
    }
    if (!ready()) throw RankGroupAborted();
  }

  std::string name_;
  std::vector<int> world_ranks_;  // by member
  const std::atomic<bool>* aborted_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<const void*> posted_;
  std::vector<bool> arrived_;
  int count_ = 0;
  int done_ = 0;
  std::int64_t generation_ = 0;
};

nn::OptimizerShard part_of(std::size_t total, int members, int k) {
  return nn::OptimizerShard::of(static_cast<std::int64_t>(total), members, k);
}

float* at(const void* values, std::int64_t offset) {
  return static_cast<const std::span<float>*>(values)->data() + offset;
}

// A reduce-scatter between threads: nothing moves until finish(), where
// every member adds the members' copies of its own part in member order.
class ThreadReduceScatter final : public PartsReduction {
 public:
  ThreadReduceScatter(Meeting& meeting, int member, std::span<float> values, std::string what)
      : meeting_(&meeting), member_(member), values_(values), what_(std::move(what)) {}
  void poll() override {}
  void finish(Deadline deadline) override {
    meeting_->meet(member_, &values_, deadline, what_, [&](std::span<const void* const> all) {
      const nn::OptimizerShard part = part_of(values_.size(), meeting_->size(), member_);
      for (std::int64_t i = part.begin; i < part.end; ++i) {
        float sum = *at(all[0], i);
        for (std::size_t j = 1; j < all.size(); ++j) sum += *at(all[j], i);
        values_[static_cast<std::size_t>(i)] = sum;
      }
    });
  }

 private:
  Meeting* meeting_;
  int member_;
  std::span<float> values_;
  std::string what_;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(Meeting& meeting, int member) : meeting_(&meeting), member_(member) {}
  int size() const override { return meeting_->size(); }
  int rank() const override { return member_; }

  std::vector<double> all_gather(std::span<const double> values, Deadline deadline, std::string_view what) override {
    std::vector<double> all;
    meeting_->meet(member_, &values, deadline, what, [&](std::span<const void* const> posted) {
      for (const void* p : posted) {
        const auto& theirs = *static_cast<const std::span<const double>*>(p);
        all.insert(all.end(), theirs.begin(), theirs.end());
      }
    });
    return all;
  }

  std::unique_ptr<PartsReduction> reduce_scatter_parts(std::span<float> values, std::string what,
                                                       std::size_t /*bucket_floats*/) override {
    return std::make_unique<ThreadReduceScatter>(*meeting_, member_, values, std::move(what));
  }

  void all_gather_parts(std::span<float> values, Deadline deadline, std::string_view what) override {
    copy_parts(values, deadline, what, false);
  }
  void gather_parts(std::span<float> values, Deadline deadline, std::string_view what) override {
    copy_parts(values, deadline, what, true);
  }

  std::vector<std::string> gather_bytes(const std::string& bytes, Deadline deadline, std::string_view what) override {
    std::vector<std::string> all;
    meeting_->meet(member_, &bytes, deadline, what, [&](std::span<const void* const> posted) {
      if (member_ != 0) return;
      for (const void* p : posted) all.push_back(*static_cast<const std::string*>(p));
    });
    return all;
  }

  void broadcast_bytes(std::string& bytes, Deadline deadline, std::string_view what) override {
    std::string received;
    meeting_->meet(member_, &bytes, deadline, what, [&](std::span<const void* const> posted) {
      if (member_ != 0) received = *static_cast<const std::string*>(posted[0]);
    });
    if (member_ != 0) bytes = std::move(received);
  }

 private:
  // Every member's part into this member's `values` (`to_first_only`: into member 0's alone).
  void copy_parts(std::span<float> values, Deadline deadline, std::string_view what, bool to_first_only) {
    meeting_->meet(member_, &values, deadline, what, [&](std::span<const void* const> posted) {
      if (to_first_only && member_ != 0) return;
      for (int k = 0; k < size(); ++k) {
        if (k == member_) continue;
        const nn::OptimizerShard part = part_of(values.size(), size(), k);
        std::memcpy(values.data() + part.begin, at(posted[static_cast<std::size_t>(k)], part.begin),
                    static_cast<std::size_t>(part.size()) * sizeof(float));
      }
    });
  }

  Meeting* meeting_;
  int member_;
};

class ThreadGroup final : public RankGroup {
 public:
  explicit ThreadGroup(RankLayout layout) : RankGroup(layout, all_ranks(layout)) {
    const int p = layout.pipeline;
    const int d = layout.data_parallel;
    const int t = layout.tensor;
    std::vector<int> everyone = local_ranks();
    world_meeting_ = std::make_unique<Meeting>("the world", everyone, aborted_);
    // Each sub-group's meeting, keyed by what its members share.
    const auto meeting = [&](std::string name, auto member_of) {
      std::vector<int> members;
      for (const int w : everyone) {
        if (member_of(w)) members.push_back(w);
      }
      return std::make_unique<Meeting>(std::move(name), std::move(members), aborted_);
    };
    for (int dr = 0; dr < d; ++dr) {
      for (int tr = 0; tr < t; ++tr) {
        pipeline_meetings_.push_back(meeting(
            t > 1 ? fmt::format("the pipeline of data-parallel rank {}, tensor-parallel rank {}", dr, tr)
                  : fmt::format("the pipeline of data-parallel rank {}", dr),
            [&](int w) { return layout.data_rank(w) == dr && layout.tensor_rank(w) == tr; }));
      }
    }
    for (int pr = 0; pr < p; ++pr) {
      for (int tr = 0; tr < t; ++tr) {
        data_meetings_.push_back(meeting(
            t > 1 ? fmt::format("the data-parallel group of pipeline rank {}, tensor-parallel rank {}", pr, tr)
                  : fmt::format("the data-parallel group of pipeline rank {}", pr),
            [&](int w) { return layout.pipeline_rank(w) == pr && layout.tensor_rank(w) == tr; }));
      }
      for (int dr = 0; dr < d; ++dr) {
        tensor_meetings_.push_back(
            meeting(fmt::format("the tensor-parallel group of pipeline rank {}, data-parallel rank {}", pr, dr),
                    [&](int w) { return layout.pipeline_rank(w) == pr && layout.data_rank(w) == dr; }));
      }
    }
    for (const int w : everyone) {
      const auto pr = static_cast<std::size_t>(layout.pipeline_rank(w));
      const auto dr = static_cast<std::size_t>(layout.data_rank(w));
      const auto tr = static_cast<std::size_t>(layout.tensor_rank(w));
      const auto ts = static_cast<std::size_t>(t);
      world_.push_back(std::make_unique<ThreadCommunicator>(*world_meeting_, w));
      pipeline_.push_back(std::make_unique<ThreadCommunicator>(*pipeline_meetings_[dr * ts + tr], pr));
      data_.push_back(std::make_unique<ThreadCommunicator>(*data_meetings_[pr * ts + tr], dr));
      tensor_.push_back(std::make_unique<ThreadCommunicator>(
          *tensor_meetings_[pr * static_cast<std::size_t>(d) + dr], static_cast<int>(tr)));
    }
  }

  bool spans_processes() const override { return false; }
  bool shares_process(int, int) const override { return true; }
  Communicator& world(int w) override { return *world_.at(static_cast<std::size_t>(w)); }
  Communicator& pipeline(int w) override { return *pipeline_.at(static_cast<std::size_t>(w)); }
  Communicator& data(int w) override { return *data_.at(static_cast<std::size_t>(w)); }
  Communicator& tensor(int w) override { return *tensor_.at(static_cast<std::size_t>(w)); }

  std::unique_ptr<Transport> pipeline_transport(int /*data_rank*/, int /*tensor_rank*/,
                                                const PipelineTraffic& traffic) override {
    return std::make_unique<InProcessTransport>(traffic.inbox_capacity, handoff_spin());
  }

  void run(const std::function<void(int)>& job, const std::function<void()>& abort) override {
    if (!threads_) threads_ = std::make_unique<RankThreads>(layout().world_size());
    aborted_.store(false, std::memory_order_release);
    for_each_meeting([](Meeting& m) { m.reset(); });
    std::mutex error_mutex;
    std::exception_ptr first_error;
    threads_->run([&](int w) {
      try {
        job(w);
      } catch (const RankGroupAborted&) {  // another rank failed: it reports
      } catch (...) {
        {
          const std::lock_guard lock(error_mutex);
          if (!first_error) first_error = std::current_exception();
        }
        aborted_.store(true, std::memory_order_release);
        for_each_meeting([](Meeting& m) { m.wake(); });
        abort();
      }
    });
    if (first_error) std::rethrow_exception(first_error);
  }

  double max_over_processes(double value, Deadline, std::string_view) override { return value; }

  double clock_offset_s() const override { return 0; }

  std::string placement() const override {
    const RankLayout& l = layout();
    if (l.data_parallel == 1 && l.tensor == 1) {
      return fmt::format("one worker thread per rank on a machine with {} cores", usable_cores());
    }
    return fmt::format("{} worker threads ({}) on a machine with {} cores", l.world_size(), l.dimensions(),
                       usable_cores());
  }

  std::string oversubscription(bool emulated, bool can_emulate) const override {
    return oversubscription_note(layout().world_size(), usable_cores(), emulated,
                                 can_emulate && layout().data_parallel == 1 && layout().tensor == 1);
  }

  // How long a wait for a message spins before it sleeps: spinning pays only
  // when each rank has a core of its own (RankThreads pins them then).
  std::chrono::nanoseconds handoff_spin() const {
    return layout().world_size() <= usable_cores() ? kHandoffSpin : std::chrono::nanoseconds(0);
  }

 private:
  static std::vector<int> all_ranks(RankLayout layout) {
    std::vector<int> ranks(static_cast<std::size_t>(std::max(0, layout.world_size())));
    std::iota(ranks.begin(), ranks.end(), 0);
    return ranks;
  }
  template <typename F>
  void for_each_meeting(F f) {
    f(*world_meeting_);
    for (auto& m : pipeline_meetings_) f(*m);
    for (auto& m : data_meetings_) f(*m);
    for (auto& m : tensor_meetings_) f(*m);
  }

  std::atomic<bool> aborted_{false};
  std::unique_ptr<Meeting> world_meeting_;
  std::vector<std::unique_ptr<Meeting>> pipeline_meetings_;  // by data rank · t + tensor rank
  std::vector<std::unique_ptr<Meeting>> data_meetings_;      // by pipeline rank · t + tensor rank
  std::vector<std::unique_ptr<Meeting>> tensor_meetings_;    // by pipeline rank · d + data rank
  std::vector<std::unique_ptr<ThreadCommunicator>> world_, pipeline_, data_, tensor_;  // by world rank
  // Started at the first run; destroyed (stopped and joined) first.
  std::unique_ptr<RankThreads> threads_;
};

}  // namespace

std::unique_ptr<RankGroup> RankGroup::in_threads(RankLayout layout) { return std::make_unique<ThreadGroup>(layout); }

}  // namespace pipeflow::runtime
