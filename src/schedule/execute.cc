#include "pipeflow/schedule/execute.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

constexpr double kNotDone = -1.0;  // times are >= 0
constexpr int kNobody = -1;

// An input of an action: the action that produces it and whether it crosses
// ranks without communication (compute-only schedules: transfer time applies).
struct Input {
  Action producer;
  bool cross_rank = false;
};

struct Inputs {
  std::array<Input, 2> items;
  int count = 0;
  void add(Action producer, bool cross_rank) { items[static_cast<std::size_t>(count++)] = {producer, cross_rank}; }
};

// What a blocked rank lacks: an input, or (kBlocking) its rendezvous partner.
struct Need {
  Action action;
  bool rendezvous = false;
};

class Executor {
 public:
  Executor(const Schedule& schedule, const ExecutionCosts& costs, std::span<const double> rank_start_s)
      : schedule_(schedule),
        costs_(costs),
        lowered_(schedule.has_communication()),
        stages_(schedule.num_stages()),
        microbatches_(schedule.num_microbatches()),
        ranks_(schedule.num_ranks()) {
    const std::size_t keys = static_cast<std::size_t>(kNumActionKinds) * static_cast<std::size_t>(stages_) *
                             static_cast<std::size_t>(microbatches_);
    end_.assign(keys, kNotDone);
    waiter_head_.assign(keys, kNobody);
    split_backward_.assign(keys / kNumActionKinds, false);
    next_waiter_.assign(static_cast<std::size_t>(ranks_), kNobody);
    next_.assign(static_cast<std::size_t>(ranks_), 0);
    free_.assign(static_cast<std::size_t>(ranks_), 0.0);
    if (!rank_start_s.empty()) free_.assign(rank_start_s.begin(), rank_start_s.end());
    at_rendezvous_.assign(static_cast<std::size_t>(ranks_), false);
    queued_.assign(static_cast<std::size_t>(ranks_), false);
    result_.ranks.resize(static_cast<std::size_t>(ranks_));
    for (int r = 0; r < ranks_; ++r) {
      lists_.push_back(&schedule.actions(RankId(r)));
      result_.ranks[static_cast<std::size_t>(r)].reserve(list(r).size());
    }
    check_and_classify();
  }

  Execution run() {
    for (int r = ranks_ - 1; r >= 0; --r) enqueue(r);
    while (!worklist_.empty()) {
      const int r = worklist_.back();
      worklist_.pop_back();
      queued_[static_cast<std::size_t>(r)] = false;
      while (next_[static_cast<std::size_t>(r)] < list(r).size() && step(r)) {
      }
    }
    for (const auto& timed : result_.ranks) {
      for (const TimedAction& t : timed) result_.makespan = std::max(result_.makespan, t.end);
    }
    describe_stuck_ranks();
    return std::move(result_);
  }

 private:
  const std::vector<Action>& list(int r) const { return *lists_[static_cast<std::size_t>(r)]; }

  // All kinds of one (stage, micro-batch) share a cache line.
  std::size_t key(const Action& a) const {
    return (static_cast<std::size_t>(a.stage.value()) * static_cast<std::size_t>(microbatches_) +
            static_cast<std::size_t>(a.microbatch.value())) *
               kNumActionKinds +
           static_cast<std::size_t>(a.kind);
  }
  std::size_t cell(int stage, MicrobatchId microbatch) const {
    return static_cast<std::size_t>(stage) * static_cast<std::size_t>(microbatches_) +
           static_cast<std::size_t>(microbatch.value());
  }
  bool done(const Action& a) const { return end_[key(a)] != kNotDone; }
  // The rank whose list holds `a` (its first occurrence), or kNobody.
  int rank_holding(const Action& a) const {
    const std::int64_t w = where_[key(a)];
    return w < 0 ? kNobody : static_cast<int>(w >> 32);
  }
  std::size_t index_in_list(const Action& a) const {
    return static_cast<std::size_t>(where_[key(a)] & 0xffffffff);
  }

