// pipeflow train under mpirun: every schedule family, pipeline and data
// parallel layouts, against the in-process and the unpipelined run; a
// checkpoint moving between layouts; and what the other processes do when
// one fails.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "pipeflow/core/file.h"
#include "pipeflow/nn/safetensors.h"
#include "../sanitized.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

// 4 blocks of width 32; a global batch of 8 sequences of 16 bytes in
// micro-batches of 2 (gradient_accumulation_steps follows data_parallel).
std::string config_text(const std::string& out_dir, const std::string& schedule, int stages, int chunks,
                        const std::string& extra = "") {
  return R"({
  "model": {"n_layer": 4, "n_head": 2, "n_embd": 32, "n_ctx": 16, "vocab_size": 256},
  "train_batch_size": 8,
  "train_micro_batch_size_per_gpu": 2,
  "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
  "pipeline": {"stages": )" + std::to_string(stages) + R"(, "schedule": ")" + schedule +
         R"(", "virtual_stages": )" + std::to_string(chunks) + R"(, "partition_method": "uniform"},
  "steps": 3,
  "eval_interval": 0,
  "seed": 11,)" + extra + R"(
  "out_dir": ")" + out_dir + R"("
})";
}

std::string write_config(const std::string& path, const std::string& text) {
  write_file_atomic(path, text);
  return path;
}

std::vector<double> losses(const std::string& out_dir) {
  std::istringstream lines(read_file(out_dir + "/metrics.jsonl"));
  std::vector<double> values;
  for (std::string line; std::getline(lines, line);) values.push_back(nlohmann::json::parse(line)["loss"]);
  return values;
}

// Step 0's squared norm of one micro-batch's gradient (global micro-batch 0
// in every layout: replica 0's first) and of the global batch's.
std::pair<double, double> first_grad_squares(const std::string& out_dir) {
  std::istringstream lines(read_file(out_dir + "/metrics.jsonl"));
  std::string line;
  std::getline(lines, line);
  const nlohmann::json json = nlohmann::json::parse(line);
  return {json.at("grad_square_small").get<double>(), json.at("grad_square_big").get<double>()};
}

// The largest difference between two weight files, relative to the largest
// weight. Not per tensor: the attention's key bias has a gradient of exactly
// 0 in exact arithmetic, so its float gradient is rounding noise, which
// AdamW normalises into steps of about lr whatever the summation order; such
// a tensor differs by ~1e-4 of itself between any two orders of the same sums.
double weight_difference(const std::string& a_path, const std::string& b_path) {
  const nn::SafetensorsFile a = nn::SafetensorsFile::read(a_path);
  const nn::SafetensorsFile b = nn::SafetensorsFile::read(b_path);
  EXPECT_EQ(a.names().size(), b.names().size());
  double scale = 0;
  double diff = 0;
  for (const std::string& name : a.names()) {
    const Tensor x = a.floats(name);
    const Tensor y = b.floats(name);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      scale = std::max(scale, static_cast<double>(std::abs(y.data()[i])));
      diff = std::max(diff, static_cast<double>(std::abs(x.data()[i] - y.data()[i])));
    }
  }
  return diff / scale;
}

void expect_same_run(const std::string& run, const std::string& reference, const std::string& what) {
  const std::vector<double> got = losses(run);
  const std::vector<double> want = losses(reference);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << what << ", step " << i;
  }
  EXPECT_LT(weight_difference(run + "/weights.safetensors", reference + "/weights.safetensors"), 1e-5) << what;
}

struct Layout {
  std::string schedule;
  int stages;
  int chunks;
  int data_parallel;
};

std::string describe(const Layout& l) {
  return l.schedule + " pp " + std::to_string(l.stages) + " v " + std::to_string(l.chunks) + " dp " +
         std::to_string(l.data_parallel);
}

class MpiTrain : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }

  // Trains `layout` (under mpirun when it has more than one process) into dir_/NAME.
  std::string train(const Layout& layout, const std::string& name, const std::string& extra = "",
                    const std::string& flags = "") {
    const std::string out = dir_ + "/" + name;
    const std::string config = write_config(
        dir_ + "/" + name + ".json", config_text(out, layout.schedule, layout.stages, layout.chunks, extra));
    const int processes = layout.stages * layout.data_parallel;
    const std::string arguments = "train --config " + config + " " + flags;
    const CommandResult result = processes == 1 && layout.data_parallel == 1
                                     ? run_pipeflow(arguments)
                                     : run_mpirun(processes, arguments);
    EXPECT_EQ(result.exit_code, 0) << describe(layout) << "\n" << result.err;
    return out;
  }

  std::string dir_;
};

TEST_F(MpiTrain, EverySchedulesLossesAndWeightsEqualTheInProcessAndTheUnpipelinedRun) {
  const std::string unpipelined = train({"1f1b", 1, 1, 1}, "unpipelined");
  for (const Layout& layout : {Layout{"gpipe", 2, 1, 1}, Layout{"1f1b", 2, 1, 1}, Layout{"interleaved-1f1b", 2, 2, 1},
                               Layout{"looped-bfs", 2, 2, 1}, Layout{"zb-h1", 2, 1, 1}, Layout{"zb-h2", 2, 1, 1},
                               Layout{"zbv", 2, 2, 1}, Layout{"dualpipev", 2, 2, 1}}) {
    const std::string name = layout.schedule;
    const std::string under_mpi = dir_ + "/" + name + "-mpi";
    const std::string config = write_config(
        under_mpi + ".json", config_text(under_mpi, layout.schedule, layout.stages, layout.chunks));
    const CommandResult result = run_mpirun(layout.stages, "train --config " + config);
    ASSERT_EQ(result.exit_code, 0) << describe(layout) << "\n" << result.err;
    expect_same_run(under_mpi, unpipelined, describe(layout) + " under MPI vs unpipelined");
    // Under a sanitizer the runtime's own tests run every schedule in threads.
    if (!kSanitized) {
      const std::string in_process = train(layout, name + "-threads", "", "");
      expect_same_run(under_mpi, in_process, describe(layout) + " under MPI vs in-process");
    }
  }
}

