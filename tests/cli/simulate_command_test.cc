#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "../trace/xml_check.h"
#include "pipeflow/core/file.h"
#include "pipeflow/trace/chrome_trace.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

const std::string kExample =
    "simulate --model gpt3-175b --hardware a100-80g --devices 1536 --tp 8 --pp 8 --dp 24 --micro-batch 1 "
    "--global-batch 1536 --seq 2048 --schedule interleaved-1f1b --virtual 3 --recompute selective --bf16";

std::string source_path(const std::string& relative) { return std::string(PIPEFLOW_SOURCE_DIR) + "/" + relative; }

TEST(SimulateCommand, TheIssuesExamplePrintsTablesAndWarnsAboutTheRanksPastTheDevice) {
  const CommandResult r = run_pipeflow(kExample);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("gpt3-175b on 1536 × a100-80g in bf16: tp 8 × pp 8 × dp 24, interleaved-1f1b (v=3), 64 "
                        "micro-batches of 1 × 2048 tokens per replica, recompute selective, overlapped communication\n",
                        0),
            0u)
      << r.out;
  EXPECT_NE(r.out.find("step time  bubble  pipeline bubble  ZB bubble rate  steady step  steady bubble  tokens/s"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("steady: steps back to back"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank   stages    busy    comm  optimizer    idle  bubble  peak memory  model states  "
                       "activations"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("   0   0,8,16  "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("partition (parameters):\n"), std::string::npos);
  EXPECT_NE(r.out.find("   23     7  block.92..head"), std::string::npos) << r.out;
  // 18 B a parameter of model states (bf16 without ZeRO accumulates its
  // gradients in fp32): rank 0, holding the most micro-batches, and rank 1
  // pass the device; no other rank does.
  EXPECT_EQ(r.err.rfind("warning: rank 0 needs 85.5 GiB at its peak", 0), 0u) << r.err;
  const std::size_t second = r.err.find("warning: ", 1);
  EXPECT_EQ(r.err.find("warning: rank 1 needs 81.0 GiB at its peak", 1), second) << r.err;
  EXPECT_EQ(r.err.find("warning: ", second + 1), std::string::npos) << r.err;
}

TEST(SimulateCommand, JsonHasTheKeysAndEveryRanksTimeAddsUpToTheStep) {
  const CommandResult r = run_pipeflow(kExample + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  for (const char* key : {"step_time_s", "bubble_ratio", "pipeline_time_s", "pipeline_bubble_ratio",
                          "zero_bubble_rate", "steady_step_time_s", "steady_bubble_ratio", "steady_state_converged", "tokens_per_s", "mfu",
                          "tflops_per_device", "ranks"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  const double step = json["step_time_s"];
  EXPECT_NEAR(json["tokens_per_s"].get<double>(), 1536.0 * 2048 / step, 1e-6);
  ASSERT_EQ(json["ranks"].size(), 8u);
  for (const auto& rank : json["ranks"]) {
    for (const char* key : {"busy_s", "idle_s", "comm_s", "peak_memory_bytes", "model_states_bytes",
                            "activation_bytes"}) {
      EXPECT_TRUE(rank.contains(key)) << key;
    }
    EXPECT_NEAR(rank["busy_s"].get<double>() + rank["comm_s"].get<double>() + rank["optimizer_s"].get<double>() +
                    rank["idle_s"].get<double>(),
                step, 1e-9);
    EXPECT_DOUBLE_EQ(rank["peak_memory_bytes"].get<double>(),
                     rank["model_states_bytes"].get<double>() + rank["activation_bytes"].get<double>() +
                         rank["comm_buffer_bytes"].get<double>());
  }
  EXPECT_EQ(json["stages"].size(), 24u);
  EXPECT_EQ(json["layout"]["microbatches"], 64);
  EXPECT_EQ(json["warnings"].size(), 2u);
}

// Steps back to back: ZB-H2's ramp-down overlaps the next step's ramp-up
// (gpt3-175b, tp 8 × pp 8, 16 micro-batches: its bubble falls from 16.0% to
// 11.9%; 15.8% to 7.5% before the cost model priced the head's cross entropy
// and the other memory-bound kernels, which make the last stage the
// heaviest and bound the period); 1F1B's rank 0 spans its whole step, so it
// gains nothing (up to rounding).
TEST(SimulateCommand, SteadyStateIsShorterOnlyForZeroBubbleSchedules) {
  const std::string layout =
      "simulate --json --model gpt3-175b --hardware a100-80g --tp 8 --pp 8 --devices 64 --global-batch 16 "
      "--micro-batch 1 --seq 2048 --recompute selective --bf16 --schedule ";
  const CommandResult zb = run_pipeflow(layout + "zb-h2");
  ASSERT_EQ(zb.exit_code, 0) << zb.err;
  const nlohmann::json h2 = nlohmann::json::parse(zb.out);
  EXPECT_TRUE(h2["steady_state_converged"].get<bool>());
  EXPECT_LT(h2["steady_step_time_s"].get<double>(), h2["step_time_s"].get<double>() * 0.96);
  EXPECT_LT(h2["steady_bubble_ratio"].get<double>(), h2["bubble_ratio"].get<double>() * 0.8);
  EXPECT_GE(h2["steady_bubble_ratio"].get<double>(), 0);
  // The figures docs/SIMULATOR.md quotes for this layout.
  EXPECT_NEAR(h2["bubble_ratio"].get<double>(), 0.160, 5e-4);
  EXPECT_NEAR(h2["steady_bubble_ratio"].get<double>(), 0.119, 5e-4);
  const CommandResult one = run_pipeflow(layout + "1f1b");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const nlohmann::json f1b = nlohmann::json::parse(one.out);
  EXPECT_NEAR(f1b["steady_step_time_s"].get<double>(), f1b["step_time_s"].get<double>(), 1e-9);
  EXPECT_NEAR(f1b["steady_bubble_ratio"].get<double>(), f1b["bubble_ratio"].get<double>(), 1e-9);
  EXPECT_NEAR(f1b["bubble_ratio"].get<double>(), 0.321, 5e-4);
}

// --sequence-parallel is checked as the key sequence_parallel: off with a
// warning at --tp 1, an error for a sequence the tensor-parallel ranks
// cannot split.
TEST(SimulateCommand, SequenceParallelWarnsAtTp1AndNeedsTheSequenceDivisibleByTp) {
  const std::string base = "simulate --json --model gpt2-124m --global-batch 4 --sequence-parallel";
  const CommandResult one = run_pipeflow(base);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(one.err.rfind("warning: the command line: sequence_parallel = true with tensor_parallel = 1: ", 0), 0u)
      << one.err;
  EXPECT_FALSE(nlohmann::json::parse(one.out)["layout"]["sequence_parallel"].get<bool>());
  const CommandResult four = run_pipeflow(base + " --tp 4 --devices 4 --seq 1000");
  ASSERT_EQ(four.exit_code, 0) << four.err;
  EXPECT_EQ(four.err, "");
  EXPECT_TRUE(nlohmann::json::parse(four.out)["layout"]["sequence_parallel"].get<bool>());
  const CommandResult odd = run_pipeflow(base + " --tp 8 --devices 8 --seq 1001");
  EXPECT_EQ(odd.exit_code, 1);
  EXPECT_EQ(odd.err,
            "pipeflow: error: the command line: sequence_parallel = true: seq_length 1001 is not a multiple of "
            "tensor_parallel 8: Megatron's sequence parallelism splits the sequence over the tensor-parallel ranks: "
            "use seq_length 1000 or 1008, another tensor_parallel, or drop sequence_parallel\n");
}

TEST(SimulateCommand, ConfigFileFromExamplesRunsAndFlagsOverrideIt) {
  const std::string config = source_path("examples/simulate/gpt3-175b-megatron.json");
  const CommandResult r = run_pipeflow("simulate --json --config " + config);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["layout"]["sequence_parallel"], true);
  EXPECT_EQ(json["layout"]["zero_stage"], 1);
  EXPECT_EQ(json["layout"]["partition"], "balanced");
  EXPECT_TRUE(json["warnings"].empty());

  const CommandResult more = run_pipeflow("simulate --json --pp 16 --global-batch 3072 --config " + config);
  ASSERT_EQ(more.exit_code, 0) << more.err;
  const nlohmann::json again = nlohmann::json::parse(more.out);
  EXPECT_EQ(again["layout"]["pipeline_parallel"], 16);
  EXPECT_EQ(again["layout"]["devices"], 8 * 16 * 24);
  EXPECT_EQ(again["layout"]["microbatches"], 128);
  EXPECT_EQ(again["ranks"].size(), 16u);

  for (const char* name : {"examples/simulate/llama3-8b-zbv-h100.json", "examples/simulate/gpt-tiny-1f1b-cpu.json"}) {
    const CommandResult example = run_pipeflow(std::string("simulate --config ") + source_path(name));
    EXPECT_EQ(example.exit_code, 0) << name << ": " << example.err;
  }
}

TEST(SimulateCommand, TraceIsChromeTraceJsonAndSvgIsWellFormed) {
  const std::string dir = make_temp_dir();
  const CommandResult r = run_pipeflow("simulate --config " + source_path("examples/simulate/gpt-tiny-1f1b-cpu.json") +
                                       " --trace " + dir + "/t.json --svg " + dir + "/t.svg");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string trace = read_file(dir + "/t.json");
  const nlohmann::json json = nlohmann::json::parse(trace);
  ASSERT_TRUE(json.contains("traceEvents"));
  const Timeline timeline = read_chrome_trace(trace, "t.json");
  EXPECT_EQ(timeline.num_ranks, 2);
  // 2 stages × 8 micro-batches × (F + B), and one optimizer step per rank.
  int compute = 0;
  int optimizer = 0;
  for (const TraceEvent& e : timeline.events) {
    compute += is_compute(e.category) ? 1 : 0;
    optimizer += e.category == EventCategory::kOptimizer ? 1 : 0;
  }
  EXPECT_EQ(compute, 32);
  EXPECT_EQ(optimizer, 2);
  const std::string svg = read_file(dir + "/t.svg");
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("gpt-4x128 1f1b: 2 ranks, 8 micro-batches, simulated"), std::string::npos);
}

TEST(SimulateCommand, ModelAndHardwareMayBeFilesAndAProfileReplacesTheCostModel) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/profile.json", R"({"pipeflow_profile": 1, "stages": [
      {"forward_s": 0.01, "backward_s": 0.02, "output_bytes": 1000},
      {"forward_s": 0.02, "backward_s": 0.04, "output_bytes": 0}],
      "link": {"latency_s": 1e-6, "bandwidth_bytes_per_s": 1e9}})");
  const CommandResult r = run_pipeflow("simulate --json --model " + source_path("tests/data/hf/gpt2/config.json") +
                                       " --hardware " + source_path("examples/hardware/cpu.json") +
                                       " --pp 2 --global-batch 4 --micro-batch 1 --seq 128 --profile " + dir + "/profile.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  EXPECT_NEAR(json["pipeline_time_s"].get<double>(), 0.01 + 2e-6 + 4 * 0.06 + 2e-6 + 0.02, 1e-12);
  EXPECT_DOUBLE_EQ(json["stages"][1]["forward_s"].get<double>(), 0.02);
  // A measured profile's durations hold the run's host time already: no overhead on top.
  const CommandResult overhead = run_pipeflow("simulate --model " + source_path("tests/data/hf/gpt2/config.json") +
                                              " --hardware " + source_path("examples/hardware/cpu.json") +
                                              " --pp 2 --global-batch 4 --micro-batch 1 --seq 128 --profile " + dir +
                                              "/profile.json --block-launch-overhead 0.004");
  EXPECT_EQ(overhead.exit_code, 1);
  EXPECT_EQ(overhead.err,
            "pipeflow: error: block_launch_overhead_s (--block-launch-overhead) = 0.004: --profile's measured "
            "durations already hold the run's host time; leave the overhead out with --profile\n");
}

TEST(SimulateCommand, BrokenLayoutsFailWithOneLineNamingTheFix) {
  const CommandResult devices = run_pipeflow("simulate --model gpt2-124m --devices 6 --pp 2 --global-batch 4");
  EXPECT_EQ(devices.exit_code, 1);
  EXPECT_EQ(devices.err,
            "pipeflow: error: the command line: devices = 6: tensor_parallel × pipeline stages × data_parallel = 1 × "
            "2 × 1 = 2 devices, not 6: use data_parallel 3 or devices 2\n");
  // DeepSpeed's rule: a global batch alone means one micro-batch of B / dp.
  const CommandResult batch = run_pipeflow("simulate --model gpt2-124m --pp 4 --global-batch 8");
  EXPECT_EQ(batch.exit_code, 1);
  EXPECT_EQ(batch.err,
            "pipeflow: error: the command line: pipeline.schedule = \"1f1b\" (stages = 4, micro-batches per step = "
            "1, virtual_stages = 1): 1f1b needs microbatches >= stages (got 1 < 4): raise "
            "gradient_accumulation_steps or use gpipe\n");
  const CommandResult fixed = run_pipeflow("simulate --model gpt2-124m --pp 4 --global-batch 8 --micro-batch 2");
  EXPECT_EQ(fixed.exit_code, 0) << fixed.err;
  const CommandResult model = run_pipeflow("simulate --hardware h100");
  EXPECT_EQ(model.exit_code, 1);
  EXPECT_EQ(model.err.rfind("pipeflow: error: the command line: no model:", 0), 0u) << model.err;
}

TEST(SimulateCommand, InferencePrintsLatencyThroughputAndMemoryPerStage) {
  const std::string command = "simulate --inference --model llama3-70b --hardware h100 --stages 4 --context 32768 "
                              "--sequences 8";
  const CommandResult text = run_pipeflow(command);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out.rfind("llama3-70b on 4 × h100 (80.0 GiB per device), bf16: 8 sequences of 32768-token "
                           "context, prompts of 32768 tokens, 4 micro-batches of at most 2 sequences\n",
                           0),
            0u)
      << text.out;
  EXPECT_NE(text.out.find("stage  layers"), std::string::npos) << text.out;
  const CommandResult json = run_pipeflow(command + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["stages"].size(), 4u);
  EXPECT_EQ(j["group_sizes"], nlohmann::json::array({2, 2, 2, 2}));
  double kv = 0;
  for (const auto& stage : j["stages"]) kv += stage["kv_cache_bytes"].get<double>();
  EXPECT_EQ(kv, 80.0 * 1024 * 1024 * 1024);  // 320 KiB per token × 32768 tokens × 8 sequences
  EXPECT_NEAR(j["tokens_per_s"].get<double>(), 8 / j["per_token_s"].get<double>(), 1e-9);
  EXPECT_GT(j["time_to_first_token_s"].get<double>(), 0);

  const CommandResult traced = run_pipeflow(command + " --trace t.json");
  EXPECT_NE(traced.exit_code, 0);
  EXPECT_NE(traced.err.find("--profile, --trace and --svg describe a training step"), std::string::npos) << traced.err;
  const CommandResult no_model = run_pipeflow("simulate --inference --stages 2");
  EXPECT_NE(no_model.exit_code, 0);
  EXPECT_NE(no_model.err.find("--inference needs a model: give --model"), std::string::npos) << no_model.err;
}

}  // namespace
}  // namespace pipeflow::testing
