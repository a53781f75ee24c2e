#include "pipeflow/sim/simulation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../support/error_of.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/passes.h"
#include "pipeflow/schedule/validate.h"

namespace pipeflow {
namespace {

constexpr double kTight = 1e-12;

using testing::error_of;

struct Unit {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
};

// Every stage costs the same; B = I + W; no communication, no memory.
SimulationCosts uniform_costs(const Schedule& schedule, Unit unit = {}) {
  SimulationCosts costs;
  StageCosts stage;
  stage.forward_s = unit.forward;
  stage.backward_input_s = unit.backward_input;
  stage.backward_weight_s = unit.backward_weight;
  stage.backward_s = unit.backward_input + unit.backward_weight;
  costs.stages.assign(static_cast<std::size_t>(schedule.num_stages()), stage);
  return costs;
}

// The closed forms are checked on compute-only schedules: messages are free
// and arrive without rank time, the overlapped mode's ideal. Lowered lists
// fix each RECV's position for unit costs (insert_send_recv), so under other
// costs a RECV can hold its rank early: LoweredListsMatchComputeOnlyAtUnitCosts
// and RecvPositionsOfALoweredListCanStallUnderOtherCosts.
// The first compute action of a rank.
const TimedAction& first_compute(const SimulationResult& r, int rank) {
  const auto& timed = r.execution.ranks[static_cast<std::size_t>(rank)];
  return *std::find_if(timed.begin(), timed.end(), [](const TimedAction& t) { return is_compute(t.action.kind); });
}

double idle_of(const SimulationResult& result, int rank) {
  return result.ranks[static_cast<std::size_t>(rank)].idle_s;
}

TEST(RingAllReduce, IsTwiceTheReduceScatterVolumeAndLatency) {
  const LinkCost link{1e-5, 1e9};
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(8e9, 4, link), 2.0 * 3 / 4 * 8 + 2 * 3 * 1e-5);
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(8e9, 1, link), 0);
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(0, 8, link), 0);
}

TEST(Simulate, GpipeAnd1f1bBubbleIsPMinus1OverMPlusPMinus1) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {p, p + 1, 2 * p, 3 * p + 1}) {
      for (const char* name : {"gpipe", "1f1b"}) {
        const Schedule schedule = make_schedule(name, p, m);
        const SimulationResult r = simulate(schedule, uniform_costs(schedule));
        const double expected = (p - 1.0) / (m + p - 1.0);
        EXPECT_NEAR(r.bubble_ratio, expected, kTight) << name << " p=" << p << " m=" << m;
        EXPECT_NEAR(r.pipeline_bubble_ratio, expected, kTight) << name << " p=" << p << " m=" << m;
        EXPECT_NEAR(r.step_time_s, 3.0 * (m + p - 1), kTight);
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_NEAR(idle_of(r, rank), 3.0 * (p - 1), kTight) << name << " rank " << rank;
          EXPECT_NEAR(r.ranks[static_cast<std::size_t>(rank)].bubble_ratio, expected, kTight);
        }
      }
    }
  }
}

TEST(Simulate, SeedExampleFourStagesSixteenMicrobatchesIs15Point8Percent) {
  const Schedule schedule = make_1f1b(4, 16);
  const SimulationResult r = simulate(schedule, uniform_costs(schedule));
  EXPECT_NEAR(r.bubble_ratio, 3.0 / 19.0, kTight);
  EXPECT_EQ(static_cast<int>(r.bubble_ratio * 1000 + 0.5), 158);  // 15.8%
}

TEST(Simulate, GpipeBubbleDoesNotDependOnTheForwardBackwardRatio) {
  const Schedule schedule = make_gpipe(4, 6);
  const SimulationResult r = simulate(schedule, uniform_costs(schedule, {0.7, 0.5, 0.8}));
  EXPECT_NEAR(r.step_time_s, (6 + 3) * 2.0, 1e-9);
  EXPECT_NEAR(r.bubble_ratio, 3.0 / 9.0, kTight);
}

TEST(Simulate, InterleavedBubbleIsPMinus1OverVmPlusPMinus1WhenMIsAMultipleOfP) {
  for (int p : {2, 4, 8}) {
    for (int v : {2, 3, 4}) {
      for (int m : {p, 2 * p, 4 * p}) {
        const Schedule schedule = make_interleaved_1f1b(p, m, v);
        const SimulationResult r = simulate(schedule, uniform_costs(schedule));
        EXPECT_NEAR(r.bubble_ratio, (p - 1.0) / (v * m + p - 1.0), kTight) << "p=" << p << " v=" << v << " m=" << m;
        EXPECT_NEAR(r.step_time_s, 3.0 * (v * m + p - 1), kTight);
      }
    }
  }
}

TEST(Simulate, ZbH1IdlePerRankIsPMinus1TimesFPlusIMinusW) {
  for (int p : {2, 4, 6}) {
    for (int m : {p, 2 * p, 3 * p}) {
      for (Unit unit : {Unit{1, 1, 1}, Unit{2, 2, 1}, Unit{1.5, 1.25, 0.5}}) {
        const Schedule schedule = make_zb_h1(p, m);
        const SimulationResult r = simulate(schedule, uniform_costs(schedule, unit));
        const double expected = (p - 1) * (unit.forward + unit.backward_input - unit.backward_weight);
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_NEAR(idle_of(r, rank), expected, 1e-9)
              << "p=" << p << " m=" << m << " F=" << unit.forward << " rank " << rank;
        }
      }
    }
  }
}

