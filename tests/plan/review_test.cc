#include "pipeflow/plan/review.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <fstream>
#include <string>
#include <vector>

#include "pipeflow/core/config.h"
#include "pipeflow/model/model_states.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/prediction.h"
#include "../support/error_of.h"
#include "../support/temp_dir.h"

namespace pipeflow {
namespace {

using testing::error_of;

// GPT-2 124M on A100s at sequence 1024 in bf16, balanced: a run the checks
// pass, which each test breaks one way. `keys` are added to (or replace) its keys.
std::string config_json(const std::string& keys) {
  nlohmann::json config = nlohmann::json::parse(R"({"model": "gpt2-124m", "hardware": "a100-80g",
      "seq_length": 1024, "bf16": {"enabled": true}, "train_micro_batch_size_per_gpu": 1,
      "gradient_accumulation_steps": 16, "pipeline": {"stages": 2, "partition_method": "balanced"}})");
  config.merge_patch(nlohmann::json::parse(keys));
  return config.dump();
}

ResolvedRun run_of(const std::string& keys) {
  return resolve(parse_run_config(Config::parse(config_json(keys), "run.json")));
}

Prediction prediction_of(const std::string& keys) { return predict(layout_of(run_of(keys))); }

ReviewOptions with_noise_scale(double noise_scale) {
  ReviewOptions options;
  options.noise_scale = noise_scale;
  return options;
}

ReviewOptions with_reference(long long batch, std::optional<double> lr) {
  ReviewOptions options;
  options.base_batch = batch;
  options.base_lr = lr;
  return options;
}

std::vector<std::string> checks_of(const Review& r) {
  std::vector<std::string> names;
  for (const Finding& f : r.findings) names.push_back(f.check);
  return names;
}

const Finding& only_finding(const Review& r, const std::string& check) {
  EXPECT_EQ(checks_of(r), std::vector<std::string>{check});
  static const Finding none;
  return r.findings.empty() ? none : r.findings.front();
}

TEST(Review, TheBaseRunHasNoFinding) {
  const Review r = review(run_of("{}"), {.noise_scale = 1024, .base_batch = 16, .base_lr = 1e-3});
  EXPECT_TRUE(r.findings.empty()) << review_text(r);
  EXPECT_TRUE(r.skipped.empty());
  EXPECT_FALSE(r.has_error());
}

TEST(Review, WithoutANoiseScaleOrAReferenceThoseChecksAreSkippedAndSaidSo) {
  const Review r = review(run_of("{}"));
  ASSERT_EQ(r.skipped.size(), 2u);
  EXPECT_NE(r.skipped[0].find("--noise-scale"), std::string::npos);
  EXPECT_NE(r.skipped[1].find("--base-batch and --base-lr"), std::string::npos);
}

TEST(Review, MemoryPastTheDeviceIsAnErrorWithTheSimulatorsPeak) {
  const std::string keys = R"({"model": "gpt3-13b", "seq_length": 2048, "train_micro_batch_size_per_gpu": 4})";
  const Review r = review(run_of(keys));
  const Finding& f = only_finding(r, "memory");
  const Prediction p = prediction_of(keys);
  EXPECT_DOUBLE_EQ(f.value, peak_memory(p) / p.layout.hardware.memory_bytes);
  EXPECT_GT(f.value, 1);
  EXPECT_EQ(f.severity, Severity::kError);
  EXPECT_TRUE(r.has_error());
  EXPECT_NE(f.fix.find("pipeline.stages"), std::string::npos) << f.fix;
}

// Blocks 0 and 1 of GPT-3 13B frozen (2 · (12h² + 13h) = 634,204,040 of 12,952,938,780 parameters, h = 5140):
// ZeRO-1 could shard only the others' optimizer state, and the fix says so.
TEST(Review, MemoryPastTheDeviceSaysWhoseOptimizerStateZeroCouldShardWhereLayersAreFrozen) {
  const Review r = review(run_of(R"({"model": "gpt3-13b", "seq_length": 2048, "train_micro_batch_size_per_gpu": 4,
                                    "freeze": ["block.0", "block.1"]})"));
  const Finding& f = only_finding(r, "memory");
  EXPECT_EQ(f.severity, Severity::kError);
  EXPECT_NE(f.fix.find("on more devices; ZeRO-1 shards only the optimizer state of the 12.32B trainable parameters "
                       "(the 634.2M frozen have no gradients or optimizer state)"),
            std::string::npos)
      << f.fix;
}

TEST(Review, MemoryPastTheLineIsAWarningFixedByRecompute) {
  // GPT-3 6.7B on 2 A100s, 2 sequences a micro-batch, gradients in bf16
  // (16 B a parameter): 87% of the device.
  const std::string keys =
      R"({"model": "gpt3-6.7b", "train_micro_batch_size_per_gpu": 2, "data_types": {"grad_accum_dtype": "bf16"}})";
  const Review r = review(run_of(keys));
  const Finding& f = only_finding(r, "memory");
  const Prediction p = prediction_of(keys);
  EXPECT_DOUBLE_EQ(f.value, peak_memory(p) / p.layout.hardware.memory_bytes);
  EXPECT_GT(f.value, kMemoryLine);
  EXPECT_LE(f.value, 1);
  EXPECT_EQ(f.severity, Severity::kWarning);
  EXPECT_NE(f.fix.find("recompute \"selective\""), std::string::npos) << f.fix;
  ASSERT_TRUE(f.gain.has_value());
  EXPECT_DOUBLE_EQ(*f.gain, prediction_of(R"({"model": "gpt3-6.7b", "train_micro_batch_size_per_gpu": 2,
                                         "data_types": {"grad_accum_dtype": "bf16"}, "recompute": "selective"})")
                          .tokens_per_s / p.tokens_per_s - 1)
      << "the fix's gain is its re-simulation's";
}

