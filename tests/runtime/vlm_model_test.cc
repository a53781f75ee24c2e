// The vision-language model the runtime trains is the one the model module
// prices: for the tiny LLaVA config.json, read by the model module's
// reader, the same layers under the same names, each holding exactly the
// parameters the model module counts for it.

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "../support/error_of.h"
#include "pipeflow/model/hf_config.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/nn/vision_language_model.h"
#include "pipeflow/runtime/stage_partition.h"
#include "pipeflow/runtime/stage_traits.h"

namespace pipeflow::runtime {
namespace {

const std::string kTinyLlava = std::string(PIPEFLOW_SOURCE_DIR) + "/examples/models/tiny-llava/config.json";

TEST(VlmModel, EveryLayerHoldsTheParametersTheModelModuleCounts) {
  const ModelSpec spec = model_from_hf_config(kTinyLlava);
  const nn::VlmConfig config = runtime_vlm_model(spec, "tiny-llava");
  // vision_feature_layer -2 of 2 CLIP layers: one block runs.
  EXPECT_EQ(config.vision.layers, 1);
  const std::vector<PipelineLayer> layers =
      pipeline_layers(spec, {.micro_batch = 1, .seq_length = 34, .bytes_per_element = 4});
  ASSERT_EQ(static_cast<int>(layers.size()), config.pipeline_layers());
  // By hand: D = C = 32, F = 3·4·4 = 48 pixels a patch, N = 16 patches, V = 256, 34 LM positions.
  const std::int64_t block = 12 * 32 * 32 + 13 * 32;  // GPT-2's: 12 704
  const std::vector<std::int64_t> expected = {
      48 * 32 + 32 + 17 * 32 + 2 * 32,  // patch weight (no bias), class embedding, N + 1 positions, pre-LayerNorm
      block,                            // vision.block.0
      32 * 32 + 32 + 32 * 32 + 32,      // projector
      256 * 32 + 34 * 32,               // wte, wpe
      block,
      block,
      2 * 32};  // ln_f; wte tied to the embedding's
  for (int i = 0; i < config.pipeline_layers(); ++i) {
    const PipelineLayer& layer = layers[static_cast<std::size_t>(i)];
    EXPECT_EQ(layer.name, nn::vlm_layer_name(config, i));
    EXPECT_EQ(layer.parameters, expected[static_cast<std::size_t>(i)]) << layer.name;
    // A layer on a stage of its own: the head holds its copy of the tied wte.
    EXPECT_EQ(nn::vlm_layout(config, {i, i + 1}).total(), layer.parameters + layer.tied_parameters) << layer.name;
  }
  EXPECT_EQ(nn::vlm_layout(config, {0, config.pipeline_layers()}).total(), sum_layers(layers).parameters);
}

// A stage's trained parameters, counted from vlm_stage_layouts without
// building it, by hand: the whole tiny LLaVA's 2176 + 12704 + 2112 + 9280 +
// 2 x 12704 + 64 = 51744; its encoder frozen, 51744 - 2176 - 12704 =
// 36864; the encoder frozen and LoRA r 2, the projector's 2112 and each
// LM block's adapters 32·2 + 2·96 = 256: 2624 (the rest, 49632, frozen).
// Each is what a built stage's layout() holds, tensor for tensor.
TEST(VlmModel, StageLayoutsCountATrainedStageWithoutBuildingIt) {
  const nn::VlmConfig config = runtime_vlm_model(model_from_hf_config(kTinyLlava), "tiny-llava");
  const nn::LayerRange whole{0, config.pipeline_layers()};
  const std::vector<std::pair<VlmTraining, std::int64_t>> cases = {
      {{.model = config}, 51744},
      {{.model = config, .freeze_vision = true}, 36864},
      {{.model = config, .freeze_vision = true, .lora = nn::LoraOptions{.r = 2, .alpha = 4}}, 2624}};
  for (const auto& [training, trained] : cases) {
    EXPECT_EQ(StageTraits<nn::VlmStage>::parameter_count(training, whole, 1), trained);
    const nn::VlmStageLayouts layouts =
        nn::vlm_stage_layouts(config, whole, {.freeze_vision = training.freeze_vision, .lora = training.lora});
    EXPECT_EQ(layouts.trained.total(), trained);
    EXPECT_EQ(layouts.trained.total() + layouts.frozen.total() - (training.lora ? 512 : 0), 51744);
    for (const nn::LayerRange range : {whole, nn::LayerRange{1, 5}, nn::LayerRange{5, 7}}) {
      const nn::VlmStage stage(config, range, {.freeze_vision = training.freeze_vision, .lora = training.lora});
      const nn::VlmStageLayouts split =
          nn::vlm_stage_layouts(config, range, {.freeze_vision = training.freeze_vision, .lora = training.lora});
      EXPECT_EQ(StageTraits<nn::VlmStage>::parameter_count(training, range, 1), stage.layout().total());
      ASSERT_EQ(split.trained.entries().size(), stage.layout().entries().size());
      for (std::size_t i = 0; i < split.trained.entries().size(); ++i) {
        EXPECT_EQ(split.trained.entries()[i].name, stage.layout().entries()[i].name);
      }
      EXPECT_EQ(split.frozen.total(), stage.frozen_layout().total());
    }
  }
}

// What the runtime does not build or compute is refused by the
// config.json's key, its value, the rule and the fix.
TEST(VlmModel, ALlamaLanguageModelOrTheClassTokenKeptIsRefusedByKey) {
  const std::string tower = R"({"hidden_size": 32, "intermediate_size": 128, "num_attention_heads": 4,
      "num_hidden_layers": 2, "image_size": 16, "patch_size": 4, "hidden_act": "gelu_new")";
  const auto error_with = [](const std::string& config) {
    return pipeflow::testing::error_of(
        [&] { runtime_vlm_model(model_from_hf_config_text(config, "c.json"), "c.json"); });
  };
  const auto error = [&](const std::string& text_config, const std::string& extra) {
    return error_with(R"({"model_type": "llava", "projector_hidden_act": "gelu_new", "text_config": )" +
                      text_config + R"(, "vision_config": )" + tower + "}" + extra + "}");
  };
  const std::string llama = R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
      "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 256, "max_position_embeddings": 34})";
  const std::string gpt2 = R"({"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 32, "n_positions": 34,
      "vocab_size": 256, "attn_pdrop": 0, "resid_pdrop": 0, "embd_pdrop": 0)";
  EXPECT_NE(error(llama, "").find("c.json: model c.json: text_config model_type = \"llama\" (transformers' default "
                                  "where text_config or its model_type is absent): the language model behind the "
                                  "tower is GPT-2's; give a text_config with model_type \"gpt2\""),
            std::string::npos)
      << error(llama, "");
  // No text_config at all: transformers' LlamaConfig, and the error says so.
  const std::string no_text = error_with(R"({"model_type": "llava", "vision_config": )" + tower + "}}");
  EXPECT_NE(no_text.find("where text_config or its model_type is absent"), std::string::npos) << no_text;
  EXPECT_NE(error(gpt2 + "}", R"(, "vision_feature_select_strategy": "full")")
                .find("vision_feature_select_strategy = \"full\": the projector takes the patch tokens alone"),
            std::string::npos);
  // An untied head: the key in its section and what pipeflow runs, not a
  // Llama, nor a language model given inline (which would drop the tower).
  const std::string untied = error(gpt2 + R"(, "tie_word_embeddings": false})", "");
  EXPECT_NE(untied.find("text_config tie_word_embeddings = false: pipeflow train runs GPT-2 with a GELU MLP of 4 x "
                        "n_embd, the LM head tied to wte and no dropout; in its config.json's text_config, set "
                        "tie_word_embeddings to true"),
            std::string::npos)
      << untied;
  EXPECT_EQ(untied.find("Llama"), std::string::npos) << untied;
  EXPECT_EQ(untied.find("inline"), std::string::npos) << untied;
  // Keys that change the arithmetic: honoured (nn computes the tanh GELU,
  // LayerNorm eps 1e-5) or refused, never ignored; CLIP's default
  // activation is quick_gelu, LLaVA's projector's erf GELU.
  const auto refused = [&](const std::string& config, const std::string& expected) {
    const std::string text = error_with(config);
    EXPECT_NE(text.find(expected), std::string::npos) << text;
  };
  const std::string base = R"({"model_type": "llava", "text_config": )" + gpt2 + "}, ";
  refused(base + R"("projector_hidden_act": "gelu_new", "vision_config": )" +
              std::string(R"({"hidden_size": 32, "intermediate_size": 128, "num_attention_heads": 4,
      "num_hidden_layers": 2, "image_size": 16, "patch_size": 4}})"),
          "vision_config hidden_act = \"quick_gelu\" (CLIP's activation, and CLIPVisionConfig's default): the "
          "tower computes GPT-2's tanh GELU; set vision_config's hidden_act to \"gelu_new\"");
  refused(base + R"("vision_config": )" + tower + "}}",
          "projector_hidden_act = \"gelu\" (LlavaConfig's default)");
  refused(base + R"("projector_hidden_act": "gelu_new", "vision_config": )" + tower + R"(, "layer_norm_eps": 1e-6}})",
          "vision_config layer_norm_eps = 1e-06: the tower's LayerNorms add 1e-05; set layer_norm_eps to 1e-05");
  EXPECT_NE(error(gpt2 + R"(, "activation_function": "relu"})", "")
                .find("activation_function = \"relu\": pipeflow train runs GPT-2"),
            std::string::npos);
  EXPECT_NE(error(gpt2 + R"(, "layer_norm_epsilon": 1e-6})", "").find("set layer_norm_epsilon to 1e-05"),
            std::string::npos);
  EXPECT_EQ(error(gpt2 + "}", ""), "(no error)");
  EXPECT_EQ(error(gpt2 + R"(, "activation_function": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-5})", ""),
            "(no error)");
}

}  // namespace
}  // namespace pipeflow::runtime