TEST_F(MpiTrain, PipelineAndDataParallelLayoutsOfFourProcessesEqualTheUnpipelinedRun) {
  const std::string unpipelined = train({"1f1b", 1, 1, 1}, "unpipelined");
  for (const Layout& layout : {Layout{"1f1b", 4, 1, 1}, Layout{"1f1b", 2, 1, 2}, Layout{"1f1b", 1, 1, 4}}) {
    const std::string name = "pp" + std::to_string(layout.stages) + "dp" + std::to_string(layout.data_parallel);
    const std::string out = train(layout, name);
    expect_same_run(out, unpipelined, describe(layout));
    if (layout.data_parallel > 1) {  // the same ranks as threads of one process
      const std::string threads = dir_ + "/" + name + "-threads";
      const std::string config = write_config(
          threads + ".json", config_text(threads, layout.schedule, layout.stages, layout.chunks));
      const CommandResult result =
          run_pipeflow("train --config " + config + " --data-parallel " + std::to_string(layout.data_parallel));
      ASSERT_EQ(result.exit_code, 0) << describe(layout) << "\n" << result.err;
      expect_same_run(threads, out, describe(layout) + " in threads vs under MPI");
      EXPECT_NE(result.err.find(std::to_string(layout.stages * layout.data_parallel) + " worker threads (pipeline " +
                                std::to_string(layout.stages) + " x data parallel " +
                                std::to_string(layout.data_parallel) + ")"),
                std::string::npos)
          << result.err;
    }
    // The noise scale's small batch is replica 0's micro-batch 0 whatever the layout.
    const auto [small, big] = first_grad_squares(out);
    const auto [small_reference, big_reference] = first_grad_squares(unpipelined);
    EXPECT_NEAR(small, small_reference, 1e-5 * small_reference) << describe(layout);
    EXPECT_NEAR(big, big_reference, 1e-5 * big_reference) << describe(layout);
    const std::string err_of_layout = read_file(out + "/report.md");
    EXPECT_NE(err_of_layout.find(std::to_string(layout.stages * layout.data_parallel) + " MPI processes (pipeline " +
                                 std::to_string(layout.stages) + " x data parallel " +
                                 std::to_string(layout.data_parallel) + ")"),
              std::string::npos)
        << err_of_layout;
  }
}

// A Llama (grouped-query attention, rotary positions, untied head) given as a
// config.json through --model: pipelined and data-parallel under mpirun, it
// trains to the unpipelined run's losses and weights.
TEST_F(MpiTrain, ALlamaUnderMpiEqualsItsUnpipelinedRun) {
  const std::string llama = dir_ + "/config.json";
  write_file_atomic(llama, R"({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 256,
    "max_position_embeddings": 16, "tie_word_embeddings": false})");
  const std::string flags = "--model " + llama;
  const std::string unpipelined = train({"1f1b", 1, 1, 1}, "llama-unpipelined", "", flags);
  EXPECT_NE(read_file(unpipelined + "/report.md").find("Llama, 4 layers"), std::string::npos);
  for (const Layout& layout : {Layout{"zbv", 2, 2, 1}, Layout{"1f1b", 2, 1, 2}}) {
    const std::string name = "llama-" + layout.schedule + "-dp" + std::to_string(layout.data_parallel);
    expect_same_run(train(layout, name, "", flags), unpipelined, "Llama " + describe(layout));
  }
}

// In bf16 and fp16 the activations and their gradients cross processes as
// 16-bit values: the same values (each is one of the format's), so the run
// under mpirun is the in-process run's to the bit.
TEST_F(MpiTrain, HalfPrecisionMessagesGiveTheInProcessRunsBits) {
  for (const char* format : {"bf16", "fp16"}) {
    const std::string extra = fmt::format(R"("{}": {{"enabled": true}},)", format);
    const std::string threads = train({"1f1b", 2, 1, 1}, std::string(format) + "-threads", extra);
    const std::string under_mpi = dir_ + "/" + format + "-mpi";
    const std::string config =
        write_config(under_mpi + ".json", config_text(under_mpi, "1f1b", 2, 1, extra));
    const CommandResult result = run_mpirun(2, "train --config " + config);
    ASSERT_EQ(result.exit_code, 0) << format << "\n" << result.err;
    EXPECT_EQ(losses(under_mpi), losses(threads)) << format;
    EXPECT_EQ(read_file(under_mpi + "/weights.safetensors"), read_file(threads + "/weights.safetensors")) << format;
  }
}

// A checkpoint's bytes with its run id (13 hexadecimal digits, its own to
// each run) blanked.
std::string without_run_id(std::string bytes) {
  const std::string key = "\"run_id\":\"";
  if (const std::size_t at = bytes.find(key); at != std::string::npos) bytes.replace(at + key.size(), 13, 13, '-');
  return bytes;
}