// "Zero bubble": every rank works without a gap from its first action to its
// last; what remains is the ramp, rank r starting r·F late and ending
// (p − 1 − r)·F early: p − 1 per rank at F = 1, which the next step's
// warm-up fills when the optimizer step is post-validated (Qi et al. §4).
void expect_no_gap_inside_ranks(const SimulationResult& r, int p, const char* name, int m) {
  for (int rank = 0; rank < p; ++rank) {
    const double start = first_compute(r, rank).start;
    EXPECT_NEAR(start, rank, kTight) << name << " m=" << m;
    EXPECT_NEAR(r.ranks[static_cast<std::size_t>(rank)].busy_s,
                r.ranks[static_cast<std::size_t>(rank)].pipeline_end_s - start, kTight)
        << name << " m=" << m << " rank " << rank;
    EXPECT_NEAR(idle_of(r, rank), p - 1.0, kTight) << name << " m=" << m << " rank " << rank;
  }
}

TEST(Simulate, ZbH2AndZbvHaveNoBubbleInsideTheRanksWhenFEqualsIEqualsW) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {2 * p, 2 * p + 1, 3 * p}) {
      const Schedule h2 = make_zb_h2(p, m);
      const SimulationResult rh2 = simulate(h2, uniform_costs(h2));
      EXPECT_NEAR(rh2.step_time_s, 3.0 * m + p - 1, kTight);
      expect_no_gap_inside_ranks(rh2, p, "zb-h2", m);

      const Schedule v = make_zbv(p, m);
      const SimulationResult rv = simulate(v, uniform_costs(v));
      EXPECT_NEAR(rv.step_time_s, 6.0 * m + p - 1, kTight);
      expect_no_gap_inside_ranks(rv, p, "zbv", m);
    }
  }
}

// The steady state (SteadyState): steps back to back, each rank starting
// the next step when it has finished its own part of this one.
SimulationResult simulate_steady(const Schedule& schedule, const SimulationCosts& costs, int max_steps = 16) {
  return simulate(schedule, costs, {.steady_state = true, .max_steady_steps = max_steps});
}

// `copies` steps of `schedule` in one schedule: every rank runs its list once
// per step, the micro-batch ids of step c offset by c·m. Nothing between the
// steps: the back-to-back run without all-reduce or optimizer.
Schedule back_to_back(const Schedule& schedule, int copies) {
  const int m = schedule.num_microbatches();
  Schedule out(schedule.name() + " back to back", schedule.num_ranks(), schedule.num_stages(), copies * m,
               schedule.placement());
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    for (int c = 0; c < copies; ++c) {
      for (Action a : schedule.actions(RankId(r))) {
        a.microbatch = MicrobatchId(a.microbatch.value() + c * m);
        out.add(RankId(r), a);
      }
    }
  }
  return out;
}

// The paper's steady-state figures (Qi et al. 2023, Table 2): ZB-H2's bubble
// (p−1)(F+I−2W) and ZB-V's are 0 at F = I = W once a step's ramp-down
// overlaps the next step's ramp-up. Every rank's span is its busy time (the
// test above), so step 2 repeats step 1 shifted by it: period 3m (ZB-H2),
// 6m (ZB-V, two chunks per rank).
TEST(SimulateSteadyState, ZbH2AndZbvHaveNoBubbleWhenFEqualsIEqualsW) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {2 * p, 2 * p + 1, 3 * p, 4 * p}) {
      for (const char* name : {"zb-h2", "zbv"}) {
        const Schedule schedule = make_schedule(name, p, m);
        const SimulationResult r = simulate_steady(schedule, uniform_costs(schedule));
        const double busy = std::string(name) == "zbv" ? 6.0 * m : 3.0 * m;
        ASSERT_TRUE(r.steady_state.has_value());
        EXPECT_NEAR(r.steady_state->step_time_s, busy, kTight) << name << " p=" << p << " m=" << m;
        EXPECT_NEAR(r.steady_state->bubble_ratio, 0, kTight) << name << " p=" << p << " m=" << m;
        EXPECT_EQ(r.steady_state->steps, 2);
        EXPECT_TRUE(r.steady_state->converged);
        EXPECT_NEAR(r.step_time_s, busy + p - 1, kTight);  // the one-step figure keeps its ramp
      }
    }
  }
}

// ZB-H1 at F = I = W = 1 keeps its one-step bubble in the steady state: rank
// 0 runs p forwards, then waits p − 1 for micro-batch 0's input gradient
// (p forwards and p − 1 input backwards after its first start), a chain
// inside the step that no earlier step can shorten. Its span is busy + p − 1 =
// 3m + p − 1, the step, so the steady bubble is (p−1)/(3m+p−1), the one-step
// figure (p − 1 idle per rank, (p−1)(F+I−W)).
TEST(SimulateSteadyState, ZbH1KeepsItsBubblePMinus1Over3mPlusPMinus1) {
  for (int p : {2, 3, 4, 6, 8}) {
    for (int m : {p, 2 * p, 3 * p + 1}) {
      const Schedule schedule = make_zb_h1(p, m);
      const SimulationResult r = simulate_steady(schedule, uniform_costs(schedule));
      const TimedAction& first_gradient = *std::find_if(
          r.execution.ranks[0].begin(), r.execution.ranks[0].end(),
          [](const TimedAction& t) { return t.action.kind == ActionKind::kBackwardInput; });
      EXPECT_NEAR(first_gradient.start, 2.0 * p - 1, kTight) << "p=" << p << " m=" << m;
      EXPECT_NEAR(r.steady_state->step_time_s, 3.0 * m + p - 1, kTight) << "p=" << p << " m=" << m;
      EXPECT_NEAR(r.steady_state->bubble_ratio, (p - 1.0) / (3.0 * m + p - 1), kTight) << "p=" << p << " m=" << m;
      EXPECT_EQ(r.steady_state->steps, 2);
    }
  }
}

