// The cost model against published training runs, six tables of measured
// large runs on A100 80GB and H100 (docs/VALIDATION.md lists each row's
// source and the layout details assumed where a source is silent):
//   Narayanan et al. 2021 Table 1    hardware TFLOP/s per GPU (recomputation counted, their eq. 3)
//   Korthikanti et al. 2022 Table 5  seconds per iteration, full and selective + SP recomputation
//   Smith et al. 2022 §2.4           MT-NLG 530B, seconds per iteration on 280, 350, 420 DGX A100
//   BigScience 2022                  BLOOM 176B, hardware TFLOP/s per GPU on 384 A100 80GB
//   BigScience 2022 prequel          its layout search on the same 384 GPUs, seconds per iteration
//   Dubey et al. 2024 Table 4        Llama 3 405B, model TFLOP/s per GPU (BF16 MFU × 989) on H100
// Two tests, both printing the table docs/VALIDATION.md holds; regenerate with
//   build/release/sim_tests --gtest_filter='Validation.*'
// Validation.PresetsAgainstPublishedRuns: the hardware presets as shipped
//   (a100's curve fitted on two rows, marked "fitted"), the DeepSpeed
//   pipeline engine's host overhead fitted on the prequel's rows.
// Validation.LeaveOneTableOut: for each table, the GEMM curve and the launch
//   overhead calibrated on the other five tables alone, then that table predicted.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "pipeflow/model/model_spec.h"
#include "pipeflow/sim/cost_model.h"
#include "pipeflow/sim/prediction.h"

