#include "pipeflow/plan/analyze.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>

#include "../support/error_of.h"
#include "pipeflow/core/config.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/sim/run_metadata.h"
#include "pipeflow/trace/chrome_trace.h"

namespace pipeflow {
namespace {

using testing::error_of;

RunConfig config_of(const std::string& json) { return parse_run_config(Config::parse(json, "run.json")); }

// What `pipeflow simulate --trace` writes for `config`, read back as analyze reads it.
TraceInput simulated_trace(const RunConfig& config) {
  const ResolvedRun run = resolve(config);
  const Prediction p = predict(layout_of(run));
  Timeline timeline = simulation_timeline(p.schedule, p.result, "simulated");
  timeline.run_metadata = std::make_shared<const nlohmann::json>(
      run_metadata_json(run.config, profile_of_costs(p.costs.costs, "the cost model"), false, "pipeflow simulate"));
  TraceInput input;
  input.source = "trace.json";
  input.timeline = read_chrome_trace(write_chrome_trace(timeline), input.source);
  input.run = read_run_metadata(*input.timeline.run_metadata, input.source);
  return input;
}

// The advice's figures are those of simulating its layout on its own.
void expect_gain_is_the_resimulation(const Analysis& analysis, const Advice& advice) {
  const Prediction base = predict(analysis.baseline->layout);
  const Prediction changed = predict(advice.layout);
  EXPECT_DOUBLE_EQ(advice.step_time_s, changed.result.step_time_s);
  EXPECT_DOUBLE_EQ(advice.tokens_per_s, changed.tokens_per_s);
  EXPECT_DOUBLE_EQ(advice.gain, changed.tokens_per_s / base.tokens_per_s - 1);
  EXPECT_GT(advice.gain, 0);
}

// A unit-cost execution (F 1, B 2) as a timeline without run metadata.
TraceInput unit_cost_trace(const Schedule& schedule) {
  TraceInput input;
  input.source = "unit";
  input.timeline = timeline_from_execution(schedule, execute(schedule, unit_costs(CommMode::kOverlapped)), "unit");
  return input;
}

TEST(Analyze, GpipeAndOneFOneBIdleIsAllFillAndDrainAndTheCriticalPathIsTheStep) {
  for (const char* name : {"gpipe", "1f1b"}) {
    const int p = 4, m = 4;
    const Analysis a = analyze(unit_cost_trace(make_schedule(name, p, m, 1)));
    EXPECT_DOUBLE_EQ(a.step_s, 3.0 * (m + p - 1)) << name;
    EXPECT_NEAR(a.bubble, (p - 1.0) / (m + p - 1), 1e-12) << name;  // GPipe's (p−1)/(m+p−1)
    EXPECT_NEAR(a.fill_drain_share, a.bubble, 1e-12) << name;
    EXPECT_NEAR(a.stall_share, 0, 1e-12) << name;
    EXPECT_DOUBLE_EQ(a.imbalance, 1) << name;
    for (const RankUsage& u : a.ranks) EXPECT_DOUBLE_EQ(u.busy_s, 3.0 * m) << name;
    // Rank r waits r forwards before its first, and as long again for the last backward to come back.
    EXPECT_DOUBLE_EQ(a.ranks[2].fill_s + a.ranks[2].drain_s, 3.0 * (p - 1)) << name;
    EXPECT_DOUBLE_EQ(a.critical_path.length_s, a.step_s) << name;
    EXPECT_DOUBLE_EQ(a.critical_path.compute_s, a.step_s) << name;
    EXPECT_EQ(a.critical_path.actions.front(), "0F0") << name;
    EXPECT_FALSE(a.baseline) << name;
    ASSERT_EQ(a.notes.size(), 1u) << name;
    EXPECT_NE(a.notes[0].find("no run metadata"), std::string::npos) << a.notes[0];
  }
}

TEST(Analyze, ReadsATraceOfAnotherProgramWhoseEventsArePyTorchActionNames) {
  // 2 ranks, 1 micro-batch, GPipe, times in microseconds; categories of its own; stage 1's backward slow.
  TraceInput input;
  input.source = "torch.json";
  input.timeline = read_chrome_trace(R"({"traceEvents": [
      {"name": "0F0", "cat": "user_annotation", "ph": "X", "pid": 1, "tid": 0, "ts": 0, "dur": 10},
      {"name": "1F0", "cat": "user_annotation", "ph": "X", "pid": 1, "tid": 1, "ts": 12, "dur": 10},
      {"name": "1B0", "cat": "user_annotation", "ph": "X", "pid": 1, "tid": 1, "ts": 22, "dur": 40},
      {"name": "0B0", "cat": "user_annotation", "ph": "X", "pid": 1, "tid": 0, "ts": 64, "dur": 20},
      {"name": "ProfilerStep#1", "ph": "X", "pid": 1, "tid": 0, "ts": 84, "dur": 1}]})",
                                     input.source);
  const Analysis a = analyze(input);
  EXPECT_DOUBLE_EQ(a.step_s, 85e-6);
  ASSERT_EQ(a.stage_compute_s.size(), 2u);
  EXPECT_NEAR(a.stage_compute_s[0], 30e-6, 1e-15);
  EXPECT_NEAR(a.stage_compute_s[1], 50e-6, 1e-15);
  EXPECT_NEAR(a.imbalance, 50.0 / 40, 1e-12);
  EXPECT_EQ(a.critical_path.actions, (std::vector<std::string>{"0F0", "1F0", "1B0", "0B0"}));
  EXPECT_NEAR(a.critical_path.compute_s, 80e-6, 1e-15);
  EXPECT_NEAR(a.ranks[0].flush_s, 1e-6, 1e-15);  // the profiler's own event: other
  EXPECT_NEAR(a.ranks[0].fill_s, 54e-6, 1e-15);   // rank 0 waits 0F0's end to 0B0's start
}

