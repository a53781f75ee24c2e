// analyze on PyTorch profiler traces of a real two-process pipeline
// (tests/data/traces/, made by tools/make_torch_traces.py), against the
// truth the run measured itself (truth.json beside them).
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/plan/sweep.h"
#include "../support/temp_dir.h"

namespace pipeflow {
namespace {

std::filesystem::path sample(const std::string& name) {
  return std::filesystem::path(PIPEFLOW_SOURCE_DIR) / "tests" / "data" / "traces" / name;
}

nlohmann::json truth(const std::string& name) { return nlohmann::json::parse(read_file(sample(name) / "truth.json")); }

const nlohmann::json& truth_step(const nlohmann::json& t, int step) {
  for (const nlohmann::json& s : t["steps"]) {
    if (s["step"] == step) return s;
  }
  throw std::runtime_error("no such step in truth.json");
}

class TorchTraceSample : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchTraceSample, AnalyzeRecoversTheActionsTheStepTheBubbleAndTheSlowStage) {
  const nlohmann::json t = truth(GetParam());
  const TraceInput input = load_trace_input({sample(GetParam())});
  const Analysis a = analyze(input);
  ASSERT_EQ(a.num_ranks, 2);
  ASSERT_TRUE(a.reading.step);
  EXPECT_EQ(a.reading.steps, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(*a.reading.step, 2);  // the last every rank has
  const nlohmann::json& s = truth_step(t, *a.reading.step);

  // Every labelled action of the step, on its rank.
  for (int r = 0; r < 2; ++r) {
    std::multiset<std::string> expected, read;
    for (const nlohmann::json& action : s["actions"][r]) {
      const std::string label = action["action"];
      // The truth also times the optimizer step and GPipe's unlabelled transfers ("recv F0").
      if (label.starts_with("PP:") || label.starts_with("Forward ") || label.starts_with("Backward ")) {
        expected.insert(label);
      }
    }
    for (const TraceEvent& e : input.timeline.events) {
      if (e.rank.value() == r && e.action && e.category != EventCategory::kWait) read.insert(e.name);
    }
    EXPECT_EQ(read, expected) << "rank " << r;
  }
  // The step (first action to the optimizer's end) and the bubble.
  EXPECT_NEAR(a.step_s, s["span_us"].get<double>() * 1e-6, 0.02 * a.step_s);
  EXPECT_NEAR(a.bubble, s["bubble"].get<double>(), 0.02);
  // The slow stage built in (truth.json's slow_stage): stage 1 holds twice stage 0's layers.
  ASSERT_EQ(a.stage_compute_s.size(), 2u);
  const int slow = t["slow_stage"].get<int>();
  EXPECT_GT(a.stage_compute_s[slow], 1.2 * a.stage_compute_s[1 - slow]);
  // The spans of the other steps are there for min / median / max.
  EXPECT_EQ(a.reading.step_spans_s.size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Samples, TorchTraceSample, ::testing::Values("torch-1f1b", "torch-gpipe", "kineto-1f1b"));

TEST(TorchTraceSample, TheLegacyProfilersClocksAreAlignedToWhatTheRunMeasured) {
  // The legacy profiler counts from each process's own start: the ranks' clocks differ by the
  // time between their starts, which the run measured on one wall clock.
  for (const std::string name : {"torch-1f1b", "torch-gpipe"}) {
    const nlohmann::json t = truth(name);
    const double truth_s = (t["clock_offset_us"][0].get<double>() - t["clock_offset_us"][1].get<double>()) * -1e-6;
    const TraceInput input = load_trace_input({sample(name)});
    ASSERT_EQ(input.reading.clock_window_s.size(), 2u);
    const auto [lower, upper] = input.reading.clock_window_s[1];
    EXPECT_LE(lower, truth_s) << name;
    EXPECT_GE(upper, truth_s) << name;
    if (name == "torch-1f1b") {  // labelled sends and receives: a window of a few hundred microseconds
      EXPECT_NEAR(input.reading.clock_offset_s[1], truth_s, 300e-6);
    }
  }
  // Kineto's ts are on one wall clock (after baseTimeNanoseconds): no shift.
  const TraceInput kineto = load_trace_input({sample("kineto-1f1b")});
  EXPECT_EQ(kineto.reading.clock_offset_s, (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(kineto.reading.format, "PyTorch profiler (Kineto)");
}

TEST(TorchTraceSample, FilesGivenOneByOneAndAnEarlierStep) {
  const std::filesystem::path dir = sample("torch-gpipe");
  const TraceInput input = load_trace_input({dir / "rank-1.json.gz", dir / "rank-0.json.gz"}, TraceOptions{0, std::nullopt});
  EXPECT_EQ(input.reading.step, 0);
  EXPECT_EQ(input.reading.format, "PyTorch profiler (legacy profiler)");
  EXPECT_EQ(input.reading.files.size(), 2u);
  const Analysis a = analyze(input);
  EXPECT_NEAR(a.bubble, truth_step(truth("torch-gpipe"), 0)["bubble"].get<double>(), 0.02);
}

TEST(TorchTraceSample, ANonTraceFileNamedByTheUserIsAnErrorAndOneInAFolderIsSkipped) {
  EXPECT_THROW(load_trace_input({sample("torch-1f1b") / "truth.json"}), Error);
  const TraceInput input = load_trace_input({sample("torch-1f1b")});
  ASSERT_FALSE(input.reading.notes.empty());
  EXPECT_NE(input.reading.notes.front().find("skipped 1 file that is no trace or log: "), std::string::npos);
  EXPECT_NE(input.reading.notes.front().find("truth.json"), std::string::npos);
}

TEST(TorchTraceSample, OneRanksTraceAloneIsNotAPipeline) {
  try {
    load_trace_input({sample("torch-1f1b") / "rank1_trace.json"});
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("no trace of pipeline rank 0"), std::string::npos) << error.what();
  }
}

TEST(TorchTraceSample, APipeflowTraceAndAPyTorchTraceTogetherAreRefused) {
  const std::filesystem::path own = std::filesystem::path(pipeflow::testing::make_temp_dir()) / "own.json";
  write_file_atomic(own, R"({"traceEvents":[{"name":"0F0","ph":"X","tid":0,"ts":0,"dur":1}]})");
  EXPECT_THROW(load_trace_input({own, sample("torch-1f1b")}), Error);
}

}  // namespace
}  // namespace pipeflow

namespace pipeflow {
namespace {

TEST(TorchTraceSample, WithTheRunsConfigurationTheAdviceRebalancesTheSlowStage) {
  const std::filesystem::path config = sample("torch-pipeline.json");  // the run's layout: 2 blocks | 4 blocks
  TraceOptions options;
  options.config = config;
  const Analysis a = analyze(load_trace_input({sample("torch-1f1b")}, options));
  ASSERT_TRUE(a.baseline);
  // The re-simulation runs on the measured durations: its compute per stage is the trace's.
  ASSERT_FALSE(a.advice.empty());
  EXPECT_EQ(a.advice.front().kind, "partition");
  EXPECT_GT(a.advice.front().gain, 0.05);
  EXPECT_EQ(a.advice.front().details.front(), "stage 0: embedding..block.1 -> embedding..block.2");
}

TEST(TorchTraceSample, AConfigurationOfAnotherShapeIsRefusedNamingBoth) {
  const std::filesystem::path config = std::filesystem::path(pipeflow::testing::make_temp_dir()) / "4stage.json";
  std::string text = read_file(sample("torch-pipeline.json"));
  text.replace(text.find("\"stages\": 2"), 11, "\"stages\": 4");
  text.replace(text.find("counts:3,5"), 10, "uniform");
  write_file_atomic(config, text);
  TraceOptions options;
  options.config = config;
  try {
    load_trace_input({sample("torch-1f1b")}, options);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("the configuration runs 4 stages (4 ranks x 1 chunks), the trace 2"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace pipeflow

namespace pipeflow {
namespace {

TEST(TorchTraceSample, ATraceIsAMeasuredProfileForSweepAndSimulate) {
  const RunConfig config = load_run_config(sample("torch-pipeline.json"));
  const RunMetadata measured = measured_run_from(sample("torch-1f1b"), config);
  ASSERT_TRUE(measured.costs_measured);
  TraceOptions options;
  options.config = sample("torch-pipeline.json");
  const Analysis a = analyze(load_trace_input({sample("torch-1f1b")}, options));
  const ConfigSource source = [&](const RunOverrides& o) { return load_run_config(sample("torch-pipeline.json"), o); };
  SweepRequest request{{}, {parse_sweep_axis("partition=balanced")}, LrRule::kNone, {}, {}, measured};
  const Sweep with_trace = run_sweep(source, request);
  request.measured.reset();
  const Sweep modelled = run_sweep(source, request);
  ASSERT_TRUE(with_trace.points.at(0).error.empty()) << with_trace.points[0].error;
  // The rebalanced point is analyze's partition advice, re-simulated from the same measurements.
  ASSERT_EQ(a.advice.front().kind, "partition");
  EXPECT_DOUBLE_EQ(with_trace.points[0].step_time_s, a.advice.front().step_time_s);
  EXPECT_NE(with_trace.points[0].step_time_s, modelled.points[0].step_time_s);
  // The run's own layout, re-simulated, is analyze's baseline.
  EXPECT_DOUBLE_EQ(Resimulator(measured).predict(layout_of(resolve(config))).result.step_time_s,
                   a.baseline->result.step_time_s);
}

}  // namespace
}  // namespace pipeflow
