#include "engine/tensor_collectives.h"

#include <algorithm>

#include "pipeflow/core/cpu_time.h"

namespace pipeflow::runtime {

// The CPU clock is read inside the wall-clock interval (as rank_worker does
// for an action), so a collective's CPU time never exceeds its wall time by
// more than the clocks' resolution.
TensorCollectives::Started TensorCollectives::start() {
  const Clock::time_point wall = Clock::now();
  return {wall, thread_cpu_seconds()};
}

void TensorCollectives::finish(const Started& started, std::int64_t bytes) {
  const double cpu_s = thread_cpu_seconds() - started.cpu_s;
  done_.push_back({started.wall, Clock::now(), bytes, cpu_s});
}

void TensorCollectives::all_reduce_sum(std::span<float> values, std::string_view what) {
  const Started started = start();
  comm_->all_reduce_sum(values, deadline_after(timeout_), what, values.size());
  finish(started, static_cast<std::int64_t>(values.size_bytes()));
}

// A few values a row (the logits' row maxima): gathered whole, each
// member's largest taken in member order, the same on every member.
void TensorCollectives::all_reduce_max(std::span<float> values, std::string_view what) {
  const Started started = start();
  const std::vector<double> mine(values.begin(), values.end());
  const std::vector<double> all = comm_->all_gather(mine, deadline_after(timeout_), what);
  for (std::size_t member = 0; member < all.size() / std::max<std::size_t>(values.size(), 1); ++member) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = std::max(values[i], static_cast<float>(all[member * values.size() + i]));
    }
  }
  finish(started, static_cast<std::int64_t>(values.size_bytes()));
}

// Each member's part of `all` is nn::OptimizerShard::of(all.size(), size, k):
// k · mine.size() onwards when every member gives as many.
void TensorCollectives::all_gather(std::span<const float> mine, std::span<float> all, std::string_view what) {
  const Started started = start();
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(rank() * mine.size()));
  comm_->all_gather_parts(all, deadline_after(timeout_), what);
  finish(started, static_cast<std::int64_t>(all.size_bytes()));
}

void TensorCollectives::reduce_scatter(std::span<float> values, std::span<float> mine, std::string_view what) {
  const Started started = start();
  comm_->reduce_scatter_parts(values, std::string(what), values.size())->finish(deadline_after(timeout_));
  const auto from = values.begin() + static_cast<std::ptrdiff_t>(rank() * mine.size());
  std::copy(from, from + static_cast<std::ptrdiff_t>(mine.size()), mine.begin());
  finish(started, static_cast<std::int64_t>(values.size_bytes()));
}

std::vector<CollectiveTiming> TensorCollectives::take(Clock::time_point epoch) {
  std::vector<CollectiveTiming> timings;
  timings.reserve(done_.size());
  const auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - epoch).count(); };
  for (const Done& d : done_) timings.push_back({since(d.start), since(d.end), d.bytes, d.cpu_s});
  done_.clear();
  return timings;
}

}  // namespace pipeflow::runtime
