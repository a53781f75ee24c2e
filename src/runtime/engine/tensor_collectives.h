#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "pipeflow/nn/tensor_group.h"
#include "pipeflow/runtime/rank_group.h"
#include "pipeflow/runtime/step_record.h"

namespace pipeflow::runtime {

// The layers' view of a rank's tensor-parallel group (nn::TensorGroup) over
// the rank group's communicator: each collective waits at most `timeout`
// (an Error naming the collective and the ranks that never came; a peer's
// failure ends it with RankGroupAborted) and is timed, so that the step's
// record holds every one (its bytes and its span).
//
// Thread safety: the rank's own thread only.
class TensorCollectives final : public nn::TensorGroup {
 public:
  TensorCollectives(Communicator& comm, std::chrono::duration<double> timeout) : comm_(&comm), timeout_(timeout) {}

  int size() const override { return comm_->size(); }
  int rank() const override { return comm_->rank(); }
  void all_reduce_sum(std::span<float> values, std::string_view what) override;
  void all_reduce_max(std::span<float> values, std::string_view what) override;
  void all_gather(std::span<const float> mine, std::span<float> all, std::string_view what) override;
  void reduce_scatter(std::span<float> values, std::span<float> mine, std::string_view what) override;

  // How long each later collective may wait.
  void set_timeout(std::chrono::duration<double> timeout) { timeout_ = timeout; }
  // The collectives since the last call, their times seconds after `epoch`.
  std::vector<CollectiveTiming> take(Clock::time_point epoch);

 private:
  struct Done {
    Clock::time_point start, end;
    std::int64_t bytes;
    double cpu_s;
  };
  // Starts timing a collective; finish records it.
  struct Started {
    Clock::time_point wall;
    double cpu_s;
  };
  static Started start();
  void finish(const Started& started, std::int64_t bytes);
  Communicator* comm_;
  std::chrono::duration<double> timeout_;
  std::vector<Done> done_;
};

}  // namespace pipeflow::runtime