  // Rejects actions outside the schedule; notes which (stage, micro-batch) split their backward.
  void check_and_classify() {
    for (int r = 0; r < ranks_; ++r) {
      const auto& actions = list(r);
      for (std::size_t i = 0; i < actions.size(); ++i) {
        const Action& a = actions[i];
        if (a.stage.value() < 0 || a.stage.value() >= stages_ || a.microbatch.value() < 0 ||
            a.microbatch.value() >= microbatches_) {
          fail("cannot execute {}: {} on rank {} step {} lies outside its {} stages and {} micro-batches "
               "(run validate first)",
               schedule_.name(), to_string(a), r, i, stages_, microbatches_);
        }
        if (a.kind == ActionKind::kBackwardInput) split_backward_[cell(a.stage.value(), a.microbatch)] = true;
      }
    }
  }

  // Where every action first occurs; needed only to describe a deadlock.
  void index_positions() {
    where_.assign(end_.size(), -1);
    for (int r = 0; r < ranks_; ++r) {
      const auto& actions = list(r);
      for (std::size_t i = 0; i < actions.size(); ++i) {
        std::int64_t& w = where_[key(actions[i])];
        if (w < 0) w = (static_cast<std::int64_t>(r) << 32) | static_cast<std::int64_t>(i);
      }
    }
  }

  // The B or I of `stage` for `microbatch`: I if the schedule holds one, else B.
  Action gradient_of(int stage, MicrobatchId microbatch) const {
    const bool split = split_backward_[cell(stage, microbatch)];
    return {StageId(stage), split ? ActionKind::kBackwardInput : ActionKind::kBackward, microbatch};
  }

  bool crosses(int stage, int other_stage) const {
    return schedule_.rank_of(StageId(stage)) != schedule_.rank_of(StageId(other_stage));
  }

  // The inputs of a compute action or a SEND (RECVs are matched separately).
  Inputs inputs_of(const Action& a) const {
    Inputs in;
    const int s = a.stage.value();
    const MicrobatchId mb = a.microbatch;
    switch (a.kind) {
      case ActionKind::kForward:
        if (s > 0) {
          const bool cross = crosses(s - 1, s);
          if (lowered_ && cross) {
            in.add({a.stage, ActionKind::kRecvForward, mb}, false);
          } else {
            in.add({StageId(s - 1), ActionKind::kForward, mb}, cross);
          }
        }
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        in.add({a.stage, ActionKind::kForward, mb}, false);
        if (s < stages_ - 1) {
          const bool cross = crosses(s + 1, s);
          if (lowered_ && cross) {
            in.add({a.stage, ActionKind::kRecvBackward, mb}, false);
          } else {
            in.add(gradient_of(s + 1, mb), cross);
          }
        }
        break;
      case ActionKind::kBackwardWeight:
        in.add({a.stage, ActionKind::kBackwardInput, mb}, false);
        break;
      case ActionKind::kSendForward:
        in.add({a.stage, ActionKind::kForward, mb}, false);
        break;
      case ActionKind::kSendBackward:
        in.add(gradient_of(s, mb), false);
        break;
      case ActionKind::kRecvForward:
      case ActionKind::kRecvBackward:
        break;
    }
    return in;
  }

  // The other half of a message, if the stage has a neighbour in that direction.
  std::optional<Action> partner_of(const Action& a) const {
    if (!schedule_.peer_rank(a)) return std::nullopt;
    return partner(a);
  }

  // The first thing the head action of rank r lacks, if any.
  std::optional<Need> missing(int r) const {
    const Action& a = list(r)[next_[static_cast<std::size_t>(r)]];
    const Inputs in = inputs_of(a);
    for (int i = 0; i < in.count; ++i) {
      if (!done(in.items[static_cast<std::size_t>(i)].producer)) {
        return Need{in.items[static_cast<std::size_t>(i)].producer, false};
      }
    }
    if (is_communication(a.kind)) {
      const std::optional<Action> partner = partner_of(a);
      if (!partner) return Need{a, true};
      if (costs_.mode == CommMode::kBlocking) return Need{*partner, true};
      if (is_recv(a.kind) && !done(*partner)) return Need{*partner, false};
    }
    return std::nullopt;
  }

  void enqueue(int r) {
    if (queued_[static_cast<std::size_t>(r)]) return;
    queued_[static_cast<std::size_t>(r)] = true;
    worklist_.push_back(r);
  }

  void park(int r, const Action& on) {
    const std::size_t k = key(on);
    next_waiter_[static_cast<std::size_t>(r)] = waiter_head_[k];
    waiter_head_[k] = r;
  }