TEST(Review, BubblePastTheLineWithTheSchedulesClosedFormAtLeast) {
  // 1F1B on 4 ranks with 16 micro-batches: (p - 1) / (m + p - 1) = 3 / 19 = 15.8%, past 15%, with m = 4p.
  const std::string keys = R"({"pipeline": {"stages": 4}, "devices": 4})";
  const Review r = review(run_of(keys));
  const Finding& f = only_finding(r, "bubble");
  EXPECT_DOUBLE_EQ(f.value, prediction_of(keys).result.pipeline_bubble_ratio);
  EXPECT_NEAR(f.value, 3.0 / 19, 0.02);
  EXPECT_EQ(f.limit, kBubbleLine);
  ASSERT_TRUE(f.gain.has_value());
  EXPECT_GT(*f.gain, 0);
}

TEST(Review, FewerMicrobatchesThanFourPerStageIsANoteWhileTheBubbleIsSmall) {
  // m = 7 < 4 · 2: bubble 1/8 = 12.5%, under the line; b = 1 cannot split, so the fix grows the batch.
  const std::string keys = R"({"gradient_accumulation_steps": 7})";
  const Review r = review(run_of(keys));
  const Finding& f = only_finding(r, "microbatches");
  EXPECT_EQ(f.value, 7);
  EXPECT_EQ(f.limit, 8);
  EXPECT_EQ(f.severity, Severity::kNote);
  EXPECT_NE(f.fix.find("gradient_accumulation_steps 8 (train_batch_size 8)"), std::string::npos) << f.fix;
  EXPECT_NE(f.fix.find("learning rate"), std::string::npos) << f.fix;
}

