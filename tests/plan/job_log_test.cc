// Megatron-LM and DeepSpeed logs (tests/data/logs/, written by
// tools/make_job_logs.py in those programs' formats with the truth built in:
// 4 stages, 1F1B, 8 micro-batches, stage 2 slow).
#include "pipeflow/plan/job_log.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "../support/error_of.h"
#include "../support/temp_dir.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/plan/analyze.h"

namespace pipeflow {
namespace {

std::filesystem::path logs(const std::string& name) {
  return std::filesystem::path(PIPEFLOW_SOURCE_DIR) / "tests" / "data" / "logs" / name;
}

nlohmann::json truth() { return nlohmann::json::parse(read_file(logs("truth.json"))); }

std::string error_of(std::string_view text) {
  try {
    read_timer_log(text, "job.log");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(JobLog, MegatronsTimersMapEachGlobalRankToItsStageAndTheStageIsTheSlowOne) {
  const nlohmann::json t = truth();
  const TraceInput input = load_trace_input({logs("megatron.log")});
  ASSERT_TRUE(input.log);
  EXPECT_EQ(input.reading.format, "Megatron-LM log");
  // tensor 2 x pipeline 4: global ranks 2s and 2s+1 are stage s, their timers averaged.
  ASSERT_EQ(input.log->ranks.size(), 4u);
  for (int s = 0; s < 4; ++s) {
    ASSERT_TRUE(input.log->ranks[s]) << s;
    EXPECT_NEAR(input.log->ranks[s]->forward_s + input.log->ranks[s]->backward_s,
                t["compute_ms"][s].get<double>() * 1e-3, 1e-6);
  }
  EXPECT_EQ(input.log->microbatches, 8);
  const Analysis a = analyze(input);
  // The step: the median interval (the first, warm-up, is 1.25x slower and shows as the max).
  EXPECT_NEAR(a.step_s, t["step_ms"].get<double>() * 1e-3, 0.01 * a.step_s);
  EXPECT_NEAR(a.bubble, t["bubble"].get<double>(), 0.02);
  const auto slowest = std::max_element(a.stage_compute_s.begin(), a.stage_compute_s.end());
  EXPECT_EQ(slowest - a.stage_compute_s.begin(), t["slow_stage"].get<int>());
  ASSERT_EQ(a.reading.step_spans_s.size(), 3u);
  EXPECT_NEAR(*std::max_element(a.reading.step_spans_s.begin(), a.reading.step_spans_s.end()),
              t["first_interval_step_ms"].get<double>() * 1e-3, 1e-3);
  // Memory: report_memory's max allocated; 1F1B's stage 0 holds the most.
  ASSERT_TRUE(a.reading.peak_memory_bytes[0]);
  EXPECT_DOUBLE_EQ(*a.reading.peak_memory_bytes[0], 4600.0 * 1024 * 1024);
  EXPECT_NEAR(a.memory_skew, 4600.0 / 3400.0, 1e-9);
  // The arguments block gives the run: re-simulated on the measured durations, 1F1B's step is the truth's.
  ASSERT_TRUE(a.baseline);
  EXPECT_NEAR(a.baseline->result.step_time_s, t["step_ms"].get<double>() * 1e-3, 0.03 * a.step_s);
  EXPECT_FALSE(a.advice.empty());
}

TEST(JobLog, DeepSpeedShowsRankZeroOnlyAndSaysSo) {
  const nlohmann::json t = truth();
  const TraceInput input = load_trace_input({logs("deepspeed.log")});
  ASSERT_TRUE(input.log);
  EXPECT_EQ(input.log->stage_layers, (std::vector<int>{3, 3, 3, 3}));
  EXPECT_EQ(input.log->microbatches, 8);
  const Analysis a = analyze(input);
  EXPECT_NEAR(a.step_s, t["step_ms"].get<double>() * 1e-3, 1e-3);
  EXPECT_NEAR(a.bubble, t["stage0_bubble"].get<double>(), 0.02);  // over the one rank it shows
  EXPECT_EQ(a.rank_seen, (std::vector<bool>{true, false, false, false}));
  EXPECT_TRUE(a.stage_compute_s.empty());
  EXPECT_FALSE(a.baseline);
  ASSERT_FALSE(a.reading.notes.empty());
  EXPECT_NE(a.reading.notes.back().find("rank 0's timers only: stages 1 to 3 are not seen"), std::string::npos);

  TraceOptions options;
  options.config = logs("deepspeed-pipeline.json");
  const Analysis advised = analyze(load_trace_input({logs("deepspeed.log")}, options));
  ASSERT_TRUE(advised.baseline);
  EXPECT_FALSE(advised.advice.empty());
}

TEST(JobLog, DeepSpeedsOlderTimerNamesAndItsAccumulationOverThePrintInterval) {
  const TimerLog log = read_timer_log(
      "RANK=0 STAGE=0 LAYERS=2 [0, 2) STAGE_PARAMS=1 (0.000M) TOTAL_PARAMS=2 (0.000M) UNIQUE_PARAMS=2 (0.000M)\n"
      "RANK=1 STAGE=1 LAYERS=2 [2, 4) STAGE_PARAMS=1 (0.000M) TOTAL_PARAMS=2 (0.000M) UNIQUE_PARAMS=2 (0.000M)\n"
      "steps: 5 loss: 2.0 iter time (s): 0.500 samples/sec: 8.0\n"
      "steps: 10 loss: 1.9 iter time (s): 0.400 samples/sec: 10.0\n"
      "[2022-01-01 00:00:00,000] [INFO] [logging.py:60:log_dist] rank=0 time (ms) | forward_microstep: 500.00 | "
      "backward_microstep: 1000.00 | step_microstep: 50.00\n",
      "old.log");
  ASSERT_EQ(log.ranks.size(), 2u);
  ASSERT_TRUE(log.ranks[0]);
  // 5 steps per print (10 - 5): the totals over them, per step.
  EXPECT_DOUBLE_EQ(log.ranks[0]->forward_s, 0.1);
  EXPECT_DOUBLE_EQ(log.ranks[0]->backward_s, 0.2);
  EXPECT_DOUBLE_EQ(log.ranks[0]->optimizer_s, 0.01);
  EXPECT_FALSE(log.ranks[1]);
  EXPECT_EQ(log.step_s, (std::vector<double>{0.5, 0.4}));
}

TEST(JobLog, ALogWithoutPerRankTimersSaysHowToGetThem) {
  EXPECT_NE(error_of(" iteration       10/     100 | consumed samples:           80 | elapsed time per iteration (ms): "
                     "250.0 |\n(min, max) time across ranks (ms):\n"
                     "    forward-compute ................................: (10.00, 12.00)\n")
                .find("run Megatron-LM with --timing-log-level 2 --timing-log-option all"),
            std::string::npos);
  EXPECT_NE(error_of("steps: 10 loss: 1 iter time (s): 0.1 samples/sec: 1\n").find("\"wall_clock_breakdown\": true"),
            std::string::npos);
}

TEST(JobLog, DeepSpeedsStepsMustIncreaseAndItsPrintIntervalIsThePrintedOne) {
  EXPECT_NE(error_of("steps: 10 loss: 1 iter time (s): 0.1 samples/sec: 1\n"
                     "steps: 10 loss: 1 iter time (s): 0.1 samples/sec: 1\n")
                .find("job.log:2: step 10 after step 10: the steps of one run increase"),
            std::string::npos);
  // A resumed run prints step 1010 first: its timers are over steps_per_print = 10 steps, not 1010.
  const TimerLog log = read_timer_log(
      "[INFO] [config.py:1004:print]   steps_per_print .............. 10\n"
      "steps: 1010 loss: 1 iter time (s): 0.100 samples/sec: 1\n"
      "[Rank 0] time (ms) | fwd_microstep: 300.00 | bwd_microstep: 600.00\n",
      "resumed.log");
  ASSERT_TRUE(log.ranks.at(0));
  EXPECT_DOUBLE_EQ(log.ranks[0]->forward_s, 0.03);
}

TEST(JobLog, AMalformedTimerLineIsNamedByItsLine) {
  EXPECT_NE(error_of(" iteration 1/ 2 | elapsed time per iteration (ms): 10.0 |\ntimes across ranks (ms):\n"
                     "  forward-compute:\n     rank  0: soon\n")
                .find("job.log:4: \"soon\" is not a time in milliseconds"),
            std::string::npos);
  EXPECT_NE(error_of("steps: 10 loss: 1 iter time (s): 0.1 samples/sec: 1\n[Rank 0] time (ms) | fwd_microstep 12\n")
                .find("job.log:2: a timer is \"NAME: MS\" between bars"),
            std::string::npos);
  EXPECT_NE(error_of("times across ranks (ms):\n").find("not a Megatron-LM or DeepSpeed log"), std::string::npos);
}

TEST(JobLog, AConfigurationOfAnotherRunThanTheLogsIsRefused) {
  TraceOptions options;
  options.config = logs("deepspeed-pipeline.json");  // 10 layers, tensor 1: the log's run has 8 and tensor 2
  try {
    load_trace_input({logs("megatron.log")}, options);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("arguments block states tensor 2 x pipeline 4, 8 layers of width 1024"),
              std::string::npos)
        << error.what();
  }
}

// msprof-analyze's cluster_step_trace_time.csv: a row per step and rank or stage, microseconds.
constexpr const char* kAscendCluster =
    "Step,Type,Index,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,"
    "Communication(Not Overlapped and Exclude Receive),Preparing\n"
    "0,rank,0,240000,195000,1000,196000,550,400000,190000,5000,100\n"
    "0,stage,0,240000,195000,1000,196000,550,400000,190000,5000,100\n"
    "0,stage,1,360000,35000,1000,36000,40500,400000,30000,5000,100\n"
    "1,stage,0,240000,195000,1000,196000,550,400000,190000,5000,100\n"
    "1,stage,1,360000,35000,1000,36000,40500,400000,30000,5000,100\n";

TEST(JobLog, AnAscendClusterStepTraceGivesEachStagesTimes) {
  ASSERT_TRUE(is_timer_log(kAscendCluster));
  const TimerLog log = read_timer_log(kAscendCluster, "cluster_step_trace_time.csv");
  EXPECT_EQ(log.format, "Ascend step trace");
  ASSERT_EQ(log.ranks.size(), 2u);  // the stage rows, not the rank row
  ASSERT_TRUE(log.ranks[1]);
  EXPECT_DOUBLE_EQ(log.ranks[1]->forward_s + log.ranks[1]->backward_s, 0.36);
  EXPECT_DOUBLE_EQ(log.ranks[0]->comm_s, 0.195);
  // A step ends with its slowest stage: computing + communication not overlapped + free.
  ASSERT_EQ(log.step_s.size(), 2u);
  for (double step : log.step_s) EXPECT_NEAR(step, 0.43555, 1e-12);
  TraceInput input;
  input.source = "cluster_step_trace_time.csv";
  input.log = log;
  const Analysis a = analyze(input);
  // The bubble: the Bubble column's receive time over the step; busy time would give 1 - 0.6 / (2 * 0.43555).
  EXPECT_NEAR(a.bubble, (0.19 + 0.03) / (2 * 0.43555), 1e-12);
  EXPECT_EQ(a.bubble_source, "Ascend's Bubble column: receive time / (ranks x step)");
  EXPECT_NEAR(a.imbalance, 1.2, 1e-12);
}

TEST(JobLog, AnAscendDevicesStepTraceIsOneRankAndAShortRowIsNamed) {
  const TimerLog log = read_timer_log(
      "Device_id,Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,"
      "Communication(Not Overlapped and Exclude Receive),Preparing\n"
      "0,1,79663.2,0,0,0,3458.9,83121.75,0,0,3324\n",
      "step_trace_time.csv");
  ASSERT_EQ(log.ranks.size(), 1u);
  EXPECT_NEAR(log.step_s.at(0), 0.0831221, 1e-9);
  EXPECT_NE(error_of("Step,Computing,Communication(Not Overlapped),Free\n1,2\n").find("job.log:2: 2 fields, the header has 4"),
            std::string::npos);
}

// tests/data/logs/ascend/ (tools/make_ascend_traces.py): torch_npu's step_trace_time.csv of each of 8 devices,
// tensor 2 x pipeline 4, the job of truth.json.
TEST(JobLog, AscendsDevicesStepTracesAreOneJobWhoseBubbleIsTheBubbleColumns) {
  const nlohmann::json t = nlohmann::json::parse(read_file(logs("ascend-truth.json")));
  TraceOptions options;
  options.config = logs("ascend-run.json");  // tensor 2 x pipeline 4: ranks 2s and 2s + 1 are stage s
  const TraceInput input = load_trace_input({logs("ascend")}, options);
  ASSERT_TRUE(input.log);
  EXPECT_EQ(input.reading.format, "Ascend step trace (8 devices)");
  EXPECT_EQ(input.reading.files.size(), 8u);
  ASSERT_EQ(input.log->ranks.size(), 4u);
  for (int s = 0; s < 4; ++s) {
    ASSERT_TRUE(input.log->ranks[s]) << s;
    // Computing holds the optimizer step's kernels (4 ms) too; the two tensor ranks' skews cancel.
    EXPECT_NEAR(input.log->ranks[s]->forward_s + input.log->ranks[s]->backward_s,
                (t["compute_ms"][s].get<double>() + 4) * 1e-3, 1e-9);
  }
  const Analysis a = analyze(input);
  EXPECT_NEAR(a.step_s, t["step_ms"].get<double>() * 1e-3, 1e-9);
  EXPECT_NEAR(a.bubble, t["bubble_column_share"].get<double>(), 1e-9);
  EXPECT_NEAR(a.bubble, t["bubble"].get<double>(), 0.02);
  EXPECT_FALSE(a.bubble_source.empty());
  const auto slowest = std::max_element(a.stage_compute_s.begin(), a.stage_compute_s.end());
  EXPECT_EQ(slowest - a.stage_compute_s.begin(), t["slow_stage"].get<int>());
  const auto named = std::find_if(a.notes.begin(), a.notes.end(), [](const std::string& note) {
    return note.find("the Stage column (the step less its receives): stage 2 is the slowest") != std::string::npos;
  });
  EXPECT_NE(named, a.notes.end());
  ASSERT_TRUE(a.baseline);  // re-simulated on the measured durations
  EXPECT_NEAR(a.baseline->result.step_time_s, t["step_ms"].get<double>() * 1e-3, 0.03 * a.step_s);

  // Without the layout, each device is a stage, and the report says so.
  const TraceInput alone = load_trace_input({logs("ascend")});
  EXPECT_EQ(alone.log->ranks.size(), 8u);
  const std::vector<std::string>& notes = alone.reading.notes;
  EXPECT_NE(std::find_if(notes.begin(), notes.end(),
                         [](const std::string& n) { return n.find("no --config: each device") != std::string::npos; }),
            notes.end());
}

// A device's rank: its folder's profiler_info_{R}.json, else a rank{R} in a folder's name, else Device_id.
TEST(JobLog, AnAscendDevicesRankComesFromItsFolderOrItsDeviceIdAndTwoOfOneRankAreRefused) {
  const std::string dir = testing::make_temp_dir();
  const auto write_device = [&](const std::string& folder, const std::string& device_id, double computing) {
    std::filesystem::create_directories(dir + "/" + folder);
    write_file_atomic(dir + "/" + folder + "/step_trace_time.csv",
                      std::string(device_id.empty() ? "" : "Device_id,") + "Step,Computing,"
                      "Communication(Not Overlapped),Free,Bubble\n" + (device_id.empty() ? "" : device_id + ",") +
                      fmt::format("1,{},100,50,100\n", computing));
  };
  write_device("a/rank_1", "", 3000);
  write_device("a/rank_0", "", 6000);
  const TraceInput named = load_trace_input({dir + "/a"});
  ASSERT_EQ(named.log->ranks.size(), 2u);
  EXPECT_NEAR(named.log->ranks[0]->forward_s + named.log->ranks[0]->backward_s, 6000e-6, 1e-12);
  EXPECT_NEAR(named.log->step_s.at(0), 6150e-6, 1e-12);  // the slowest device's

  write_device("b/x", "1", 3000);
  write_device("b/y", "0", 6000);
  const TraceInput by_device = load_trace_input({dir + "/b"});
  EXPECT_NEAR(by_device.log->ranks.at(0)->forward_s + by_device.log->ranks[0]->backward_s, 6000e-6, 1e-12);

  write_device("c/x", "0", 3000);
  write_device("c/y", "0", 6000);
  write_device("d/x", "", 3000);
  write_device("d/y", "", 6000);
  const auto error_reading = [&](const std::string& folder) {
    return testing::error_of([&] { load_trace_input({dir + "/" + folder}); });
  };
  EXPECT_NE(error_reading("c").find("are both rank 0: give one job's devices, one file each"), std::string::npos);
  EXPECT_NE(error_reading("d").find("whose rank? No profiler_info_{R}.json"), std::string::npos);
}

TEST(JobLog, ALogAndATraceTogetherAreRefused) {
  const std::filesystem::path trace =
      std::filesystem::path(PIPEFLOW_SOURCE_DIR) / "tests" / "data" / "traces" / "torch-1f1b";
  EXPECT_THROW(load_trace_input({logs("megatron.log"), trace}), Error);
  EXPECT_THROW(load_trace_input({logs("megatron.log"), logs("deepspeed.log")}), Error);
}

}  // namespace
}  // namespace pipeflow
