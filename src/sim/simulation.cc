#include "pipeflow/sim/simulation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

void check_cost(double value, std::string_view what, int stage) {
  if (!std::isfinite(value) || value < 0) {
    fail("simulation cost {} of stage {} is {}: costs must be finite and >= 0", what, stage, value);
  }
}

bool usable(const LinkCost& link) {
  return std::isfinite(link.latency_s) && link.latency_s >= 0 && link.bandwidth_bytes_per_s > 0;
}

void check_link(const LinkCost& link, std::string_view what) {
  if (!usable(link)) {
    fail("{} has latency {} s and bandwidth {} B/s: latency must be finite and >= 0, bandwidth > 0", what,
         link.latency_s, link.bandwidth_bytes_per_s);
  }
}

}  // namespace

const StageCosts& SimulationCosts::of(int stage, int microbatch) const {
  if (microbatch_stages.empty() || microbatch < 0 || microbatch >= static_cast<int>(microbatch_stages.size())) {
    return stages[static_cast<std::size_t>(stage)];
  }
  return microbatch_stages[static_cast<std::size_t>(microbatch)][static_cast<std::size_t>(stage)];
}

namespace {

void check_costs(const Schedule& schedule, const SimulationCosts& costs) {
  if (static_cast<int>(costs.stages.size()) != schedule.num_stages()) {
    fail("simulation costs give {} stages but schedule {} has {}: give one StageCosts per stage",
         costs.stages.size(), schedule.name(), schedule.num_stages());
  }
  for (int s = 0; s < schedule.num_stages(); ++s) {
    const StageCosts& c = costs.stages[static_cast<std::size_t>(s)];
    check_cost(c.forward_s, "forward_s", s);
    check_cost(c.backward_s, "backward_s", s);
    check_cost(c.backward_input_s, "backward_input_s", s);
    check_cost(c.backward_weight_s, "backward_weight_s", s);
    check_cost(c.forward_backward_overlap_s, "forward_backward_overlap_s", s);
    if (c.forward_backward_overlap_s > c.backward_s) {
      fail("simulation cost forward_backward_overlap_s of stage {} is {} > backward_s {}: an overlap cannot "
           "save more than the backward takes",
           s, c.forward_backward_overlap_s, c.backward_s);
    }
    check_cost(c.output_bytes, "output_bytes", s);
    check_cost(c.model_state_bytes, "model_state_bytes", s);
    check_cost(c.activation_bytes, "activation_bytes", s);
    check_cost(c.weight_gradient_bytes, "weight_gradient_bytes", s);
    check_cost(c.forward_working_bytes, "forward_working_bytes", s);
    check_cost(c.backward_working_bytes, "backward_working_bytes", s);
    check_cost(c.comm_buffer_bytes, "comm_buffer_bytes", s);
    check_cost(c.gradient_bytes, "gradient_bytes", s);
    check_cost(c.optimizer_s, "optimizer_s", s);
  }
  if (!costs.microbatch_stages.empty()) {
    if (static_cast<int>(costs.microbatch_stages.size()) != schedule.num_microbatches()) {
      fail("simulation costs give {} micro-batches' costs but schedule {} has {}: give one per micro-batch or none",
           costs.microbatch_stages.size(), schedule.name(), schedule.num_microbatches());
    }
    for (const std::vector<StageCosts>& stages : costs.microbatch_stages) {
      if (stages.size() != costs.stages.size()) {
        fail("simulation costs of a micro-batch give {} stages but schedule {} has {}: give one StageCosts per stage",
             stages.size(), schedule.name(), schedule.num_stages());
      }
      for (std::size_t s = 0; s < stages.size(); ++s) {
        const StageCosts& c = stages[s];
        for (const auto& [value, what] :
             {std::pair{c.forward_s, "forward_s"}, std::pair{c.backward_s, "backward_s"},
              std::pair{c.backward_input_s, "backward_input_s"}, std::pair{c.backward_weight_s, "backward_weight_s"},
              std::pair{c.output_bytes, "output_bytes"}, std::pair{c.activation_bytes, "activation_bytes"},
              std::pair{c.weight_gradient_bytes, "weight_gradient_bytes"}}) {
          check_cost(value, what, static_cast<int>(s));
        }
      }
    }
  }
  if (costs.data_parallel < 1) {
    fail("simulation data_parallel is {}: it must be >= 1 (1 for no data parallelism)", costs.data_parallel);
  }
  if (!costs.data_parallel_links.empty() &&
      static_cast<int>(costs.data_parallel_links.size()) != schedule.num_ranks()) {
    fail("simulation costs give {} data-parallel links for {} ranks: give one per rank or none",
         costs.data_parallel_links.size(), schedule.num_ranks());
  }
  for (const LinkCost& link : costs.data_parallel_links) check_link(link, "a data-parallel link");
}

// Which B actions are the second half of an F&B pair: per rank, a B whose
// previous compute action is an F of another stage.
std::vector<bool> overlapped_backwards(const Schedule& schedule) {
  const int m = schedule.num_microbatches();
  std::vector<bool> overlapped(static_cast<std::size_t>(schedule.num_stages() * m), false);
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    const Action* previous = nullptr;
    for (const Action& a : schedule.actions(RankId(r))) {
      if (!is_compute(a.kind)) continue;
      if (a.kind == ActionKind::kBackward && previous != nullptr && previous->kind == ActionKind::kForward &&
          previous->stage != a.stage && a.stage.value() < schedule.num_stages() &&
          a.microbatch.value() < m) {
        overlapped[static_cast<std::size_t>(a.stage.value() * m + a.microbatch.value())] = true;
      }
      previous = &a;
    }
  }
  return overlapped;
}