TEST(Review, ZeroTwoWithAPipelineIsTheReadersRefusalAsAnErrorFinding) {
  const std::filesystem::path path = std::filesystem::path(pipeflow::testing::make_temp_dir()) / "zero2.json";
  std::ofstream(path) << config_json(R"({"zero_optimization": {"stage": 2}, "data_parallel": 2})");
  const ReviewedConfig read = read_for_review(path, {});
  ASSERT_TRUE(read.refusal.has_value());
  EXPECT_EQ(read.config.zero, ZeroStage::kOne) << "the rest is reviewed at ZeRO-1";
  const Review r = review(resolve(read.config), {}, read.refusal);
  const Finding& f = only_finding(r, "zero-pipeline");
  EXPECT_EQ(f.value, 2);
  EXPECT_EQ(f.severity, Severity::kError);
  EXPECT_NE(f.finding.find("DeepSpeed's pipeline engine refuses it"), std::string::npos) << f.finding;
  EXPECT_NE(f.fix.find("zero_optimization.stage 1"), std::string::npos);
}

TEST(Review, AnotherRefusalOfTheReaderIsThrown) {
  const std::filesystem::path path = std::filesystem::path(pipeflow::testing::make_temp_dir()) / "bad.json";
  std::ofstream(path) << config_json(R"({"zero_optimization": {"stage": 2}, "pipeline": {"stages": 0}})");
  EXPECT_NE(error_of([&] { read_for_review(path, {}); }).find("pipeline.stages"), std::string::npos);
}

TEST(Review, TensorParallelismPastANodeIsFound) {
  // 16 > the A100 profile's 8 devices per node; GPT-2's 12 heads do not split 16 ways, GPT-3 6.7B's 32 do.
  const std::string keys = R"({"model": "gpt3-6.7b", "tensor_parallel": 16, "pipeline": {"stages": 1}})";
  const Review r = review(run_of(keys));
  const Finding& f = only_finding(r, "tensor-across-nodes");
  EXPECT_EQ(f.value, 16);
  EXPECT_EQ(f.limit, 8);
  EXPECT_NE(f.fix.find("tensor_parallel 8, pipeline.stages 2"), std::string::npos) << f.fix;
  ASSERT_TRUE(f.gain.has_value());
  EXPECT_DOUBLE_EQ(*f.gain, prediction_of(R"({"model": "gpt3-6.7b", "tensor_parallel": 8})").tokens_per_s /
                                    prediction_of(keys).tokens_per_s -
                                1);
}

TEST(Review, AGlobalBatchPastTheNoiseScaleIsFoundWithMcCandlishsSamples) {
  const Review r = review(run_of(R"({"gradient_accumulation_steps": 512})"), with_noise_scale(256));
  const Finding& f = only_finding(r, "noise-scale");
  EXPECT_EQ(f.value, 512);
  EXPECT_EQ(f.limit, 256);
  // 1 + B / B_noise = 3 times the minimum samples; at 256, 2.
  EXPECT_NE(f.finding.find("3.00x the minimum samples"), std::string::npos) << f.finding;
  EXPECT_NE(f.fix.find("train_batch_size 256 (gradient_accumulation_steps 256): 2.00x"), std::string::npos) << f.fix;
  // With micro-batches to shrink, the fix keeps the 16 micro-batches (and the bubble): 4 -> 2 sequences each.
  const Review smaller =
      review(run_of(R"({"train_micro_batch_size_per_gpu": 4})"), with_noise_scale(32));
  const Finding& g = only_finding(smaller, "noise-scale");
  EXPECT_EQ(g.value, 64);
  EXPECT_NE(g.fix.find("train_micro_batch_size_per_gpu 2 (train_batch_size 32, the same 16 micro-batches): 2.00x"),
            std::string::npos)
      << g.fix;
}

TEST(Review, ALearningRateNotScaledWithTheBatchIsFoundAgainstTheSquareRootRule) {
  // 1e-3 at 16 sequences, the reference's at 4: Adam's rule gives 1e-3 · √(16/4) = 2e-3; 1e-3 is 0.5x of it.
  const Review r = review(run_of("{}"), with_reference(4, 1e-3));
  const Finding& f = only_finding(r, "learning-rate");
  EXPECT_DOUBLE_EQ(f.value, 0.5);
  EXPECT_NE(f.fix.find("optimizer.params.lr 0.002"), std::string::npos) << f.fix;
  // Within the tolerance (1.5x either way) it passes: 1.4e-3 against 2e-3 is 0.7x.
  EXPECT_TRUE(review(run_of(R"({"optimizer": {"params": {"lr": 1.4e-3}}})"), with_reference(4, 1e-3))
                  .findings.empty());
}