// GPipe, 1F1B, interleaved 1F1B and DualPipeV: rank 0's span is the whole
// step, so back-to-back steps gain nothing.
TEST(SimulateSteadyState, OtherSchedulesKeepTheirOneStepFigures) {
  for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b", "dualpipev"}) {
    for (int p : {2, 4, 8}) {
      for (int m : {2 * p, 4 * p}) {
        const int v = std::string(name) == "interleaved-1f1b" ? 2 : 1;
        const Schedule schedule = make_schedule(name, p, m, v);
        const SimulationResult r = simulate_steady(schedule, uniform_costs(schedule));
        EXPECT_NEAR(r.steady_state->step_time_s, r.step_time_s, kTight) << name << " p=" << p << " m=" << m;
        EXPECT_NEAR(r.steady_state->bubble_ratio, r.bubble_ratio, kTight) << name << " p=" << p << " m=" << m;
        EXPECT_EQ(r.steady_state->steps, 2);
      }
    }
  }
}

// The all-reduce and the optimizer step are each rank's own: ZB-V with 0.25
// optimizer seconds per stage (0.5 per rank) and a 0.25 all-reduce repeats
// with period 6m + 0.75, those 0.75 its whole bubble.
TEST(SimulateSteadyState, AllReduceAndOptimizerAreInThePeriod) {
  const int p = 4;
  const int m = 8;
  const Schedule schedule = make_zbv(p, m);
  SimulationCosts costs = uniform_costs(schedule);
  for (StageCosts& stage : costs.stages) {
    stage.optimizer_s = 0.25;
    stage.gradient_bytes = 1;
  }
  costs.data_parallel = 2;
  costs.data_parallel_links.assign(p, LinkCost{0.125, std::numeric_limits<double>::infinity()});
  const SimulationResult r = simulate_steady(schedule, costs);
  ASSERT_NEAR(r.ranks[0].all_reduce_s, 0.25, kTight);  // 2(d−1) latencies
  EXPECT_NEAR(r.steady_state->step_time_s, 6.0 * m + 0.75, kTight);
  EXPECT_NEAR(r.steady_state->bubble_ratio, 0.75 / (6.0 * m + 0.75), kTight);
  EXPECT_NEAR(r.step_time_s, 6.0 * m + p - 1 + 0.75, kTight);
}

// Unequal stage costs, in a few patterns: `pattern` shifts which stages are
// slow. ZB-H2's ends then move unequally for a few steps before they settle.
SimulationCosts uneven_costs(const Schedule& schedule, int pattern = 0) {
  SimulationCosts costs = uniform_costs(schedule);
  for (int s = 0; s < schedule.num_stages(); ++s) {
    StageCosts& stage = costs.stages[static_cast<std::size_t>(s)];
    stage.forward_s = 1 + 0.25 * (s * (pattern + 1) % 3);
    stage.backward_input_s = 1 + 0.5 * ((s + pattern) % 2);
    stage.backward_weight_s = 0.5 + 0.25 * ((7 * s + pattern) % 5);
    stage.backward_s = stage.backward_input_s + stage.backward_weight_s;
  }
  return costs;
}

// The period found must be what one more step adds to a schedule that
// really lists the steps back to back, once settled.
TEST(SimulateSteadyState, ThePeriodIsWhatOneMoreStepAddsToBackToBackSteps) {
  int most_steps = 0;
  for (int pattern : {0, 1, 7}) {
    for (const char* name : {"zb-h1", "zb-h2", "zbv", "1f1b", "dualpipev"}) {
      for (int p : {3, 4, 8}) {
        for (int m : {2 * p, 3 * p}) {
          const Schedule schedule = make_schedule(name, p, m);
          const SimulationResult r = simulate_steady(schedule, uneven_costs(schedule, pattern));
          ASSERT_TRUE(r.steady_state->converged) << name << " p=" << p;
          most_steps = std::max(most_steps, r.steady_state->steps);
          const int k = r.steady_state->steps;
          const Schedule k_steps = back_to_back(schedule, k);
          const Schedule k_plus_one = back_to_back(schedule, k + 1);
          const double added = simulate(k_plus_one, uneven_costs(k_plus_one, pattern)).step_time_s -
                               simulate(k_steps, uneven_costs(k_steps, pattern)).step_time_s;
          EXPECT_NEAR(r.steady_state->step_time_s, added, 1e-9) << name << " p=" << p << " m=" << m;
          EXPECT_LE(r.steady_state->step_time_s, r.step_time_s + 1e-9) << name << " p=" << p << " m=" << m;
        }
      }
    }
  }
  EXPECT_EQ(most_steps, 9);  // ZB-H2, p = 8, m = 24, pattern 7
}

// Why the period is executed rather than read off one step: each rank's span
// (first start to last end) bounds it from above — releasing every rank at
// its own first start plus the longest span replays step 1 shifted, and no
// rank ends later for being released earlier — but it can be shorter, when
// the next step's early ranks shorten a wait inside the longest span. ZB-V,
// p = 8, m = 16, pattern 1: spans up to 132.25, period 131.
TEST(SimulateSteadyState, ThePeriodCanBeShorterThanTheLongestSpan) {
  const Schedule schedule = make_zbv(8, 16);
  const SimulationResult r = simulate_steady(schedule, uneven_costs(schedule, 1));
  double longest_span = 0;
  for (int rank = 0; rank < 8; ++rank) {
    longest_span = std::max(longest_span, r.ranks[static_cast<std::size_t>(rank)].pipeline_end_s -
                                              first_compute(r, rank).start);
  }
  EXPECT_DOUBLE_EQ(longest_span, 132.25);
  EXPECT_DOUBLE_EQ(r.steady_state->step_time_s, 131);
  EXPECT_EQ(r.steady_state->steps, 2);
}

