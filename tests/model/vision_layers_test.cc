#include <gtest/gtest.h>

#include "../support/error_of.h"
#include "pipeflow/model/partition.h"
#include "pipeflow/model/pipeline_layers.h"

namespace pipeflow {
namespace {

using testing::error_of;

// CLIP ViT-L/14 at 336 px (LLaVA-1.5's tower), all 24 layers, in front of
// Llama 2 7B.
ModelSpec vit_l14_336_llama2_7b(int layers = 24, int images = 1) {
  ModelSpec spec = model_preset("llama2-7b");
  spec.name = "vlm";
  spec.vision = VisionSpec{.layers = layers,
                           .hidden = 1024,
                           .heads = 16,
                           .ffn = 4096,
                           .image_size = 336,
                           .patch_size = 14,
                           .channels = 3,
                           .class_token = true,
                           .drop_class_token = true,
                           .images = images};
  return spec;
}

ParallelConfig config_of(int b, int s, int t = 1, Recompute recompute = Recompute::kNone) {
  ParallelConfig config;
  config.micro_batch = b;
  config.seq_length = s;
  config.tensor_parallel = t;
  config.recompute = recompute;
  return config;
}

TEST(VisionLayers, TowerProjectorThenTheLanguageModel) {
  const auto layers = pipeline_layers(vit_l14_336_llama2_7b(), config_of(1, 2048));
  ASSERT_EQ(layers.size(), 1u + 24 + 1 + 1 + 32 + 1);
  EXPECT_EQ(layers[0].name, "vision.patch_embedding");
  EXPECT_EQ(layers[0].kind, LayerKind::kPatchEmbedding);
  EXPECT_EQ(layers[1].name, "vision.block.0");
  EXPECT_EQ(layers[24].name, "vision.block.23");
  EXPECT_EQ(layers[24].kind, LayerKind::kVisionBlock);
  EXPECT_EQ(layers[25].name, "projector");
  EXPECT_EQ(layers[25].kind, LayerKind::kProjector);
  EXPECT_EQ(layers[26].name, "embedding");
  EXPECT_EQ(layers[27].name, "block.0");
  EXPECT_EQ(layers.back().name, "head");
  EXPECT_EQ(pipeline_layer_count(vit_l14_336_llama2_7b()), 60);
}

// ViT-L/14-336: P = 14, C = 3 (P²·C = 588 pixels per patch), n_p = (336/14)² = 576
// patches, n = 577 tokens with CLS, h_v = 1024; b = 1, one image, e = 2.
TEST(VisionLayers, PatchEmbeddingOfVitL14At336) {
  const PipelineLayer layer = pipeline_layers(vit_l14_336_llama2_7b(), config_of(1, 2048))[0];
  const double pixels = 14 * 14 * 3, patches = 576, tokens = 577, h = 1024, e = 2;
  // Convolution P²·C·h (no bias), CLS h, positions n·h, pre-LayerNorm 2h.
  EXPECT_EQ(layer.parameters, 588 * 1024 + 1024 + 577 * 1024 + 2 * 1024);
  EXPECT_EQ(layer.parameters, 1'196'032);
  // The convolution as a GEMM: 2·n_p·(P²·C)·h; no input gradient (pixels).
  EXPECT_EQ(layer.forward_flops, 2 * patches * pixels * h);
  EXPECT_EQ(layer.forward_flops, 693'633'024);
  EXPECT_EQ(layer.backward_input_flops, 0);
  EXPECT_EQ(layer.backward_weight_flops, 693'633'024);
  EXPECT_EQ(layer.recompute_flops, 0);
  // Pixels kept for dW, and the pre-LayerNorm's input.
  EXPECT_EQ(layer.activation_bytes, e * (patches * pixels + tokens * h));
  EXPECT_EQ(layer.activation_bytes, 1'859'072);
  EXPECT_EQ(layer.output_bytes, e * tokens * h);
}

TEST(VisionLayers, VitBlockOfVitL14At336) {
  const auto layers = pipeline_layers(vit_l14_336_llama2_7b(), config_of(1, 2048));
  const PipelineLayer& block = layers[1];
  const double s = 577, h = 1024, f = 4096, a = 16, e = 2;
  // LayerNorms 2·2h; QKV h·3h + 3h; out h·h + h; fc1 h·f + f; fc2 f·h + h.
  EXPECT_EQ(block.parameters, 4 * 1024 + (1024 * 3072 + 3072) + (1024 * 1024 + 1024) + (1024 * 4096 + 4096) +
                                  (4096 * 1024 + 1024));
  EXPECT_EQ(block.parameters, 12'596'224);
  // Linear: 2·s·(4h² + 2hf); attention core QKᵀ and ·V: 4·s²·h.
  const double linear = 2 * s * (4 * h * h + 2 * h * f);
  const double core = 4 * s * s * h;
  EXPECT_EQ(block.forward_flops, linear + core);
  EXPECT_EQ(block.forward_flops, 15'884'357'632.0);
  EXPECT_EQ(block.backward_input_flops, linear + 2 * core);
  EXPECT_EQ(block.backward_weight_flops, linear);
  // No dropout: inputs of the two norms, QKV and fc1 (4e·sh), Q, K, V,
  // out-proj input, GELU in and out (e·s·(4h + 2f)), softmax output (e·a·s²).
  EXPECT_EQ(block.activation_bytes, 4 * e * s * h + e * s * (4 * h + 2 * f) + e * a * s * s);
  EXPECT_EQ(block.activation_bytes, 29'560'864);
  EXPECT_EQ(block.output_bytes, e * s * h);
  // Two images per sequence: the tower's batch doubles.
  const auto two = pipeline_layers(vit_l14_336_llama2_7b(24, 2), config_of(1, 2048));
  EXPECT_EQ(two[1].forward_flops, 2 * block.forward_flops);
  EXPECT_EQ(two[1].activation_bytes, 2 * block.activation_bytes);
  // Selective recompute drops the softmax output and repeats the core.
  const auto selective = pipeline_layers(vit_l14_336_llama2_7b(), config_of(1, 2048, 1, Recompute::kSelective));
  EXPECT_EQ(selective[1].activation_bytes, 32 * s * h);
  EXPECT_EQ(selective[1].recompute_flops, core);
}

// LLaVA-1.5's mlp2x_gelu: Linear(1024 -> 4096), GELU, Linear(4096 -> 4096)
// over the 576 patch tokens (CLS dropped).
TEST(VisionLayers, ProjectorOfLlava15) {
  const auto layers = pipeline_layers(vit_l14_336_llama2_7b(), config_of(1, 2048));
  const PipelineLayer& projector = layers[25];
  const double T = 576, hv = 1024, H = 4096, e = 2;
  EXPECT_EQ(projector.parameters, 1024 * 4096 + 4096 + 4096 * 4096 + 4096);
  EXPECT_EQ(projector.parameters, 20'979'712);
  EXPECT_EQ(projector.forward_flops, 2 * T * (hv * H + H * H));
  EXPECT_EQ(projector.forward_flops, 24'159'191'040.0);
  EXPECT_EQ(projector.backward_input_flops, projector.forward_flops);
  EXPECT_EQ(projector.backward_weight_flops, projector.forward_flops);
  // fc1's input, GELU's input and output.
  EXPECT_EQ(projector.activation_bytes, e * T * (hv + 2 * H));
  EXPECT_EQ(projector.output_bytes, e * T * H);
  // Where the image tokens join the text: the embedding hands on all s.
  EXPECT_EQ(layers[26].output_bytes, e * 2048 * H);
  // Tensor-parallel: fc1 column-, fc2 row-parallel.
  const auto split = pipeline_layers(vit_l14_336_llama2_7b(), config_of(1, 2048, 2));
  EXPECT_EQ(split[25].parameters, (1024 * 2048 + 2048) + (2048 * 4096 + 4096));
  EXPECT_EQ(split[25].forward_flops, projector.forward_flops / 2);
  EXPECT_EQ(split[0].parameters, 1'196'032);  // the patch embedding is replicated
}

// The language model is as without the tower, its sequence holding the image tokens.
TEST(VisionLayers, LanguageModelLayersAreUnchanged) {
  const auto alone = pipeline_layers(model_preset("llama2-7b"), config_of(2, 2048));
  const auto with = pipeline_layers(vit_l14_336_llama2_7b(), config_of(2, 2048));
  ASSERT_EQ(with.size() - 26, alone.size());
  for (std::size_t i = 0; i < alone.size(); ++i) {
    EXPECT_EQ(with[i + 26].parameters, alone[i].parameters) << alone[i].name;
    EXPECT_EQ(with[i + 26].forward_flops, alone[i].forward_flops) << alone[i].name;
    EXPECT_EQ(with[i + 26].activation_bytes, alone[i].activation_bytes) << alone[i].name;
    EXPECT_EQ(with[i + 26].output_bytes, alone[i].output_bytes) << alone[i].name;
  }
}

TEST(VisionLayers, ConfigErrorsNameTheRuleAndTheFix) {
  EXPECT_EQ(error_of([] { pipeline_layers(vit_l14_336_llama2_7b(), config_of(1, 576)); }),
            "sequence = 576: vlm's sequence holds 576 image tokens (1 image(s) of 576) and the text after them: use "
            "a sequence > 576 (image and text tokens together)");
  ModelSpec odd = vit_l14_336_llama2_7b();
  odd.vision->image_size = 335;
  EXPECT_EQ(error_of([&] { validate_model(odd); }),
            "model vlm: image_size = 335: must be a multiple of patch_size (14), the image being cut into whole "
            "patches; change image_size or patch_size");
  ModelSpec short_context = vit_l14_336_llama2_7b();
  short_context.max_positions = 576;
  EXPECT_EQ(error_of([&] { validate_model(short_context); }),
            "model vlm: max_positions = 576 (the language model's context: n_ctx, or a config.json's n_positions or "
            "max_position_embeddings): must exceed the 576 image tokens in front of the text (1 image(s) of 576); "
            "raise it above 576, or the vision tower's patch_size");
  ModelSpec narrow = vit_l14_336_llama2_7b();
  narrow.vision->heads = 12;
  EXPECT_EQ(error_of([&] { pipeline_layers(narrow, config_of(1, 2048, 8)); }),
            "model vlm: vision hidden = 1024: must be a multiple of the vision heads (12); change hidden_size or "
            "num_attention_heads of the vision tower");
}

// type:block counts the blocks of both towers alike: 24 + 32 = 56 over 4
// stages, 14 each; balanced weighs a ViT block at its own cost, far below a
// Llama block's, so the tower's stage takes more layers.
TEST(VisionLayers, PartitionsCutAcrossTheTwoTowers) {
  const auto layers = pipeline_layers(vit_l14_336_llama2_7b(), config_of(1, 2048));
  const HardwareProfile a100 = hardware_preset("a100-80g");
  const Partition by_type = partition_layers(layers, 4, parse_partition_method("type:block"), a100);
  for (const StagePlan& stage : by_type.stages) {
    int blocks = 0;
    for (const std::string& name : stage.layer_names) blocks += name.find("block") != std::string::npos ? 1 : 0;
    EXPECT_EQ(blocks, 14);
  }
  const Partition balanced = partition_layers(layers, 4, parse_partition_method("balanced"), a100);
  EXPECT_GT(balanced.stages[0].end - balanced.stages[0].first, balanced.stages[3].end - balanced.stages[3].first);
}

}  // namespace
}  // namespace pipeflow