namespace pipeflow {
namespace {

// What a table reports of a run.
enum class Figure {
  kHardwareTflops,  // TFLOP/s per GPU with recomputation counted (Prediction::hardware_tflops_per_device)
  kModelTflops,     // TFLOP/s per GPU of model FLOPs (MFU × peak; Prediction::tflops_per_device)
  kStepSeconds,     // seconds per iteration
};

struct PublishedRun {
  const char* table;
  const char* name;
  ModelSpec model;
  const char* hardware;  // preset
  int tp, pp, dp, micro_batch, global_batch, seq_length;
  int chunks;  // v: 1 runs 1F1B, >= 2 interleaved 1F1B
  Recompute recompute;
  bool sequence_parallel;
  ZeroStage zero;
  Precision precision;
  const char* partition;  // parse_partition_method's text
  CommMode comm_mode;
  double inter_node_gbit_per_node;  // the cluster's scale-out links, when not the preset's (0)
  Figure figure;
  double published;
  bool fitted;      // one of the two rows a100's preset curve was fitted to
  double pinned;    // the prediction with the presets, to 0.1%
  double held_out;  // the prediction calibrated on the other tables only, to 0.1%
  // Trained with DeepSpeed's pipeline engine (Megatron-DeepSpeed: MT-NLG,
  // BigScience): priced with the calibrated block_launch_overhead_s (a
  // per-block-pass host overhead; docs/VALIDATION.md says why it is fitted,
  // not explained).
  bool priced_with_host_overhead = false;
};

// Megatron-LM's GPT (Narayanan, Korthikanti, MT-NLG): GPT-2's vocabulary
// padded to 51,200, 2,048 positions, dropout.
ModelSpec megatron_gpt(const char* name, int layers, int hidden, int heads) {
  ModelSpec model = gpt_model(name, layers, hidden, heads, 51200, 2048);
  model.dropout = true;
  return model;
}

// BigScience's Megatron-DeepSpeed GPT (BLOOM 176B, tr11-176B-ml.slurm: 70
// layers, width 14336, 112 heads; and the shapes its layout search timed):
// the vocabulary padded to 250,880, dropout at Megatron-DeepSpeed's default
// (no flag sets it). ALiBi has no position table; the 2,048-row table
// gpt_model counts is 0.03% of the parameters.
ModelSpec bigscience_gpt(const char* name, int layers, int hidden, int heads) {
  ModelSpec model = gpt_model(name, layers, hidden, heads, 250880, 2048);
  model.dropout = true;
  return model;
}

// The tables. Where a source leaves a layout detail out, the assumption is
// in docs/VALIDATION.md: micro-batch 1 (Narayanan, Korthikanti, Llama 3),
// 2 for MT-NLG (its three rows' slot time agrees across d only at 2);
// interleaving v the smallest >= 2 dividing the blocks per rank (Narayanan
// §5.1 says every Table 1 run interleaved; Korthikanti's pipelined runs the
// same); MT-NLG and BLOOM on DeepSpeed's plain 1F1B
// pipeline with full recomputation; Llama 3 without recomputation, with
// sequence parallelism.
const std::vector<PublishedRun>& published_runs() {
  using R = Recompute;
  using F = Figure;
  constexpr ZeroStage kOff = ZeroStage::kNone;
  constexpr Precision kFp16 = Precision::kFp16;
  constexpr Precision kBf16 = Precision::kBf16;
  const auto gpt = megatron_gpt;
  const char* a100 = "a100-80g";
  const char* params = "parameters";
  constexpr CommMode kOverlap = CommMode::kOverlapped;
  constexpr CommMode kBlocking = CommMode::kBlocking;
  // BigScience's layout search (below): BLOOM's stack, optimizer, partition
  // and cluster, 64 heads, seconds per iteration.
  const auto prequel = [&](const char* name, int layers, int hidden, int tp, int pp, int dp, int micro_batch,
                           double seconds, double pinned, double held_out) {
    return PublishedRun{"BigScience 2022 prequel", name, bigscience_gpt(name, layers, hidden, 64), a100, tp, pp,
                        dp, micro_batch, 2048, 2048, 1, R::kFull, false, ZeroStage::kOne, kBf16,
                        "type:embedding|block|head", kBlocking, 400, F::kStepSeconds, seconds, false, pinned, held_out,
                        true};
  };
  static const std::vector<PublishedRun> runs = {
      {"Narayanan 2021 T1", "1.7B", gpt("1.7B", 24, 2304, 24), a100, 1, 1, 32, 1, 512, 2048, 1, R::kFull, false,
       kOff, kFp16, params, kOverlap, 0, F::kHardwareTflops, 137, true, 137.134, 138.859},
      {"Narayanan 2021 T1", "3.6B", gpt("3.6B", 30, 3072, 32), a100, 2, 1, 32, 1, 512, 2048, 1, R::kFull, false,
       kOff, kFp16, params, kOverlap, 0, F::kHardwareTflops, 138, false, 136.39, 137.63},
      {"Narayanan 2021 T1", "7.5B", gpt("7.5B", 36, 4096, 32), a100, 4, 1, 32, 1, 512, 2048, 1, R::kFull, false,
       kOff, kFp16, params, kOverlap, 0, F::kHardwareTflops, 142, false, 135.15, 135.769},
      {"Narayanan 2021 T1", "18.4B", gpt("18.4B", 40, 6144, 48), a100, 8, 1, 32, 1, 1024, 2048, 1, R::kFull, false,
       kOff, kFp16, params, kOverlap, 0, F::kHardwareTflops, 135, false, 133.87, 134.249},
      {"Narayanan 2021 T1", "39.1B", gpt("39.1B", 48, 8192, 64), a100, 8, 2, 32, 1, 1536, 2048, 2, R::kFull, false,
       kOff, kFp16, params, kOverlap, 0, F::kHardwareTflops, 138, false, 147.734, 147.767},
      {"Narayanan 2021 T1", "76.1B", gpt("76.1B", 60, 10240, 80), a100, 8, 4, 32, 1, 1792, 2048, 3, R::kFull, false,
       kOff, kFp16, params, kOverlap, 0, F::kHardwareTflops, 140, false, 155.9, 155.634},
      {"Narayanan 2021 T1", "145.6B", gpt("145.6B", 80, 12288, 96), a100, 8, 8, 24, 1, 2304, 2048, 2, R::kFull,
       false, kOff, kFp16, params, kOverlap, 0, F::kHardwareTflops, 148, false, 161.561, 161.045},
      {"Narayanan 2021 T1", "310.1B", gpt("310.1B", 96, 16384, 128), a100, 8, 16, 15, 1, 2160, 2048, 2, R::kFull,
       false, kOff, kFp16, params, kOverlap, 0, F::kHardwareTflops, 155, false, 168.73, 167.843},
      {"Narayanan 2021 T1", "529.6B", gpt("529.6B", 105, 20480, 128), a100, 8, 35, 9, 1, 2520, 2048, 3, R::kFull,
       false, kOff, kFp16, params, kOverlap, 0, F::kHardwareTflops, 163, false, 175.785, 174.541},
      {"Narayanan 2021 T1", "1008B", gpt("1008B", 128, 25600, 160), a100, 8, 64, 6, 1, 3072, 2048, 2, R::kFull,
       false, kOff, kFp16, params, kOverlap, 0, F::kHardwareTflops, 163, false, 176.374, 174.93},
      {"Korthikanti 2022 T5", "22B full", gpt("22B", 48, 6144, 64), a100, 8, 1, 1, 1, 4, 2048, 1, R::kFull, false,
       kOff, kFp16, params, kOverlap, 0, F::kStepSeconds, 1.42, false, 1.42211, 1.43469},
      {"Korthikanti 2022 T5", "22B sel.+SP", gpt("22B", 48, 6144, 64), a100, 8, 1, 1, 1, 4, 2048, 1, R::kSelective,
       true, kOff, kFp16, params, kOverlap, 0, F::kStepSeconds, 1.10, false, 1.04099, 1.04876},
      {"Korthikanti 2022 T5", "175B full", gpt("175B", 96, 12288, 96), a100, 8, 8, 1, 1, 64, 2048, 2, R::kFull,
       false, kOff, kFp16, params, kOverlap, 0, F::kStepSeconds, 18.13, false, 18.0675, 18.4298},
      {"Korthikanti 2022 T5", "175B sel.+SP", gpt("175B", 96, 12288, 96), a100, 8, 8, 1, 1, 64, 2048, 2,
       R::kSelective, true, kOff, kFp16, params, kOverlap, 0, F::kStepSeconds, 13.75, false, 13.2525, 13.516},
      {"Korthikanti 2022 T5", "530B full", gpt("530B", 105, 20480, 128), a100, 8, 35, 1, 1, 280, 2048, 3, R::kFull,
       false, kOff, kFp16, params, kOverlap, 0, F::kStepSeconds, 49.05, false, 49.7704, 51.0457},
      {"Korthikanti 2022 T5", "530B sel.+SP", gpt("530B", 105, 20480, 128), a100, 8, 35, 1, 1, 280, 2048, 3,
       R::kSelective, true, kOff, kFp16, params, kOverlap, 0, F::kStepSeconds, 37.83, false, 37.124, 38.0821},
      {"Korthikanti 2022 T5", "1T full", gpt("1T", 128, 25600, 160), a100, 8, 64, 1, 1, 512, 2048, 2, R::kFull,
       false, kOff, kFp16, params, kOverlap, 0, F::kStepSeconds, 94.42, true, 94.4696, 97.0409},
      {"Korthikanti 2022 T5", "1T sel.+SP", gpt("1T", 128, 25600, 160), a100, 8, 64, 1, 1, 512, 2048, 2,
       R::kSelective, true, kOff, kFp16, params, kOverlap, 0, F::kStepSeconds, 71.49, false, 70.9102, 72.8528},
      // DeepSpeed's pipeline engine sends and receives in line with the
      // compute (deepspeed/runtime/pipe/p2p.py refuses async_op): blocking.
      // Its host overhead per block pass as BigScience's (the same engine
      // and activation checkpointing). Micro-batch 2, not stated: the one
      // at which (m + p − 1) slots explain all three rows with one slot time
      // (docs/VALIDATION.md).
      {"Smith 2022 §2.4", "530B, 280 nodes", gpt("MT-NLG 530B", 105, 20480, 128), a100, 8, 35, 8, 2, 1920, 2048, 1,
       R::kFull, false, kOff, kFp16, params, kBlocking, 0, F::kStepSeconds, 60.1, false, 59.404, 59.6911, true},
      {"Smith 2022 §2.4", "530B, 350 nodes", gpt("MT-NLG 530B", 105, 20480, 128), a100, 8, 35, 10, 2, 1920, 2048,
       1, R::kFull, false, kOff, kFp16, params, kBlocking, 0, F::kStepSeconds, 50.2, false, 50.1462, 50.386, true},
      {"Smith 2022 §2.4", "530B, 420 nodes", gpt("MT-NLG 530B", 105, 20480, 128), a100, 8, 35, 12, 2, 1920, 2048,
       1, R::kFull, false, kOff, kFp16, params, kBlocking, 0, F::kStepSeconds, 44.4, false, 43.9743, 44.1827, true},
      // DeepSpeed's pipe partition "type:transformer|embedding" counts the
      // blocks and both embedding copies (the tied head is an EmbeddingPipe):
      // 72 layers, 6 per stage. Jean Zay: four 100 Gb/s Omni-Path links per
      // 8-GPU node. Priced with the fitted per-block-pass host overhead
      // (block_launch_overhead_s).
      {"BigScience 2022", "BLOOM 176B", bigscience_gpt("bloom-176b", 70, 14336, 112), a100, 4, 12, 8, 2, 2048, 2048,
       1, R::kFull, false, ZeroStage::kOne, kBf16, "type:embedding|block|head", kBlocking, 400, F::kHardwareTflops,
       150, false, 149.298, 148.251, true},
      // BigScience's layout search before BLOOM's run (tr11-176B-ml/
      // chronicles-prequel.md, "Rebalancing layers", 2022-02-28): 48 nodes of
      // Jean Zay, the stack, optimizer and partition of BLOOM's run, each
      // shape's rows at 64 heads (its first; other head counts ran up to 18%
      // slower, the fused softmax's constraints among the causes the
      // document names: kernel effects pipeflow does not price). Seconds per
      // iteration at iteration 2.
      prequel("195B, 106 × 12288", 106, 12288, 4, 12, 8, 2, 116.54, 121.108, 120.165),
      prequel("184B, 100 × 12288", 100, 12288, 8, 6, 8, 2, 139.72, 135.631, 131.02),
      prequel("184B, 100 × 12288", 100, 12288, 8, 6, 8, 4, 120.96, 120.95, 120.085),
      prequel("178B, 82 × 13312", 82, 13312, 8, 12, 4, 4, 111.79, 112.817, 112.567),
      prequel("178B, 82 × 13312", 82, 13312, 4, 12, 8, 2, 104.45, 106.935, 106.657),
      prequel("178B, 82 × 13312", 82, 13312, 4, 12, 8, 4, 104.82, 106.022, 107.574),
      prequel("176B, 70 × 14336", 70, 14336, 8, 12, 4, 2, 121.63, 117.913, 115.41),
      prequel("176B, 70 × 14336", 70, 14336, 4, 12, 8, 2, 102.03, 103.28, 103.464),
      prequel("176B, 70 × 14336", 70, 14336, 4, 12, 8, 4, 102.27, 103.266, 105.075),
      // Dubey §3.3.2: the first model chunk of the first stage holds the
      // embedding alone, the last chunk of the last stage the head: one layer
      // per chunk, 128 layers over 16 ranks, v = 8; asynchronous P2P.
      {"Dubey 2024 T4", "405B, 8,192 GPUs", model_preset("llama3-405b"), "h100", 8, 16, 64, 1, 2048, 8192, 8,
       R::kNone, true, ZeroStage::kOne, kBf16, "uniform", kOverlap, 0, F::kModelTflops, 430, false, 433.225, 423.597},
      {"Dubey 2024 T4", "405B, 16,384 GPUs", model_preset("llama3-405b"), "h100", 8, 16, 128, 1, 2048, 8192, 8,
       R::kNone, true, ZeroStage::kOne, kBf16, "uniform", kOverlap, 0, F::kModelTflops, 400, false, 398.491, 389.945},
  };
  return runs;
}

// The host overhead a DeepSpeed-pipeline row is priced with next to the presets:
// fitted on the prequel table (by 0.5 ms: 3.5 ms gives 2.0% mean error,
// 4 ms 1.8%, 4.5 ms 2.5%), BLOOM's and MT-NLG's rows held out of that fit.
constexpr double kPresetLaunchOverheadS = 0.004;

// `launch_overhead_s`: block_launch_overhead_s where the run is priced with
// the DeepSpeed pipeline engine's host overhead.
Layout layout_of(const PublishedRun& run, const HardwareProfile& hardware, double launch_overhead_s) {
  Layout layout;
  layout.model = run.model;
  layout.hardware = hardware;
  if (run.inter_node_gbit_per_node > 0) {
    layout.hardware.inter_node_bandwidth_bytes_per_s =
        run.inter_node_gbit_per_node / 8 * 1e9 / hardware.devices_per_node;
  }
  layout.tensor_parallel = run.tp;
  layout.pipeline_ranks = run.pp;
  layout.data_parallel = run.dp;
  layout.devices = run.tp * run.pp * run.dp;
  layout.micro_batch = run.micro_batch;
  layout.global_batch = run.global_batch;
  layout.seq_length = run.seq_length;
  layout.schedule = run.chunks > 1 ? "interleaved-1f1b" : "1f1b";
  layout.chunks = run.chunks;
  layout.recompute = run.recompute;
  layout.sequence_parallel = run.sequence_parallel;
  layout.zero = run.zero;
  layout.partition = parse_partition_method(run.partition);
  layout.comm_mode = run.comm_mode;
  layout.block_launch_overhead_s = run.priced_with_host_overhead ? launch_overhead_s : 0;
  layout.precision = run.precision;
  layout.gradient_precision = run.precision;
  return layout;
}

double figure_of(const PublishedRun& run, const Prediction& prediction) {
  switch (run.figure) {
    case Figure::kHardwareTflops:
      return prediction.hardware_tflops_per_device;
    case Figure::kModelTflops:
      return prediction.tflops_per_device;
    case Figure::kStepSeconds:
      return prediction.result.step_time_s;
  }
  return 0;
}

const char* unit_of(Figure figure) { return figure == Figure::kStepSeconds ? " s" : " TFLOP/s"; }

std::vector<std::string> table_names() {
  std::vector<std::string> names;
  for (const PublishedRun& run : published_runs()) {
    if (std::find(names.begin(), names.end(), run.table) == names.end()) names.emplace_back(run.table);
  }
  return names;
}

struct ErrorSummary {
  double mean_abs = 0;
  double worst = 0;  // signed, largest in magnitude
  int rows = 0;
  void add(double error) {
    mean_abs += (std::abs(error) - mean_abs) / ++rows;
    if (std::abs(error) > std::abs(worst)) worst = error;
  }
};

std::string table_header() {
  return "| source | run | t × p × d, b, B, v | recompute | published | predicted | error | |\n"
         "|---|---|---|---|---|---|---|---|\n";
}

std::string table_row(const PublishedRun& run, double predicted, const char* note) {
  const char* unit = unit_of(run.figure);
  return fmt::format("| {} | {} | {} × {} × {}, {}, {}, {} | {}{} | {}{} | {:.4g}{} | {:+.1f}% | {} |\n", run.table,
                     run.name, run.tp, run.pp, run.dp, run.micro_batch, run.global_batch, run.chunks,
                     to_string(run.recompute), run.sequence_parallel ? " + SP" : "", run.published, unit, predicted,
                     unit, 100 * (predicted / run.published - 1), note);
}

// A bound on a table's errors: the mean of |error| and the largest.
struct TableBound {
  const char* table;
  double mean, worst;
};

const TableBound& bound_of(const std::vector<TableBound>& bounds, const std::string& table) {
  const auto found =
      std::find_if(bounds.begin(), bounds.end(), [&](const TableBound& bound) { return table == bound.table; });
  if (found == bounds.end()) throw std::logic_error(table + " has no bound");
  return *found;
}

// The table kPresetLaunchOverheadS was fitted on.
constexpr const char* kLaunchOverheadTable = "BigScience 2022 prequel";

// The presets against each table: within 10% mean and 20% worst, the
// three DeepSpeed-pipeline tables within the target (5%, 10%).
// docs/VALIDATION.md.
const std::vector<TableBound> kPresetBounds = {
    {"Narayanan 2021 T1", 0.10, 0.20},       {"Korthikanti 2022 T5", 0.10, 0.20}, {"Smith 2022 §2.4", 0.05, 0.10},
    {"BigScience 2022", 0.05, 0.10},         {"Dubey 2024 T4", 0.10, 0.20},       {"rows not fitted", 0.10, 0.20},
    {"BigScience 2022 prequel", 0.05, 0.10},
};

// Each table held out and predicted by a calibration on the others: the
// target, 5% mean and 10% worst, where it holds; elsewhere what holds.
const std::vector<TableBound> kHeldOutBounds = {
    // Its pipelined rows ran 8.7-10% slower than Korthikanti's Table 5 ran
    // the same replica a year later (529.6B against 530B, 1008B against 1T,
    // both full recomputation, m = 280 and 512): 5.6% mean, +11.2% at 76.1B.
    {"Narayanan 2021 T1", 0.06, 0.12},
    {"Korthikanti 2022 T5", 0.05, 0.10},
    {"Smith 2022 §2.4", 0.05, 0.10},
    {"BigScience 2022", 0.05, 0.10},
    {"BigScience 2022 prequel", 0.05, 0.10},
    {"Dubey 2024 T4", 0.05, 0.10},
};

TEST(Validation, PresetsAgainstPublishedRuns) {
  std::string table = table_header();
  std::map<std::string, ErrorSummary> by_table;
  ErrorSummary held_out;
  for (const PublishedRun& run : published_runs()) {
    const double predicted =
        figure_of(run, predict(layout_of(run, hardware_preset(run.hardware), kPresetLaunchOverheadS)));
    const double error = predicted / run.published - 1;
    EXPECT_NEAR(predicted / run.pinned, 1, 1e-3) << run.name << ": the cost model changed; update docs/VALIDATION.md";
    by_table[run.table].add(error);
    const bool fits_overhead = run.table == std::string(kLaunchOverheadTable);
    if (!run.fitted && !fits_overhead) held_out.add(error);
    table += table_row(run, predicted, run.fitted ? "fitted" : fits_overhead ? "overhead fitted" : "");
  }
  by_table.emplace("rows not fitted", held_out);
  for (const auto& [name, summary] : by_table) {
    table += fmt::format("\n{}: {} rows, mean absolute error {:.1f}%, worst {:+.1f}%", name, summary.rows,
                         100 * summary.mean_abs, 100 * summary.worst);
    const TableBound& bound = bound_of(kPresetBounds, name);
    EXPECT_LE(summary.mean_abs, bound.mean) << name;
    EXPECT_LE(std::abs(summary.worst), bound.worst) << name;
  }
  // MT-NLG's rows at the other combinations of its two inputs Smith et al.
  // do not state, micro-batch 1 or 2 and the host overhead or none (the
  // table above prices 2 with it; docs/VALIDATION.md says why); printed,
  // not asserted.
  table += "\n\nMT-NLG, each unstated input alone (printed, not asserted): b = 1 without the host overhead, b = 1 "
           "with it, b = 2 without it";
  for (PublishedRun run : published_runs()) {
    if (run.table != std::string("Smith 2022 §2.4")) continue;
    table += fmt::format("\n{}:", run.name);
    for (const auto& [micro_batch, overhead] : {std::pair{1, false}, std::pair{1, true}, std::pair{2, false}}) {
      run.micro_batch = micro_batch;
      run.priced_with_host_overhead = overhead;
      const double step =
          figure_of(run, predict(layout_of(run, hardware_preset(run.hardware), kPresetLaunchOverheadS)));
      table += fmt::format(" {:.4g} s ({:+.1f}%)", step, 100 * (step / run.published - 1));
    }
  }
  std::puts(table.c_str());
}

// The calibrated part of the cost model: a100's GEMM plateau (efficiency)
// and the curve's half size (hardware.h). Every other preset keeps its
// plateau's ratio to a100's (h100: 0.66 / 0.745, from large bf16 GEMM
// benchmarks' share of peak), so one calibration prices A100 and H100 runs,
// each at its own peak.
struct Calibration {
  double efficiency = 0;
  double half_size = 0;
  double launch_overhead_s = 0;  // block_launch_overhead_s of the DeepSpeed-pipeline runs
};

HardwareProfile calibrated(const char* preset, const Calibration& calibration) {
  HardwareProfile hardware = hardware_preset(preset);
  hardware.efficiency *= calibration.efficiency / hardware_preset("a100-80g").efficiency;
  hardware.matmul_half_size = calibration.half_size;
  return hardware;
}

// Every GEMM's seconds are proportional to 1 / efficiency at a fixed half
// size (hardware.h), the rest of the step (memory-bound kernels, links) not,
// and the host overhead adds to every block pass: a run's step time is
// a + b / efficiency + k · overhead while its critical path keeps its shape.
// The search prices each run at two plateaus per half size (and a
// DeepSpeed-pipeline run at one overhead more) and interpolates; the chosen
// calibration is then priced in full by predict().
constexpr std::array<double, 2> kSampledEfficiencies = {0.6, 0.9};
constexpr double kHalfSizeStep = 40;
constexpr int kHalfSizes = 2;  // 0, 40: on 0 to 120 by 15, every held-out fit chose 0
constexpr double kSampledOverheadS = 0.005;
constexpr double kOverheadStepS = 0.0001;
constexpr int kOverheads = 81;  // 0 to 8 ms by 0.1 ms

struct StepCurve {
  double a = 0;
  double b = 0;
  double k = 0;
  double at(double efficiency, double overhead_s) const { return a + b / efficiency + k * overhead_s; }
};

struct RunCurves {
  std::vector<StepCurve> by_half_size;  // kHalfSizes
  double flops_per_device_step = 0;     // the figure × step time, for TFLOP/s figures
};

RunCurves step_curves(const PublishedRun& run) {
  RunCurves curves;
  for (int i = 0; i < kHalfSizes; ++i) {
    std::array<double, 2> steps{};
    for (std::size_t e = 0; e < 2; ++e) {
      const Calibration sample{kSampledEfficiencies[e], kHalfSizeStep * i};
      const Prediction prediction = predict(layout_of(run, calibrated(run.hardware, sample), 0));
      steps[e] = prediction.result.step_time_s;
      curves.flops_per_device_step = figure_of(run, prediction) * steps[e];
    }
    const double b = (steps[0] - steps[1]) / (1 / kSampledEfficiencies[0] - 1 / kSampledEfficiencies[1]);
    double k = 0;
    if (run.priced_with_host_overhead) {
      const Calibration sample{kSampledEfficiencies[0], kHalfSizeStep * i};
      const double slower =
          predict(layout_of(run, calibrated(run.hardware, sample), kSampledOverheadS)).result.step_time_s;
      k = (slower - steps[0]) / kSampledOverheadS;
    }
    curves.by_half_size.push_back({steps[0] - b / kSampledEfficiencies[0], b, k});
  }
  return curves;
}

double curve_figure(const PublishedRun& run, const RunCurves& curves, const Calibration& calibration) {
  const auto half_size_index = static_cast<std::size_t>(calibration.half_size / kHalfSizeStep);
  const double step = curves.by_half_size[half_size_index].at(calibration.efficiency, calibration.launch_overhead_s);
  return run.figure == Figure::kStepSeconds ? step : curves.flops_per_device_step / step;
}

// The calibration that best fits every table but the held-out one: the least
// mean over tables of each table's mean squared log error (each table
// weighs the same, whatever its rows); efficiency by a 0.001 scan, the
// host overhead by 0.1 ms (it moves only the DeepSpeed-pipeline rows).
Calibration calibrate_without(const std::string& held_out, const std::vector<RunCurves>& curves) {
  const std::vector<PublishedRun>& runs = published_runs();
  std::vector<std::size_t> fitted;  // the calibration's rows
  std::map<std::string, double> rows_of;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].table == held_out) continue;
    fitted.push_back(r);
    rows_of[runs[r].table] += 1;
  }
  const auto cost_of = [&](const Calibration& candidate) {
    double cost = 0;
    for (const std::size_t r : fitted) {
      const double log_error = std::log(curve_figure(runs[r], curves[r], candidate) / runs[r].published);
      cost += log_error * log_error / rows_of[runs[r].table];
    }
    return cost;
  };
  Calibration best;
  double best_cost = std::numeric_limits<double>::infinity();
  const auto consider = [&](const Calibration& candidate) {
    const double cost = cost_of(candidate);
    if (cost < best_cost) {
      best_cost = cost;
      best = candidate;
    }
  };
  // The cost has one minimum in efficiency at a fixed half size and
  // overhead: a 0.01 scan over [0.5, 1], then 0.001 steps around its best.
  for (int i = 0; i < kHalfSizes; ++i) {
    for (int o = 0; o < kOverheads; ++o) {
      int coarse = 500;
      double coarse_cost = std::numeric_limits<double>::infinity();
      for (int milli = 500; milli <= 1000; milli += 10) {
        const double cost = cost_of({milli / 1000.0, kHalfSizeStep * i, kOverheadStepS * o});
        if (cost < coarse_cost) {
          coarse_cost = cost;
          coarse = milli;
        }
      }
      for (int milli = std::max(500, coarse - 10); milli <= std::min(1000, coarse + 10); ++milli) {
        consider({milli / 1000.0, kHalfSizeStep * i, kOverheadStepS * o});
      }
    }
  }
  return best;
}