  void complete(int r, const Action& a, double start, double end, double wait) {
    result_.ranks[static_cast<std::size_t>(r)].push_back({a, start, end, wait});
    free_[static_cast<std::size_t>(r)] = end;
    ++next_[static_cast<std::size_t>(r)];
    const std::size_t k = key(a);
    if (end_[k] == kNotDone) end_[k] = end;
    for (int w = waiter_head_[k]; w != kNobody;) {
      const int following = next_waiter_[static_cast<std::size_t>(w)];
      enqueue(w);
      w = following;
    }
    waiter_head_[k] = kNobody;
  }

  double transfer(const Action& sender, int from, int to) const {
    return costs_.transfer(sender, RankId(from), RankId(to));
  }

  // Runs the head action of rank r if it can; returns false if r must wait.
  bool step(int r) {
    const Action a = list(r)[next_[static_cast<std::size_t>(r)]];
    const double free = free_[static_cast<std::size_t>(r)];
    const Inputs in = inputs_of(a);
    double ready = 0;
    for (int i = 0; i < in.count; ++i) {
      const Input& input = in.items[static_cast<std::size_t>(i)];
      if (!done(input.producer)) {
        park(r, input.producer);
        return false;
      }
      double at = end_[key(input.producer)];
      if (input.cross_rank) at += transfer(input.producer, schedule_.rank_of(input.producer.stage).value(), r);
      ready = std::max(ready, at);
    }
    if (is_compute(a.kind)) {
      const double start = std::max(free, ready);
      complete(r, a, start, start + costs_.duration(a, RankId(r)), 0);
      return true;
    }
    const std::optional<Action> partner = partner_of(a);
    if (!partner) return false;  // a message to no stage: reported as stuck
    if (costs_.mode == CommMode::kBlocking) return rendezvous(r, a, *partner);
    if (is_send(a.kind)) {
      complete(r, a, free, free, 0);
      return true;
    }
    if (!done(*partner)) {
      park(r, *partner);
      return false;
    }
    const double arrival = end_[key(*partner)] + transfer(*partner, schedule_.peer_rank(a)->value(), r);
    complete(r, a, free, std::max(free, arrival), std::max(free, arrival) - free);
    return true;
  }

  // kBlocking: fires the message if the partner rank waits at the matching
  // action; otherwise r waits at its head until the partner arrives.
  bool rendezvous(int r, const Action& a, const Action& partner) {
    at_rendezvous_[static_cast<std::size_t>(r)] = true;
    const int q = schedule_.peer_rank(a)->value();
    if (q == r || next_[static_cast<std::size_t>(q)] >= list(q).size() ||
        list(q)[next_[static_cast<std::size_t>(q)]] != partner || !at_rendezvous_[static_cast<std::size_t>(q)]) {
      return false;
    }
    const bool r_sends = is_send(a.kind);
    const Action& send = r_sends ? a : partner;
    const double free_r = free_[static_cast<std::size_t>(r)];
    const double free_q = free_[static_cast<std::size_t>(q)];
    const double begin = std::max(free_r, free_q);
    const double end = begin + transfer(send, r_sends ? r : q, r_sends ? q : r);
    at_rendezvous_[static_cast<std::size_t>(r)] = false;
    at_rendezvous_[static_cast<std::size_t>(q)] = false;
    complete(r, a, free_r, end, begin - free_r);
    complete(q, partner, free_q, end, begin - free_q);
    enqueue(q);
    return true;
  }

  std::string describe(int r, const Need& need) const {
    const std::string what = to_string(need.action);
    // A RECV always waits for its SEND; under rendezvous a SEND also waits for its RECV.
    const std::string waits = need.rendezvous && is_recv(need.action.kind)
                                  ? fmt::format("waits for {} to rendezvous", what)
                                  : fmt::format("waits for {}", what);
    const int holder = need.rendezvous ? schedule_.rank_of(need.action.stage).value() : rank_holding(need.action);
    if (rank_holding(need.action) == kNobody) {
      return fmt::format("{}, which is in no rank's list", waits);
    }
    if (holder == r) {
      return fmt::format("{}, which comes later in its own list (step {})", waits, index_in_list(need.action));
    }
    const std::size_t head = next_[static_cast<std::size_t>(holder)];
    if (head >= list(holder).size()) {
      return fmt::format("{}, but rank {} has finished its list", waits, holder);
    }
    if (list(holder)[head] == need.action) return fmt::format("{}, at which rank {} is blocked", waits, holder);
    return fmt::format("{}, which rank {} has not reached (rank {} is blocked at {})", waits, holder, holder,
                       to_string(list(holder)[head]));
  }

