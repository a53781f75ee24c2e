#include "pipeflow/model/pipeline_layers.h"

#include <gtest/gtest.h>

#include "../support/error_of.h"

namespace pipeflow {
namespace {

using testing::error_of;

ParallelConfig config_of(int b, int s, int t = 1, bool sp = false, Recompute recompute = Recompute::kNone) {
  ParallelConfig config;
  config.micro_batch = b;
  config.seq_length = s;
  config.tensor_parallel = t;
  config.sequence_parallel = sp;
  config.recompute = recompute;
  return config;
}

double block_bytes(const ModelSpec& spec, const ParallelConfig& config) {
  return pipeline_layers(spec, config)[1].activation_bytes;
}

TEST(PipelineLayers, NamesAreEmbeddingBlocksHead) {
  const auto layers = pipeline_layers(model_preset("gpt-tiny"), config_of(1, 64));
  ASSERT_EQ(layers.size(), 6u);
  EXPECT_EQ(layers[0].name, "embedding");
  EXPECT_EQ(layers[1].name, "block.0");
  EXPECT_EQ(layers[4].name, "block.3");
  EXPECT_EQ(layers[5].name, "head");
  EXPECT_EQ(layers[0].kind, LayerKind::kEmbedding);
  EXPECT_EQ(layers[5].kind, LayerKind::kHead);
}

// Korthikanti et al. 2022, Table 2, per layer, for GPT-3 175B (s = 2048,
// h = 12288, a = 96) with b = 1, t = 8: a·s/h = 16.
TEST(PipelineLayers, KorthikantiActivationsForGpt3_175b) {
  const ModelSpec gpt3 = model_preset("gpt3-175b");
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8;
  const double sbh = s * b * h;
  using R = Recompute;
  EXPECT_DOUBLE_EQ(block_bytes(gpt3, config_of(1, 2048)), sbh * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(block_bytes(gpt3, config_of(1, 2048, 8)), sbh * (10 + 24 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(block_bytes(gpt3, config_of(1, 2048, 8, true)), sbh * (34 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(block_bytes(gpt3, config_of(1, 2048, 8, false, R::kSelective)), sbh * (10 + 24 / t));
  EXPECT_DOUBLE_EQ(block_bytes(gpt3, config_of(1, 2048, 8, true, R::kSelective)), sbh * 34 / t);
  EXPECT_DOUBLE_EQ(block_bytes(gpt3, config_of(1, 2048, 8, false, R::kFull)), 2 * sbh);
  EXPECT_DOUBLE_EQ(block_bytes(gpt3, config_of(1, 2048, 1, false, R::kFull)), 2 * sbh);
  // The same numbers spelled out (bytes).
  EXPECT_EQ(block_bytes(gpt3, config_of(1, 2048)), 2'868'903'936);
  EXPECT_EQ(block_bytes(gpt3, config_of(1, 2048, 8)), 578'813'952);
  EXPECT_EQ(block_bytes(gpt3, config_of(1, 2048, 8, true)), 358'612'992);
  EXPECT_EQ(block_bytes(gpt3, config_of(1, 2048, 8, false, R::kSelective)), 327'155'712);
  EXPECT_EQ(block_bytes(gpt3, config_of(1, 2048, 8, true, R::kSelective)), 106'954'752);
  EXPECT_EQ(block_bytes(gpt3, config_of(1, 2048, 8, false, R::kFull)), 50'331'648);
  // With SP Megatron keeps the sequence shard of the block input.
  EXPECT_EQ(block_bytes(gpt3, config_of(1, 2048, 8, true, R::kFull)), 2 * sbh / t);
}

TEST(PipelineLayers, ActivationsScaleWithMicroBatch) {
  const ModelSpec gpt3 = model_preset("gpt3-175b");
  EXPECT_DOUBLE_EQ(block_bytes(gpt3, config_of(4, 2048, 8)), 4 * block_bytes(gpt3, config_of(1, 2048, 8)));
}

// Korthikanti §4.3: embedding dropout mask s·b·h/t and output layer
// 4·s·b·h/t·(1 + V/h) with SP.
TEST(PipelineLayers, EmbeddingAndHeadActivationsMatchKorthikantiWithSequenceParallelism) {
  const ModelSpec gpt3 = model_preset("gpt3-175b");
  const auto layers = pipeline_layers(gpt3, config_of(1, 2048, 8, true));
  const double s = 2048, h = 12288, V = 50257, t = 8;
  EXPECT_DOUBLE_EQ(layers.front().activation_bytes, s * h / t);
  EXPECT_DOUBLE_EQ(layers.back().activation_bytes, 4 * s * h / t * (1 + V / h));
  // Without SP or dropout: the norm and head inputs are whole; no mask.
  const auto llama = pipeline_layers(model_preset("llama2-7b"), config_of(1, 4096));
  EXPECT_EQ(llama.front().activation_bytes, 0);
  EXPECT_EQ(llama.back().activation_bytes, 2.0 * 2 * 4096 * 4096 + 4.0 * 4096 * 32000);
}

// SwiGLU + GQA + no dropout, derived in pipeline_layers.cc:
// 4e·sbh + e·sb·(2h + 2·g·d + 3f) + e·a·s²·b.
TEST(PipelineLayers, LlamaActivationsFollowTheAdaptedAccounting) {
  const double sb = 4096;
  EXPECT_EQ(block_bytes(model_preset("llama2-7b"), config_of(1, 4096)),
            8 * sb * 4096 + 2 * sb * (2 * 4096 + 2 * 4096 + 3 * 11008) + 2.0 * 32 * 4096 * sb);
  EXPECT_EQ(block_bytes(model_preset("llama2-7b"), config_of(1, 4096)), 1'612'709'888);
  // llama3-8b: K and V are 8 heads of 128 wide.
  const double sb8 = 8192;
  EXPECT_EQ(block_bytes(model_preset("llama3-8b"), config_of(1, 8192, 8, false, Recompute::kSelective)),
            8 * sb8 * 4096 + 2 * sb8 * (2 * 4096 + 2 * 1024 + 3 * 14336) / 8);
}

// Narayanan et al. 2021 eq. 3: 72·B·L·s·h²·(1 + s/(6h) + V/(12hL)) model
// FLOPs per step of B sequences; with full recompute
// 96·B·L·s·h²·(1 + s/(6h) + V/(16hL)). Our per-layer counts are the same
// matmuls, so the totals agree to rounding.
TEST(PipelineLayers, ModelFlopsPerStepAreNarayananEquationThree) {
  for (const ModelSpec& spec : model_presets()) {
    if (spec.architecture != Architecture::kGpt) continue;
    const double B = 512, L = spec.layers, s = spec.max_positions, h = spec.hidden, V = spec.vocab;
    const LayerTotals plain = sum_layers(pipeline_layers(spec, config_of(1, spec.max_positions)));
    EXPECT_NEAR(B * plain.model_flops() / (72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))), 1, 1e-12)
        << spec.name;
    const LayerTotals full =
        sum_layers(pipeline_layers(spec, config_of(1, spec.max_positions, 1, false, Recompute::kFull)));
    EXPECT_NEAR(B * full.hardware_flops() / (96 * B * L * s * h * h * (1 + s / (6 * h) + V / (16 * h * L))), 1,
                1e-12)
        << spec.name;
    EXPECT_EQ(full.model_flops(), plain.model_flops()) << spec.name;
  }
}

TEST(PipelineLayers, BlockFlopsSplitIntoInputAndWeightGradients) {
  const ModelSpec gpt3 = model_preset("gpt3-175b");
  const auto layers = pipeline_layers(gpt3, config_of(1, 2048));
  const double s = 2048, h = 12288;
  const PipelineLayer& block = layers[1];
  EXPECT_EQ(block.forward_flops, 24 * s * h * h + 4 * s * s * h);
  EXPECT_EQ(block.backward_weight_flops, 24 * s * h * h);
  EXPECT_EQ(block.backward_input_flops, 24 * s * h * h + 8 * s * s * h);
  EXPECT_EQ(block.recompute_flops, 0);
  const PipelineLayer& head = layers.back();
  EXPECT_EQ(head.forward_flops, 2 * s * h * 50257);
  EXPECT_EQ(head.backward_input_flops, head.forward_flops);
  EXPECT_EQ(head.backward_weight_flops, head.forward_flops);
  EXPECT_EQ(layers.front().forward_flops, 0);
  const auto selective = pipeline_layers(gpt3, config_of(1, 2048, 1, false, Recompute::kSelective));
  EXPECT_EQ(selective[1].recompute_flops, 4 * s * s * h);
  EXPECT_EQ(selective.back().recompute_flops, 0);
}

TEST(PipelineLayers, LlamaBlockFlopsCountSwigluAndGroupedKv) {
  const auto layers = pipeline_layers(model_preset("llama3-8b"), config_of(1, 8192));
  const double s = 8192, h = 4096, kv = 1024, f = 14336;
  EXPECT_EQ(layers[1].forward_flops, 2 * s * (2 * h * h + 2 * h * kv + 3 * h * f) + 4 * s * s * h);
  // Matmul FLOPs of the blocks are 2·(block parameters less the norms) per token.
  EXPECT_EQ(layers[1].backward_weight_flops, 2 * s * (layers[1].parameters - 2 * h));
}

TEST(PipelineLayers, TensorParallelismSplitsFlopsAndMatrices) {
  const ModelSpec gpt3 = model_preset("gpt3-175b");
  const auto whole = pipeline_layers(gpt3, config_of(1, 2048));
  const auto split = pipeline_layers(gpt3, config_of(1, 2048, 8));
  for (std::size_t i = 0; i < whole.size(); ++i) {
    EXPECT_DOUBLE_EQ(8 * split[i].forward_flops, whole[i].forward_flops) << whole[i].name;
    EXPECT_DOUBLE_EQ(8 * split[i].backward_input_flops, whole[i].backward_input_flops) << whole[i].name;
  }
  // 12h²/t + 7h/t (column-parallel biases) + 6h (norms, row-parallel biases).
  const std::int64_t h = 12288;
  EXPECT_EQ(split[1].parameters, 12 * h * h / 8 + 7 * h / 8 + 6 * h);
  // Vocabulary-parallel token table, replicated position table.
  EXPECT_EQ(split[0].parameters, (50257 + 7) / 8 * h + 2048 * h);
}

TEST(PipelineLayers, MessagesAreBshElementsSplitBySequenceParallelism) {
  const ModelSpec gpt3 = model_preset("gpt3-175b");
  const double bsh = 2.0 * 2048 * 12288;
  EXPECT_EQ(pipeline_layers(gpt3, config_of(2, 2048, 8))[3].output_bytes, 2 * bsh);
  EXPECT_EQ(pipeline_layers(gpt3, config_of(2, 2048, 8, true))[3].output_bytes, 2 * bsh / 8);
  ParallelConfig scatter = config_of(1, 2048, 8);
  scatter.scatter_gather = true;
  scatter.bytes_per_element = 4;
  EXPECT_EQ(pipeline_layers(gpt3, scatter)[0].output_bytes, 2 * bsh / 8);
  EXPECT_EQ(pipeline_layers(gpt3, scatter).back().output_bytes, 0);
}

TEST(PipelineLayers, TiedHeadCountsItsCopyOnlyAwayFromTheEmbedding) {
  const auto layers = pipeline_layers(model_preset("gpt2-124m"), config_of(1, 1024));
  const PipelineLayer& head = layers.back();
  EXPECT_EQ(head.parameters, 2 * 768);
  EXPECT_EQ(head.tied_parameters, 50257 * 768);
  EXPECT_EQ(head.tied_owner, 0);
  EXPECT_EQ(sum_layers(layers).parameters, 124'439'808);
  EXPECT_EQ(sum_layers(layers, 13, 14).parameters, 2 * 768 + 50257 * 768);
  EXPECT_EQ(sum_layers(layers, 1, 13).parameters, 12 * (12 * 768 * 768 + 13 * 768));
}

TEST(PipelineLayers, ConfigErrorsNameTheRuleAndTheFix) {
  const ModelSpec gpt2 = model_preset("gpt2-124m");
  EXPECT_EQ(error_of([&] { pipeline_layers(gpt2, config_of(1, 2048)); }),
            "sequence = 2048: gpt2-124m has 1024 learned positions: use a sequence <= 1024");
  EXPECT_EQ(error_of([&] { pipeline_layers(gpt2, config_of(1, 1024, 5)); }),
            "tensor_parallel = 5: must divide gpt2-124m's heads (12) and kv heads (12) so each rank holds whole heads");
  EXPECT_EQ(error_of([&] { pipeline_layers(gpt2, config_of(1, 0)); }),
            "sequence = 0: must be >= 1 (tokens per sequence)");
  EXPECT_EQ(error_of([&] { pipeline_layers(gpt2, config_of(0, 1024)); }), "micro_batch = 0: must be >= 1");
  // Rotary positions: a Llama sequence is not bounded by max_positions.
  EXPECT_EQ(pipeline_layers(model_preset("llama2-7b"), config_of(1, 8192)).size(), 34u);
}

TEST(PipelineLayers, RecomputeParsesItsThreeNames) {
  EXPECT_EQ(parse_recompute("selective"), Recompute::kSelective);
  EXPECT_EQ(to_string(parse_recompute("full")), "full");
  EXPECT_EQ(error_of([] { parse_recompute("some"); }), "recompute \"some\": use none, selective or full");
}

}  // namespace
}  // namespace pipeflow