TEST(Review, AWarmupSchedulersPeakIsTheRateChecked) {
  const std::string keys = R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 8e-3}}})";
  const Review r = review(run_of(keys), with_reference(4, 1e-3));
  const Finding& f = only_finding(r, "learning-rate");
  EXPECT_DOUBLE_EQ(f.value, 4);
  EXPECT_NE(f.fix.find("scheduler.params.warmup_max_lr 0.002"), std::string::npos) << f.fix;
}

TEST(Review, ImbalanceIsFoundAndTheBalancedPartitionsGainIsItsResimulation) {
  // GPT-2 355M cut uniformly: the last stage holds the LM head too.
  const std::string keys = R"({"model": "gpt2-355m", "pipeline": {"partition_method": "uniform"}})";
  const Review r = review(run_of(keys));
  const Finding& f = only_finding(r, "imbalance");
  const Prediction p = prediction_of(keys);
  EXPECT_DOUBLE_EQ(f.value, modelled_imbalance(p));
  EXPECT_GT(f.value, kImbalanceLine);
  ASSERT_TRUE(f.gain.has_value());
  EXPECT_DOUBLE_EQ(*f.gain, prediction_of(R"({"model": "gpt2-355m"})").tokens_per_s / p.tokens_per_s - 1);
  EXPECT_NE(f.fix.find("pipeline.partition_method \"balanced\""), std::string::npos);
}

TEST(Review, BlockingCommunicationIsFoundWithTheOverlapsGain) {
  // 8 replicas put pipeline neighbours 8 devices apart: on another node, where blocking sends cost.
  const std::string keys = R"({"comm_mode": "blocking", "data_parallel": 8})";
  const Review r = review(run_of(keys));
  const Finding& f = only_finding(r, "overlap");
  const double gain = prediction_of(R"({"data_parallel": 8})").tokens_per_s / prediction_of(keys).tokens_per_s - 1;
  EXPECT_DOUBLE_EQ(f.value, gain);
  EXPECT_GT(f.value, kOverlapGainLine);
  EXPECT_NE(f.fix.find("comm_mode \"overlapped\""), std::string::npos);
}

TEST(Review, RecomputeThatMemoryDoesNotNeedIsFoundWithTheTimeItCosts) {
  const std::string keys = R"({"model": "gpt2-355m", "recompute": "full"})";
  const Review r = review(run_of(keys));
  const Finding& f = only_finding(r, "recompute");
  const Prediction without = prediction_of(R"({"model": "gpt2-355m"})");
  EXPECT_DOUBLE_EQ(f.value, peak_memory(without) / without.layout.hardware.memory_bytes);
  EXPECT_LT(f.value, kMemoryLine);
  ASSERT_TRUE(f.gain.has_value());
  EXPECT_DOUBLE_EQ(*f.gain, without.tokens_per_s / prediction_of(keys).tokens_per_s - 1);
  EXPECT_GT(*f.gain, 0);
}

