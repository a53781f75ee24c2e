#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "pipeflow/core/ids.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/schedule/schedule.h"
#include "pipeflow/sim/stage_costs.h"
#include "pipeflow/trace/event.h"

namespace pipeflow {

// The simulator's core: a lowered (or compute-only) schedule plus per-stage
// costs in, a predicted step out. It knows nothing of models or hardware: the
// cost model (cost_model.h) fills SimulationCosts from a layout, and the
// runtime fills it from the per-action times it measured (profile.h), so a
// prediction can stand beside each measurement. The timing itself is the
// schedule module's execute() -- one execution semantics shared with the
// validator's dry run and the SVG -- and this file adds what a step has
// beyond the pipeline: the data-parallel gradient all-reduce, the optimizer
// step, and memory.

// One link between two ranks: a message of n bytes takes latency + n / bandwidth.
struct LinkCost {
  double latency_s = 0;
  double bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();

  double seconds(double bytes) const { return bytes > 0 ? latency_s + bytes / bandwidth_bytes_per_s : 0.0; }
};

// Ring all-reduce of `bytes` over `members` ranks on `link` (Patarasuk and
// Yuan 2009; NCCL's ring): a reduce-scatter and an all-gather, each moving
// (n−1)/n of the buffer through every rank in n−1 steps:
//   2(n−1)/n · bytes / bandwidth + 2(n−1) · latency;  0 for n = 1.
double ring_all_reduce_seconds(double bytes, int members, const LinkCost& link);
// A ring all-gather (or reduce-scatter) of `bytes` in all: half the all-reduce.
double ring_all_gather_seconds(double bytes, int members, const LinkCost& link);

// Point-to-point links between pipeline ranks: one cost for every pair, and
// any pair set apart (Megatron's layout puts some neighbours on one node and
// others across nodes).
class LinkTable {
 public:
  LinkTable() = default;  // every message free
  explicit LinkTable(LinkCost every_pair) : default_(every_pair) {}

  // The link used by messages from `from` to `to`.
  void set(RankId from, RankId to, LinkCost link);
  LinkCost at(RankId from, RankId to) const;

 private:
  static std::uint64_t key(RankId from, RankId to);

  LinkCost default_{0, std::numeric_limits<double>::infinity()};
  std::unordered_map<std::uint64_t, LinkCost> pairs_;  // looked up once per message
};

struct SimulationCosts {
  std::vector<StageCosts> stages;  // one per stage of the schedule, in stage order
  // Micro-batches of their own sizes (variable sequence lengths): per
  // micro-batch, one StageCosts per stage whose durations, output bytes and
  // activation bytes (activation, weight-gradient and working bytes) that
  // micro-batch's actions and messages take; `stages` keeps the rest (model
  // states, buffers, gradients, optimizer). Empty: every micro-batch costs
  // `stages`.
  std::vector<std::vector<StageCosts>> microbatch_stages;
  // The costs of micro-batch `microbatch` on stage `stage`.
  const StageCosts& of(int stage, int microbatch) const;
  LinkTable links;
  CommMode comm_mode = CommMode::kOverlapped;
  // Data parallelism: the replicas of pipeline rank r all-reduce their
  // gradients (the sum of its stages' gradient_bytes) over
  // data_parallel_links[r] once r has finished its actions; 1: no all-reduce.
  int data_parallel = 1;
  std::vector<LinkCost> data_parallel_links;  // per rank; empty: free links
};

// One rank's share of the step. The step [0, step_time_s] of every rank
// splits exactly into busy_s + comm_s + optimizer_s + idle_s.
struct RankResult {
  double busy_s = 0;       // compute: the F, B, I and W actions
  double comm_s = 0;       // the rank held by communication: blocking P2P transfers
                           // (their waits are idle) and the data-parallel all-reduce
  double optimizer_s = 0;  // the optimizer step
  double idle_s = 0;       // everything else: fill, drain, waiting for inputs and partners
  double bubble_ratio = 0;  // 1 − busy_s / step_time_s
  // Transfer time of the messages this rank sends that take no rank time (a
  // separate communication stream); in no sum above.
  double overlapped_comm_s = 0;
  double pipeline_end_s = 0;   // end of the rank's last action
  double all_reduce_s = 0;     // the data-parallel all-reduce (part of comm_s)

