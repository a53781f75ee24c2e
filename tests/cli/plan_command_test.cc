#include <gtest/gtest.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipeflow/core/file.h"
#include "pipeflow/core/units.h"
#include "pipeflow/model/hardware.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

const std::string kSmall = "plan --model gpt3-1.3b --hardware a100-80g --devices 8 --global-batch 32 --seq 2048";

TEST(PlanCommand, ListsTheTopLayoutsAndTheRejections) {
  const CommandResult r = run_pipeflow(kSmall + " --top 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("gpt3-1.3b on 8 × a100-80g, global batch 32 × 2048 tokens: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("#  layout"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n3  tp "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\n4  tp "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memory limit: 0.8 × 80.0 GiB = 64.0 GiB per device\nrejected: "), std::string::npos) << r.out;
}

// At one stage the five schedules that run F then B used to be five identical
// rows: the layout is listed once, under the first schedule's name.
TEST(PlanCommand, OneStageListsALayoutOnceWhateverTheSchedule) {
  const CommandResult r = run_pipeflow("plan --model gpt2-124m --devices 1 --global-batch 8 --seq 1024");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> rows;  // every row of that layout, whatever its schedule
  for (std::size_t at = r.out.find("b 8 (m 1), "); at != std::string::npos; at = r.out.find("b 8 (m 1), ", at + 1)) {
    const std::string row = r.out.substr(at, r.out.find('\n', at) - at);
    if (row.find(", recompute none, zero 0, parameters ") != std::string::npos) rows.push_back(row);
  }
  ASSERT_EQ(rows.size(), 1u) << r.out;
  EXPECT_EQ(rows[0].rfind("b 8 (m 1), gpipe, ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" same as an earlier schedule at one stage\n"), std::string::npos) << r.out;
}

// The JSON's best layout, written as a pipeflow configuration, simulates to
// the same step time.
TEST(PlanCommand, JsonBestFirstAndTheWrittenConfigSimulatesToTheSameStep) {
  const std::string dir = make_temp_dir();
  const CommandResult r = run_pipeflow(kSmall + " --json --write-config plan.json --deepspeed ds.json --megatron "
                                                "megatron.txt",
                                       dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  ASSERT_FALSE(json["candidates"].empty());
  for (const char* key : {"layout", "step_time_s", "tokens_per_s", "mfu", "tflops_per_device", "bubble_ratio",
                          "zero_bubble_rate", "stage_peak_memory_bytes"}) {
    EXPECT_TRUE(json["candidates"][0].contains(key)) << key;
  }
  for (const char* reason : {"indivisible batch", "schedule constraint", "out of memory"}) {
    EXPECT_TRUE(json["rejected"].contains(reason)) << reason;
  }
  double previous = 0;
  for (const auto& c : json["candidates"]) {
    EXPECT_GE(c["step_time_s"].get<double>(), previous);
    previous = c["step_time_s"].get<double>();
  }
  const CommandResult simulated = run_pipeflow("simulate --config plan.json --json", dir);
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(simulated.out)["step_time_s"].get<double>(),
                   json["candidates"][0]["step_time_s"].get<double>());
  const nlohmann::json deepspeed = nlohmann::json::parse(read_file(dir + "/ds.json"));
  EXPECT_EQ(deepspeed["train_batch_size"], 32);
  EXPECT_NE(read_file(dir + "/megatron.txt").find("--global-batch-size 32"), std::string::npos);
}

// --block-launch-overhead (the run key block_launch_overhead_s) prices every
// layout: each best step grows, the written configuration keeps the key and
// simulates to the same step; a measured run or --inference refuses it.
TEST(PlanCommand, AHostOverheadPerBlockPassPricesEveryLayoutAndIsWritten) {
  const std::string dir = make_temp_dir();
  const CommandResult plain = run_pipeflow(kSmall + " --json");
  const CommandResult r = run_pipeflow(kSmall + " --json --block-launch-overhead 0.004 --write-config plan.json", dir);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const double best = nlohmann::json::parse(r.out)["candidates"][0]["step_time_s"].get<double>();
  EXPECT_GT(best, nlohmann::json::parse(plain.out)["candidates"][0]["step_time_s"].get<double>());
  EXPECT_EQ(nlohmann::json::parse(read_file(dir + "/plan.json"))["block_launch_overhead_s"], 0.004);
  const CommandResult simulated = run_pipeflow("simulate --config plan.json --json", dir);
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(simulated.out)["step_time_s"].get<double>(), best);
  const CommandResult inference = run_pipeflow(
      "plan --model gpt2-124m --devices 2 --inference --block-launch-overhead 0.004");
  EXPECT_NE(inference.exit_code, 0);
  EXPECT_NE(inference.err.find("--block-launch-overhead 0.004: the host time of a training step's block passes, "
                               "which --inference does not price"),
            std::string::npos)
      << inference.err;
}

// A measured run (gpt-tiny on 2 cpu devices, 1F1B) whose trace shows every
// backward three times the cost model's: plan calibrates by it. On one
// device the best layout's step grows by (3 − 1) · m · B of the model's (one
// rank runs its forwards and backwards back to back), and the written layout
// re-simulated with the same measurement (simulate --profile
// --profile-config) gives the step plan printed.
TEST(PlanCommand, AMeasuredTraceCalibratesThePlanAndSimulateReadsItsBestBackTheSame) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/measured.json",
                    R"({"model": "gpt-tiny", "hardware": "cpu", "devices": 2, "pipeline": {"stages": 2, "schedule": "1f1b"},
                        "seq_length": 64, "train_batch_size": 8, "train_micro_batch_size_per_gpu": 1})");
  ASSERT_EQ(run_pipeflow("simulate --config measured.json --trace modelled.json", dir).exit_code, 0);
  nlohmann::json trace = nlohmann::json::parse(read_file(dir + "/modelled.json"));
  trace["otherData"].erase("pipeflow");  // a trace of another program's: its run is not in it
  for (nlohmann::json& event : trace["traceEvents"]) {
    if (event.value("cat", "") == "backward") event["dur"] = 3 * event["dur"].get<double>();
  }
  write_file_atomic(dir + "/slow.json", trace.dump());

  const std::string shape = "plan --model gpt-tiny --hardware cpu --devices 1 --global-batch 8 --seq 64 --json";
  const CommandResult unstated = run_pipeflow(shape + " --profile slow.json", dir);
  EXPECT_NE(unstated.exit_code, 0);
  EXPECT_NE(unstated.err.find("give that run's pipeflow configuration with --profile-config FILE"), std::string::npos)
      << unstated.err;
  const CommandResult plan =
      run_pipeflow(shape + " --profile slow.json --profile-config measured.json --write-config best.json", dir);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const nlohmann::json planned = nlohmann::json::parse(plan.out);
  const double forward = planned["calibration"]["forward"].get<double>();
  const double backward = planned["calibration"]["backward"].get<double>();
  EXPECT_NEAR(forward, 1, 1e-9);
  EXPECT_NEAR(backward, 3, 1e-9);
  const double step = planned["candidates"][0]["step_time_s"].get<double>();

  const CommandResult modelled = run_pipeflow("simulate --config best.json --json", dir);
  ASSERT_EQ(modelled.exit_code, 0) << modelled.err;
  const nlohmann::json model = nlohmann::json::parse(modelled.out);
  ASSERT_EQ(model["stages"].size(), 1u);
  const double m = model["layout"]["microbatches"].get<double>();
  EXPECT_NEAR(step - model["step_time_s"].get<double>(),
              m * ((backward - 1) * model["stages"][0]["backward_s"].get<double>() +
                   (forward - 1) * model["stages"][0]["forward_s"].get<double>()),
              1e-9 * step);

  const CommandResult resimulated =
      run_pipeflow("simulate --config best.json --profile slow.json --profile-config measured.json --json", dir);
  ASSERT_EQ(resimulated.exit_code, 0) << resimulated.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(resimulated.out)["step_time_s"].get<double>(), step);

  const CommandResult unmeasured = run_pipeflow(shape + " --profile modelled.json", dir);
  EXPECT_NE(unmeasured.exit_code, 0);
  EXPECT_NE(unmeasured.err.find("modelled.json: its costs are the cost model's"), std::string::npos) << unmeasured.err;
  const CommandResult alone = run_pipeflow(shape + " --profile-config measured.json", dir);
  EXPECT_NE(alone.exit_code, 0);
  EXPECT_NE(alone.err.find("is the configuration of the run --profile measured: give --profile too"),
            std::string::npos)
      << alone.err;
  const CommandResult other = run_pipeflow(
      "plan --model gpt2-124m --hardware cpu --devices 1 --global-batch 8 --seq 64 --profile slow.json "
      "--profile-config measured.json",
      dir);
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.err.find("the measured run is of gpt-tiny"), std::string::npos) << other.err;
}