// execute()'s rank start times, which the steady state releases steps with:
// every rank released c later shifts the whole execution by c.
TEST(SimulateSteadyState, ExecuteWithRankStartTimesShiftsTheExecution) {
  const Schedule schedule = make_1f1b(3, 6);
  const ExecutionCosts costs = unit_costs(CommMode::kOverlapped);
  const double step = execute(schedule, costs).makespan;
  const std::vector<double> later(3, 2.5);
  EXPECT_DOUBLE_EQ(execute(schedule, costs, later).makespan, step + 2.5);
  const std::vector<double> only_last = {0, 0, 4};  // rank 2's first forward would start at 2
  EXPECT_DOUBLE_EQ(execute(schedule, costs, only_last).ranks[2].front().start, 4);
  const std::vector<double> two = {0, 0};
  EXPECT_EQ(error_of([&] { execute(schedule, costs, two); }),
            "cannot execute 1f1b: 2 rank start times for 3 ranks: give one per rank or none");
}

// Stopped before the ends move equally, the figure is the mean growth per
// step: for 2 steps, makespan(two steps back to back) − makespan(one step).
TEST(SimulateSteadyState, UnsettledAfterMaxStepsGivesTheMeanGrowth) {
  const Schedule schedule = make_zb_h2(8, 16);
  const SimulationCosts costs = uneven_costs(schedule);
  ASSERT_GT(simulate_steady(schedule, costs).steady_state->steps, 2);
  const SimulationResult r = simulate_steady(schedule, costs, 2);
  EXPECT_FALSE(r.steady_state->converged);
  EXPECT_EQ(r.steady_state->steps, 2);
  const Schedule two = back_to_back(schedule, 2);
  EXPECT_NEAR(r.steady_state->step_time_s, simulate(two, uneven_costs(two)).step_time_s - r.step_time_s, 1e-9);
  EXPECT_EQ(error_of([&] { simulate_steady(schedule, costs, 1); }),
            "max_steady_steps is 1: the steady state needs at least 2 steps back to back");
  EXPECT_FALSE(simulate(schedule, costs).steady_state.has_value());  // only when asked for
}

TEST(Simulate, LoweredListsMatchComputeOnlyAtUnitCosts) {
  for (const ScheduleInfo& info : list_schedules()) {
    const int p = 4;
    const int v = info.takes_virtual ? 2 : 1;
    const Schedule schedule = make_schedule(info.name, p, 2 * p, v);
    const SimulationResult compute_only = simulate(schedule, uniform_costs(schedule));
    const SimulationResult lowered = simulate(insert_send_recv(schedule), uniform_costs(schedule));
    EXPECT_NEAR(lowered.step_time_s, compute_only.step_time_s, kTight) << info.name;
    EXPECT_NEAR(lowered.bubble_ratio, compute_only.bubble_ratio, kTight) << info.name;
  }
}

// insert_send_recv places each RECV for unit costs; with I = 2W the RECV
// before rank 0's second I now holds the rank 2 units before the gradient
// is needed. simulate() times the list it is given: the cost model therefore
// simulates overlapped communication on the compute-only schedule (receives
// posted early), and the runtime on the list it really runs.
TEST(Simulate, RecvPositionsOfALoweredListCanStallUnderOtherCosts) {
  const Schedule schedule = make_zb_h1(2, 4);
  const SimulationCosts costs = uniform_costs(schedule, {2, 2, 1});
  EXPECT_DOUBLE_EQ(simulate(schedule, costs).step_time_s, 23);
  EXPECT_DOUBLE_EQ(simulate(insert_send_recv(schedule), costs).step_time_s, 25);
}

// DualPipeV in the schedule module's IR: an F&B pair is an F followed by a B
// of the rank's other chunk. Rank r runs 2(m − 2p + r + 1) pairs in its main
// phase and p − r − 1 in phase 5: 2m − 3p + r + 1 pairs, most on the last
// rank. With F = I = W = 1, B = 2 and each pair saving s = F + B − F&B:
//   step = 6m + p − 1 − 2(m − p)·s          (set by rank p − 1)
//   idle of rank r = p − 1 − (p − 1 − r)·s,
// within the README's bound (PP/2 − 1)(F&B + B − 3W) with PP = 2p stages,
// which it meets on the last rank at full overlap (F&B = B).
TEST(Simulate, DualPipeVIdleAndTheReadmeBound) {
  for (int p : {2, 4, 8}) {
    for (int m : {2 * p, 3 * p}) {
      for (double saving : {0.0, 0.5, 1.0}) {
        const Schedule schedule = make_dualpipev(p, m);
        SimulationCosts costs = uniform_costs(schedule);
        for (StageCosts& stage : costs.stages) stage.forward_backward_overlap_s = saving;
        const SimulationResult r = simulate(schedule, costs);
        EXPECT_NEAR(r.step_time_s, 6.0 * m + p - 1 - 2.0 * (m - p) * saving, kTight);
        const double f_and_b = 1 + 2 - saving;
        const double readme_bound = (p - 1) * (f_and_b + 2 - 3 * 1);
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_NEAR(idle_of(r, rank), p - 1 - (p - 1 - rank) * saving, kTight)
              << "p=" << p << " m=" << m << " saving=" << saving << " rank " << rank;
          EXPECT_LE(idle_of(r, rank), readme_bound + kTight);
        }
      }
    }
  }
}