// ZeRO-1 shards the AdamW moments over the replicas; the arithmetic is the
// same, so the weights and checkpoints are the same bits, and the memory
// saved is pipeflow's fp32 AdamW formula 8Ψ(1 - 1/d).
TEST_F(MpiTrain, ZeroStageOneGivesTheSameBitsAndSavesEightPsiTimesOneMinusOneOverD) {
  const std::string zero = "\"zero_optimization\": {\"stage\": 1}, \"checkpoint\": {\"interval\": 3},";
  const std::string plain = "\"checkpoint\": {\"interval\": 3},";
  for (const Layout& layout : {Layout{"1f1b", 2, 1, 2}, Layout{"1f1b", 1, 1, 4}}) {
    const std::string tag = "pp" + std::to_string(layout.stages) + "dp" + std::to_string(layout.data_parallel);
    const std::string sharded = train(layout, tag + "-zero1", zero);
    const std::string replicated = train(layout, tag + "-zero0", plain);
    EXPECT_EQ(read_file(sharded + "/weights.safetensors"), read_file(replicated + "/weights.safetensors")) << tag;
    const std::string step = "/checkpoints/step_3/";  // the shards and the index
    ASSERT_EQ(std::distance(std::filesystem::directory_iterator(sharded + step), {}), layout.stages + 1) << tag;
    for (const auto& entry : std::filesystem::directory_iterator(sharded + step)) {
      const std::string file = entry.path().filename().string();
      EXPECT_EQ(without_run_id(read_file(entry.path())), without_run_id(read_file(replicated + step + file)))
          << tag << " " << file;
    }
    // Rank 0 holds stage 0: of 4 blocks of width 32, the embedding and blocks 0-1 at pp 2, everything at pp 1.
    const std::int64_t psi = layout.stages == 1 ? 59584 : 8192 + 512 + 2 * 12704;
    const std::int64_t d = layout.data_parallel;
    const std::int64_t kept = 8 * ((psi + d - 1) / d);
    const std::string saving = "ZeRO-1: this process keeps " + std::to_string(kept) + " of " +
                               std::to_string(8 * psi) + " bytes of AdamW moments, saving " +
                               std::to_string(8 * psi - kept) + " (8Ψ(1 - 1/d) = " + std::to_string(8 * psi * (d - 1) / d) +
                               " for its Ψ = " + std::to_string(psi) + " parameters, d = " + std::to_string(d) + ")";
    EXPECT_NE(read_file(sharded + "/report.md").find(saving), std::string::npos) << saving;
  }
}

// Interleaved and looped schedules with two replicas, ZeRO-1 on and off: the
// unpipelined run's losses and weights, and ZeRO-1's the same bits. Rank 0
// of interleaved 1F1B holds stages 0 and 2; stage 2's last backward comes
// before stage 0's, so its reduce-scatter is posted while the rank still
// computes (the trace's "data-parallel reduction stage 2" begins before the
// rank's last action ends), and the report tells how much overlapped.
TEST_F(MpiTrain, AStagesDataParallelReductionStartsOnceItsGradientsAreDone) {
  const std::string unpipelined = train({"1f1b", 1, 1, 1}, "unpipelined");
  for (const Layout& layout : {Layout{"interleaved-1f1b", 2, 2, 2}, Layout{"looped-bfs", 2, 2, 2}}) {
    const std::string plain = train(layout, layout.schedule + "-zero0");
    expect_same_run(plain, unpipelined, describe(layout));
    const std::string sharded = train(layout, layout.schedule + "-zero1", "\"zero_optimization\": {\"stage\": 1},");
    EXPECT_EQ(read_file(sharded + "/weights.safetensors"), read_file(plain + "/weights.safetensors"))
        << describe(layout);
    EXPECT_NE(read_file(plain + "/report.md").find("Data-parallel reduction over the 2 replicas"), std::string::npos);
  }
  const nlohmann::json trace = nlohmann::json::parse(read_file(dir_ + "/interleaved-1f1b-zero0/trace.json"));
  double last_action_end = 0;
  double stage_2_posted = -1;
  double stage_2_end = -1;
  double stage_0_posted = -1;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] != "X" || event["tid"] != 0) continue;
    const double end = event["ts"].get<double>() + event["dur"].get<double>();
    if (event.contains("args")) last_action_end = std::max(last_action_end, end);
    if (event["name"] == "data-parallel reduction stage 2") {
      stage_2_posted = event["ts"].get<double>();
      stage_2_end = end;
    }
    if (event["name"] == "data-parallel reduction stage 0") stage_0_posted = event["ts"].get<double>();
  }
  ASSERT_GE(stage_2_posted, 0) << trace.dump(1);
  EXPECT_LT(stage_2_posted, last_action_end);
  EXPECT_GE(stage_0_posted, last_action_end);  // the tied wte's side: after the tied exchange
  EXPECT_GE(stage_0_posted, stage_2_end);      // one stage's reduction after the other: no time counted twice
  // metrics.jsonl gives it per rank and step: rank 0's overlapped part is stage 2's lead.
  std::istringstream lines(read_file(dir_ + "/interleaved-1f1b-zero0/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json step = nlohmann::json::parse(line);
    ASSERT_EQ(step.at("data_parallel_s").size(), 2U) << line;
    EXPECT_GT(step["data_parallel_early_s"][0].get<double>(), 0) << line;
    EXPECT_LE(step["data_parallel_early_s"][0].get<double>(), step["data_parallel_s"][0].get<double>());
  }
}

// Three replicas split a stage of 59584 parameters into unequal parts, and
// buckets of 1000 elements make 60 reduce-scatters a stage, two in flight;
// ZBV splits B from W, so a stage's reduction follows its last W. Each run
// equals the unpipelined one, and ZeRO-1 on and off the same bits.
TEST_F(MpiTrain, UnequalPartsManyBucketsAndSplitBackwardsEqualTheUnpipelinedRun) {
  const std::string unpipelined6 = train({"1f1b", 1, 1, 1}, "unpipelined6", "", "--global-batch 6");
  const auto zero = [](int stage) {
    return "\"zero_optimization\": {\"stage\": " + std::to_string(stage) + ", \"reduce_bucket_size\": 1000},";
  };
  const std::string sharded = train({"1f1b", 1, 1, 3}, "dp3-zero1", zero(1), "--global-batch 6");
  expect_same_run(sharded, unpipelined6, "pp 1 x dp 3, ZeRO-1, buckets of 1000");
  const std::string plain = train({"1f1b", 1, 1, 3}, "dp3-zero0", zero(0), "--global-batch 6");
  EXPECT_EQ(read_file(sharded + "/weights.safetensors"), read_file(plain + "/weights.safetensors"));
  EXPECT_NE(read_file(sharded + "/trace.json").find("ZeRO-1 weight all-gather stage 0"), std::string::npos);

  const std::string unpipelined16 = train({"1f1b", 1, 1, 1}, "unpipelined16", "", "--global-batch 16");
  expect_same_run(train({"zbv", 2, 2, 2}, "zbv-dp2", "", "--global-batch 16"), unpipelined16, "zbv pp 2 v 2 dp 2");
}