// A model given as a file: the written configuration names it by its
// absolute path, so that it simulates from any directory, and `train` runs
// the layout (here 2 data-parallel replicas under MPI) for a step.
TEST(PlanCommand, TheWrittenConfigOfAModelFileRunsFromAnywhereAndTrains) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/tiny.json",
                    R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 256, "n_positions": 64,
                        "attn_pdrop": 0, "resid_pdrop": 0, "embd_pdrop": 0})");
  const CommandResult r = run_pipeflow("plan --model tiny.json --devices 2 --global-batch 4 --seq 32 --json "
                                       "--precision fp32 --write-config configs/best.json",
                                       dir, "mkdir configs");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json config = nlohmann::json::parse(read_file(dir + "/configs/best.json"));
  EXPECT_EQ(config["model"], dir + "/tiny.json");
  EXPECT_EQ(config["hardware"], "a100-80g");
  const CommandResult simulated = run_pipeflow("simulate --config " + dir + "/configs/best.json --json", "/");
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(simulated.out)["step_time_s"].get<double>(),
                   nlohmann::json::parse(r.out)["candidates"][0]["step_time_s"].get<double>());
  ASSERT_EQ(config["data_parallel"], 2);  // the best here: what train runs as MPI processes
  const CommandResult trained =
      run_mpirun(2, "train --config " + dir + "/configs/best.json --steps 1 --out-dir " + dir + "/run");
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  EXPECT_NE(read_file_if_exists(dir + "/run/metrics.jsonl"), "");
}