// One slow stage k (F = 2, B = 4; the others 1 and 2). Each extra
// micro-batch adds the slowest stage's F + B to the step. GPipe's step is
// m(F_k + B_k) + the other stages' F + B; 1F1B with the slow stage first
// idles only once, waiting for the first gradient: its p − 1 warm-up
// forwards and one more take p·F_0 = 8, the round trip of micro-batch 0
// through the other stages ends at F_0 + 3·(1 + 2) = 11, so the step is
// m(F_0 + B_0) + 3.
SimulationCosts one_slow_stage(const Schedule& schedule, int slow) {
  SimulationCosts costs = uniform_costs(schedule, {1, 1, 1});
  costs.stages[static_cast<std::size_t>(slow)].forward_s = 2;
  costs.stages[static_cast<std::size_t>(slow)].backward_s = 4;
  return costs;
}

TEST(Simulate, TheSlowestStageSetsTheSteadyStatePeriod) {
  const int p = 4;
  for (int slow = 0; slow < p; ++slow) {
    for (const char* name : {"gpipe", "1f1b"}) {
      const double step8 = simulate(make_schedule(name, p, 8), one_slow_stage(make_schedule(name, p, 8), slow)).step_time_s;
      const double step9 = simulate(make_schedule(name, p, 9), one_slow_stage(make_schedule(name, p, 9), slow)).step_time_s;
      EXPECT_DOUBLE_EQ(step9 - step8, 2.0 + 4.0) << name << " slow stage " << slow;
    }
    const Schedule gpipe = make_gpipe(p, 8);
    EXPECT_DOUBLE_EQ(simulate(gpipe, one_slow_stage(gpipe, slow)).step_time_s, 8 * 6.0 + 3 * 3.0);
  }
  const Schedule one_f_one_b = make_1f1b(p, 8);
  EXPECT_DOUBLE_EQ(simulate(one_f_one_b, one_slow_stage(one_f_one_b, 0)).step_time_s, 8 * 6.0 + 3);
  const SimulationResult r = simulate(one_f_one_b, one_slow_stage(one_f_one_b, 0));
  EXPECT_DOUBLE_EQ(idle_of(r, 0), 3);
}

// 1F1B with the last stage slow (F = 2, B = 4): the other ranks have slack.
// Overlapped, a message latency L shows only on the p − 1 hops of the fill
// and the p − 1 of the drain: step = 6m + 3(p − 1) + 2(p − 1)L whatever m.
// Blocking, each RECV_F and SEND_B holds the slow rank for L too: 2L more
// per micro-batch (p = 2: exactly 6m + 3 + 2mL).
SimulationCosts slow_last_stage_with_latency(const Schedule& schedule, double latency, CommMode mode) {
  SimulationCosts costs = one_slow_stage(schedule, schedule.num_stages() - 1);
  for (StageCosts& stage : costs.stages) stage.output_bytes = 1;
  costs.links = LinkTable(LinkCost{latency, std::numeric_limits<double>::infinity()});
  costs.comm_mode = mode;
  return costs;
}

TEST(Simulate, LatencyIsOnTheCriticalPathOnlyWhenCommunicationBlocks) {
  for (int p : {2, 4}) {
    for (int m : {4, 8}) {
      for (double latency : {0.1, 0.25, 0.5}) {
        const Schedule schedule = make_1f1b(p, m);
        const Schedule lowered = insert_send_recv(schedule);
        const double base = 6.0 * m + 3 * (p - 1);
        const auto overlapped = slow_last_stage_with_latency(schedule, latency, CommMode::kOverlapped);
        EXPECT_NEAR(simulate(schedule, overlapped).step_time_s, base + 2 * (p - 1) * latency, 1e-9);
        EXPECT_NEAR(simulate(lowered, overlapped).step_time_s, base + 2 * (p - 1) * latency, 1e-9);
        const auto blocking = slow_last_stage_with_latency(schedule, latency, CommMode::kBlocking);
        const SimulationResult r = simulate(lowered, blocking);
        if (p == 2) {
          EXPECT_NEAR(r.step_time_s, base + 2 * m * latency, 1e-9);
        }
        const Schedule longer = insert_send_recv(make_1f1b(p, m + 1));
        EXPECT_NEAR(simulate(longer, blocking).step_time_s - r.step_time_s, 6 + 2 * latency, 1e-9);
        // The slow rank's transfers: its m RECV_F and m SEND_B.
        EXPECT_NEAR(r.ranks[static_cast<std::size_t>(p - 1)].comm_s, 2 * m * latency, 1e-9);
      }
    }
  }
}

TEST(Simulate, OverlappedTransfersCountOnTheCommunicationStreamNotTheRank) {
  const Schedule schedule = make_1f1b(2, 4);
  SimulationCosts costs = uniform_costs(schedule);
  for (StageCosts& stage : costs.stages) stage.output_bytes = 1e6;
  costs.links = LinkTable(LinkCost{1e-6, 1e9});  // 1 us + 1 ms per message
  const SimulationResult r = simulate(schedule, costs);
  // Rank 0 sends 4 activations, rank 1 returns 4 gradients.
  EXPECT_NEAR(r.ranks[0].overlapped_comm_s, 4 * 1.001e-3, 1e-15);
  EXPECT_NEAR(r.ranks[1].overlapped_comm_s, 4 * 1.001e-3, 1e-15);
  EXPECT_DOUBLE_EQ(r.ranks[0].comm_s, 0);
  EXPECT_NEAR(r.ranks[0].busy_s + r.ranks[0].comm_s + r.ranks[0].idle_s, r.step_time_s, kTight);
}

