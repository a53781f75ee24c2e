#include "train/emulated_step.h"

#include <algorithm>

namespace pipeflow::runtime {

StepFigures emulated_figures(const Schedule& schedule, const StepResult& serial, StepFigures measured) {
  const Execution replayed = replay(schedule, serial);
  const Timeline timeline = timeline_from_execution(schedule, replayed, "");
  const BubbleStats bubble = bubble_stats(timeline);
  measured.pipeline_s = replayed.makespan;
  measured.bubble = bubble.overall;
  measured.wall_s = replayed.makespan;
  for (std::size_t r = 0; r < measured.ranks.size(); ++r) {
    RankFigures& rank = measured.ranks[r];
    rank.bubble = bubble.per_rank[r];
    rank.pipeline_end_s = replayed.ranks[r].empty() ? 0 : replayed.ranks[r].back().end;
    rank.wait_s = rank.pipeline_end_s - rank.compute_s;  // the replay's idle time is all waiting for inputs
    rank.comm_s = 0;
    rank.other_s = 0;
    measured.wall_s = std::max(measured.wall_s, replayed.makespan + rank.flush_s);
  }
  measured.tokens_per_s = static_cast<double>(serial.tokens) / measured.wall_s;
  return measured;
}

}  // namespace pipeflow::runtime