  // Peak memory = model states + activations at the worst moment + buffers.
  double model_states_bytes = 0;
  double activation_bytes = 0;   // activation_bytes and weight_gradient_bytes held at the peak
  double comm_buffer_bytes = 0;
  double peak_memory_bytes = 0;
  int peak_inflight = 0;         // micro-batch chunks holding activations at that moment
};

// Steps run back to back, as a training run does, without a global
// synchronisation between them: each rank starts step k + 1 as soon as it
// has finished its own part of step k (its last action, its data-parallel
// all-reduce, its optimizer step). One step's ramp-down then overlaps the
// next step's ramp-up. This is how the zero-bubble paper counts bubbles (Qi
// et al. 2023, Table 2: ZB-H2 (p−1)(F+I−2W), 0 at F = I = W; ZB-V 0), whose
// optimizer bypasses its global checks by post-validation (§4). A run whose
// steps do synchronise (gradient clipping's global norm, a loss scaler's
// NaN check) runs at SimulationResult::step_time_s instead.
//
// How it is found: ranks depend on each other only through one step's
// messages, so a step's per-rank end times are a max-plus linear function of
// the times its ranks are released, and releasing every rank c later moves
// every end exactly c later. Step 2 releases each rank at its step-1 end
// (plus all-reduce and optimizer) and the schedule is executed again
// (execute()'s rank_start_s); if every rank's end moved by the same c, step
// 3's releases are step 2's plus c, and so on by induction: the steps repeat
// with period c, exactly. Otherwise it steps on, up to
// SimulateOptions::max_steady_steps steps, until the ends move equally.
//
// What it gives, F = I = W = 1, free messages (tests/sim/simulation_test.cc):
// ZB-H2 and ZB-V (m ≥ 2p) repeat after one step with period 3m and 6m, the
// busy time: bubble 0. Each of their ranks works without a gap from its
// first start to its last end, so all spans are equal, and equal spans
// always repeat after one step with the span as period (releasing every rank
// at its own first start plus the span replays step 1 shifted). GPipe, 1F1B,
// interleaved 1F1B, ZB-H1 and DualPipeV keep their one-step figures: some
// rank's chain within its own step is the whole step (ZB-H1's rank 0 runs p
// forwards, then waits p − 1 for micro-batch 0's input gradient), and no
// earlier step can shorten it; ZB-H1's steady bubble stays (p−1)/(3m+p−1).
// With unequal stage costs a zero-bubble schedule may take a few steps to
// settle (ZB-H2: up to 9 seen), each one more execution.
//
// Not each rank's span (first start to last end, plus all-reduce and
// optimizer): the longest span bounds the period from above (releasing every
// rank at its own first start plus the longest span replays step 1 shifted
// by it, and a rank released earlier never ends later), but the period can be
// shorter (ZB-V with unequal stages: the test
// ThePeriodCanBeShorterThanTheLongestSpan).
struct SteadyState {
  double step_time_s = 0;   // the period of back-to-back steps
  double bubble_ratio = 0;  // 1 − Σ_r busy_s(r) / (ranks · step_time_s): all-reduce and optimizer count as bubble
  int steps = 0;            // steps simulated back to back, the first included: 2 when step 2 repeated step 1
  // false: the ends still moved unequally after max_steady_steps steps;
  // step_time_s is then the mean growth of the latest end per step over the
  // steps simulated (for 2 steps: makespan of two steps − makespan of one), an
  // estimate.
  bool converged = true;
};

// What simulate() predicts.
//
// Bubble: the idle share of the step with compute (F, B, I, W) as busy, the
// definition of the schedule module's bubble_fraction() and the trace's
// bubble_stats():
//   bubble_ratio = 1 − Σ_r busy_s(r) / (ranks · step_time_s),
// so the all-reduce and the optimizer step count as bubble; without data
// parallelism and optimizer time the step is the pipeline's makespan and this
// equals bubble_fraction(execution) exactly. pipeline_bubble_ratio is
// bubble_fraction(execution): the pipeline alone, what the closed forms of the
// schedules (GPipe's (p−1)/(m+p−1), ...) give. zero_bubble_rate is the
// zero-bubble paper's bubble rate (Qi et al. 2023, their Table 4): (cost −
// m·(T_F + T_B + T_W)) / cost with cost the pipeline's makespan and the
// busiest rank's compute for m·(T_F + T_B + T_W); equal to
// pipeline_bubble_ratio when every rank computes as long, smaller otherwise.
struct SimulationResult {
  Execution execution;  // the pipeline part, as execute() timed it
  double pipeline_time_s = 0;  // execution.makespan
  double step_time_s = 0;      // latest end of any rank's optimizer step
  double bubble_ratio = 0;
  double pipeline_bubble_ratio = 0;
  double zero_bubble_rate = 0;
  std::vector<RankResult> ranks;
  // Steps back to back (SteadyState); simulated only when asked for
  // (SimulateOptions::steady_state), as it executes the schedule again.
  std::optional<SteadyState> steady_state;
};

struct SimulateOptions {
  // Also find the steady state of back-to-back steps (SteadyState): one more
  // execution of the schedule per further step, usually exactly one.
  bool steady_state = false;
  // The most steps simulated back to back for it, the first included (>= 2).
  int max_steady_steps = 16;
};

// Simulates one step: executes `schedule` with `costs` (durations per
// (stage, kind), transfers latency + bytes / bandwidth on the rank pair's
// link, the comm mode), then per rank appends the data-parallel all-reduce
// and the optimizer step, and walks the rank's actions for its peak memory.
// Memory walk, per rank in list order: an F adds its stage's
// activation_bytes; a B removes them; an I replaces them by
// weight_gradient_bytes, which its W removes. The peak is the largest sum
// reached, counting each compute action's working bytes (forward or
// backward) on top of what the rank held when it began.
//
// Throws Error if costs.stages does not have one entry per stage, a cost is
// negative or not finite, or the schedule deadlocks (with the executor's
// description of every stuck rank).
//
// Thread safety: a pure function of its arguments.
SimulationResult simulate(const Schedule& schedule, const SimulationCosts& costs, SimulateOptions options = {});

// A rank's peak memory as simulate() reports it (RankResult::
// peak_memory_bytes) without executing the schedule: the memory walk above
// follows the order of the rank's actions, not their times. What a search
// checks before it simulates. Throws Error for costs simulate() rejects.
double peak_memory_bytes(const Schedule& schedule, const SimulationCosts& costs, RankId rank);

// The ExecutionCosts simulate() hands to execute(): exposed so the runtime and
// the trace can time a schedule with exactly the simulator's costs. The
// result refers to `schedule` and `costs`, which must outlive it.
ExecutionCosts execution_costs(const Schedule& schedule, const SimulationCosts& costs);

// The simulated step as a trace timeline (Chrome trace, SVG): the executed
// actions (timeline_from_execution), then on every rank its all-reduce and
// optimizer step as allreduce and optimizer events. bubble_stats() of it
// equals the result's bubble figures.
Timeline simulation_timeline(const Schedule& schedule, const SimulationResult& result, std::string title);

}  // namespace pipeflow