// What plan writes, pipeflow reads: for every hardware preset, the written
// run configuration simulates to plan's best step, and the DeepSpeed file
// (bf16 enabled, as plan searched) simulates with the model and hardware it
// leaves out. The Megatron arguments name the precision and, where the
// heads do not divide the width (gpt3-13b: 5140 / 40), the head width.
TEST(PlanCommand, EveryPresetsConfigurationsAreReadBackByPipeflow) {
  for (const HardwareProfile& hardware : hardware_presets()) {
    SCOPED_TRACE(hardware.name);
    const bool cpu = hardware.name == "cpu";
    const std::string model = cpu ? "gpt-tiny" : "gpt3-13b";
    const std::string dir = make_temp_dir();
    const std::string shape = fmt::format("--model {} --hardware {} --devices {} --global-batch {} --seq {}", model,
                                          hardware.name, cpu ? 2 : 8, cpu ? 8 : 64, cpu ? 64 : 2048);
    const CommandResult plan = run_pipeflow(
        "plan " + shape + " --json --write-config run.json --deepspeed ds.json --megatron megatron.txt", dir);
    ASSERT_EQ(plan.exit_code, 0) << plan.err;
    const CommandResult simulated = run_pipeflow("simulate --config run.json --json", dir);
    ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
    EXPECT_DOUBLE_EQ(nlohmann::json::parse(simulated.out)["step_time_s"].get<double>(),
                     nlohmann::json::parse(plan.out)["candidates"][0]["step_time_s"].get<double>());
    EXPECT_EQ(nlohmann::json::parse(simulated.out)["layout"]["precision"], "bf16");
    const nlohmann::json deepspeed = nlohmann::json::parse(read_file(dir + "/ds.json"));
    EXPECT_EQ(deepspeed["bf16"]["enabled"], true);
    // DeepSpeed takes the replicas from the world it starts in: the batch keys give them.
    const int replicas = deepspeed["train_batch_size"].get<int>() /
                         (deepspeed["train_micro_batch_size_per_gpu"].get<int>() *
                          deepspeed["gradient_accumulation_steps"].get<int>());
    const CommandResult from_deepspeed = run_pipeflow(
        fmt::format("simulate --config ds.json --model {} --hardware {} --seq {} --dp {} --json", model, hardware.name,
                    cpu ? 64 : 2048, replicas),
        dir);
    ASSERT_EQ(from_deepspeed.exit_code, 0) << from_deepspeed.err;
    EXPECT_EQ(nlohmann::json::parse(from_deepspeed.out)["layout"]["precision"], "bf16");
    const std::string megatron = read_file(dir + "/megatron.txt");
    EXPECT_NE(megatron.find(" --bf16"), std::string::npos) << megatron;
    EXPECT_EQ(megatron.find(" --kv-channels 128") != std::string::npos, !cpu) << megatron;
    // The layout Megatron-LM can run (plan's best, or the best it can
    // express) reads back; Megatron takes its replicas from the world, so the
    // devices are given as the launcher would.
    const auto argument = [&](const std::string& name) {
      const std::size_t at = megatron.find(name + " ");
      return at == std::string::npos ? 0 : std::stoi(megatron.substr(at + name.size() + 1));
    };
    const int tp = argument("--tensor-model-parallel-size");
    const int pp = argument("--pipeline-model-parallel-size");
    const int devices = cpu ? 2 : 8;
    const CommandResult from_megatron = run_pipeflow(
        fmt::format("simulate --megatron-args megatron.txt --hardware {} --devices {} --json", hardware.name,
                    devices / (tp * pp) * tp * pp),
        dir);
    ASSERT_EQ(from_megatron.exit_code, 0) << from_megatron.err;
    EXPECT_EQ(from_megatron.err, "") << "every argument plan writes is modelled";
    const nlohmann::json read_back = nlohmann::json::parse(from_megatron.out)["layout"];
    EXPECT_EQ(read_back["tensor_parallel"], tp) << megatron;
    EXPECT_EQ(read_back["pipeline_parallel"], pp) << megatron;
    EXPECT_EQ(read_back["micro_batch"], argument("--micro-batch-size")) << megatron;
    EXPECT_EQ(read_back["global_batch"], argument("--global-batch-size")) << megatron;
    EXPECT_EQ(read_back["seq_length"], argument("--seq-length")) << megatron;
    EXPECT_EQ(read_back["precision"], "bf16");
    EXPECT_EQ(read_back["schedule"], megatron.find("virtual") == std::string::npos ? "1f1b" : "interleaved-1f1b");
  }
}