// 16 micro-batches of 1 sequence on 2 stages of 6 blocks: each block pass
// pays the host overhead. Its share is the step less the step without it;
// the fix is the best fitting change to fewer, larger micro-batches for the
// same global batch, re-simulated.
TEST(Review, AHostOverheadThatTakesALargeShareOfTheStepIsFoundWithFewerLargerMicrobatches) {
  const std::string keys = R"({"block_launch_overhead_s": 1e-4})";
  const Review r = review(run_of(keys));
  // The overhead is not charged to the embedding and the head: the stages' compute differs (a note).
  ASSERT_EQ(checks_of(r), (std::vector<std::string>{"launch-overhead", "imbalance"}));
  const Finding& f = r.findings.front();
  const double step = prediction_of(keys).result.step_time_s;
  EXPECT_DOUBLE_EQ(f.value, (step - prediction_of("{}").result.step_time_s) / step);
  EXPECT_GT(f.value, kLaunchOverheadLine);
  EXPECT_NE(f.finding.find("block_launch_overhead_s = 100 us (host time each block pass adds) is "),
            std::string::npos)
      << f.finding;
  ASSERT_TRUE(f.gain.has_value());
  double best = 0;
  for (const int b : {2, 4, 8}) {  // b 16: one micro-batch, which 1F1B on 2 stages refuses
    const Prediction p = prediction_of(fmt::format(
        R"({{"block_launch_overhead_s": 1e-4, "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}}})",
        b, 16 / b));
    if (peak_memory(p) <= kMemoryLine * p.layout.hardware.memory_bytes) best = std::max(best, p.tokens_per_s);
  }
  EXPECT_DOUBLE_EQ(*f.gain, best / prediction_of(keys).tokens_per_s - 1);
  EXPECT_GT(*f.gain, 0);
  EXPECT_NE(f.fix.find("fewer, larger micro-batches: train_micro_batch_size_per_gpu"), std::string::npos) << f.fix;
  // Unset, or too small to matter: no finding.
  EXPECT_TRUE(review(run_of("{}")).findings.empty());
  EXPECT_TRUE(review(run_of(R"({"block_launch_overhead_s": 1e-6})")).findings.empty());
}

TEST(Review, BadOptionsNameTheFlag) {
  EXPECT_NE(error_of([] { review(run_of("{}"), with_noise_scale(-1)); }).find("--noise-scale -1: must be a positive"),
            std::string::npos);
  EXPECT_NE(error_of([] { review(run_of("{}"), with_reference(4, std::nullopt)); }).find("--base-batch given alone"),
            std::string::npos);
}

TEST(Review, TheJsonFormHoldsEveryFindingsNumberAndFix) {
  const Review r = review(run_of(R"({"gradient_accumulation_steps": 7})"));
  const nlohmann::json json = nlohmann::json::parse(review_json(r));
  ASSERT_EQ(json["findings"].size(), 1u);
  EXPECT_EQ(json["findings"][0]["severity"], "note");
  EXPECT_EQ(json["findings"][0]["check"], "microbatches");
  EXPECT_EQ(json["findings"][0]["value"], 7);
  EXPECT_EQ(json["findings"][0]["limit"], 8);
  EXPECT_EQ(json["notes"], 1);
  EXPECT_EQ(json["errors"], 0);
}

TEST(Review, TheExamplesRunConfigurationsHaveNoError) {
  const std::filesystem::path examples = std::filesystem::path(PIPEFLOW_SOURCE_DIR) / "examples";
  int reviewed = 0;
  for (const std::filesystem::path& file :
       {examples / "train_1f1b_2stage.json", examples / "train_1f1b_2stage_small.json",
        examples / "train_1f1b_4stage.json", examples / "train_gpipe.json", examples / "train_interleaved.json",
        examples / "train_llama_2stage_small.json", examples / "train_zbv.json",
        examples / "simulate/gpt-tiny-1f1b-cpu.json", examples / "simulate/gpt3-175b-megatron.json",
        examples / "simulate/llama3-8b-zbv-h100.json", examples / "analyze/case_study.json"}) {
    SCOPED_TRACE(file.string());
    const std::filesystem::path here = std::filesystem::current_path();
    std::filesystem::current_path(PIPEFLOW_SOURCE_DIR);  // the examples name files relative to the repository
    const ReviewedConfig read = read_for_review(file, {});
    const Review r = review(resolve(read.config), {}, read.refusal);
    std::filesystem::current_path(here);
    EXPECT_FALSE(r.has_error()) << review_text(r);
    ++reviewed;
  }
  EXPECT_EQ(reviewed, 11);
}

}  // namespace
}  // namespace pipeflow
