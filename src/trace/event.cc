#include "pipeflow/trace/event.h"

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

constexpr std::array<std::pair<EventCategory, std::string_view>, 11> kNames{{
    {EventCategory::kForward, "forward"},
    {EventCategory::kBackward, "backward"},
    {EventCategory::kBackwardInput, "backward_input"},
    {EventCategory::kBackwardWeight, "backward_weight"},
    {EventCategory::kSend, "send"},
    {EventCategory::kRecv, "recv"},
    {EventCategory::kWait, "wait"},
    {EventCategory::kAllreduce, "allreduce"},
    {EventCategory::kTensorParallel, "tensor_parallel"},
    {EventCategory::kOptimizer, "optimizer"},
    {EventCategory::kOther, "other"},
}};

}  // namespace

std::string_view to_string(EventCategory category) {
  for (const auto& [c, name] : kNames) {
    if (c == category) return name;
  }
  fail("internal: unknown event category {}", static_cast<int>(category));
}

EventCategory parse_event_category(std::string_view text) {
  for (const auto& [c, name] : kNames) {
    if (name == text) return c;
  }
  fail("unknown event category {}: expected forward, backward, backward_input, backward_weight, send, recv, "
       "wait, allreduce, tensor_parallel, optimizer or other",
       quoted_excerpt(text));
}

EventCategory category_of(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward: return EventCategory::kForward;
    case ActionKind::kBackward: return EventCategory::kBackward;
    case ActionKind::kBackwardInput: return EventCategory::kBackwardInput;
    case ActionKind::kBackwardWeight: return EventCategory::kBackwardWeight;
    case ActionKind::kSendForward:
    case ActionKind::kSendBackward: return EventCategory::kSend;
    case ActionKind::kRecvForward:
    case ActionKind::kRecvBackward: return EventCategory::kRecv;
  }
  return EventCategory::kOther;
}

bool is_compute(EventCategory category) {
  return category == EventCategory::kForward || category == EventCategory::kBackward ||
         category == EventCategory::kBackwardInput || category == EventCategory::kBackwardWeight;
}

double Timeline::start_s() const {
  if (events.empty()) return 0;
  double start = std::numeric_limits<double>::infinity();
  for (const TraceEvent& e : events) start = std::min(start, e.start_s);
  return start;
}

double Timeline::end_s() const {
  double end = 0;
  for (const TraceEvent& e : events) end = std::max(end, e.end_s());
  return events.empty() ? 0 : end;
}

double Timeline::makespan_s() const { return end_s() - start_s(); }

Timeline timeline_from_execution(const Schedule& schedule, const Execution& execution, std::string title) {
  Timeline timeline;
  timeline.title = std::move(title);
  timeline.num_ranks = schedule.num_ranks();
  for (std::size_t r = 0; r < execution.ranks.size(); ++r) {
    const RankId rank(static_cast<int>(r));
    for (const TimedAction& t : execution.ranks[r]) {
      const std::string name = to_string(t.action);
      if (t.wait > 0) timeline.events.push_back({rank, name, EventCategory::kWait, t.action, t.start, t.wait});
      timeline.events.push_back(
          {rank, name, category_of(t.action.kind), t.action, t.start + t.wait, t.end - t.start - t.wait});
    }
  }
  return timeline;
}

BubbleStats bubble_stats(const Timeline& timeline) {
  BubbleStats stats;
  std::vector<double> busy(static_cast<std::size_t>(std::max(timeline.num_ranks, 0)), 0.0);
  for (const TraceEvent& e : timeline.events) {
    const auto r = static_cast<std::size_t>(e.rank.value());
    if (is_compute(e.category) && r < busy.size()) busy[r] += e.duration_s;
  }
  const double makespan = timeline.makespan_s();
  double total = 0;
  for (double b : busy) {
    stats.per_rank.push_back(makespan > 0 ? 1.0 - b / makespan : 0.0);
    total += b;
  }
  const double capacity = makespan * static_cast<double>(busy.size());
  stats.overall = capacity > 0 ? 1.0 - total / capacity : 0.0;
  return stats;
}

}  // namespace pipeflow