// A Megatron-LM launch line of a Llama with grouped-query attention, as a
// script holds it (continued lines, a comment, flags pipeflow does not
// model), simulates as it is.
TEST(SimulateCommand, ReadsAMegatronLaunchLine) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/args.txt", R"(# Llama 3 8B on 16 GPUs
--num-layers 32 --hidden-size 4096 --num-attention-heads 32 \
  --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 \
  --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear \
  --untie-embeddings-and-output-weights --vocab-size 128256 --seq-length 8192 --max-position-embeddings 8192 \
  --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4 \
  --sequence-parallel --use-distributed-optimizer --recompute-granularity selective --use-tp-pp-dp-mapping \
  --micro-batch-size 1 --global-batch-size 64 --bf16 --lr 3e-4 --train-iters 1000 \
  --tokenizer-type HuggingFaceTokenizer --data-path /data/corpus --attention-dropout 0 --hidden-dropout 0
)");
  const CommandResult r =
      run_pipeflow("simulate --megatron-args args.txt --hardware h100 --devices 16 --json", dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "args.txt: read, not modelled: --data-path, --tokenizer-type\n");
  const nlohmann::json layout = nlohmann::json::parse(r.out)["layout"];
  EXPECT_EQ(layout["tensor_parallel"], 4);
  EXPECT_EQ(layout["pipeline_parallel"], 2);
  EXPECT_EQ(layout["data_parallel"], 2);
  EXPECT_EQ(layout["rank_order"], "tp-pp-dp");
  EXPECT_EQ(layout["virtual_stages"], 4);
  EXPECT_EQ(layout["schedule"], "interleaved-1f1b");
  EXPECT_EQ(layout["precision"], "bf16");
  EXPECT_EQ(layout["recompute"], "selective");
  EXPECT_EQ(layout["sequence_parallel"], true);
  EXPECT_EQ(run_pipeflow("simulate --megatron-args '--num-layers 2 --hidden-size 64 --swiglu' --json", dir).err,
            "pipeflow: error: --megatron-args: --num-attention-heads is required (the model's shape)\n");
  EXPECT_EQ(run_pipeflow("simulate --megatron-args '--num-layers two' --json", dir).err,
            "pipeflow: error: --megatron-args: --num-layers two: must be an integer >= 1\n");
}

