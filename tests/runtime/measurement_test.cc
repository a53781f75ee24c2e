#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <vector>

#include "pipeflow/runtime/measurement.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/passes.h"
#include "test_support.h"

namespace pipeflow::runtime {
namespace {

Action act(int stage, ActionKind kind, int microbatch) { return {StageId(stage), kind, MicrobatchId(microbatch)}; }

// A step as the engine would record it: every action of the lowered schedule
// at the times of execute() with F = f(stage), B = 2 f(stage), each compute
// action on its core throughout (CPU time = wall time) unless `off_core`
// says how long an action's thread was not.
StepResult synthetic_step(const Schedule& lowered, double f0, double f1,
                          const std::function<double(const Action&, RankId)>& off_core = nullptr) {
  const ExecutionCosts costs{
      .duration = [&](const Action& a, RankId) {
        const double f = a.stage.value() == 0 ? f0 : f1;
        return a.kind == ActionKind::kForward ? f : 2 * f;
      },
      .transfer = [](const Action&, RankId, RankId) { return 0.0; },
      .mode = CommMode::kOverlapped,
  };
  const Execution execution = execute(lowered, costs);
  StepResult step;
  step.tokens = 1000;
  for (const auto& rank : execution.ranks) {
    const RankId r(static_cast<int>(step.ranks.size()));
    RankRecord record;
    for (const TimedAction& t : rank) {
      const double lost = is_compute(t.action.kind) && off_core ? off_core(t.action, r) : 0;
      record.actions.push_back({.action = t.action,
                                .start_s = t.start,
                                .end_s = t.end,
                                .wait_s = t.wait,
                                .cpu_s = is_compute(t.action.kind) ? t.end - t.start - lost : 0,
                                .held_bytes = t.action.kind == ActionKind::kForward ? 100 : 0});
    }
    record.phases.push_back({FlushPhase::kOptimizer, lowered.stages_of(RankId(static_cast<int>(step.ranks.size())))[0],
                             execution.makespan, execution.makespan + 0.25});
    step.ranks.push_back(record);
  }
  step.wall_s = execution.makespan + 0.25;
  return step;
}

TEST(Measurement, FiguresOfAStepAddUpAndTheBubbleIsTheClosedForm) {
  // 1F1B, p = 2, m = 4, equal stages (F = 1, B = 2): bubble (p − 1)/(m + p − 1) = 1/5.
  const Schedule lowered = insert_send_recv(make_schedule("1f1b", 2, 4));
  const StepResult step = synthetic_step(lowered, 1, 1);
  const StepFigures figures = step_figures(step, 2);
  EXPECT_DOUBLE_EQ(figures.pipeline_s, 15);
  EXPECT_DOUBLE_EQ(figures.bubble, 0.2);
  EXPECT_DOUBLE_EQ(figures.wall_s, 15.25);
  EXPECT_DOUBLE_EQ(figures.tokens_per_s, 1000 / 15.25);
  for (const RankFigures& rank : figures.ranks) {
    EXPECT_DOUBLE_EQ(rank.compute_s, 12);
    EXPECT_DOUBLE_EQ(rank.optimizer_s, 0.25);
    EXPECT_DOUBLE_EQ(rank.compute_s + rank.comm_s + rank.wait_s + rank.other_s, rank.pipeline_end_s);
    EXPECT_DOUBLE_EQ(rank.bubble, 0.2);
  }
  // Rank 1 waits only for its first input; the later ones arrive while it computes.
  EXPECT_DOUBLE_EQ(figures.ranks[1].wait_s, 1);
}

TEST(Measurement, WakeIsTheWaitAfterThePeersSendEnded) {
  const Schedule lowered = insert_send_recv(make_schedule("1f1b", 2, 4));
  StepResult step = synthetic_step(lowered, 1, 1);
  // execute() hands every message over the moment its SEND ends.
  EXPECT_DOUBLE_EQ(step_figures(step, 2).ranks[1].wake_s, 0);
  // Rank 1's thread woke 0.25 s after stage 0's SEND_F 0 ended: its RECV_F 0 blocked that much longer.
  for (ActionTiming& t : step.ranks[1].actions) {
    if (t.action == act(1, ActionKind::kRecvForward, 0)) {
      t.wait_s += 0.25;
      t.end_s += 0.25;
    }
  }
  const StepFigures figures = step_figures(step, 2);
  EXPECT_DOUBLE_EQ(figures.ranks[1].wake_s, 0.25);
  EXPECT_DOUBLE_EQ(figures.ranks[1].wait_s, 1.25);
  EXPECT_DOUBLE_EQ(figures.ranks[0].wake_s, 0);
}

TEST(Measurement, OffCoreTimeIsComputeWallTimeTheThreadDidNotRun) {
  // Rank 1's thread loses its core for 0.5 s in each of its 4 B actions,
  // and rank 0 never does: off-core 2 s on rank 1, 0 on rank 0, and the
  // compute it is part of unchanged (B still takes 2 on the wall clock).
  const Schedule lowered = insert_send_recv(make_schedule("1f1b", 2, 4));
  const StepResult step = synthetic_step(lowered, 1, 1, [](const Action& a, RankId r) {
    return r.value() == 1 && a.kind == ActionKind::kBackward ? 0.5 : 0.0;
  });
  const StepFigures figures = step_figures(step, 2);
  EXPECT_DOUBLE_EQ(figures.ranks[0].off_core_s, 0);
  EXPECT_DOUBLE_EQ(figures.ranks[1].off_core_s, 2);
  EXPECT_DOUBLE_EQ(figures.ranks[1].compute_s, 12);
}

// With tensor parallelism the wall time a compute action's thread did not
// run holds its collectives' wait for the peers too: only that part of each
// (its wall time less its CPU time) is taken out, not its whole time.
TEST(Measurement, OffCoreTimeLeavesOutTheCollectivesWaitNotTheirWork) {
  // Rank 1's 4 B actions: 0.5 s each off the core by the wall clock; inside
  // each, one collective of 0.4 s wall time, 0.1 s of it on the CPU
  // (asleep 0.3 s), and one of 0.2 s all on the CPU (a CPU clock a little
  // ahead of the wall clock counts as none asleep).
  const Schedule lowered = insert_send_recv(make_schedule("1f1b", 2, 4));
  StepResult step = synthetic_step(lowered, 1, 1, [](const Action& a, RankId r) {
    return r.value() == 1 && a.kind == ActionKind::kBackward ? 0.5 : 0.0;
  });
  RankRecord& rank = step.ranks[1];
  for (const ActionTiming& t : std::vector<ActionTiming>(rank.actions)) {
    if (t.action.kind != ActionKind::kBackward) continue;
    rank.collectives.push_back({.start_s = t.start_s, .end_s = t.start_s + 0.4, .bytes = 64, .cpu_s = 0.1});
    rank.collectives.push_back({.start_s = t.start_s + 1, .end_s = t.start_s + 1.2, .bytes = 64, .cpu_s = 0.2001});
  }
  const StepFigures figures = step_figures(step, 2);
  // Σ_a max(0, wall − cpu) − Σ_c max(0, wall − cpu) = 4 · 0.5 − 4 · 0.3.
  EXPECT_NEAR(figures.ranks[1].off_core_s, 4 * 0.5 - 4 * 0.3, 1e-12);
  EXPECT_NEAR(figures.ranks[1].tensor_parallel_s, 4 * 0.6, 1e-12);
  EXPECT_EQ(figures.ranks[1].tensor_parallel_collectives, 8);
  EXPECT_DOUBLE_EQ(figures.ranks[0].off_core_s, 0);
  // Collectives asleep for longer than the actions lost: 0, not negative.
  for (CollectiveTiming& c : rank.collectives) c.cpu_s = 0;
  EXPECT_DOUBLE_EQ(step_figures(step, 2).ranks[1].off_core_s, 0);
}

TEST(Measurement, TheTimelineSplitsWaitsAndAddsTheFlush) {
  const Schedule lowered = insert_send_recv(make_schedule("gpipe", 2, 1));
  const StepResult step = synthetic_step(lowered, 1, 3);
  const Timeline timeline = measured_timeline(step, 2, "measured", true);
  EXPECT_EQ(timeline.num_ranks, 2);
  std::vector<std::string> rank1;
  for (const TraceEvent& e : timeline.events) {
    if (e.rank.value() == 1) rank1.push_back(std::string(to_string(e.category)) + " " + e.name);
  }
  EXPECT_EQ(rank1, (std::vector<std::string>{"wait 1RECV_F0", "recv 1RECV_F0", "forward 1F0", "backward 1B0",
                                             "send 1SEND_B0", "optimizer optimizer stage 1"}));
  EXPECT_DOUBLE_EQ(measured_timeline(step, 2, "", false).makespan_s(), 1 + 3 + 6 + 2);
}

TEST(Measurement, CostsAreMediansPerStageAndKindAndPredictTheStep) {
  // Unequal stages, F0 = 1, F1 = 3: the slow stage sets the period, 1F1B
  // p = 2, m = 4 takes F0 + 4·(F1 + B1) + B0 = 1 + 36 + 2 = 39.
  const Schedule lowered = insert_send_recv(make_schedule("1f1b", 2, 4));
  CostProfile costs(2);
  costs.add(synthetic_step(lowered, 1, 3));
  costs.add(synthetic_step(lowered, 1, 3));
  costs.add(synthetic_step(lowered, 5, 5));  // an outlier step: the medians ignore it
  EXPECT_EQ(costs.steps(), 3);
  EXPECT_EQ(costs.stage(StageId(0)).forward_s, 1);
  EXPECT_EQ(costs.stage(StageId(1)).backward_s, 6);
  EXPECT_EQ(costs.stage(StageId(1)).backward_input_s, 0);
  EXPECT_EQ(costs.stage(StageId(0)).activation_bytes, 100);
  EXPECT_EQ(costs.stage(StageId(1)).optimizer_s, 0.25);
  EXPECT_EQ(costs.duration(act(1, ActionKind::kSendBackward, 0)), 0);
  const auto engine = testing::tiny_engine(lowered);
  const SimulationResult prediction = predict_step(*engine, costs);
  EXPECT_DOUBLE_EQ(prediction.pipeline_time_s, 39);
  EXPECT_DOUBLE_EQ(prediction.step_time_s, 39.25);  // + the optimizer of the last rank to finish
  EXPECT_DOUBLE_EQ(prediction.ranks[1].busy_s, 36);
  EXPECT_DOUBLE_EQ(prediction.ranks[1].optimizer_s, 0.25);
  EXPECT_DOUBLE_EQ(prediction.pipeline_bubble_ratio, 1 - (12.0 + 36) / (2 * 39));
  // 1F1B's first rank holds p = 2 micro-batches at its peak, the last one 1.
  EXPECT_DOUBLE_EQ(prediction.ranks[0].activation_bytes, 2 * 100);
  EXPECT_DOUBLE_EQ(prediction.ranks[1].activation_bytes, 100);
}

TEST(Measurement, TheMeasuredProfileHasTheEnginesMessagesAndModelStates) {
  const Schedule lowered = insert_send_recv(make_schedule("gpipe", 2, 1));
  const auto engine = testing::tiny_engine(lowered);
  CostProfile costs(2);
  costs.add(synthetic_step(lowered, 1, 3));
  const MeasuredProfile profile = measured_profile(costs, *engine, "test");
  ASSERT_EQ(profile.stages.size(), 2u);
  EXPECT_EQ(profile.source, "test");
  EXPECT_EQ(profile.stages[0].costs.output_bytes, testing::kMicroBatch * 16 * 32 * 4);  // [b, T, C] floats
  EXPECT_EQ(profile.stages[1].costs.output_bytes, 0);
  EXPECT_EQ(profile.stages[1].costs.backward_s, 6);
  EXPECT_TRUE(profile.stages[0].was_measured(&StageCosts::model_state_bytes));
  EXPECT_EQ(profile.stages[0].costs.model_state_bytes,
            16.0 * static_cast<double>(engine->stage(StageId(0)).layout().total()));
  EXPECT_EQ(profile_from_json(profile_to_json(profile), "round trip").stages[1].costs.forward_s, 3);
  // bf16: the rounded copy the layers multiply by adds 2 B a parameter.
  EngineOptions options = testing::tiny_options();
  options.format = ComputeFormat::kBf16;
  const PipelineEngine bf16(testing::kTiny, lowered, partition_uniform(testing::kTiny.pipeline_layers(), 2), options);
  EXPECT_EQ(measured_profile(costs, bf16, "bf16").stages[0].costs.model_state_bytes,
            18.0 * static_cast<double>(bf16.stage(StageId(0)).layout().total()));
}

TEST(Measurement, ReplayingASerialStepGivesTheTimelineOfOneCorePerRank) {
  const Schedule lowered = insert_send_recv(make_schedule("zb-h1", 2, 3));
  auto engine = testing::tiny_engine(lowered);
  const DatasetSource source(testing::tiny_dataset(), nn::Split::kTrain);
  const StepResult serial = engine->step(0, source, StepMode::kTrain, RunMode::kSerial);
  const Execution emulated = replay(engine->schedule(), serial);
  // Each action keeps its own measured duration, placed where a pipeline
  // with one core per rank would run it.
  double serial_compute = 0;
  for (const RankRecord& r : serial.ranks) {
    for (const ActionTiming& t : r.actions) serial_compute += is_compute(t.action.kind) ? t.duration_s() : 0;
  }
  double emulated_compute = 0;
  for (int r = 0; r < 2; ++r) emulated_compute += busy_time(emulated, RankId(r));
  EXPECT_DOUBLE_EQ(emulated_compute, serial_compute);
  EXPECT_LT(emulated.makespan, serial_compute);  // the ranks overlap
  EXPECT_FALSE(emulated.deadlocked);
}

}  // namespace
}  // namespace pipeflow::runtime
