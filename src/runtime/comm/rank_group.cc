#include "pipeflow/runtime/rank_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "pipeflow/core/error.h"
#include "pipeflow/runtime/rank_threads.h"

namespace pipeflow::runtime {
namespace {

std::string ranks_line(const std::vector<int>& ranks) {
  std::string line;
  for (const int r : ranks) line += fmt::format(" {}", r);
  return line;
}

}  // namespace

std::string RankLayout::describe() const {
  std::string text;
  for (int d = 0; d < data_parallel; ++d) {
    for (int t = 0; t < tensor; ++t) {
      std::vector<int> ranks;
      for (int p = 0; p < pipeline; ++p) ranks.push_back(world_rank(p, d, t));
      text += fmt::format("pipeline ({}): world ranks{}\n",
                          tensor > 1 ? fmt::format("data-parallel rank {}, tensor-parallel rank {}", d, t)
                                     : fmt::format("data-parallel rank {}", d),
                          ranks_line(ranks));
    }
  }
  if (data_parallel > 1) {
    for (int p = 0; p < pipeline; ++p) {
      for (int t = 0; t < tensor; ++t) {
        std::vector<int> ranks;
        for (int d = 0; d < data_parallel; ++d) ranks.push_back(world_rank(p, d, t));
        text += fmt::format("data-parallel group ({}): world ranks{}\n",
                            tensor > 1 ? fmt::format("pipeline rank {}, tensor-parallel rank {}", p, t)
                                       : fmt::format("pipeline rank {}", p),
                            ranks_line(ranks));
      }
    }
  }
  if (tensor > 1) {
    for (int p = 0; p < pipeline; ++p) {
      for (int d = 0; d < data_parallel; ++d) {
        std::vector<int> ranks;
        for (int t = 0; t < tensor; ++t) ranks.push_back(world_rank(p, d, t));
        text += fmt::format("tensor-parallel group (pipeline rank {}, data-parallel rank {}): world ranks{}\n", p, d,
                            ranks_line(ranks));
      }
    }
  }
  return text;
}

std::string RankLayout::dimensions() const {
  std::string text = fmt::format("pipeline {} x data parallel {}", pipeline, data_parallel);
  if (tensor > 1) text += fmt::format(" x tensor parallel {}", tensor);
  if (data_slowest()) text += ", ranks tp-pp-dp";
  return text;
}

void Communicator::all_reduce_sum(std::span<float> values, Deadline deadline, std::string_view what,
                                  std::size_t bucket_floats) {
  reduce_scatter_parts(values, std::string(what), bucket_floats)->finish(deadline);
  all_gather_parts(values, deadline, what);
}

void Communicator::barrier(Deadline deadline, std::string_view what) { all_gather({}, deadline, what); }

RankGroup::RankGroup(RankLayout layout, std::vector<int> local_ranks)
    : layout_(layout), local_ranks_(std::move(local_ranks)) {
  if (layout_.pipeline < 1 || layout_.data_parallel < 1 || layout_.tensor < 1) {
    fail("a rank group of pipeline {} x data parallel {} x tensor parallel {}: each must be at least 1",
         layout_.pipeline, layout_.data_parallel, layout_.tensor);
  }
}

std::unique_ptr<RankGroup> RankGroup::make(const MpiWorld* world, RankLayout layout) {
  return world != nullptr ? in_processes(*world, layout) : in_threads(layout);
}

bool RankGroup::is_local(int world_rank) const {
  return std::binary_search(local_ranks_.begin(), local_ranks_.end(), world_rank);
}

int usable_cores() {
  const auto affinity = static_cast<int>(usable_cpus().size());
  if (affinity > 0) return affinity;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string oversubscription_note(int ranks, int cores, bool emulated, bool can_emulate) {
  if (cores <= 0 || ranks <= cores) return "";
  if (emulated) {
    return fmt::format(
        "{} ranks, {} cores: threads would time-slice, so this run is emulated: each action ran alone and the "
        "timeline replays the measured durations with one core per rank.",
        ranks, cores);
  }
  return fmt::format(
      "{} ranks share {} cores: the workers are time-sliced, so the measured step time, tokens/s and bubble are "
      "not those of a pipeline with one device per rank{}",
      ranks, cores,
      can_emulate ? "; --emulate runs each action alone and replays the measured durations with one core per rank."
                  : ".");
}

}  // namespace pipeflow::runtime