// The vision-language model's 2 stages in 2 MPI processes (the LM
// embedding's stage found from the cut, not among a process's own stages)
// train the in-process run's steps: the same losses, bit for bit (the same
// actions on the same values; only the transport differs). Its checkpoint
// after 3 steps (a folder of 2 shards) resumes in one process and ends on
// the in-process 5-step run's losses and weights, bit for bit.
TEST_F(MpiTrain, TrainsTheVisionLanguageModelToTheInProcessRunsBits) {
  std::string config = read_file(std::string(PIPEFLOW_SOURCE_DIR) + "/examples/train_vlm_2stage.json");
  const std::string steps = "\"steps\": 300,";
  ASSERT_NE(config.find(steps), std::string::npos);
  config.replace(config.find(steps), steps.size(), "\"steps\": 5, \"checkpoint\": {\"interval\": 3},");
  const std::string path = write_config(dir_ + "/vlm.json", config);
  const std::string under_mpi = dir_ + "/vlm-mpi", threads = dir_ + "/vlm-threads";
  const CommandResult result = run_mpirun(2, "train --config " + path + " --steps 3 --out-dir " + under_mpi);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("2 MPI processes (pipeline 2 x data parallel 1)"), std::string::npos) << result.err;
  EXPECT_TRUE(std::filesystem::exists(under_mpi + "/checkpoints/step_3/model.safetensors.index.json"));
  const CommandResult in_process = run_pipeflow("train --config " + path + " --out-dir " + threads);
  ASSERT_EQ(in_process.exit_code, 0) << in_process.err;
  const std::vector<double> straight = losses(threads);
  ASSERT_EQ(straight.size(), 5u);
  EXPECT_EQ(losses(under_mpi), std::vector<double>(straight.begin(), straight.begin() + 3));
  const CommandResult resumed = run_pipeflow("train --config " + path + " --resume " + under_mpi + " --out-dir " +
                                             under_mpi);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resuming after 3 steps from " + under_mpi + "/checkpoints/step_3"), std::string::npos)
      << resumed.err;
  EXPECT_EQ(losses(under_mpi), straight);
  EXPECT_EQ(read_file(under_mpi + "/weights.safetensors"), read_file(threads + "/weights.safetensors"));
}

TEST_F(MpiTrain, PrintsTheRankLayoutAndDerivesDataParallelFromTheProcessCount) {
  const std::string out = dir_ + "/layout";
  const std::string config = write_config(dir_ + "/layout.json", config_text(out, "1f1b", 2, 1));
  const CommandResult result = run_mpirun(4, "train --config " + config + " --steps 1");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (const char* line : {"4 MPI processes (pipeline 2 x data parallel 2)", "pipeline (data-parallel rank 0): world "
                           "ranks 0 2", "pipeline (data-parallel rank 1): world ranks 1 3",
                           "data-parallel group (pipeline rank 0): world ranks 0 1",
                           "data-parallel group (pipeline rank 1): world ranks 2 3"}) {
    EXPECT_NE(result.err.find(line), std::string::npos) << line << "\n" << result.err;
  }
  // Rank 0 alone prints: one header, one line per step.
  const std::string header = "pipeflow train: GPT-2";
  EXPECT_EQ(result.err.find(header), result.err.rfind(header)) << result.err;

  const CommandResult disagree = run_mpirun(4, "train --config " + config + " --steps 1 --data-parallel 1");
  EXPECT_NE(disagree.exit_code, 0);
  EXPECT_NE(disagree.err.find("tensor_parallel × pipeline.stages × data_parallel = 1 × 2 × 1 = 2 ranks, but 4 processes were started"),
            std::string::npos)
      << disagree.err;
  // Every process fails alike: rank 0 alone says so.
  EXPECT_NE(disagree.err.find("pipeflow: error in MPI process 0 of 4"), std::string::npos) << disagree.err;
  EXPECT_EQ(disagree.err.find("error in MPI process 1 of 4"), std::string::npos) << disagree.err;
  const CommandResult odd = run_mpirun(3, "train --config " + config + " --steps 1");
  EXPECT_NE(odd.exit_code, 0);
  EXPECT_NE(odd.err.find("3 processes were started, not a multiple of tensor_parallel × pipeline.stages = 2: start 2 (mpirun -np 2)"), std::string::npos)
      << odd.err;
}

// The tensor names of a sharded checkpoint's index, by shard file.
std::map<std::string, std::set<std::string>> shards_of(const std::string& folder) {
  const nlohmann::json index = nlohmann::json::parse(read_file(folder + "/model.safetensors.index.json"));
  std::map<std::string, std::set<std::string>> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards[file.get<std::string>()].insert(name);
  return shards;
}