// Bytes of the message a sending action (SEND, or the producing compute
// action of a compute-only schedule) carries: a forward message is the
// stage's output, a backward one the gradient of the stage's input, which is
// the previous stage's output.
double message_bytes(const Action& sender, const SimulationCosts& costs) {
  const int s = sender.stage.value();
  const bool forward = sender.kind == ActionKind::kForward || sender.kind == ActionKind::kSendForward;
  const int producer_stage = forward ? s : s - 1;
  if (producer_stage < 0 || producer_stage >= static_cast<int>(costs.stages.size())) return 0;
  return costs.of(producer_stage, sender.microbatch.value()).output_bytes;
}

// `overlapped`: a B that is the second half of an F&B pair.
double compute_duration(const Action& a, const StageCosts& c, bool overlapped) {
  return overlapped ? c.duration(a.kind) - c.forward_backward_overlap_s : c.duration(a.kind);
}

// The rank a compute action of a compute-only schedule sends its result to,
// if that is another rank (F(s) feeds s + 1, B/I(s) feeds s − 1: see result_send).
std::optional<RankId> cross_rank_consumer(const Schedule& schedule, const Action& a, RankId rank) {
  const std::optional<Action> send = result_send(a);
  if (!send) return std::nullopt;
  const std::optional<RankId> to = schedule.peer_rank(*send);
  if (to == rank) return std::nullopt;
  return to;
}

struct MemoryPeak {
  double bytes = 0;
  int inflight = 0;
};

MemoryPeak walk_memory(const std::vector<Action>& actions, const SimulationCosts& costs) {
  MemoryPeak peak;
  double held = 0;
  int inflight = 0;
  for (const Action& a : actions) {
    const StageCosts& c = costs.of(a.stage.value(), a.microbatch.value());
    if (is_compute(a.kind)) {
      const double working = a.kind == ActionKind::kForward ? c.forward_working_bytes : c.backward_working_bytes;
      if (held + working > peak.bytes) peak = {held + working, inflight};
    }
    switch (a.kind) {
      case ActionKind::kForward:
        held += c.activation_bytes;
        ++inflight;
        break;
      case ActionKind::kBackward:
        held -= c.activation_bytes;
        --inflight;
        break;
      case ActionKind::kBackwardInput:
        held += c.weight_gradient_bytes - c.activation_bytes;
        break;
      case ActionKind::kBackwardWeight:
        held -= c.weight_gradient_bytes;
        --inflight;
        break;
      default:
        continue;
    }
    if (held > peak.bytes) peak = {held, inflight};
  }
  return peak;
}

// A rank's memory (simulate's walk, in simulation.h): the model states and
// buffers of its stages, and the activations its list holds at its peak.
struct RankMemory {
  double model_states_bytes = 0;
  double comm_buffer_bytes = 0;
  MemoryPeak activations;
  double peak_bytes() const { return model_states_bytes + activations.bytes + comm_buffer_bytes; }
};

RankMemory rank_memory(const Schedule& schedule, const SimulationCosts& costs, RankId rank) {
  RankMemory out;
  for (StageId s : schedule.stages_of(rank)) {
    const StageCosts& c = costs.stages[static_cast<std::size_t>(s.value())];
    out.model_states_bytes += c.model_state_bytes;
    out.comm_buffer_bytes += c.comm_buffer_bytes;
  }
  out.activations = walk_memory(schedule.actions(rank), costs);
  return out;
}

