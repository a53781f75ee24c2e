#include "pipeflow/schedule/passes.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "pipeflow/core/error.h"
#include "pipeflow/schedule/execute.h"

namespace pipeflow {
namespace {

struct Message {
  std::tuple<double, int, std::size_t> key;  // message time, producer rank, producer index
  RankId rank;                               // where this half of the message goes
  Action action;
};

Schedule empty_like(const Schedule& schedule) {
  Schedule out(schedule.name(), schedule.num_ranks(), schedule.num_stages(), schedule.num_microbatches(),
               schedule.placement());
  out.set_inference(schedule.is_inference());
  return out;
}

// The unit-cost timing of a compute-only schedule, searchable by action and time.
class Timing {
 public:
  explicit Timing(const Execution& execution) : execution_(execution) {
    for (std::size_t r = 0; r < execution.ranks.size(); ++r) {
      for (std::size_t i = 0; i < execution.ranks[r].size(); ++i) {
        where_.emplace(execution.ranks[r][i].action, std::make_pair(r, i));
      }
    }
  }

  const std::vector<TimedAction>& rank(RankId r) const {
    return execution_.ranks[static_cast<std::size_t>(r.value())];
  }
  const TimedAction* find(const Action& a) const {
    const auto it = where_.find(a);
    return it == where_.end() ? nullptr : &execution_.ranks[it->second.first][it->second.second];
  }
  // The end of the action of rank r that runs across time t (start < t < end), if any.
  std::optional<double> busy_until(RankId r, double t) const {
    const auto& timed = rank(r);
    const auto after = std::upper_bound(timed.begin(), timed.end(), t,
                                        [](double time, const TimedAction& a) { return time <= a.start; });
    if (after == timed.begin()) return std::nullopt;
    const TimedAction& running = *std::prev(after);
    if (running.end > t) return running.end;
    return std::nullopt;
  }

 private:
  const Execution& execution_;
  std::unordered_map<Action, std::pair<std::size_t, std::size_t>> where_;
};

// When the message from `producer` (rank a) to its consumer (rank b) is
// placed: the earliest time in [producer end, consumer start] at which
// neither rank is inside an action, so that even a rendezvous delays
// nobody; the producer's end if there is no such time.
double message_time(const Timing& timing, const TimedAction& producer, RankId a, const TimedAction* consumer,
                    RankId b) {
  const double earliest = producer.end;
  if (consumer == nullptr) return earliest;
  double t = earliest;
  while (t <= consumer->start) {
    if (const auto until = timing.busy_until(a, t)) {
      t = *until;
    } else if (const auto until_b = timing.busy_until(b, t)) {
      t = *until_b;
    } else {
      return t;
    }
  }
  return earliest;
}

// Both halves of the message a compute action sends to another rank, if any.
void collect_messages(const Schedule& schedule, const Timing& timing, RankId rank, std::size_t index,
                      std::vector<Message>& out) {
  const TimedAction& timed = timing.rank(rank)[index];
  const Action& a = timed.action;
  const std::optional<Action> send = result_send(a);
  if (!send) return;
  const std::optional<RankId> to = schedule.peer_rank(*send);
  if (!to || *to == rank) return;
  const Action recv = partner(*send);
  // The neighbour consumes it in its F, or in its B (its I when the backward is split).
  const ActionKind consumer = a.kind == ActionKind::kForward ? ActionKind::kForward : ActionKind::kBackward;
  const TimedAction* consumed = timing.find(Action{recv.stage, consumer, a.microbatch});
  if (consumed == nullptr && consumer == ActionKind::kBackward) {
    consumed = timing.find(Action{recv.stage, ActionKind::kBackwardInput, a.microbatch});
  }
  const auto key = std::make_tuple(message_time(timing, timed, rank, consumed, *to), rank.value(), index);
  out.push_back({key, rank, *send});
  out.push_back({key, *to, recv});
}

}  // namespace

Schedule insert_send_recv(const Schedule& schedule) {
  if (schedule.has_communication()) {
    fail("insert_send_recv: {} already has SEND/RECV actions; lower a compute-only schedule", schedule.name());
  }
  const Execution timing = execute(schedule, unit_costs(CommMode::kOverlapped));
  if (timing.deadlocked) {
    fail("cannot insert send/recv into {}: its compute-only order deadlocks:\n{}", schedule.name(),
         timing.deadlock_message());
  }
  const Timing times(timing);
  std::vector<std::vector<Message>> per_rank(static_cast<std::size_t>(schedule.num_ranks()));
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    std::vector<Message> messages;
    for (std::size_t i = 0; i < timing.ranks[static_cast<std::size_t>(r)].size(); ++i) {
      collect_messages(schedule, times, RankId(r), i, messages);
    }
    for (Message& m : messages) per_rank[static_cast<std::size_t>(m.rank.value())].push_back(m);
  }
  Schedule lowered = empty_like(schedule);
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    auto& messages = per_rank[static_cast<std::size_t>(r)];
    std::sort(messages.begin(), messages.end(), [](const Message& a, const Message& b) { return a.key < b.key; });
    const auto& timed = timing.ranks[static_cast<std::size_t>(r)];
    std::vector<Action>& out = lowered.mutable_actions(RankId(r));
    std::size_t next = 0;
    for (std::size_t i = 0; i <= timed.size(); ++i) {
      const double boundary = i < timed.size() ? timed[i].start : std::numeric_limits<double>::infinity();
      while (next < messages.size() && std::get<0>(messages[next].key) <= boundary) {
        out.push_back(messages[next++].action);
      }
      if (i < timed.size()) out.push_back(timed[i].action);
    }
  }
  return lowered;
}

Schedule merge_bw(const Schedule& schedule) {
  Schedule merged = empty_like(schedule);
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    const auto& in = schedule.actions(RankId(r));
    auto& out = merged.mutable_actions(RankId(r));
    for (std::size_t i = 0; i < in.size(); ++i) {
      const bool pair = i + 1 < in.size() && in[i].kind == ActionKind::kBackwardInput &&
                        in[i + 1].kind == ActionKind::kBackwardWeight && in[i].stage == in[i + 1].stage &&
                        in[i].microbatch == in[i + 1].microbatch;
      if (pair) {
        out.push_back({in[i].stage, ActionKind::kBackward, in[i].microbatch});
        ++i;
      } else {
        out.push_back(in[i]);
      }
    }
  }
  return merged;
}

Schedule strip_communication(const Schedule& schedule) {
  Schedule stripped = empty_like(schedule);
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    for (const Action& a : schedule.actions(RankId(r))) {
      if (is_compute(a.kind)) stripped.add(RankId(r), a);
    }
  }
  return stripped;
}

}  // namespace pipeflow