// Found by a review: a backward labelled before its forward (clocks that
// disagree, a mislabelled action) sent the critical-path walk round in a
// loop without end, its memory growing by gigabytes.
TEST(Analyze, TheCriticalPathWalkEndsWhenAnActionStartsBeforeItsInput) {
  TraceInput input;
  input.source = "skewed.json";
  input.timeline = read_chrome_trace(R"({"traceEvents": [
      {"name": "0F0", "ph": "X", "tid": 0, "ts": 100, "dur": 10},
      {"name": "0B0", "ph": "X", "tid": 0, "ts": 0, "dur": 50}]})",
                                     input.source);
  const Analysis a = analyze(input);
  EXPECT_EQ(a.critical_path.actions, (std::vector<std::string>{"0B0", "0F0"}));
}

// pipeflow's own trace under MPI with data parallelism: a stage's reduction
// is posted while the rank still computes another stage; only its part
// after the compute counts as flush, so busy + flush + idle is the step.
TEST(Analyze, AReductionPostedDuringComputeCountsAsFlushOnlyWhereNothingElseRuns) {
  TraceInput input;
  input.source = "trace.json";
  input.timeline = read_chrome_trace(R"({"traceEvents": [
      {"name": "0F0", "cat": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 10},
      {"name": "2B0", "cat": "backward", "ph": "X", "pid": 0, "tid": 0, "ts": 10, "dur": 20},
      {"name": "data-parallel reduction stage 2", "cat": "allreduce", "ph": "X", "pid": 0, "tid": 0, "ts": 30,
       "dur": 25},
      {"name": "0B0", "cat": "backward", "ph": "X", "pid": 0, "tid": 0, "ts": 30, "dur": 20},
      {"name": "optimizer stage 0", "cat": "optimizer", "ph": "X", "pid": 0, "tid": 0, "ts": 55, "dur": 5}]})",
                                     input.source);
  const Analysis a = analyze(input);
  EXPECT_DOUBLE_EQ(a.step_s, 60e-6);
  EXPECT_NEAR(a.ranks[0].busy_s, 50e-6, 1e-15);
  EXPECT_NEAR(a.ranks[0].flush_s, 10e-6, 1e-15);  // 5 µs of the reduction after 0B0, and the optimizer
  EXPECT_NEAR(a.ranks[0].idle_s, 0, 1e-15);
}

// pipeflow's own trace of a tensor-parallel run: a layer's all-reduce lies
// inside its F; its time is counted as the communication inside the
// actions, the bubble stays the pipeline's (outside the actions).
TEST(Analyze, ATensorParallelAllReduceInsideAnActionCountsAsCommunicationInsideIt) {
  TraceInput input;
  input.source = "trace.json";
  input.timeline = read_chrome_trace(R"({"traceEvents": [
      {"name": "0F0", "cat": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 10},
      {"name": "tensor-parallel all-reduce", "cat": "tensor_parallel", "ph": "X", "pid": 0, "tid": 0, "ts": 2,
       "dur": 3},
      {"name": "0B0", "cat": "backward", "ph": "X", "pid": 0, "tid": 0, "ts": 10, "dur": 20},
      {"name": "tensor-parallel all-reduce", "cat": "tensor_parallel", "ph": "X", "pid": 0, "tid": 0, "ts": 25,
       "dur": 4}]})",
                                     input.source);
  const Analysis a = analyze(input);
  EXPECT_DOUBLE_EQ(a.step_s, 30e-6);
  EXPECT_NEAR(a.ranks[0].busy_s, 30e-6, 1e-15);
  EXPECT_NEAR(a.ranks[0].tensor_parallel_s, 7e-6, 1e-15);
  EXPECT_NEAR(a.ranks[0].comm_s, 0, 1e-15);
  EXPECT_NEAR(a.bubble, 0, 1e-12);
  EXPECT_NEAR(a.tensor_parallel_share, 7.0 / 30, 1e-12);
  EXPECT_NE(analysis_text(a).find("tensor-parallel collectives inside the actions 23.3% of the step"),
            std::string::npos)
      << analysis_text(a);
}