// Megatron-LM keeps gradients in fp32 under bf16 (and under fp16 with
// --accumulate-allreduce-grads-in-fp32), also beside its distributed
// optimizer: rank 0's model states are 2 + 4 + 12/d bytes a parameter there
// (d = 2: 12) against 2 + 4 + 12 = 18 without it, where DeepSpeed's ZeRO-1
// keeps 16-bit gradients (2 + 2 + 6 = 10). fp16 alone keeps 16-bit ones:
// 2 + 2 + 6 = 10 against 2 + 2 + 12 = 16.
TEST(SimulateCommand, MegatronArgumentsHoldGradientsInFp32UnderBf16AndTheDistributedOptimizer) {
  const auto states = [](const std::string& flags) {
    const CommandResult r = run_pipeflow(
        "simulate --megatron-args '--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
        "--micro-batch-size 1 --global-batch-size 8 --pipeline-model-parallel-size 2 " +
        flags + "' --hardware a100-80g --devices 4 --json");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["ranks"][0]["model_states_bytes"].get<double>();
  };
  EXPECT_DOUBLE_EQ(states("--bf16 --use-distributed-optimizer") / states("--bf16"), 12.0 / 18.0);
  EXPECT_DOUBLE_EQ(states("--fp16 --use-distributed-optimizer") / states("--fp16"), 10.0 / 16.0);
  EXPECT_DOUBLE_EQ(
      states("--fp16 --accumulate-allreduce-grads-in-fp32 --use-distributed-optimizer") / states("--fp16"), 12.0 / 16.0);
}

