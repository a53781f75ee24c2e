#include "pipeflow/sim/cost_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "../support/error_of.h"
#include "pipeflow/config/rules.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/sim/prediction.h"

namespace pipeflow {
namespace {

using testing::error_of;

// A layout with one device per (tp, pp, dp) rank and micro-batches of 1.
Layout make_layout(const char* model, const char* hardware, int tp, int pp, int dp, int global_batch, int seq_length) {
  Layout layout;
  layout.model = model_preset(model);
  layout.hardware = hardware_preset(hardware);
  layout.tensor_parallel = tp;
  layout.pipeline_ranks = pp;
  layout.data_parallel = dp;
  layout.devices = tp * pp * dp;
  layout.global_batch = global_batch;
  layout.seq_length = seq_length;
  layout.precision = Precision::kBf16;  // Korthikanti's and the ZeRO paper's 2-byte accounting
  layout.gradient_precision = Precision::kBf16;
  layout.gradient_accumulation = Precision::kBf16;
  return layout;
}

// GPT-3 175B in 4 pipeline stages cut so that stage 1 is block.0 alone and
// stage 2 block.1 alone: per-stage figures are per-layer figures.
Layout single_block_stages(int tensor_parallel, bool sequence_parallel, Recompute recompute) {
  Layout layout = make_layout("gpt3-175b", "a100-80g", tensor_parallel, 4, 1, 8, 2048);
  layout.recompute = recompute;
  layout.sequence_parallel = sequence_parallel;
  layout.partition = parse_partition_method("bounds:0,1,2,3,98");
  return layout;
}

const StageCosts& block_stage(const LayoutCosts& costs) { return costs.costs.stages[1]; }

LayoutCosts costs_of(const Layout& layout) { return layout_costs(layout, layout_schedule(layout)); }

Layout make_layout_like(Layout layout, int recompute_interval) {
  layout.recompute_interval = recompute_interval;
  return layout;
}

double worst_peak(const Prediction& prediction) {
  double peak = 0;
  for (const RankResult& rank : prediction.result.ranks) peak = std::max(peak, rank.peak_memory_bytes);
  return peak;
}

Layout make_zero(Layout layout, ZeroStage zero) {
  layout.zero = zero;
  return layout;
}

// Korthikanti et al. 2022 eq. 1-6 per layer (GPT-3 175B, b = 1, s = 2048,
// h = 12288, a = 96, t = 8), through the cost model's per-stage figure.
TEST(CostModel, StageActivationsReproduceKorthikantisPerLayerExpressions) {
  const double s = 2048, h = 12288, a = 96, t = 8;
  const double sbh = s * h;
  using R = Recompute;
  EXPECT_DOUBLE_EQ(block_stage(costs_of(single_block_stages(1, false, R::kNone))).activation_bytes,
                   sbh * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(block_stage(costs_of(single_block_stages(8, false, R::kNone))).activation_bytes,
                   sbh * (10 + 24 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(block_stage(costs_of(single_block_stages(8, true, R::kNone))).activation_bytes,
                   sbh * (34 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(block_stage(costs_of(single_block_stages(8, false, R::kSelective))).activation_bytes,
                   sbh * (10 + 24 / t));
  EXPECT_DOUBLE_EQ(block_stage(costs_of(single_block_stages(8, true, R::kSelective))).activation_bytes,
                   sbh * 34 / t);
  EXPECT_DOUBLE_EQ(block_stage(costs_of(single_block_stages(8, false, R::kFull))).activation_bytes, 2 * sbh);
}

// Full recomputation every k layers (activation_checkpoint_interval), as
// nn::Stage keeps it: of a stage's layers only every k-th from its first
// keeps its input (2·sbh in bf16), and a backward rebuilds min(k, blocks)
// blocks' whole activations (34·sbh + 5·a·s²·b each, t = 1) above that. The
// recomputed FLOPs, and so the step time, do not depend on k: every block's
// forward runs once more either way.
TEST(CostModel, ACheckpointIntervalKeepsEveryKthInputAndRebuildsKBlocks) {
  const double s = 2048, h = 12288, a = 96, sbh = s * h;
  const double whole_block = sbh * (34 + 5 * a * s / h);
  Layout layout = make_layout("gpt3-175b", "a100-80g", 1, 2, 1, 8, 2048);
  layout.recompute = Recompute::kFull;
  layout.partition = parse_partition_method("bounds:0,10,98");  // stage 1: blocks 9..95 and the head
  const LayoutCosts one = costs_of(layout);
  layout.recompute_interval = 4;
  const LayoutCosts four = costs_of(layout);
  // Stage 0: the embedding (local layer 0) and blocks 0-8 (local 1-9): k = 4 keeps blocks at local 4 and 8.
  EXPECT_DOUBLE_EQ(one.costs.stages[0].activation_bytes - four.costs.stages[0].activation_bytes, 7 * 2 * sbh);
  EXPECT_DOUBLE_EQ(one.costs.stages[0].backward_working_bytes, whole_block);
  EXPECT_DOUBLE_EQ(four.costs.stages[0].backward_working_bytes, 4 * whole_block);
  // Stage 1: blocks 9..95 at local 0..86 (22 of them at multiples of 4) and the head.
  EXPECT_DOUBLE_EQ(one.costs.stages[1].activation_bytes - four.costs.stages[1].activation_bytes, (87 - 22) * 2 * sbh);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_DOUBLE_EQ(four.costs.stages[i].forward_s, one.costs.stages[i].forward_s);
    EXPECT_DOUBLE_EQ(four.costs.stages[i].backward_s, one.costs.stages[i].backward_s);
  }
  // The trade: with 1F1B's two micro-batches in flight the larger segment
  // rebuilt outweighs the inputs saved; with GPipe's 8 the saving wins.
  EXPECT_GT(worst_peak(predict(layout)), worst_peak(predict(make_layout_like(layout, 1))));
  layout.schedule = "gpipe";
  EXPECT_LT(worst_peak(predict(layout)), worst_peak(predict(make_layout_like(layout, 1))));
}

// ZeRO-3 gathers each stage's bf16 parameters from the d replicas before
// every F and every backward ((d-1)/d·2Ψ bytes a gather on a ring), and
// reduce-scatters the gradients instead of all-reducing them: slower steps
// than ZeRO-1, which moves the same bytes as plain data parallelism.
TEST(CostModel, ZeroThreeGathersTheParametersForEveryForwardAndBackward) {
  Layout layout = single_block_stages(1, false, Recompute::kNone);
  const double block = 12.0 * 12288 * 12288 + 13.0 * 12288;
  layout.data_parallel = 4;
  layout.devices = 16;
  layout.global_batch = 32;
  layout.zero = ZeroStage::kOne;
  const LayoutCosts zero1 = costs_of(layout);
  layout.zero = ZeroStage::kThree;
  const LayoutCosts zero3 = costs_of(layout);
  const LinkCost link = zero3.costs.data_parallel_links[1];
  const double gather = 0.75 * 2 * block / link.bandwidth_bytes_per_s + 3 * link.latency_s;
  EXPECT_DOUBLE_EQ(block_stage(zero3).forward_s - block_stage(zero1).forward_s, gather);
  EXPECT_DOUBLE_EQ(block_stage(zero3).backward_s - block_stage(zero1).backward_s, gather);
  EXPECT_DOUBLE_EQ(block_stage(zero3).gradient_bytes, block_stage(zero1).gradient_bytes / 2);
  EXPECT_DOUBLE_EQ(block_stage(zero3).model_state_bytes, 16 * block / 4);
  EXPECT_GT(predict(layout).result.step_time_s, predict(make_zero(layout, ZeroStage::kOne)).result.step_time_s);
}

// W keeps each matrix's input and output gradient: 2·sbh·(4 + (4h + 2f)/(h·t))
// = sbh·(8 + 24/t) for GPT (f = 4h), whatever the recomputation.
TEST(CostModel, WeightGradientShareIsTheMatrixInputsAndOutputGradients) {
  const double sbh = 2048.0 * 12288;
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    EXPECT_DOUBLE_EQ(block_stage(costs_of(single_block_stages(1, false, r))).weight_gradient_bytes, sbh * 32);
    EXPECT_DOUBLE_EQ(block_stage(costs_of(single_block_stages(8, false, r))).weight_gradient_bytes,
                     sbh * (8 + 24.0 / 8));
    EXPECT_DOUBLE_EQ(block_stage(costs_of(single_block_stages(8, true, r))).weight_gradient_bytes, sbh * 32 / 8);
  }
  ParallelConfig config;
  config.seq_length = 8;
  const ModelSpec llama = model_preset("llama3-8b");  // h 4096, 8 kv heads of 128, f 14336
  EXPECT_DOUBLE_EQ(weight_gradient_bytes(llama, config, LayerKind::kBlock), 2.0 * 8 * (4 * 4096 + 2 * 4096 + 2048 + 3 * 14336));
  EXPECT_DOUBLE_EQ(weight_gradient_bytes(llama, config, LayerKind::kHead), 2.0 * 8 * (4096 + 128256));
  EXPECT_DOUBLE_EQ(weight_gradient_bytes(llama, config, LayerKind::kEmbedding), 2.0 * 8 * 4096);
}

// a100-80g's curve (hardware.h): a GEMM m×k by k×n at 312 TFLOP/s × 0.745 ×
// x/(x + 60), x = 1/(1/m + 1/n + 1/k); memory-bound kernels at 0.85 × 2039
// GB/s; all-reduces at 0.77 × 300 GB/s. GPT-3 175B (dropout: 1-byte masks), b = 1,
// s = 2048, t = 8: F = the four linear GEMMs + the attention core (12 heads
// of QKᵀ and probs·V, k = 128) + the bytes of LayerNorm, bias-dropout-add,
// GELU and softmax + 2 ring all-reduces of the b·s·h bf16 activation; I the
// same GEMMs, the core twice, the backward kernels' bytes and 2 all-reduces;
// W the linear GEMMs alone. (Before the curve, every FLOP ran at 0.65 of
// peak; the expected values changed with the cost model: docs/VALIDATION.md.)
TEST(CostModel, BlockDurationsFollowTheGemmCurveMemoryBoundKernelsAndTensorParallelAllReduces) {
  const Layout layout = single_block_stages(8, false, Recompute::kNone);
  const StageCosts stage = block_stage(costs_of(layout));
  const double s = 2048, h = 12288, t = 8, d = 128, heads = 96 / t;
  const auto gemm = [](double m, double n, double k) {
    const double x = 1 / (1 / m + 1 / n + 1 / k);
    return 2 * m * n * k / (312e12 * 0.745 * x / (x + 60));
  };
  const double linear = gemm(s, 3 * h / t, h) + gemm(s, h, h / t) + gemm(s, 4 * h / t, h) + gemm(s, h, 4 * h / t);
  const double core = heads * (gemm(s, s, d) + gemm(s, d, s));
  const double hbm = 0.85 * 2039e9;
  const double wide = s * h, mlp = s * 4 * h / t, scores = heads * s * s;
  // e = 2: LayerNorm 2e / 3e, bias-dropout-add 3e + 1 / 2e + 1, GELU 2e / 3e,
  // softmax 2e / 3e and its dropout 2e + 1 both ways (forward / backward).
  const double forward_bytes = 2 * 4 * wide + 2 * 7 * wide + 4 * mlp + 9 * scores;
  const double backward_bytes = 2 * 6 * wide + 2 * 5 * wide + 6 * mlp + 11 * scores;
  const double all_reduce = 2 * (t - 1) / t * (2 * s * h) / (0.77 * 300e9) + 2 * (t - 1) * 3e-6;
  EXPECT_NEAR(stage.forward_s, linear + core + forward_bytes / hbm + 2 * all_reduce, 1e-12);
  EXPECT_NEAR(stage.backward_input_s, linear + 2 * core + backward_bytes / hbm + 2 * all_reduce, 1e-12);
  EXPECT_NEAR(stage.backward_weight_s, linear, 1e-12);
  EXPECT_DOUBLE_EQ(stage.backward_s, stage.backward_input_s + stage.backward_weight_s);
  // Full recompute repeats the forward, its kernels and all-reduces included, inside I.
  const StageCosts full = block_stage(costs_of(single_block_stages(8, false, Recompute::kFull)));
  EXPECT_NEAR(full.backward_input_s, stage.backward_input_s + stage.forward_s, 1e-12);
  // Selective recompute repeats the attention core and its softmax.
  const StageCosts selective = block_stage(costs_of(single_block_stages(8, false, Recompute::kSelective)));
  EXPECT_NEAR(selective.backward_input_s, stage.backward_input_s + core + 9 * scores / hbm, 1e-12);
  // Scatter/gather: each of the t ranks sends b·s·h/t bf16 elements.
  EXPECT_DOUBLE_EQ(stage.output_bytes, 2 * s * h / t);
}

// The curve: thin GEMMs run far below the plateau, wide ones approach it;
// matmul_half_size 0 is flat.
// block_launch_overhead_s c: a block's F gains c, its I c (2c with full
// recomputation: the rebuilt forward's launches too), its W c; the
// embedding and the head gain nothing. Stage 3 holds blocks 2..95 (94) and the head.
TEST(CostModel, SynchronousLaunchesAddTheHostTimeToEveryBlockPass) {
  for (const Recompute recompute : {Recompute::kNone, Recompute::kFull}) {
    Layout layout = single_block_stages(8, false, recompute);
    const LayoutCosts base = costs_of(layout);
    layout.block_launch_overhead_s = 0.004;
    const LayoutCosts slow = costs_of(layout);
    const double rebuilt = recompute == Recompute::kFull ? 0.004 : 0;
    const StageCosts& embedding = slow.costs.stages[0];
    EXPECT_DOUBLE_EQ(embedding.forward_s, base.costs.stages[0].forward_s);
    EXPECT_DOUBLE_EQ(embedding.backward_s, base.costs.stages[0].backward_s);
    const StageCosts& block = block_stage(slow);
    EXPECT_NEAR(block.forward_s - block_stage(base).forward_s, 0.004, 1e-12);
    EXPECT_NEAR(block.backward_input_s - block_stage(base).backward_input_s, 0.004 + rebuilt, 1e-12);
    EXPECT_NEAR(block.backward_weight_s - block_stage(base).backward_weight_s, 0.004, 1e-12);
    EXPECT_NEAR(block.backward_s - block_stage(base).backward_s, 0.008 + rebuilt, 1e-12);
    EXPECT_NEAR(slow.costs.stages[3].forward_s - base.costs.stages[3].forward_s, 94 * 0.004, 1e-9);
    EXPECT_NEAR(slow.costs.stages[3].backward_s - base.costs.stages[3].backward_s, 94 * (0.008 + rebuilt), 1e-9);
  }
}

TEST(CostModel, MatmulEfficiencyRisesWithTheGemmsSize) {
  HardwareProfile a100 = hardware_preset("a100-80g");
  EXPECT_DOUBLE_EQ(matmul_efficiency(a100, 60 * 3, 60 * 3, 60 * 3), 0.745 / 2);
  EXPECT_LT(matmul_efficiency(a100, 2048, 2048, 128), 0.55);
  EXPECT_GT(matmul_efficiency(a100, 8192, 8192, 8192), 0.72);
  a100.matmul_half_size = 0;
  EXPECT_DOUBLE_EQ(matmul_efficiency(a100, 2048, 2048, 128), 0.745);
}

TEST(CostModel, ModelStatesAre16BytesPerParameterAndZeroOneShardsTheOptimizer) {
  Layout layout = single_block_stages(1, false, Recompute::kNone);
  const double block = 12.0 * 12288 * 12288 + 13.0 * 12288;  // Narayanan eq. 2, per block
  EXPECT_DOUBLE_EQ(block_stage(costs_of(layout)).model_state_bytes, 16 * block);
  layout.data_parallel = 4;
  layout.devices = 16;
  layout.global_batch = 32;
  layout.zero = ZeroStage::kOne;
  const StageCosts sharded = block_stage(costs_of(layout));
  EXPECT_DOUBLE_EQ(sharded.model_state_bytes, 4 * block + 12 * block / 4);
  // The optimizer touches 28 B per local parameter at the streaming share of the HBM bandwidth.
  EXPECT_DOUBLE_EQ(sharded.optimizer_s, 28 * (block / 4) / (0.85 * 2039e9));
  EXPECT_DOUBLE_EQ(sharded.gradient_bytes, 2 * block);
}

// Gradients accumulated in fp32 (DeepSpeed's bf16 optimizer, Megatron-LM's
// bf16): 2 + 4 + 12 = 18 B a parameter; 6Ψ + 12Ψ/d under ZeRO-1. The wire
// (communication_data_type) is another setting: still 2 B a parameter.
TEST(CostModel, Fp32GradientAccumulationHolds18BytesPerParameter) {
  Layout layout = single_block_stages(1, false, Recompute::kNone);
  layout.gradient_accumulation = Precision::kFp32;
  const double block = 12.0 * 12288 * 12288 + 13.0 * 12288;
  EXPECT_DOUBLE_EQ(block_stage(costs_of(layout)).model_state_bytes, 18 * block);
  EXPECT_DOUBLE_EQ(block_stage(costs_of(layout)).gradient_bytes, 2 * block);
  layout.data_parallel = 4;
  layout.devices = 16;
  layout.global_batch = 32;
  layout.zero = ZeroStage::kOne;
  EXPECT_DOUBLE_EQ(block_stage(costs_of(layout)).model_state_bytes, 6 * block + 12 * block / 4);
}

// The same layout in fp32: 4-byte activations (Korthikanti's 34·sbh +
// 5·as²b becomes 66·sbh + 9·as²b: the 2-byte terms doubled, the 1-byte
// dropout masks as they were), fp32 Adam's states
// (8Ψ + 8Ψ/d under ZeRO-1), 4-byte gradients on the wire, and the block's
// GEMMs at the fp32 peak (19.5 against 312 TFLOP/s: 16 times the GEMM time);
// communication_data_type alone changes the gradients' bytes.
TEST(CostModel, Fp32DoublesTheElementsAndPricesGemmsAtTheFp32Peak) {
  const double block = 12.0 * 12288 * 12288 + 13.0 * 12288;
  Layout half = single_block_stages(1, false, Recompute::kNone);
  Layout full = half;
  full.precision = Precision::kFp32;
  full.gradient_precision = Precision::kFp32;
  const StageCosts h = block_stage(costs_of(half));
  const StageCosts f = block_stage(costs_of(full));
  const double s = 2048, hidden = 12288, a = 96;
  EXPECT_DOUBLE_EQ(h.activation_bytes, s * hidden * (34 + 5 * a * s / hidden));
  EXPECT_DOUBLE_EQ(f.activation_bytes, s * hidden * (66 + 9 * a * s / hidden));
  EXPECT_DOUBLE_EQ(f.model_state_bytes, 16 * block);
  for (Layout* layout : {&half, &full}) {
    layout->data_parallel = 4;
    layout->devices = 16;
    layout->global_batch = 32;
    layout->zero = ZeroStage::kOne;
  }
  EXPECT_DOUBLE_EQ(block_stage(costs_of(full)).model_state_bytes, 8 * block + 8 * block / 4);
  EXPECT_DOUBLE_EQ(block_stage(costs_of(full)).gradient_bytes, 4 * block);
  Layout reduced_in_half = full;
  reduced_in_half.gradient_precision = Precision::kBf16;
  EXPECT_DOUBLE_EQ(block_stage(costs_of(reduced_in_half)).gradient_bytes, 2 * block);
  // Compute-bound GEMMs: the block's forward in fp32 over bf16 lies between
  // the peak ratio for its GEMMs (16) and 1 for its memory-bound kernels.
  const double ratio = f.forward_s / h.forward_s;
  EXPECT_GT(ratio, 8);
  EXPECT_LT(ratio, 16);
}

// Devices pp_rank·(t·d) + dp_rank·t + tp_rank, 8 per node: with t = 2, d = 2
// pipeline neighbours are 4 devices apart (two per node), with t = 8 they
// are on different nodes.
TEST(CostModel, LinksFollowMegatronsDeviceOrder) {
  Layout layout = single_block_stages(2, false, Recompute::kNone);
  layout.data_parallel = 2;
  layout.devices = 16;
  LayoutCosts costs = costs_of(layout);
  const LinkCost intra = costs.costs.links.at(RankId(0), RankId(1));
  EXPECT_DOUBLE_EQ(intra.bandwidth_bytes_per_s, 300e9);
  EXPECT_DOUBLE_EQ(intra.latency_s, 3e-6);
  const LinkCost across = costs.costs.links.at(RankId(1), RankId(2));  // devices 4 and 8
  EXPECT_DOUBLE_EQ(across.bandwidth_bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(across.latency_s, 8e-6);
  // The data-parallel pair of rank 0 (devices 0, 2) shares a node; a
  // collective runs at the bus efficiency (0.77) of the link.
  EXPECT_DOUBLE_EQ(costs.costs.data_parallel_links[0].bandwidth_bytes_per_s, 0.77 * 300e9);
  EXPECT_EQ(costs.costs.data_parallel, 2);

  layout = single_block_stages(8, false, Recompute::kNone);
  costs = costs_of(layout);
  EXPECT_DOUBLE_EQ(costs.costs.links.at(RankId(0), RankId(1)).bandwidth_bytes_per_s, 25e9);
  // With t = 8 a data-parallel ring leaves the node (devices 0 and 8): it runs at the inter-node link.
  layout.data_parallel = 2;
  layout.devices = 64;
  costs = costs_of(layout);
  EXPECT_DOUBLE_EQ(costs.costs.data_parallel_links[0].bandwidth_bytes_per_s, 0.77 * 25e9);
  EXPECT_DOUBLE_EQ(costs.costs.data_parallel_links[0].latency_s, 8e-6);
}

Layout gpt3_175b_example() {
  Layout layout = make_layout("gpt3-175b", "a100-80g", 8, 8, 24, 1536, 2048);
  layout.schedule = "interleaved-1f1b";
  layout.chunks = 3;
  layout.recompute = Recompute::kSelective;
  return layout;
}

// MFU counts Narayanan eq. 3 without recomputation:
// 72·B·L·s·h²·(1 + s/(6h) + V/(12hL)).
TEST(Predict, ThroughputFiguresFollowTheirDefinitions) {
  const Layout layout = gpt3_175b_example();
  const Prediction p = predict(layout);
  const double B = 1536, L = 96, s = 2048, h = 12288, V = 50257;
  const double model_flops = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L));
  EXPECT_NEAR(p.costs.model_flops_per_step / model_flops, 1, 1e-12);
  EXPECT_EQ(p.microbatches, 64);
  EXPECT_EQ(p.schedule.num_stages(), 24);
  const double step = p.result.step_time_s;
  EXPECT_NEAR(p.tokens_per_s / (B * s / step), 1, 1e-12);
  EXPECT_NEAR(p.mfu / (model_flops / (step * 1536 * 312e12)), 1, 1e-12);
  EXPECT_NEAR(p.tflops_per_device / (model_flops / (step * 1536) / 1e12), 1, 1e-12);
  EXPECT_GT(p.hfu, p.mfu);  // selective recompute repeats the attention core
  // Interleaving: rank 0 holds L·(1 + (p − 1)/(p·v)) blocks' worth at its peak.
  EXPECT_EQ(p.result.ranks[0].peak_inflight, 31);
}

TEST(Predict, WarnsWhenARankOutgrowsTheDeviceAndNamesTheFix) {
  const Prediction p = predict(gpt3_175b_example());
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_EQ(p.warnings[0].substr(0, 28), "rank 0 needs 80.3 GiB at its");
  EXPECT_NE(p.warnings[0].find("but a100-80g has 80.0 GiB per device: use --recompute full, --sequence-parallel, "
                               "--zero 1, more pipeline stages (--pp)"),
            std::string::npos)
      << p.warnings[0];
  Layout sp = gpt3_175b_example();
  sp.sequence_parallel = true;
  EXPECT_TRUE(predict(sp).warnings.empty());
}

// 1F1B's first stage holds p micro-batches, GPipe's all m (gpt2-124m, 4 stages).
TEST(Predict, FirstStageHoldsPMicrobatchesUnder1f1bAndMUnderGpipe) {
  Layout layout = make_layout("gpt2-124m", "a100-80g", 1, 4, 1, 12, 1024);
  for (const char* name : {"1f1b", "gpipe"}) {
    layout.schedule = name;
    const Prediction p = predict(layout);
    const StageCosts& first = p.costs.costs.stages[0];
    const double expected = std::string(name) == "1f1b" ? 4 : 12;
    EXPECT_DOUBLE_EQ(p.result.ranks[0].activation_bytes, expected * first.activation_bytes) << name;
    EXPECT_DOUBLE_EQ(p.result.ranks[0].peak_memory_bytes,
                     first.model_state_bytes + expected * first.activation_bytes + first.comm_buffer_bytes);
  }
}

TEST(Predict, BlockingCommunicationSimulatesTheLoweredScheduleAndCostsMore) {
  Layout layout = gpt3_175b_example();
  const Prediction overlapped = predict(layout);
  layout.comm_mode = CommMode::kBlocking;
  const Prediction blocking = predict(layout);
  EXPECT_FALSE(overlapped.schedule.has_communication());
  EXPECT_TRUE(blocking.schedule.has_communication());
  EXPECT_GT(blocking.result.step_time_s, overlapped.result.step_time_s);
  EXPECT_GT(blocking.result.ranks[0].comm_s, blocking.result.ranks[0].all_reduce_s);
}

TEST(Predict, AMeasuredProfileReplacesTheComputedDurations) {
  const Layout layout = make_layout("gpt-tiny", "cpu", 1, 2, 1, 4, 64);
  MeasuredProfile profile;
  profile.stages.resize(2);
  profile.stages[0].costs.forward_s = 0.01;
  profile.stages[0].costs.backward_s = 0.02;
  profile.stages[0].costs.output_bytes = 1000;
  profile.stages[0].set_measured(&StageCosts::activation_bytes, 5e5);
  profile.stages[1].costs.forward_s = 0.02;
  profile.stages[1].costs.backward_s = 0.04;
  for (ProfiledStage& stage : profile.stages) stage.set_measured(&StageCosts::optimizer_s, 0.005);
  profile.link = {1e-6, 1e9};
  const Prediction p = predict(layout, &profile);
  // 1F1B, the second stage the slowest: 0.01 + 1 us + 1 us (1000 B at 1 GB/s) to
  // fill, 4 × 0.06 on stage 1, the last gradient back and its backward; then
  // rank 0's optimizer step.
  EXPECT_NEAR(p.result.pipeline_time_s, 0.01 + 2e-6 + 4 * 0.06 + 2e-6 + 0.02, 1e-12);
  EXPECT_NEAR(p.result.step_time_s, p.result.pipeline_time_s + 0.005, 1e-12);
  EXPECT_DOUBLE_EQ(p.costs.costs.stages[0].activation_bytes, 5e5);
  EXPECT_DOUBLE_EQ(p.result.ranks[0].activation_bytes, 2 * 5e5);

  Layout variable = layout;
  variable.variable_seq_lengths = {32, 64};
  EXPECT_EQ(error_of([&] { predict(variable, &profile); }),
            "variable_seq_lengths with a measured profile (--profile): the profile's durations are one micro-batch "
            "shape's, and micro-batches of their own shapes are priced by the cost model alone; drop one of the two");

  profile.stages.pop_back();
  EXPECT_EQ(error_of([&] { predict(layout, &profile); }),
            "profile has 1 stages but the simulated layout has 2: measure the same pipeline stages × virtual stages");
}

TEST(Layout, RulesNameBothSidesAndTheFix) {
  Layout layout = gpt3_175b_example();
  layout.data_parallel = 16;
  EXPECT_EQ(error_of([&] { validate_layout(layout); }),
            "tensor_parallel × pipeline stages × data_parallel = 8 × 8 × 16 = 1024 devices, not 1536: use "
            "data_parallel 24 or devices 1024");
  layout = gpt3_175b_example();
  layout.global_batch = 1000;
  EXPECT_EQ(error_of([&] { validate_layout(layout); }),
            "global batch 1000 is not a multiple of micro-batch × data parallel = 1 × 24 = 24: use a global batch "
            "of 984 or 1008");
  layout = gpt3_175b_example();
  layout.tensor_parallel = 0;
  EXPECT_EQ(error_of([&] { validate_layout(layout); }),
            "tensor parallel = 0: must be >= 1: use 1 for no tensor parallelism");
  // 96 × 98 × 1000000 wrapped around int (pipeflow simulate said "internal: negative device index").
  layout = gpt3_175b_example();
  layout.tensor_parallel = 96;
  layout.pipeline_ranks = 98;
  layout.data_parallel = 1000000;
  EXPECT_EQ(error_of([&] { validate_layout(layout); }),
            "tensor_parallel × pipeline stages × data_parallel = 96 × 98 × 1000000: more than 2147483647 devices: "
            "use smaller sizes");
  layout = gpt3_175b_example();
  layout.micro_batch = 65536;
  layout.data_parallel = 65536;
  layout.devices = 8 * 8 * 65536;
  EXPECT_EQ(error_of([&] { validate_layout(layout); }),
            "micro-batch × data parallel = 65536 × 65536: more than 2147483647 sequences per step: use smaller sizes");
  EXPECT_EQ(nearest_multiples(2147483647, 2), "2147483646 or 2147483648");
}

// The stages are ranks × chunks: the message names both (was the partitioner's
// "16 stages for 14 pipeline layers: ... use at most 14 stages" for --pp 2 --virtual 8).
TEST(Layout, MoreStagesThanLayersNamesRanksAndChunks) {
  Layout layout = make_layout("gpt2-124m", "a100-80g", 1, 2, 1, 8, 1024);
  layout.schedule = "interleaved-1f1b";
  layout.chunks = 8;
  EXPECT_EQ(error_of([&] { predict(layout); }),
            "2 ranks × 8 chunks = 16 stages for gpt2-124m's 14 pipeline layers (embedding, 12 blocks, head): every "
            "stage needs a layer; use fewer pipeline stages or virtual stages");
  layout.schedule = "gpipe";
  layout.chunks = 1;
  layout.pipeline_ranks = 16;
  layout.devices = 16;
  EXPECT_EQ(error_of([&] { predict(layout); }),
            "16 stages for gpt2-124m's 14 pipeline layers (embedding, 12 blocks, head): every stage needs a layer; use "
            "fewer pipeline stages or virtual stages");
}

// Only trainable parameters have gradients (2 B in bf16), optimizer states
// (12 B) and a reduction; a frozen one holds its bf16 weight (2 B). LoRA r = 8
// on q_proj, v_proj of Llama 2 7B: T = 32 · 8·(4096 + 4096)·2 = 4,194,304
// trainable of P = 6,738,415,616 + T.
TEST(CostModel, LoraTrainsItsAdaptersAloneAndFrozenWeightsHoldTheirWeight) {
  Layout layout = make_layout("llama2-7b", "a100-80g", 1, 1, 1, 1, 4096);
  layout.training.lora = LoraSpec{.rank = 8, .alpha = 16, .targets = {"q_proj", "v_proj"}};
  const StageCosts stage = costs_of(layout).costs.stages[0];
  const double T = 4'194'304, P = 6'738'415'616 + T;
  EXPECT_DOUBLE_EQ(stage.model_state_bytes, 16 * T + 2 * (P - T));
  EXPECT_DOUBLE_EQ(stage.gradient_bytes, 2 * T);
  EXPECT_DOUBLE_EQ(stage.optimizer_s, 28 * T / (0.85 * 2039e9));
  // W is the adapters' alone: 2·s·131,072 FLOPs per block at the achieved rate.
  const double adapter_w = compute_seconds(2.0 * 4096 * 131'072, priced_hardware(layout));
  EXPECT_NEAR(stage.backward_weight_s, 32 * adapter_w, 1e-12 * stage.backward_weight_s);
}

// LLaVA-1.5-7B with its tower frozen, cut after the tower: the tower's
// stage runs no backward and keeps nothing, and holds its bf16 weights alone.
TEST(CostModel, AFrozenTowerStageHasNoBackwardGradientsOrOptimizerState) {
  Layout layout = make_layout("llama2-7b", "a100-80g", 1, 2, 1, 4, 2048);
  layout.model.vision = VisionSpec{.layers = 23, .hidden = 1024, .heads = 16, .ffn = 4096, .image_size = 336,
                                   .patch_size = 14};
  layout.partition = parse_partition_method("bounds:0,24,59");
  layout.training.freeze = {"vision.*"};
  const LayoutCosts costs = costs_of(layout);
  const StageCosts& tower = costs.costs.stages[0];
  const double tower_parameters = 1'196'032 + 23 * 12'596'224.0;
  EXPECT_DOUBLE_EQ(tower.model_state_bytes, 2 * tower_parameters);
  EXPECT_EQ(tower.backward_s, 0);
  EXPECT_EQ(tower.gradient_bytes, 0);
  EXPECT_EQ(tower.optimizer_s, 0);
  EXPECT_EQ(tower.activation_bytes, 0);
  EXPECT_GT(tower.forward_s, 0);
  // Trained, the tower's stage holds 16 B per parameter and has a backward.
  layout.training = {};
  const StageCosts trained = costs_of(layout).costs.stages[0];
  EXPECT_DOUBLE_EQ(trained.model_state_bytes, 16 * tower_parameters);
  EXPECT_GT(trained.backward_s, trained.forward_s);
  // The language model's stage is the same either way.
  EXPECT_EQ(costs.costs.stages[1].model_state_bytes, costs_of(layout).costs.stages[1].model_state_bytes);
}

}  // namespace
}  // namespace pipeflow