// One rank's figures except idle and bubble, which need the step's end:
// its pipeline times, then its stages' all-reduce, optimizer step and memory.
// `lowered`: schedule.has_communication(), a scan of every action, passed in
// so that it runs once per step and not once per rank.
RankResult rank_result(const Schedule& schedule, bool lowered, const SimulationCosts& costs,
                       const ExecutionCosts& execution, const std::vector<TimedAction>& timed, RankId rank) {
  RankResult out;
  for (const TimedAction& t : timed) {
    const Action& a = t.action;
    if (is_compute(a.kind)) {
      out.busy_s += t.end - t.start;
      const std::optional<RankId> to = lowered ? std::nullopt : cross_rank_consumer(schedule, a, rank);
      if (to) out.overlapped_comm_s += execution.transfer(a, rank, *to);
    } else {
      out.comm_s += t.end - t.start - t.wait;
      // A SEND that ran has a peer: one to no stage deadlocks, and simulate() fails before this.
      if (is_send(a.kind) && costs.comm_mode == CommMode::kOverlapped) {
        out.overlapped_comm_s += execution.transfer(a, rank, *schedule.peer_rank(a));
      }
    }
  }
  out.pipeline_end_s = timed.empty() ? 0.0 : timed.back().end;

  double gradient_bytes = 0;
  for (StageId s : schedule.stages_of(rank)) {
    const StageCosts& c = costs.stages[static_cast<std::size_t>(s.value())];
    gradient_bytes += c.gradient_bytes;
    out.optimizer_s += c.optimizer_s;
  }
  const LinkCost dp_link = costs.data_parallel_links.empty()
                               ? LinkCost{}
                               : costs.data_parallel_links[static_cast<std::size_t>(rank.value())];
  out.all_reduce_s = ring_all_reduce_seconds(gradient_bytes, costs.data_parallel, dp_link);
  out.comm_s += out.all_reduce_s;

  // The executor ran the whole list in order (simulate fails on a deadlock): the walk over the list is the run's.
  const RankMemory memory = rank_memory(schedule, costs, rank);
  out.model_states_bytes = memory.model_states_bytes;
  out.comm_buffer_bytes = memory.comm_buffer_bytes;
  out.activation_bytes = memory.activations.bytes;
  out.peak_inflight = memory.activations.inflight;
  out.peak_memory_bytes = memory.peak_bytes();
  return out;
}

// The end of each rank's part of a step: its last action, then its
// all-reduce and optimizer step (`tails`). A rank without actions ends at its
// release.
std::vector<double> step_ends(const Execution& execution, const std::vector<double>& releases,
                              const std::vector<double>& tails) {
  std::vector<double> ends(tails.size());
  for (std::size_t r = 0; r < tails.size(); ++r) {
    const auto& timed = execution.ranks[r];
    ends[r] = (timed.empty() ? releases[r] : timed.back().end) + tails[r];
  }
  return ends;
}

// Steps back to back (SteadyState in the header): step k + 1's ranks are
// released at step k's ends; stop when every end moved by the same amount.
SteadyState steady_state(const Schedule& schedule, const ExecutionCosts& execution, const SimulationResult& step,
                         int max_steps) {
  const std::size_t ranks = step.ranks.size();
  std::vector<double> tails(ranks);
  double busy = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    tails[r] = step.ranks[r].all_reduce_s + step.ranks[r].optimizer_s;
    busy += step.ranks[r].busy_s;
  }
  const std::vector<double> first = step_ends(step.execution, std::vector<double>(ranks, 0.0), tails);
  std::vector<double> ends = first;
  SteadyState out;
  out.steps = 1;
  double period = 0;
  bool repeats = false;
  while (!repeats && out.steps < max_steps) {
    const Execution next = execute(schedule, execution, ends);
    if (next.deadlocked) fail("internal: schedule {} deadlocks in a second step", schedule.name());
    const std::vector<double> next_ends = step_ends(next, ends, tails);
    double low = std::numeric_limits<double>::infinity();
    double high = -low;
    for (std::size_t r = 0; r < ranks; ++r) {
      low = std::min(low, next_ends[r] - ends[r]);
      high = std::max(high, next_ends[r] - ends[r]);
    }
    // Equal up to rounding: the ends are sums of up to a few million costs.
    repeats = high - low <= 1e-9 * high;
    period = high;
    ends = next_ends;
    ++out.steps;
  }
  out.converged = repeats;
  if (!repeats) {
    period = (*std::max_element(ends.begin(), ends.end()) - *std::max_element(first.begin(), first.end())) /
             (out.steps - 1);
  }
  out.step_time_s = period;
  const double capacity = period * static_cast<double>(ranks);
  out.bubble_ratio = capacity > 0 ? 1 - busy / capacity : 0;
  return out;
}

}  // namespace

double ring_all_reduce_seconds(double bytes, int members, const LinkCost& link) {
  if (members <= 1 || bytes <= 0) return 0;
  const double n = members;
  return 2 * (n - 1) / n * bytes / link.bandwidth_bytes_per_s + 2 * (n - 1) * link.latency_s;
}

double ring_all_gather_seconds(double bytes, int members, const LinkCost& link) {
  return ring_all_reduce_seconds(bytes, members, link) / 2;
}