// A checkpoint written by pp 2 × dp 2 with ZeRO-1 is a folder of one shard
// per pipeline rank and an index naming every tensor of the whole model
// once; pp 4 under MPI and one process resume from it and end where an
// uninterrupted run ends, and the same layout resumes bit for bit.
TEST_F(MpiTrain, ACheckpointOfTwoByTwoResumesUnderFourStagesAndInOneProcess) {
  const std::string zero = "\"zero_optimization\": {\"stage\": 1}, ";
  const std::string checkpointed = zero + "\"checkpoint\": {\"interval\": 1},";
  const std::string whole = train({"1f1b", 1, 1, 1}, "whole", "\"checkpoint\": {\"interval\": 2},", "--steps 4");
  const std::string straight =
      train({"1f1b", 2, 1, 2}, "straight", zero + "\"checkpoint\": {\"interval\": 1, \"keep\": 2},", "--steps 4");
  const std::string first = train({"1f1b", 2, 1, 2}, "first", checkpointed, "--steps 2");

  // checkpoint.keep = 2 prunes folders as it prunes files.
  std::set<std::string> kept;
  for (const auto& entry : std::filesystem::directory_iterator(straight + "/checkpoints")) {
    kept.insert(entry.path().filename().string());
  }
  EXPECT_EQ(kept, (std::set<std::string>{"step_3", "step_4"}));

  const std::string folder = first + "/checkpoints/step_2";
  const std::map<std::string, std::set<std::string>> shards = shards_of(folder);
  ASSERT_EQ(shards.size(), 2u);
  std::set<std::string> indexed;
  for (const auto& [file, names] : shards) {
    std::set<std::string> held;
    for (const std::string& name : nn::SafetensorsFile::read(folder + "/" + file).names()) held.insert(name);
    EXPECT_EQ(held, names) << file;
    indexed.insert(names.begin(), names.end());
  }
  std::set<std::string> every;
  for (const std::string& name : nn::SafetensorsFile::read(whole + "/checkpoints/step_4.safetensors").names()) {
    every.insert(name);
  }
  EXPECT_EQ(indexed, every);
  // the tied wte (and its moments) in the embedding's shard alone
  EXPECT_TRUE(shards.at("model-00001-of-00002.safetensors").contains("exp_avg_sq.wte.weight"));
  EXPECT_FALSE(shards.at("model-00002-of-00002.safetensors").contains("wte.weight"));

  const std::string same = train({"1f1b", 2, 1, 2}, "same", zero, "--steps 4 --resume " + first);
  const std::vector<double> straight_losses = losses(straight);
  EXPECT_EQ(losses(same), std::vector<double>(straight_losses.begin() + 2, straight_losses.end()));
  EXPECT_EQ(read_file(same + "/weights.safetensors"), read_file(straight + "/weights.safetensors"));

  const std::string pp4 = train({"1f1b", 4, 1, 1}, "pp4", "", "--steps 4 --resume " + folder);
  const std::string threads =
      train({"1f1b", 2, 1, 1}, "threads", "", "--steps 4 --resume " + folder + "/model.safetensors.index.json");
  // and one process's single file under MPI
  const std::string from_file =
      train({"1f1b", 2, 1, 2}, "from-file", zero, "--steps 4 --resume " + whole + "/checkpoints/step_2.safetensors");
  const std::vector<double> all = losses(whole);
  for (const std::string& run : {pp4, threads, from_file}) {
    const std::vector<double> tail = losses(run);
    ASSERT_EQ(tail.size(), 2u) << run;
    for (std::size_t i = 0; i < 2; ++i) EXPECT_NEAR(tail[i], all[i + 2], 1e-5 * all[i + 2]) << run << " step " << i;
    EXPECT_LT(weight_difference(run + "/weights.safetensors", whole + "/weights.safetensors"), 1e-5) << run;
  }
}

// Tensor parallelism under mpirun (Megatron-LM's order: the tensor-parallel
// rank fastest): GPT-2 and a Llama split over 2 ranks, with pipeline and
// data parallelism and ZeRO-1, train to the unpipelined run's losses and
// weights and to the same layout in threads, with and without sequence
// parallelism; a checkpoint written at tp 2 holds whole tensors and resumes
// at tp 1 in one process.
TEST_F(MpiTrain, TensorParallelLayoutsEqualTheUnpipelinedRunAndTheirCheckpointResumesAtTensorParallelOne) {
  const std::string llama = dir_ + "/config.json";
  write_file_atomic(llama, R"({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 256,
    "max_position_embeddings": 16, "tie_word_embeddings": false})");
  struct Case {
    std::string name;
    Layout layout;
    int tensor;
    std::string extra;
    std::string model;
  };
  const std::string zero = "\"zero_optimization\": {\"stage\": 1},";
  const std::string sequence = "\"sequence_parallel\": true,";
  const std::string gpt_unpipelined = train({"1f1b", 1, 1, 1}, "gpt-unpipelined", "", "--steps 4");
  // --emulate replays one pipeline: refused with tensor parallelism, before any step.
  const CommandResult emulated = run_pipeflow("train --config " + write_config(dir_ + "/emulated.json",
                                                                               config_text(dir_ + "/emulated", "1f1b",
                                                                                           2, 1)) +
                                              " --tp 2 --emulate");
  EXPECT_EQ(emulated.exit_code, 1);
  EXPECT_NE(emulated.err.find("--emulate replays one pipeline with one rank a stage: it cannot emulate "
                              "data_parallel 1 x tensor_parallel 2"),
            std::string::npos)
      << emulated.err;
  const std::string llama_unpipelined = train({"1f1b", 1, 1, 1}, "llama-unpipelined", "", "--steps 4 --model " + llama);
  for (const Case& c : {Case{"gpt-tp2-pp2", {"interleaved-1f1b", 2, 2, 1}, 2, "", ""},
                        Case{"gpt-tp2-pp2-dp2", {"1f1b", 2, 1, 2}, 2, zero, ""},
                        Case{"llama-tp2-pp2", {"zbv", 2, 2, 1}, 2, "", llama},
                        Case{"llama-tp2-dp2", {"1f1b", 1, 1, 2}, 2, zero, llama},
                        Case{"gpt-tp2-pp2-sp", {"1f1b", 2, 1, 1}, 2, sequence, ""},
                        Case{"gpt-tp2-pp2-dp2-tp-pp-dp", {"1f1b", 2, 1, 2}, 2, R"("rank_order": "tp-pp-dp",)", ""},
                        Case{"llama-tp2-dp2-sp", {"zbv", 1, 2, 2}, 2, zero + sequence, llama}}) {
    const std::string flags = fmt::format("--steps 4 --tp {}{}", c.tensor, c.model.empty() ? "" : " --model " + c.model);
    const std::string out = dir_ + "/" + c.name;
    const std::string config = write_config(
        out + ".json",
        config_text(out, c.layout.schedule, c.layout.stages, c.layout.chunks, c.extra + "\"checkpoint\": {\"interval\": 2},"));
    const int processes = c.layout.stages * c.layout.data_parallel * c.tensor;
    const CommandResult result = run_mpirun(processes, "train --config " + config + " " + flags);
    ASSERT_EQ(result.exit_code, 0) << c.name << "\n" << result.err;
    EXPECT_NE(read_file(out + "/report.md").find(fmt::format("{} MPI processes (pipeline {} x data parallel {} x tensor "
                                                             "parallel {}",
                                                             processes, c.layout.stages, c.layout.data_parallel,
                                                             c.tensor)),
              std::string::npos)
        << c.name;
    expect_same_run(out, c.model.empty() ? gpt_unpipelined : llama_unpipelined, c.name + " under MPI vs unpipelined");
    // Each layer's all-reduce is in the trace and measured in the report beside the simulator's price.
    EXPECT_NE(read_file(out + "/trace.json").find(R"("cat":"tensor_parallel")"), std::string::npos) << c.name;
    EXPECT_NE(read_file(out + "/report.md").find("## Tensor parallelism"), std::string::npos) << c.name;
    // The same layout as threads of one process (under a sanitizer for the
    // first layout alone: runtime.TensorParallelInThreads runs them there).
    if (!kSanitized || c.name == "gpt-tp2-pp2") {
      const std::string threads = dir_ + "/" + c.name + "-threads";
      const std::string threads_config = write_config(
          threads + ".json", config_text(threads, c.layout.schedule, c.layout.stages, c.layout.chunks, c.extra));
      const CommandResult in_threads = run_pipeflow("train --config " + threads_config + " " + flags +
                                                    " --data-parallel " + std::to_string(c.layout.data_parallel));
      ASSERT_EQ(in_threads.exit_code, 0) << c.name << "\n" << in_threads.err;
      expect_same_run(threads, out, c.name + " in threads vs under MPI");
      EXPECT_NE(in_threads.err.find("tensor-parallel group (pipeline rank 0, data-parallel rank 0): world ranks 0 1"),
                std::string::npos)
          << in_threads.err;
      EXPECT_NE(read_file(threads + "/timeline.svg").find("tensor-parallel all-reduce"), std::string::npos) << c.name;
    }
    // Whole tensors in the checkpoint: it resumes at tp 1 in one process.
    const std::string resumed = dir_ + "/" + c.name + "-resumed";
    const std::string resumed_config =
        write_config(resumed + ".json", config_text(resumed, "1f1b", 1, 1, c.extra));
    const CommandResult one = run_pipeflow("train --config " + resumed_config + " --steps 4 --resume " + out +
                                           "/checkpoints/step_2" + (c.model.empty() ? "" : " --model " + c.model));
    ASSERT_EQ(one.exit_code, 0) << c.name << "\n" << one.err;
    const std::vector<double> all = losses(out);
    const std::vector<double> tail = losses(resumed);
    ASSERT_EQ(tail.size(), 2u) << c.name;
    for (std::size_t i = 0; i < 2; ++i) EXPECT_NEAR(tail[i], all[i + 2], 1e-5 * all[i + 2]) << c.name << " step " << i;
  }
}