// GPipe, p = 2, m = 1, rank 1 twice as slow (F 2, B 4 against F 1, B 2):
// rank 0 F [0, 1], rank 1 F [1, 3] B [3, 7], rank 0 B [7, 9]. pipeflow's
// bubble counts both ranks' idle time, 1 − (3 + 6)/(2 · 9) = 1/2; the
// zero-bubble paper's rate only the busiest rank's, 1 − 6/9 = 1/3.
TEST(Simulate, TheZeroBubbleRateCountsTheBusiestRank) {
  const Schedule schedule = make_gpipe(2, 1);
  SimulationCosts costs = uniform_costs(schedule, {1, 1, 1});
  costs.stages[1].forward_s = 2;
  costs.stages[1].backward_input_s = 2;
  costs.stages[1].backward_weight_s = 2;
  costs.stages[1].backward_s = 4;
  const SimulationResult r = simulate(schedule, costs);
  EXPECT_DOUBLE_EQ(r.pipeline_time_s, 9);
  EXPECT_DOUBLE_EQ(r.pipeline_bubble_ratio, 0.5);
  EXPECT_DOUBLE_EQ(r.zero_bubble_rate, 1 - 6.0 / 9);
}

TEST(Simulate, DataParallelAllReduceAndOptimizerFollowEachRanksLastAction) {
  const Schedule schedule = make_1f1b(2, 4);
  SimulationCosts costs = uniform_costs(schedule);
  for (StageCosts& stage : costs.stages) {
    stage.gradient_bytes = 1e9;
    stage.optimizer_s = 0.5;
  }
  costs.data_parallel = 4;
  costs.data_parallel_links.assign(2, LinkCost{0, 1e9});
  const SimulationResult r = simulate(schedule, costs);
  // Ring over 4 replicas: 2·3/4 · 1 GB / 1 GB/s = 1.5 s.
  EXPECT_DOUBLE_EQ(r.ranks[0].all_reduce_s, 1.5);
  EXPECT_DOUBLE_EQ(r.ranks[0].pipeline_end_s, 15);
  EXPECT_DOUBLE_EQ(r.ranks[1].pipeline_end_s, 13);
  EXPECT_DOUBLE_EQ(r.pipeline_time_s, 15);
  EXPECT_DOUBLE_EQ(r.step_time_s, 15 + 1.5 + 0.5);
  for (const RankResult& rank : r.ranks) {
    EXPECT_DOUBLE_EQ(rank.busy_s, 12);
    EXPECT_DOUBLE_EQ(rank.comm_s, 1.5);
    EXPECT_DOUBLE_EQ(rank.optimizer_s, 0.5);
    EXPECT_DOUBLE_EQ(rank.idle_s, 3);
  }
  EXPECT_DOUBLE_EQ(r.bubble_ratio, 1 - 24.0 / 34.0);
  EXPECT_DOUBLE_EQ(r.pipeline_bubble_ratio, 3.0 / 15.0);
  EXPECT_DOUBLE_EQ(r.zero_bubble_rate, 1 - 12.0 / 15.0);  // every rank computes 12: the same figure
  // The trace of the step counts the same way.
  const Timeline timeline = simulation_timeline(schedule, r, "dp");
  EXPECT_DOUBLE_EQ(timeline.end_s(), 17);
  EXPECT_DOUBLE_EQ(bubble_stats(timeline).overall, r.bubble_ratio);
  EXPECT_DOUBLE_EQ(bubble_stats(timeline).per_rank[1], r.ranks[1].bubble_ratio);
}

TEST(Simulate, WithoutDataParallelismTheBubbleIsTheScheduleEnginesBubble) {
  const Schedule schedule = make_interleaved_1f1b(4, 12, 3);
  const SimulationCosts costs = uniform_costs(schedule, {1.3, 0.9, 1.7});
  const SimulationResult r = simulate(schedule, costs);
  EXPECT_DOUBLE_EQ(r.bubble_ratio, bubble_fraction(r.execution));
  EXPECT_DOUBLE_EQ(r.bubble_ratio, bubble_fraction(execute(schedule, execution_costs(schedule, costs))));
}

SimulationCosts with_memory(SimulationCosts costs, double activation, double weight_gradient) {
  for (StageCosts& stage : costs.stages) {
    stage.activation_bytes = activation;
    stage.weight_gradient_bytes = weight_gradient;
  }
  return costs;
}

TEST(SimulateMemory, OneFOneBRankRHoldsPMinusRMicrobatchesAndGpipeM) {
  const int p = 4;
  const int m = 10;
  const Schedule one_f_one_b = make_1f1b(p, m);
  const SimulationResult r = simulate(one_f_one_b, with_memory(uniform_costs(one_f_one_b), 1e6, 0));
  for (int rank = 0; rank < p; ++rank) {
    EXPECT_DOUBLE_EQ(r.ranks[static_cast<std::size_t>(rank)].activation_bytes, (p - rank) * 1e6);
    EXPECT_EQ(r.ranks[static_cast<std::size_t>(rank)].peak_inflight, p - rank);
  }
  const Schedule gpipe = make_gpipe(p, m);
  const SimulationResult g = simulate(gpipe, with_memory(uniform_costs(gpipe), 1e6, 0));
  for (const RankResult& rank : g.ranks) {
    EXPECT_DOUBLE_EQ(rank.activation_bytes, m * 1e6);
    EXPECT_EQ(rank.peak_inflight, m);
  }
}

// An action's working bytes (its temporaries; a recomputing backward
// rebuilds its segment) sit on top of what the rank holds when it begins:
// the last warm-up F of 1F1B rank r begins with p − r − 1 micro-batches held,
// its first B with p − r.
TEST(SimulateMemory, WorkingBytesOfAnActionAddToWhatTheRankHolds) {
  const int p = 4;
  const Schedule schedule = make_1f1b(p, 10);
  const auto peaks = [&](double forward_working, double backward_working) {
    SimulationCosts costs = with_memory(uniform_costs(schedule), 1e6, 0);
    for (StageCosts& stage : costs.stages) {
      stage.forward_working_bytes = forward_working;
      stage.backward_working_bytes = backward_working;
    }
    std::vector<double> out;
    for (const RankResult& rank : simulate(schedule, costs).ranks) out.push_back(rank.activation_bytes);
    return out;
  };
  const std::vector<double> backward_sets_it = peaks(1.2e6, 5e5);
  const std::vector<double> forward_sets_it = peaks(1.2e6, 1e5);
  for (int rank = 0; rank < p; ++rank) {
    EXPECT_DOUBLE_EQ(backward_sets_it[static_cast<std::size_t>(rank)], (p - rank) * 1e6 + 5e5);
    EXPECT_DOUBLE_EQ(forward_sets_it[static_cast<std::size_t>(rank)], (p - rank - 1) * 1e6 + 1.2e6);
  }
}

