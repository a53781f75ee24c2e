#pragma once

#include <nlohmann/json_fwd.hpp>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/core/ids.h"
#include "pipeflow/schedule/action.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/schedule/schedule.h"

namespace pipeflow {

// What a span of a rank's time was spent on.
enum class EventCategory {
  kForward,
  kBackward,
  kBackwardInput,
  kBackwardWeight,
  kSend,
  kRecv,
  kWait,
  kAllreduce,
  // A tensor-parallel collective inside a compute action (the all-reduce that
  // ends a row-parallel product): drawn over its action, and counted as
  // communication, not compute, where it overlaps one.
  kTensorParallel,
  kOptimizer,
  kOther,
};

// "forward", "backward", "backward_input", "backward_weight", "send", "recv",
// "wait", "allreduce", "tensor_parallel", "optimizer", "other"; parse_event_category is its
// inverse and throws Error for any other text.
std::string_view to_string(EventCategory category);
EventCategory parse_event_category(std::string_view text);
// The category of an action of that kind (F -> forward, SEND_B -> send, ...).
EventCategory category_of(ActionKind kind);
// F/B/I/W: the categories that count as busy in bubble figures.
bool is_compute(EventCategory category);

// One span on one rank: predicted by an executor or simulator, or measured
// by the runtime. `action` is set when the span belongs to a schedule action.
struct TraceEvent {
  RankId rank;
  std::string name;
  EventCategory category = EventCategory::kOther;
  std::optional<Action> action;
  double start_s = 0;
  double duration_s = 0;

  double end_s() const { return start_s + duration_s; }
  bool operator==(const TraceEvent&) const = default;
};

// The events of one step on every rank. Events of one rank do not overlap.
struct Timeline {
  std::string title;
  int num_ranks = 0;
  std::vector<TraceEvent> events;
  // The unit of start_s and duration_s as shown to people: "s" for measured
  // and simulated timelines, "unit" for the unit-cost dry run.
  std::string time_unit = "s";
  // What the program that made the timeline says about its run (pipeflow's
  // resolved configuration, hardware and per-stage costs: sim/run_metadata.h),
  // carried as otherData.pipeflow of a Chrome trace; null: nothing. Held by
  // pointer so that this header needs only <nlohmann/json_fwd.hpp>.
  std::shared_ptr<const nlohmann::json> run_metadata;

  double start_s() const;     // earliest start (0 if empty)
  double end_s() const;       // latest end (0 if empty)
  double makespan_s() const;  // end_s() - start_s()
};

// The timeline of an execution: one event per executed action at its start
// and duration; a SEND/RECV that waited becomes a wait event for the waiting
// part followed by its send/recv event for the rest (possibly of duration 0).
Timeline timeline_from_execution(const Schedule& schedule, const Execution& execution, std::string title);

// The idle share of the makespan, counting only compute (F/B/I/W) as busy:
// per rank 1 - busy_r / makespan, overall 1 - sum(busy) / (ranks * makespan).
struct BubbleStats {
  std::vector<double> per_rank;
  double overall = 0;
};
BubbleStats bubble_stats(const Timeline& timeline);

}  // namespace pipeflow