// Every layout of tensor parallelism under mpirun for the GPT-2 of 2 heads
// (t = 2 with p = 1, 2, 4 and d = 1, 2 up to 8 processes, 1F1B, with and
// without sequence parallelism, ZeRO-1 where d = 2) and one of 4 heads at
// t = 4: the unpipelined run's losses over 5 steps and its weights.
TEST_F(MpiTrain, EveryTensorParallelLayoutUnderMpirunEqualsTheUnpipelinedRun) {
  const std::string zero = "\"zero_optimization\": {\"stage\": 1},";
  const std::string gpt4 = dir_ + "/gpt4.json";
  write_file_atomic(gpt4, R"({"model_type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 32, "n_positions": 16,
    "vocab_size": 256, "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0})");
  const std::string two_heads = train({"1f1b", 1, 1, 1}, "unpipelined", "", "--steps 5");
  const std::string four_heads = train({"1f1b", 1, 1, 1}, "unpipelined-4", "", "--steps 5 --model " + gpt4);
  struct Case {
    int t, p, d;
    std::string model;
  };
  const std::vector<Case> cases = {Case{2, 1, 1, ""}, Case{2, 1, 2, ""}, Case{2, 2, 1, ""}, Case{2, 2, 2, ""},
                                   Case{2, 4, 1, ""}, Case{4, 2, 1, gpt4}, Case{4, 1, 2, gpt4}};
  for (const Case& c : cases) {
    for (const bool sequence : {false, true}) {
      // Under a sanitizer each layout once, with and without sequence parallelism by turns.
      if (kSanitized && sequence != ((&c - cases.data()) % 2 == 1)) continue;
      const std::string name = fmt::format("tp{}-pp{}-dp{}{}", c.t, c.p, c.d, sequence ? "-sp" : "");
      const std::string extra = (c.d > 1 ? zero : "") + (sequence ? "\"sequence_parallel\": true," : "");
      const std::string out = dir_ + "/" + name;
      const std::string config = write_config(out + ".json", config_text(out, "1f1b", c.p, 1, extra));
      const CommandResult result =
          run_mpirun(c.t * c.p * c.d, "train --config " + config + fmt::format(" --steps 5 --tp {}", c.t) +
                                          (c.model.empty() ? "" : " --model " + c.model));
      ASSERT_EQ(result.exit_code, 0) << name << "\n" << result.err;
      expect_same_run(out, c.model.empty() ? two_heads : four_heads, name);
    }
  }
}