// ZB-H1 keeps 1F1B's p − r micro-batches of activations until their I, and
// holds p micro-batches on every rank until their W.
TEST(SimulateMemory, SplitBackwardHoldsTheWeightGradientShareUntilW) {
  const int p = 4;
  const Schedule schedule = make_zb_h1(p, 12);
  const SimulationResult none = simulate(schedule, with_memory(uniform_costs(schedule), 1e6, 0));
  const SimulationResult all = simulate(schedule, with_memory(uniform_costs(schedule), 1e6, 1e6));
  for (int rank = 0; rank < p; ++rank) {
    EXPECT_DOUBLE_EQ(none.ranks[static_cast<std::size_t>(rank)].activation_bytes, (p - rank) * 1e6);
    EXPECT_DOUBLE_EQ(all.ranks[static_cast<std::size_t>(rank)].activation_bytes, p * 1e6);
  }
}

// The memory walk against the schedule engine, for every schedule in the
// registry: with a weight-gradient share as large as the activations, an I
// frees nothing and a micro-batch is held from its F until its W (or B), so
// each rank's peak is validate()'s peak in-flight until W; with no such
// share, the I frees it and the peak is the peak in-flight until I. A walk
// whose W stops releasing its micro-batch fails the first.
TEST(SimulateMemory, EveryScheduleHoldsItsEnginesPeakInFlightMicrobatches) {
  constexpr double kActivation = 1e6;
  for (const ScheduleInfo& info : list_schedules()) {
    if (info.inference) continue;  // forward only: no activation is held for a backward
    for (int p : {2, 3, 4}) {
      for (int m : {2 * p, 3 * p + 1}) {
        const Schedule schedule = make_schedule(info.name, p, m, info.takes_virtual ? 2 : 1);
        const ValidationReport engine = validate(schedule);
        ASSERT_TRUE(engine.ok()) << engine.render(schedule);
        const SimulationResult until_weight =
            simulate(schedule, with_memory(uniform_costs(schedule), kActivation, kActivation));
        const SimulationResult until_input = simulate(schedule, with_memory(uniform_costs(schedule), kActivation, 0));
        for (std::size_t r = 0; r < static_cast<std::size_t>(p); ++r) {
          const std::string where = fmt::format("{} p={} m={} rank {}", info.name, p, m, r);
          EXPECT_EQ(until_weight.ranks[r].peak_inflight, engine.peak_inflight_until_weight[r]) << where;
          EXPECT_DOUBLE_EQ(until_weight.ranks[r].activation_bytes,
                           engine.peak_inflight_until_weight[r] * kActivation)
              << where;
          EXPECT_DOUBLE_EQ(until_input.ranks[r].activation_bytes, engine.peak_inflight[r] * kActivation) << where;
        }
      }
    }
  }
}

// The same walk against REFERENCE.md's closed forms where the sources give
// one (peak in-flight until W, in chunks): DualPipeV's PP + 1 = 2p + 1 on
// every rank, ZB-V's 2p, ZB-H2's 2p − 1, ZB-H1's p.
TEST(SimulateMemory, ZeroBubbleAndDualPipeVPeaksAreTheirClosedForms) {
  const int p = 4;
  const int m = 12;
  const std::vector<std::pair<std::string, int>> closed_forms = {
      {"dualpipev", 2 * p + 1}, {"zbv", 2 * p}, {"zb-h2", 2 * p - 1}, {"zb-h1", p}};
  for (const auto& [name, peak] : closed_forms) {
    const Schedule schedule = make_schedule(name, p, m);
    const SimulationResult r = simulate(schedule, with_memory(uniform_costs(schedule), 1e6, 1e6));
    for (const RankResult& rank : r.ranks) {
      EXPECT_EQ(rank.peak_inflight, peak) << name;
      EXPECT_DOUBLE_EQ(rank.activation_bytes, peak * 1e6) << name;
    }
  }
}

TEST(SimulateMemory, PeakIsModelStatesPlusActivationsPlusBuffersOfTheRanksStages) {
  const Schedule schedule = make_interleaved_1f1b(2, 4, 2);  // rank 0: stages 0, 2
  SimulationCosts costs = with_memory(uniform_costs(schedule), 0, 0);
  for (int s = 0; s < 4; ++s) {
    StageCosts& stage = costs.stages[static_cast<std::size_t>(s)];
    stage.model_state_bytes = 1000.0 * (s + 1);
    stage.comm_buffer_bytes = 10.0 * (s + 1);
    stage.activation_bytes = s == 0 ? 1.0 : 0.0;
  }
  const SimulationResult r = simulate(schedule, costs);
  const RankResult& rank0 = r.ranks[0];
  EXPECT_DOUBLE_EQ(rank0.model_states_bytes, 1000 + 3000);
  EXPECT_DOUBLE_EQ(rank0.comm_buffer_bytes, 10 + 30);
  EXPECT_DOUBLE_EQ(rank0.activation_bytes, 4);  // every micro-batch's chunk 0 in flight at once
  EXPECT_DOUBLE_EQ(rank0.peak_memory_bytes, 4000 + 40 + 4);
}