// plan --precision fp32 searches and writes fp32 (what pipeflow train runs).
TEST(PlanCommand, Fp32IsSearchedAndWrittenWhenAsked) {
  const std::string dir = make_temp_dir();
  const CommandResult r = run_pipeflow("plan --model gpt-tiny --hardware a100-80g --devices 2 --global-batch 8 --seq 64 "
                                       "--precision fp32 --json --write-config run.json --deepspeed ds.json "
                                       "--megatron megatron.txt",
                                       dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json written = nlohmann::json::parse(read_file(dir + "/run.json"));
  EXPECT_EQ(written["bf16"]["enabled"], false);
  EXPECT_EQ(written["fp16"]["enabled"], false);
  EXPECT_FALSE(nlohmann::json::parse(read_file(dir + "/ds.json")).contains("bf16"));
  EXPECT_EQ(read_file(dir + "/megatron.txt").find("--bf16"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(r.out)["candidates"][0]["layout"]["precision"], "fp32");
}

TEST(PlanCommand, NothingFitsExitsNonZeroWithTheCounts) {
  const CommandResult r = run_pipeflow("plan --model gpt3-175b --devices 8 --global-batch 8 --seq 2048");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no layout of gpt3-175b on 8 × a100-80g fits"), std::string::npos) << r.err;
}

// Nothing fits: the error says what the nearest layout needs against the
// limit. GPT-2 124M's model states on its one device are 18 B (bf16
// weights, gradients accumulated in fp32, fp32 Adam) × 124,439,808 =
// 2.09 GiB, over 0.01 × 80 GiB; at 0.027 × 80 GiB = 2.16 GiB they fit and
// the lowest peak (full recompute, as simulate gives it) does not.
TEST(PlanCommand, NothingFitsSaysWhatTheNearestLayoutNeedsAgainstTheLimit) {
  const std::string args = "plan --model gpt2-124m --devices 1 --global-batch 1 --seq 1024 --memory-fraction ";
  const CommandResult states = run_pipeflow(args + "0.01");
  EXPECT_NE(states.exit_code, 0);
  EXPECT_NE(states.err.find("; the fewest model states of any layout's fullest rank are 2.09 GiB (weights, gradients "
                            "and optimizer state, before activations) > the limit 0.01 × 80.0 GiB = 819 MiB; use "
                            "more devices"),
            std::string::npos)
      << states.err;
  const CommandResult peaks = run_pipeflow(args + "0.027");
  EXPECT_NE(peaks.exit_code, 0);
  const nlohmann::json full = nlohmann::json::parse(
      run_pipeflow("simulate --model gpt2-124m --hardware a100-80g --global-batch 1 --seq 1024 --recompute full --bf16 --json").out);
  const std::string lowest = format_bytes(full["ranks"][0]["peak_memory_bytes"].get<double>());
  EXPECT_NE(peaks.err.find("; the lowest peak of any layout's fullest rank is " + lowest +
                           " > the limit 0.027 × 80.0 GiB = 2.16 GiB; use more devices"),
            std::string::npos)
      << peaks.err;
}

TEST(PlanCommand, InferenceListsTheStageCountsThatFitAndWhyOthersDoNot) {
  const CommandResult r =
      run_pipeflow("plan --inference --model llama3-405b --hardware h100 --devices 16 --context 131072");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("llama3-405b on 1 .. 16 × h100: 1 sequence, context 131072 tokens, prompts of 131072 tokens; "
                        "memory limit 0.8 × 80.0 GiB = 64.0 GiB per device\n",
                        0),
            0u)
      << r.out;
  EXPECT_NE(r.out.find("#  stages  micro-batches  time to first token"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("does not fit:\n  1 stage: out of memory: stage 0 needs"), std::string::npos) << r.out;
  const CommandResult json =
      run_pipeflow("plan --inference --model llama3-405b --hardware h100 --devices 16 --context 131072 --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["fitting"].size() + j["rejected"].size(), 16u);
  EXPECT_EQ(j["rejected"][0]["stages"], 1);
  const CommandResult none = run_pipeflow(
      "plan --inference --model llama3-405b --hardware h100 --devices 16 --context 131072 --sequences 8");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.out.find("no stage count fits\ndoes not fit:\n"), std::string::npos) << none.out;
  EXPECT_EQ(none.err, "pipeflow: error: no stage count of 1 .. 16 fits (reasons above): use more --devices, fewer "
                      "--sequences, a shorter --context or a larger --memory-fraction\n");
  const CommandResult training = run_pipeflow("plan --model llama3-8b --devices 8");
  EXPECT_NE(training.exit_code, 0);
  EXPECT_NE(training.err.find("plan needs --global-batch and --seq (or --inference for generation)"),
            std::string::npos)
      << training.err;
}

}  // namespace
}  // namespace pipeflow::testing