// A sharded checkpoint without its index (a writer stopped before it), or
// with a shard whose bytes changed, is passed over for the one before it,
// with a warning naming the folder, or the shard file and the tensor (a
// CRC32 that does not match, a NaN under a valid CRC32).
TEST_F(MpiTrain, AnIncompleteOrCorruptShardedCheckpointFallsBackToTheOneBefore) {
  const std::string first = train({"1f1b", 2, 1, 2}, "first", "\"checkpoint\": {\"interval\": 1},", "--steps 2");
  const std::string incomplete = dir_ + "/incomplete";
  const std::string corrupt = dir_ + "/corrupt";
  const std::string nonfinite = dir_ + "/nonfinite";
  for (const std::string& copy : {incomplete, corrupt, nonfinite}) {
    std::filesystem::copy(first + "/checkpoints", copy, std::filesystem::copy_options::recursive);
  }
  std::filesystem::remove(incomplete + "/step_2/model.safetensors.index.json");
  const std::string shard = corrupt + "/step_2/model-00002-of-00002.safetensors";
  const std::vector<std::string> names = nn::SafetensorsFile::read(shard).names();
  std::string bytes = read_file(shard);
  bytes.back() = static_cast<char>(bytes.back() ^ 1);  // in the last tensor
  write_file_atomic(shard, bytes);
  // a NaN under a valid CRC32
  const std::string nan_shard = nonfinite + "/step_2/model-00002-of-00002.safetensors";
  const nn::SafetensorsFile intact = nn::SafetensorsFile::read(nan_shard);
  nn::SafetensorsWriter with_nan;
  for (const auto& [key, value] : intact.metadata()) with_nan.set_metadata(key, value);
  for (const std::string& name : intact.names()) {
    Tensor values = intact.floats(name);
    if (name == names.front()) values.data()[0] = std::nanf("");
    with_nan.add(name, values.span(), values.shape());
  }
  with_nan.write(nan_shard);

  const std::string config = write_config(dir_ + "/resumed.json", config_text(dir_ + "/resumed", "1f1b", 2, 1));
  // and a shard's temporary that a killed writer left in a checkpoint folder goes at the next start
  const pid_t writer = ::fork();
  if (writer == 0) ::_exit(0);
  ::waitpid(writer, nullptr, 0);
  std::filesystem::create_directories(dir_ + "/resumed/checkpoints/step_1");
  const std::string left =
      dir_ + "/resumed/checkpoints/step_1/model-00001-of-00002.safetensors.pipeflow-tmp." + std::to_string(writer);
  write_file_atomic(left, "x");
  struct Refused {
    std::string checkpoints;
    std::string warning;  // after "warning: not resuming from DIR/step_2: "
  };
  for (const Refused& bad :
       {Refused{incomplete, incomplete + "/step_2: no model.safetensors.index.json: the checkpoint is incomplete"},
        Refused{corrupt, shard + ": tensor " + names.back() + ": CRC32"},
        Refused{nonfinite, nan_shard + ": tensor " + names.front() + " holds nan at index 0: values must be finite"}}) {
    const CommandResult resumed = run_pipeflow("train --config " + config + " --steps 3 --resume " + bad.checkpoints);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_NE(resumed.err.find("warning: not resuming from " + bad.checkpoints + "/step_2: " + bad.warning),
              std::string::npos)
        << resumed.err;
    EXPECT_NE(resumed.err.find("resuming after 1 step from " + bad.checkpoints + "/step_1"), std::string::npos)
        << resumed.err;
    if (bad.checkpoints == incomplete) {
      EXPECT_NE(resumed.err.find("removed " + left), std::string::npos) << resumed.err;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(left));
}

// A rank that throws while its peer waits on it: world rank 1 cannot write
// its shard of step 2's checkpoint (a directory stands at the path), and
// rank 0 waits for the shards' names. The job ends at once, naming process 1
// and what it could not do; step 2 gets no index, so a resume falls back to
// step 1 and continues the run the failure cut short.
TEST_F(MpiTrain, ARankThatThrowsEndsTheJobNamingItAndTheLastGoodCheckpointResumes) {
  const std::string straight = train({"1f1b", 2, 1, 1}, "straight", "", "--steps 3");
  const std::string out = dir_ + "/failing";
  const std::string blocked = out + "/checkpoints/step_2/model-00002-of-00002.safetensors";
  std::filesystem::create_directories(blocked);
  write_file_atomic(blocked + "/in_the_way", "x");
  const std::string config =
      write_config(out + ".json", config_text(out, "1f1b", 2, 1, "\"checkpoint\": {\"interval\": 1},"));
  const auto start = std::chrono::steady_clock::now();
  const CommandResult failed = run_mpirun(2, "train --config " + config);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(failed.exit_code, 0);
  EXPECT_LT(seconds, 60) << failed.err;
  EXPECT_NE(failed.err.find("pipeflow: error in MPI process 1 of 2"), std::string::npos) << failed.err;
  EXPECT_NE(failed.err.find("cannot write " + blocked + ": Is a directory"), std::string::npos) << failed.err;
  EXPECT_FALSE(std::filesystem::exists(out + "/checkpoints/step_2/model.safetensors.index.json"));

  std::filesystem::remove_all(blocked);
  const CommandResult resumed = run_mpirun(2, "train --config " + config + " --resume " + out);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resuming after 1 step from " + out + "/checkpoints/step_1"), std::string::npos)
      << resumed.err;
  EXPECT_EQ(losses(out), losses(straight));
}

struct FailedJob {
  int exit_code = -1;
  std::string err;
  double seconds = 0;  // from the fault until mpirun returned
  std::vector<pid_t> ranks;
};

// Starts a long 2-process run, waits for its first step, does `fault` to
// world rank 1, and waits (at most 120 s) for mpirun to end.
// `stages` 1 with flags "--tp 2": the two processes split one stage.
template <typename Fault>
FailedJob fail_rank_one(const std::string& dir, Fault fault, const std::string& flags, int stages = 2) {
  const std::string out = dir + "/faulty";
  const std::string config = write_config(dir + "/faulty.json", config_text(out, "1f1b", stages, 1));
  const std::string err_path = dir + "/err";
  const std::string command = "exec " + mpirun_command(2) + " " + PIPEFLOW_BINARY + " train --config " + config +
                              " --steps 100000 " + flags + " >/dev/null 2>" + err_path;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  FailedJob job;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline &&
         read_file_if_exists(err_path).find("step 1/100000 ") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // in the middle of later steps
  job.ranks = ranks_of_job(config, 2);
  const auto start = std::chrono::steady_clock::now();
  if (job.ranks[1] != 0) fault(job.ranks[1]);
  int status = 0;
  for (;;) {
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    if (std::chrono::steady_clock::now() > start + std::chrono::seconds(120)) {
      ::kill(pid, SIGKILL);  // a hang fails the test, and does not outlive it
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  job.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  job.err = read_file(err_path);
  return job;
}

TEST(MpiTrainFaults, ARankKilledEndsTheJobNamingIt) {
  const std::string dir = make_temp_dir();
  const FailedJob job = fail_rank_one(dir, [](pid_t rank) { ::kill(rank, SIGKILL); }, "");
  ASSERT_NE(job.ranks[1], 0) << "the job never reached step 1:\n" << job.err;
  EXPECT_NE(job.exit_code, 0);
  EXPECT_LT(job.seconds, 30) << job.err;
  EXPECT_NE(job.err.find("rank 1"), std::string::npos) << job.err;
  EXPECT_NE(job.err.find("signal 9"), std::string::npos) << job.err;
  EXPECT_TRUE(ends_within_10_s(job.ranks[0])) << "rank 0 outlived the job";
}

// A rank that stops answering (SIGSTOP): its peer times out after --timeout,
// says where it waited and for what, and ends the job.
TEST(MpiTrainFaults, ARankThatHangsMakesItsPeerTimeOutAndEndTheJob) {
  const std::string dir = make_temp_dir();
  const FailedJob job = fail_rank_one(dir, [](pid_t rank) { ::kill(rank, SIGSTOP); }, "--timeout 3");
  ASSERT_NE(job.ranks[1], 0) << "the job never reached step 1:\n" << job.err;
  EXPECT_NE(job.exit_code, 0);
  EXPECT_LT(job.seconds, 60) << job.err;
  EXPECT_NE(job.err.find("pipeflow: error in MPI process 0 of 2"), std::string::npos) << job.err;
  EXPECT_NE(job.err.find("timed out after 3"), std::string::npos) << job.err;
  // What it waited for: the message from rank 1 ("waited for the ... rank 1
  // -> rank 0"), or (stopped between the pipeline's actions) a collective:
  // "waiting for the micro-batch losses of every replica", ...
  EXPECT_TRUE(job.err.find("waited for ") != std::string::npos ||
              job.err.find("waiting for ") != std::string::npos)
      << job.err;
  for (const pid_t rank : job.ranks) {
    const bool ended = ends_within_10_s(rank);
    if (!ended) ::kill(rank, SIGKILL);  // does not outlive the test either
    EXPECT_TRUE(ended) << "process " << rank << " outlived the job";
  }
}

// A tensor-parallel peer that stops answering: the other rank waits in a
// collective of the layers (nearly every collective of a step is one), times
// out after --timeout naming it, and ends the job.
TEST(MpiTrainFaults, ATensorParallelPeerThatHangsEndsTheJobNamingTheCollective) {
  const std::string dir = make_temp_dir();
  const FailedJob job = fail_rank_one(dir, [](pid_t rank) { ::kill(rank, SIGSTOP); }, "--timeout 3 --tp 2", 1);
  ASSERT_NE(job.ranks[1], 0) << "the job never reached step 1:\n" << job.err;
  EXPECT_NE(job.exit_code, 0);
  EXPECT_LT(job.seconds, 60) << job.err;
  EXPECT_NE(job.err.find("pipeflow: error in MPI process 0 of 2"), std::string::npos) << job.err;
  EXPECT_NE(job.err.find("timed out after 3 s waiting for "), std::string::npos) << job.err;
  // A layer's all-reduce, or (stopped in the flush or between steps) the
  // gradient norm's, the losses' or the stop request's gather.
  EXPECT_TRUE(job.err.find("tensor-parallel") != std::string::npos ||
              job.err.find("the micro-batch losses of every replica") != std::string::npos ||
              job.err.find("every process's stop request") != std::string::npos)
      << job.err;
  for (const pid_t rank : job.ranks) {
    const bool ended = ends_within_10_s(rank);
    if (!ended) ::kill(rank, SIGKILL);
    EXPECT_TRUE(ended) << "process " << rank << " outlived the job";
  }
}

// SIGTERM to mpirun reaches every process: all stop after the same step,
// one checkpoint is written, rank 0 alone says so, no process is left.
TEST(MpiTrainFaults, SigtermToMpirunStopsEveryProcessAfterOneCheckpoint) {
  const std::string dir = make_temp_dir();
  const std::string out = dir + "/stopped";
  const std::string config = write_config(dir + "/stopped.json", config_text(out, "1f1b", 2, 1));
  const std::string err_path = dir + "/err";
  const std::string command = "exec " + mpirun_command(2) + " " + PIPEFLOW_BINARY + " train --config " + config +
                              " --steps 100000 >/dev/null 2>" + err_path;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline &&
         read_file_if_exists(err_path).find("step 1/100000 ") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::vector<pid_t> ranks = ranks_of_job(config, 2);
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string err = read_file(err_path);
  ASSERT_TRUE(ranks[0] != 0 && ranks[1] != 0) << "the job never reached step 1:\n" << err;
  EXPECT_NE(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0) << err;
  const std::string stopped = "pipeflow: stopped by signal 15: resume with --resume " + out + "/checkpoints";
  ASSERT_NE(err.find(stopped), std::string::npos) << err;
  EXPECT_EQ(err.find(stopped), err.rfind(stopped)) << err;
  std::vector<std::filesystem::path> checkpoints;
  for (const auto& entry : std::filesystem::directory_iterator(out + "/checkpoints")) checkpoints.push_back(entry);
  ASSERT_EQ(checkpoints.size(), 1u);
  const nn::SafetensorsFile checkpoint =
      nn::SafetensorsFile::read(checkpoints.front() / "model-00001-of-00002.safetensors");
  EXPECT_EQ(checkpoints.front().filename().string(),
            "step_" + std::to_string(checkpoint.metadata_count("steps_done")));
  EXPECT_TRUE(std::filesystem::exists(checkpoints.front() / "model.safetensors.index.json"));
  for (const pid_t rank : ranks) EXPECT_TRUE(ends_within_10_s(rank)) << "process " << rank << " outlived the job";
}

}  // namespace
}  // namespace pipeflow::testing
