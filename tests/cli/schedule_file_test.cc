// pipeflow simulate and train with --schedule-file: a file dumped from a
// built-in schedule runs exactly as that schedule, in either PyTorch CSV
// dialect; a file that disagrees with the configuration or is no valid
// schedule is refused.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "pipeflow/core/file.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

std::string source_path(const std::string& relative) { return std::string(PIPEFLOW_SOURCE_DIR) + "/" + relative; }

// `pipeflow schedule ... --format csv` written to DIR/NAME.
std::string dump_schedule(const std::string& dir, const std::string& name, const std::string& arguments) {
  const std::string path = dir + "/" + name;
  const CommandResult r = run_pipeflow("schedule " + arguments + " --format csv -o " + path);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return path;
}

nlohmann::json simulated(const std::string& arguments) {
  const CommandResult r =
      run_pipeflow("simulate --model gpt2-124m --hardware a100-80g --micro-batch 1 --global-batch 4 --json " +
                   arguments);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(ScheduleFile, SimulatesAsTheBuiltInScheduleItWasDumpedFrom) {
  const std::string dir = make_temp_dir();
  const std::string csv = dump_schedule(dir, "1f1b.csv", "--schedule 1f1b --stages 2 --microbatches 4");
  const nlohmann::json built_in = simulated("--stages 2 --schedule 1f1b");
  const nlohmann::json from_file = simulated("--schedule-file " + csv);  // stages from the file
  EXPECT_EQ(from_file["layout"]["schedule"], "1f1b.csv");
  EXPECT_EQ(from_file["layout"]["pipeline_parallel"], 2);
  EXPECT_EQ(from_file["step_time_s"], built_in["step_time_s"]);
  EXPECT_EQ(from_file["bubble_ratio"], built_in["bubble_ratio"]);
  EXPECT_EQ(from_file["ranks"], built_in["ranks"]);
}

TEST(ScheduleFile, SimulatesPyTorch26FilesAndSaysWhichDialectItRead) {
  const std::string zb = source_path("examples/schedules/pytorch26_zbh1_2x4.csv");
  const CommandResult r = run_pipeflow(
      "simulate --model gpt2-124m --hardware a100-80g --micro-batch 1 --global-batch 4 --json --schedule-file " + zb);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("pytorch26_zbh1_2x4.csv: read as PyTorch 2.5-2.6's CSV (BW full backward, B/W split)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["step_time_s"], simulated("--stages 2 --schedule zb-h1")["step_time_s"]);

  // A lowered file under blocking communication runs its own messages.
  const std::string lowered = source_path("examples/schedules/pytorch26_1f1b_2x4_lowered.csv");
  EXPECT_EQ(simulated("--comm blocking --schedule-file " + lowered)["step_time_s"],
            simulated("--comm blocking --stages 2 --schedule 1f1b")["step_time_s"]);
}

TEST(ScheduleFile, AKeyThatDisagreesWithTheFileNamesBoth) {
  const std::string dir = make_temp_dir();
  const std::string csv = dump_schedule(dir, "1f1b.csv", "--schedule 1f1b --stages 2 --microbatches 4");
  const std::string base = "simulate --model gpt2-124m --micro-batch 1 --schedule-file " + csv;
  CommandResult r = run_pipeflow(base + " --global-batch 4 --stages 4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("pipeline.stages = 4: but schedule_file " + csv + " has 2 ranks: remove stages to take the "
                       "file's"),
            std::string::npos)
      << r.err;
  r = run_pipeflow(base + " --global-batch 8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("gradient_accumulation_steps = 8 (given or derived from the batch keys) but "
                       "pipeline.schedule_file " + csv + " runs 4 micro-batches per step"),
            std::string::npos)
      << r.err;
}

TEST(ScheduleFile, AnInvalidFileIsRefusedWithTheValidatorsReport) {
  const std::string deadlock = source_path("examples/schedules/deadlock_2x1.csv");
  const CommandResult r = run_pipeflow("simulate --model gpt2-124m --schedule-file " + deadlock);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("pipeline.schedule_file " + deadlock + " is no valid schedule"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("deadlock: rank 0 blocked at 0RECV_B0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("<-- ERROR HERE"), std::string::npos) << r.err;
}

// 2 blocks of width 32; 2 ranks, 4 micro-batches of 2 sequences, 2 steps.
std::string tiny_config(const std::string& dir, const std::string& out_dir) {
  const std::string path = dir + "/run.json";
  write_file_atomic(path, R"({
  "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_ctx": 32, "vocab_size": 256},
  "train_batch_size": 8,
  "train_micro_batch_size_per_gpu": 2,
  "pipeline": {"stages": 2, "schedule": "1f1b", "partition_method": "uniform"},
  "steps": 2,
  "eval_interval": 0,
  "seed": 7,
  "out_dir": ")" + out_dir + R"("
})");
  return path;
}

std::vector<double> losses(const std::string& out_dir) {
  std::istringstream lines(read_file(out_dir + "/metrics.jsonl"));
  std::vector<double> out;
  for (std::string line; std::getline(lines, line);) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

TEST(ScheduleFile, TrainsBitForBitAsTheBuiltInScheduleItWasDumpedFrom) {
  const std::string dir = make_temp_dir();
  const std::string csv = dump_schedule(dir, "1f1b.csv", "--schedule 1f1b --stages 2 --microbatches 4");
  const CommandResult built_in = run_pipeflow("train --config " + tiny_config(dir, dir + "/built_in"));
  ASSERT_EQ(built_in.exit_code, 0) << built_in.err;
  // The flag replaces the configuration's pipeline.schedule; stages agree.
  const CommandResult from_file =
      run_pipeflow("train --config " + tiny_config(dir, dir + "/from_file") + " --schedule-file " + csv);
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_NE(from_file.err.find("1f1b.csv: read as PyTorch 2.7+'s CSV"), std::string::npos) << from_file.err;
  const std::vector<double> expected = losses(dir + "/built_in");
  ASSERT_EQ(expected.size(), 2u);
  EXPECT_EQ(losses(dir + "/from_file"), expected);
}

}  // namespace
}  // namespace pipeflow::testing
