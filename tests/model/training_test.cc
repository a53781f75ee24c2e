#include "pipeflow/model/training.h"

#include <gtest/gtest.h>

#include "../support/error_of.h"

namespace pipeflow {
namespace {

using testing::error_of;

// LLaVA-1.5-7B's shape: CLIP ViT-L/14-336 up to block 23, projector, Llama 2 7B.
ModelSpec llava() {
  ModelSpec spec = model_preset("llama2-7b");
  spec.name = "llava";
  spec.vision = VisionSpec{.layers = 23, .hidden = 1024, .heads = 16, .ffn = 4096, .image_size = 336,
                           .patch_size = 14};
  return spec;
}

ParallelConfig config_of(int b, int s, Recompute recompute = Recompute::kNone) {
  ParallelConfig config;
  config.micro_batch = b;
  config.seq_length = s;
  config.recompute = recompute;
  return config;
}

std::vector<PipelineLayer> trained(const ModelSpec& spec, const ParallelConfig& config, const TrainingSpec& training) {
  std::vector<PipelineLayer> layers = pipeline_layers(spec, config);
  apply_training(layers, spec, config, training);
  return layers;
}

TEST(Training, GlobsMatchWholeNames) {
  EXPECT_TRUE(glob_matches("vision.*", "vision.block.3"));
  EXPECT_TRUE(glob_matches("vision.*", "vision.patch_embedding"));
  EXPECT_FALSE(glob_matches("vision.*", "projector"));
  EXPECT_TRUE(glob_matches("block.1?", "block.10"));
  EXPECT_FALSE(glob_matches("block.1?", "block.1"));
  EXPECT_FALSE(glob_matches("block.1", "block.10"));  // the whole name
  EXPECT_TRUE(glob_matches("*", "head"));
  EXPECT_TRUE(glob_matches("*.block.*", "vision.block.0"));
  EXPECT_FALSE(glob_matches("*.block.*", "block.0"));
}

TEST(Training, EverythingTrainsByDefault) {
  const auto layers = pipeline_layers(llava(), config_of(1, 2048));
  for (const PipelineLayer& layer : layers) {
    EXPECT_EQ(layer.trainable_parameters, layer.parameters) << layer.name;
    EXPECT_FALSE(layer.frozen);
    EXPECT_TRUE(layer.backward);
  }
  // LLaVA-1.5-7B's 7,050,828,800 at Llama 2's vocabulary (32000, not 32064).
  EXPECT_EQ(sum_layers(layers).trainable_parameters, 7'050'828'800 - 2 * 64 * 4096);
}

// LLaVA-1.5's fine-tuning: the vision tower frozen. It comes first, so it
// runs no backward at all; the projector and the LM train whole.
TEST(Training, AFrozenTowerBeforeEverythingRunsNoBackward) {
  const auto all = pipeline_layers(llava(), config_of(1, 2048));
  const auto layers = trained(llava(), config_of(1, 2048), {.freeze = {"vision.*"}});
  for (int i = 0; i < 24; ++i) {
    SCOPED_TRACE(layers[i].name);
    EXPECT_TRUE(layers[i].frozen);
    EXPECT_FALSE(layers[i].backward);
    EXPECT_EQ(layers[i].trainable_parameters, 0);
    EXPECT_EQ(layers[i].parameters, all[i].parameters);  // the weights are still held
    EXPECT_EQ(layers[i].forward_flops, all[i].forward_flops);
    EXPECT_EQ(layers[i].backward_input_flops, 0);
    EXPECT_EQ(layers[i].backward_weight_flops, 0);
    EXPECT_EQ(layers[i].activation_bytes, 0);
  }
  EXPECT_EQ(layers[24].name, "projector");
  EXPECT_TRUE(layers[24].backward);
  EXPECT_EQ(layers[24].backward_weight_flops, all[24].backward_weight_flops);
  // Trainable: 7,050,828,800 less the patch embedding (1,196,032) and 23 blocks of 12,596,224.
  EXPECT_EQ(sum_layers(layers).trainable_parameters,
            7'050'828'800 - 2 * 64 * 4096 - 1'196'032 - 23 * std::int64_t{12'596'224});
  // The whole model's FLOPs lose the tower's I and W: 2·(patch W) + 23·(I + W) of a block.
  const double vit_i = all[1].backward_input_flops, vit_w = all[1].backward_weight_flops;
  EXPECT_DOUBLE_EQ(sum_layers(all).model_flops() - sum_layers(layers).model_flops(),
                   all[0].backward_weight_flops + 23 * (vit_i + vit_w));
}

// LLaVA-1.5's pre-training: only the projector trains; the LM after it is
// frozen but passes the gradient back to it (I, activations kept; no W).
TEST(Training, AFrozenLayerAfterATrainableOnePassesTheGradient) {
  const auto all = pipeline_layers(llava(), config_of(1, 2048));
  const auto layers = trained(llava(), config_of(1, 2048), {.freeze = {"vision.*", "embedding", "block.*", "head"}});
  EXPECT_EQ(sum_layers(layers).trainable_parameters, 20'979'712);
  const PipelineLayer& block = layers[26];
  EXPECT_EQ(block.name, "block.0");
  EXPECT_TRUE(block.frozen);
  EXPECT_TRUE(block.backward);
  EXPECT_EQ(block.backward_input_flops, all[26].backward_input_flops);
  EXPECT_EQ(block.backward_weight_flops, 0);
  EXPECT_EQ(block.activation_bytes, all[26].activation_bytes);
}

// LoRA r = 8 on q_proj and v_proj of Llama 2 7B: per block 8·(4096 + 4096)
// twice, 131,072; 32 blocks: 4,194,304 trainable (PEFT prints the same).
TEST(Training, LoraAdaptersOfLlama2_7b) {
  const ModelSpec llama = model_preset("llama2-7b");
  const double b = 1, s = 4096, e = 2, r = 8;
  const TrainingSpec lora{.lora = LoraSpec{.rank = 8, .alpha = 16, .targets = {"q_proj", "v_proj"}}};
  const auto all = pipeline_layers(llama, config_of(1, 4096));
  const auto layers = trained(llama, config_of(1, 4096), lora);
  const double adapter = r * (4096 + 4096) * 2;
  EXPECT_EQ(sum_layers(layers).trainable_parameters, 4'194'304);
  EXPECT_EQ(sum_layers(layers).parameters, 6'738'415'616 + 4'194'304);
  const PipelineLayer& block = layers[1];
  EXPECT_EQ(block.trainable_parameters, 131'072);
  EXPECT_TRUE(block.frozen);
  EXPECT_TRUE(block.backward);
  EXPECT_EQ(block.forward_flops, all[1].forward_flops + 2 * b * s * adapter);
  EXPECT_EQ(block.backward_input_flops, all[1].backward_input_flops + 2 * b * s * adapter);
  EXPECT_EQ(block.backward_weight_flops, 2 * b * s * adapter);  // the base's W is gone
  EXPECT_EQ(block.activation_bytes, all[1].activation_bytes + e * b * s * r * 2);  // x·A of each adapter
  // Embedding and head are frozen; the embedding, first, runs no backward.
  EXPECT_FALSE(layers.front().backward);
  EXPECT_TRUE(layers.back().frozen);
  EXPECT_EQ(layers.back().trainable_parameters, 0);
  EXPECT_EQ(layers.back().backward_input_flops, all.back().backward_input_flops);
  // Full recomputation repeats the adapters' forward too.
  const auto full = trained(llama, config_of(1, 4096, Recompute::kFull), lora);
  EXPECT_EQ(full[1].recompute_flops, full[1].forward_flops);
  // lora.train keeps a layer whole: the head trains.
  TrainingSpec with_head = lora;
  with_head.lora->train = {"head"};
  EXPECT_EQ(sum_layers(trained(llama, config_of(1, 4096), with_head)).trainable_parameters,
            4'194'304 + 4096 + 32000 * std::int64_t{4096});
}

TEST(Training, ErrorsNameTheKeyTheValueAndTheFix) {
  const ModelSpec llama = model_preset("llama2-7b");
  EXPECT_EQ(error_of([&] { trained(llama, config_of(1, 64), {.freeze = {"vision.*"}}); }),
            "freeze \"vision.*\": matches no layer of llama2-7b (embedding .. head); patterns are globs over whole "
            "layer names ('*' any run of characters, '?' one): e.g. \"vision.*\", \"block.*\", \"embedding\"");
  EXPECT_EQ(error_of([&] {
              trained(llama, config_of(1, 64), {.lora = LoraSpec{.rank = 8, .alpha = 16, .targets = {"c_attn"}}});
            }),
            "lora.target \"c_attn\": llama2-7b is a llama model, whose block matrices are q_proj, k_proj, v_proj, "
            "o_proj, gate_proj, up_proj, down_proj: use those names");
  EXPECT_EQ(error_of([&] {
              trained(llama, config_of(1, 64), {.lora = LoraSpec{.rank = 0, .alpha = 16, .targets = {"q_proj"}}});
            }),
            "lora.r = 0: must lie in [1, 1048576] (the adapters' rank; 8 to 64 are usual)");
}

}  // namespace
}  // namespace pipeflow