// What a search checks before it simulates: the peak from the action lists
// alone equals simulate()'s, bit for bit, for every training schedule,
// compute-only and lowered, with uneven per-stage memory and working bytes,
// under durations that make ranks wait.
TEST(SimulateMemory, ThePeakWithoutExecutingIsSimulatesPeak) {
  for (const ScheduleInfo& info : list_schedules()) {
    if (info.inference) continue;
    const Schedule compute_only = make_schedule(info.name, 3, 7, info.takes_virtual ? 2 : 1);
    for (const Schedule& schedule : {compute_only, insert_send_recv(compute_only)}) {
      SimulationCosts costs = uniform_costs(schedule, {1.3, 0.7, 0.4});
      for (int s = 0; s < schedule.num_stages(); ++s) {
        StageCosts& stage = costs.stages[static_cast<std::size_t>(s)];
        stage.activation_bytes = 1e6 * (s + 1);
        stage.weight_gradient_bytes = 3e5 * (s + 2);
        stage.forward_working_bytes = 7e5 * (s % 2);
        stage.backward_working_bytes = 9e5;
        stage.model_state_bytes = 1e9 + s;
        stage.comm_buffer_bytes = 1e3 * s;
      }
      const SimulationResult r = simulate(schedule, costs);
      for (int rank = 0; rank < schedule.num_ranks(); ++rank) {
        EXPECT_EQ(peak_memory_bytes(schedule, costs, RankId(rank)),
                  r.ranks[static_cast<std::size_t>(rank)].peak_memory_bytes)
            << info.name << (schedule.has_communication() ? " lowered" : "") << " rank " << rank;
      }
    }
  }
  const Schedule schedule = make_1f1b(2, 2);
  SimulationCosts costs = uniform_costs(schedule);
  costs.stages.pop_back();
  EXPECT_EQ(error_of([&] { peak_memory_bytes(schedule, costs, RankId(0)); }),
            "simulation costs give 1 stages but schedule 1f1b has 2: give one StageCosts per stage");
}

TEST(SimulateErrors, StageCountNegativeCostsAndDeadlocksAreNamed) {
  const Schedule schedule = make_1f1b(2, 2);
  SimulationCosts costs = uniform_costs(schedule);
  costs.stages.pop_back();
  EXPECT_EQ(error_of([&] { simulate(schedule, costs); }),
            "simulation costs give 1 stages but schedule 1f1b has 2: give one StageCosts per stage");
  costs = uniform_costs(schedule);
  costs.stages[1].backward_s = -1;
  EXPECT_EQ(error_of([&] { simulate(schedule, costs); }),
            "simulation cost backward_s of stage 1 is -1: costs must be finite and >= 0");

  Schedule stuck("stuck", 2, 2, 1, Placement::kLoop);
  stuck.add(RankId(0), parse_action("0B0"));
  stuck.add(RankId(0), parse_action("0F0"));
  stuck.add(RankId(1), parse_action("1F0"));
  stuck.add(RankId(1), parse_action("1B0"));
  EXPECT_EQ(error_of([&] { simulate(stuck, uniform_costs(stuck)); }),
            "schedule stuck deadlocks under the simulated costs:\n"
            "rank 0 blocked at 0B0: waits for 0F0, which comes later in its own list (step 1)\n"
            "rank 1 blocked at 1F0: waits for 0F0, which rank 0 has not reached (rank 0 is blocked at 0B0)\n"
            "run `pipeflow validate` on it");
}

}  // namespace
}  // namespace pipeflow

namespace pipeflow {
namespace {

// Micro-batches of their own sizes: micro-batch 0 costs F = 1, B = 2 on both
// stages, micro-batch 1 twice as much (F = 2, B = 4), as a sequence twice as
// long would at a linear cost. GPipe, p = 2, m = 2, by hand: rank 0 runs F0
// [0, 1], F1 [1, 3]; rank 1 F0 [1, 2], F1 [3, 5], B0 [5, 7], B1 [7, 11];
// rank 0 B0 [7, 9], B1 [11, 15]: step 15. Both at the mean (F = 1.5, B = 3):
// (m + p − 1)(F + B) = 13.5. 1F1B: rank 1 F0 [1, 2], B0 [2, 4], F1 [4, 6],
// B1 [6, 10]; rank 0 F0 [0, 1], F1 [1, 3], B0 [4, 6], B1 [10, 14]: step 14.
SimulationCosts two_sizes(const Schedule& schedule) {
  SimulationCosts costs = uniform_costs(schedule, {1.5, 1.5, 1.5});
  for (double scale : {1.0, 2.0}) {
    costs.microbatch_stages.push_back(uniform_costs(schedule, {scale, scale, scale}).stages);
  }
  return costs;
}

TEST(VariableMicrobatches, EachMicrobatchTakesItsOwnCosts) {
  const Schedule gpipe = make_schedule("gpipe", 2, 2, 1);
  EXPECT_NEAR(simulate(gpipe, two_sizes(gpipe)).step_time_s, 15, kTight);
  EXPECT_NEAR(simulate(gpipe, uniform_costs(gpipe, {1.5, 1.5, 1.5})).step_time_s, 13.5, kTight);
  const Schedule one_f_one_b = make_schedule("1f1b", 2, 2, 1);
  EXPECT_NEAR(simulate(one_f_one_b, two_sizes(one_f_one_b)).step_time_s, 14, kTight);
  SimulationCosts short_of_one = two_sizes(gpipe);
  short_of_one.microbatch_stages.pop_back();
  EXPECT_EQ(error_of([&] { simulate(gpipe, short_of_one); }),
            "simulation costs give 1 micro-batches' costs but schedule gpipe has 2: give one per micro-batch or none");
}

}  // namespace
}  // namespace pipeflow