std::uint64_t LinkTable::key(RankId from, RankId to) {
  return static_cast<std::uint64_t>(static_cast<std::uint32_t>(from.value())) << 32 |
         static_cast<std::uint32_t>(to.value());
}

void LinkTable::set(RankId from, RankId to, LinkCost link) {
  // The name is formatted for the error only: a search sets thousands of links.
  if (!usable(link)) check_link(link, fmt::format("the link from rank {} to rank {}", from, to));
  pairs_[key(from, to)] = link;
}

LinkCost LinkTable::at(RankId from, RankId to) const {
  const auto it = pairs_.find(key(from, to));
  return it == pairs_.end() ? default_ : it->second;
}

ExecutionCosts execution_costs(const Schedule& schedule, const SimulationCosts& costs) {
  auto overlapped = std::make_shared<const std::vector<bool>>(overlapped_backwards(schedule));
  const int m = schedule.num_microbatches();
  ExecutionCosts execution;
  execution.duration = [&costs, overlapped, m](const Action& a, RankId) {
    const std::size_t key = static_cast<std::size_t>(a.stage.value() * m + a.microbatch.value());
    return compute_duration(a, costs.of(a.stage.value(), a.microbatch.value()),
                            a.kind == ActionKind::kBackward && (*overlapped)[key]);
  };
  execution.transfer = [&costs](const Action& sender, RankId from, RankId to) {
    return costs.links.at(from, to).seconds(message_bytes(sender, costs));
  };
  execution.mode = costs.comm_mode;
  return execution;
}

SimulationResult simulate(const Schedule& schedule, const SimulationCosts& costs, SimulateOptions options) {
  check_costs(schedule, costs);
  const ExecutionCosts execution = execution_costs(schedule, costs);
  SimulationResult result;
  result.execution = execute(schedule, execution);
  if (result.execution.deadlocked) {
    fail("schedule {} deadlocks under the simulated costs:\n{}\nrun `pipeflow validate` on it", schedule.name(),
         result.execution.deadlock_message());
  }
  result.pipeline_time_s = result.execution.makespan;
  result.pipeline_bubble_ratio = bubble_fraction(result.execution);

  const bool lowered = schedule.has_communication();
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    const RankResult out = rank_result(schedule, lowered, costs, execution,
                                       result.execution.ranks[static_cast<std::size_t>(r)], RankId(r));
    result.step_time_s = std::max(result.step_time_s, out.pipeline_end_s + out.all_reduce_s + out.optimizer_s);
    result.ranks.push_back(out);
  }
  result.step_time_s = std::max(result.step_time_s, result.pipeline_time_s);

  double busy = 0;
  double busiest = 0;
  for (RankResult& out : result.ranks) {
    out.idle_s = result.step_time_s - out.busy_s - out.comm_s - out.optimizer_s;
    out.bubble_ratio = result.step_time_s > 0 ? 1 - out.busy_s / result.step_time_s : 0;
    busy += out.busy_s;
    busiest = std::max(busiest, out.busy_s);
  }
  const double capacity = result.step_time_s * schedule.num_ranks();
  result.bubble_ratio = capacity > 0 ? 1 - busy / capacity : 0;
  result.zero_bubble_rate = result.pipeline_time_s > 0 ? 1 - busiest / result.pipeline_time_s : 0;
  if (options.steady_state) {
    if (options.max_steady_steps < 2) {
      fail("max_steady_steps is {}: the steady state needs at least 2 steps back to back", options.max_steady_steps);
    }
    result.steady_state = steady_state(schedule, execution, result, options.max_steady_steps);
  }
  return result;
}

double peak_memory_bytes(const Schedule& schedule, const SimulationCosts& costs, RankId rank) {
  check_costs(schedule, costs);
  return rank_memory(schedule, costs, rank).peak_bytes();
}

Timeline simulation_timeline(const Schedule& schedule, const SimulationResult& result, std::string title) {
  Timeline timeline = timeline_from_execution(schedule, result.execution, std::move(title));
  for (std::size_t r = 0; r < result.ranks.size(); ++r) {
    const RankResult& rank = result.ranks[r];
    const RankId id(static_cast<int>(r));
    if (rank.all_reduce_s > 0) {
      timeline.events.push_back(
          {id, "all-reduce", EventCategory::kAllreduce, std::nullopt, rank.pipeline_end_s, rank.all_reduce_s});
    }
    if (rank.optimizer_s > 0) {
      timeline.events.push_back({id, "optimizer step", EventCategory::kOptimizer, std::nullopt,
                                 rank.pipeline_end_s + rank.all_reduce_s, rank.optimizer_s});
    }
  }
  return timeline;
}

}  // namespace pipeflow