// The held-out table's rows predicted in full with `calibration`, each
// against its pinned held_out figure, into `table`; their errors summarised.
ErrorSummary predict_table(const std::string& held_out, const Calibration& calibration,
                           const std::vector<RunCurves>& curves, std::string& table) {
  const std::vector<PublishedRun>& runs = published_runs();
  ErrorSummary summary;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const PublishedRun& run = runs[r];
    if (run.table != held_out) continue;
    const double predicted = figure_of(
        run, predict(layout_of(run, calibrated(run.hardware, calibration), calibration.launch_overhead_s)));
    // The interpolated step the search ranked by, against the full price.
    const double interpolated = curve_figure(run, curves[r], calibration);
    EXPECT_NEAR(interpolated / predicted, 1, 0.01) << run.name;
    EXPECT_NEAR(predicted / run.held_out, 1, 1e-3)
        << run.name << ": the cost model or the calibration changed; update docs/VALIDATION.md";
    summary.add(predicted / run.published - 1);
    table += table_row(run, predicted, "");
  }
  return summary;
}

std::string summary_row(const std::string& held_out, const Calibration& calibration, const ErrorSummary& summary) {
  return fmt::format("| {} | {:.3f}, {:g}, {:.1f} ms | {} | {:.1f}% | {:+.1f}% |\n", held_out,
                     calibration.efficiency, calibration.half_size, 1e3 * calibration.launch_overhead_s, summary.rows,
                     100 * summary.mean_abs, 100 * summary.worst);
}

TEST(Validation, LeaveOneTableOut) {
  const std::vector<PublishedRun>& runs = published_runs();
  std::vector<RunCurves> curves;
  for (const PublishedRun& run : runs) curves.push_back(step_curves(run));

  const std::string header =
      "\n| held-out table | calibrated on the others: efficiency, half size, host overhead | rows | mean abs. "
      "error | worst |\n"
      "|---|---|---|---|---|\n";
  std::string table = table_header();
  std::string summaries = header;
  for (const std::string& held_out : table_names()) {
    const Calibration calibration = calibrate_without(held_out, curves);
    const ErrorSummary summary = predict_table(held_out, calibration, curves, table);
    summaries += summary_row(held_out, calibration, summary);
    const TableBound& bound = bound_of(kHeldOutBounds, held_out);
    EXPECT_LE(summary.mean_abs, bound.mean) << held_out;
    EXPECT_LE(std::abs(summary.worst), bound.worst) << held_out;
  }
  std::puts((table + summaries).c_str());
}

}  // namespace
}  // namespace pipeflow