TEST(Analyze, ASlowStageIsNamedFirstWithTheGainOfTheRebalancedPartition) {
  // gpt2-124m has 14 pipeline layers: stage 1 gets 6 blocks, the others 2 or 3 layers.
  const Analysis a = analyze(simulated_trace(config_of(R"({
    "model": "gpt2-124m", "hardware": "a100-80g", "seq_length": 1024,
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16,
    "pipeline": {"stages": 4, "partition_method": "counts:3,6,3,2", "schedule": "1f1b"}})")));
  EXPECT_GT(a.imbalance, 1.4);
  EXPECT_GT(a.stall_share, 0.1);  // the other stages wait on stage 1 in the steady state
  ASSERT_FALSE(a.advice.empty());
  const Advice& first = a.advice.front();
  EXPECT_EQ(first.kind, "partition");
  EXPECT_EQ(first.layout.partition.kind, PartitionMethod::Kind::kBalanced);
  EXPECT_FALSE(first.details.empty());
  expect_gain_is_the_resimulation(a, first);
  for (std::size_t i = 1; i < a.advice.size(); ++i) EXPECT_LE(a.advice[i].gain, a.advice[i - 1].gain);
}

// The embedding and block.0 frozen come before any trainable layer: they run no backward, so a recompute
// repeats nothing of theirs, and the advice says so.
TEST(Analyze, RecomputeAdviceSaysAFrozenPrefixRecomputesNothing) {
  const Analysis a = analyze(simulated_trace(config_of(R"({
    "model": "gpt2-124m", "hardware": "a100-80g", "seq_length": 1024, "recompute": "selective",
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "freeze": ["embedding", "block.0"],
    "pipeline": {"stages": 2, "partition_method": "balanced", "schedule": "1f1b"}})")));
  const auto recompute = std::find_if(a.advice.begin(), a.advice.end(), [](const Advice& x) {
    return x.kind == "recompute";
  });
  ASSERT_NE(recompute, a.advice.end()) << analysis_text(a);
  EXPECT_EQ(recompute->finding,
            "recompute selective repeats forward work in the backward (embedding..block.0, frozen before any "
            "trainable layer, run no backward: they keep no activations and recompute nothing)");
}

TEST(Analyze, AStarvedWarmUpIsNamedFirstWithTheGainOfMoreMicrobatches) {
  const Analysis a = analyze(simulated_trace(config_of(R"({
    "model": "gpt2-124m", "hardware": "a100-80g", "seq_length": 1024,
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
    "pipeline": {"stages": 4, "partition_method": "balanced", "schedule": "gpipe"}})")));
  EXPECT_GT(a.fill_drain_share, 0.35);
  ASSERT_FALSE(a.advice.empty());
  const Advice& first = a.advice.front();
  EXPECT_EQ(first.kind, "microbatches");
  EXPECT_EQ(first.layout.global_batch, 8);
  EXPECT_EQ(first.layout.schedule, "1f1b");  // GPipe would hold all 8 micro-batches' activations
  expect_gain_is_the_resimulation(a, first);
}

TEST(Analyze, ASlowLinkIsNamedFirstWithTheGainOfOverlappedCommunication) {
  RunConfig config = config_of(R"({
    "model": "gpt2-124m", "hardware": "a100-80g", "seq_length": 1024,
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16, "comm_mode": "blocking",
    "pipeline": {"stages": 4, "partition_method": "balanced", "schedule": "1f1b"}})");
  config.hardware.devices_per_node = 1;  // every pipeline neighbour on another node
  config.hardware.inter_node_bandwidth_bytes_per_s = 1e9;
  const Analysis a = analyze(simulated_trace(config));
  EXPECT_GT(a.comm_wait_share, 0.2);
  ASSERT_FALSE(a.advice.empty());
  const Advice& first = a.advice.front();
  EXPECT_EQ(first.kind, "overlap");
  EXPECT_EQ(first.layout.comm_mode, CommMode::kOverlapped);
  expect_gain_is_the_resimulation(a, first);
}

TEST(Analyze, TheRunMetadataCarriesTheHardwareItself) {
  RunConfig config = config_of(R"({"model": "gpt2-124m", "gradient_accumulation_steps": 2, "pipeline": {"stages": 2}})");
  config.hardware.name = "a machine of its own";
  config.hardware.inter_node_bandwidth_bytes_per_s = 3e9;
  const TraceInput input = simulated_trace(config);
  EXPECT_EQ(input.run->config.hardware.name, "a machine of its own");
  EXPECT_EQ(input.run->config.hardware.inter_node_bandwidth_bytes_per_s, 3e9);
  EXPECT_EQ(input.run->producer, "pipeflow simulate");
  EXPECT_FALSE(input.run->costs_measured);
  EXPECT_EQ(input.run->costs.stages.size(), 2u);
}

TEST(Analyze, RejectsATraceWithoutEventsAndMetadataOfAnotherFormat) {
  TraceInput empty;
  empty.source = "empty.json";
  EXPECT_EQ(error_of([&] { analyze(empty); }),
            "empty.json: the trace has no events (\"X\" events, tid = rank): nothing to analyse");
  EXPECT_EQ(error_of([] { read_run_metadata(nlohmann::json{{"format", 2}}, "t.json"); }),
            "t.json: otherData.pipeflow: no \"producer\": a trace of pipeflow train or simulate has it");
}

}  // namespace
}  // namespace pipeflow