  void describe_stuck_ranks() {
    for (int r = 0; r < ranks_; ++r) {
      if (next_[static_cast<std::size_t>(r)] < list(r).size() && where_.empty()) index_positions();
    }
    for (int r = 0; r < ranks_; ++r) {
      const std::size_t i = next_[static_cast<std::size_t>(r)];
      if (i >= list(r).size()) continue;
      const Action& a = list(r)[i];
      result_.deadlocked = true;
      const std::optional<Need> need = missing(r);
      std::string why;
      if (!need) {
        why = "internal: ready but not run";
      } else if (need->rendezvous && need->action == a) {
        why = fmt::format("{} has no partner stage", kind_token(a.kind));
      } else {
        why = describe(r, *need);
      }
      result_.stuck.push_back({RankId(r), i, a, fmt::format("rank {} blocked at {}: {}", r, to_string(a), why)});
    }
  }

  const Schedule& schedule_;
  const ExecutionCosts& costs_;
  const bool lowered_;
  const int stages_;
  const int microbatches_;
  const int ranks_;
  std::vector<const std::vector<Action>*> lists_;  // per rank: its actions
  std::vector<double> end_;           // per action key: end of its first run, or kNotDone
  std::vector<bool> split_backward_;  // per (stage, micro-batch): the schedule holds an I
  std::vector<std::int64_t> where_;   // per action key: (rank << 32 | index) of its first occurrence
  std::vector<int> waiter_head_;      // per action key: first rank waiting for it
  std::vector<int> next_waiter_;      // per rank: next rank waiting for the same key
  std::vector<std::size_t> next_;     // per rank: index of its next action
  std::vector<double> free_;          // per rank: when it is free
  std::vector<bool> at_rendezvous_;   // per rank: waiting at a SEND/RECV for its partner
  std::vector<bool> queued_;          // per rank: in the worklist
  std::vector<int> worklist_;
  Execution result_;
};

}  // namespace

std::string Execution::deadlock_message() const {
  std::string out;
  for (const StuckRank& s : stuck) {
    if (!out.empty()) out += '\n';
    out += s.message;
  }
  return out;
}

ExecutionCosts unit_costs(CommMode mode) {
  ExecutionCosts costs;
  costs.duration = [](const Action& a, RankId) { return a.kind == ActionKind::kBackward ? 2.0 : 1.0; };
  costs.transfer = [](const Action&, RankId, RankId) { return 0.0; };
  costs.mode = mode;
  return costs;
}

Execution execute(const Schedule& schedule, const ExecutionCosts& costs, std::span<const double> rank_start_s) {
  if (!costs.duration || !costs.transfer) fail("internal: execute needs both a duration and a transfer cost");
  if (!rank_start_s.empty() && static_cast<int>(rank_start_s.size()) != schedule.num_ranks()) {
    fail("cannot execute {}: {} rank start times for {} ranks: give one per rank or none", schedule.name(),
         rank_start_s.size(), schedule.num_ranks());
  }
  for (double start : rank_start_s) {
    if (!std::isfinite(start) || start < 0) {
      fail("cannot execute {}: a rank start time is {}: it must be finite and >= 0", schedule.name(), start);
    }
  }
  return Executor(schedule, costs, rank_start_s).run();
}

double busy_time(const Execution& execution, RankId rank) {
  double busy = 0;
  for (const TimedAction& t : execution.ranks.at(static_cast<std::size_t>(rank.value()))) {
    if (is_compute(t.action.kind)) busy += t.end - t.start;
  }
  return busy;
}

double bubble_fraction(const Execution& execution) {
  const double capacity = execution.makespan * static_cast<double>(execution.ranks.size());
  if (capacity <= 0) return 0;
  double busy = 0;
  for (std::size_t r = 0; r < execution.ranks.size(); ++r) busy += busy_time(execution, RankId(static_cast<int>(r)));
  return 1.0 - busy / capacity;
}

Execution dry_run(const Schedule& schedule) {
  return execute(schedule, unit_costs(schedule.has_communication() ? CommMode::kBlocking : CommMode::kOverlapped));
}

}  // namespace pipeflow
