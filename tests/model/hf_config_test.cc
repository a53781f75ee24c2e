#include "pipeflow/model/hf_config.h"

#include <gtest/gtest.h>

#include "../support/error_of.h"
#include "pipeflow/core/file.h"

namespace pipeflow {
namespace {

using testing::error_of;

std::string sample(const std::string& name) {
  return std::string(PIPEFLOW_SOURCE_DIR) + "/tests/data/hf/" + name + "/config.json";
}

TEST(HfConfig, Gpt2ConfigGivesTheGpt2Preset) {
  const ModelSpec spec = model_from_hf_config(sample("gpt2"));
  EXPECT_EQ(spec.architecture, Architecture::kGpt);
  EXPECT_EQ(spec.layers, 12);
  EXPECT_EQ(spec.hidden, 768);
  EXPECT_EQ(spec.heads, 12);
  EXPECT_EQ(spec.ffn, 3072);  // n_inner null → 4h
  EXPECT_EQ(spec.vocab, 50257);
  EXPECT_EQ(spec.max_positions, 1024);
  EXPECT_TRUE(spec.tied_embeddings);
  EXPECT_TRUE(spec.dropout);
  EXPECT_EQ(parameter_count(spec), 124'439'808);
  EXPECT_EQ(spec.name, sample("gpt2"));
}

TEST(HfConfig, LlamaConfigsGiveTheLlamaPresets) {
  const ModelSpec llama2 = model_from_hf_config(sample("llama-2-7b"));
  EXPECT_EQ(llama2.architecture, Architecture::kLlama);
  EXPECT_EQ(llama2.kv_heads, 32);
  EXPECT_EQ(llama2.ffn, 11008);
  EXPECT_FALSE(llama2.tied_embeddings);
  EXPECT_EQ(parameter_count(llama2), 6'738'415'616);
  const ModelSpec llama3 = model_from_hf_config(sample("llama-3-8b"));
  EXPECT_EQ(llama3.kv_heads, 8);
  EXPECT_EQ(llama3.max_positions, 8192);
  EXPECT_EQ(parameter_count(llama3), 8'030'261'248);
}

TEST(HfConfig, FamilyIsTakenFromTheKeysWithoutModelType) {
  const ModelSpec spec = model_from_hf_config_text(
      R"({"n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 256, "n_positions": 64,
          "n_inner": 256, "attn_pdrop": 0, "resid_pdrop": 0, "embd_pdrop": 0})",
      "tiny.json");
  EXPECT_EQ(spec.architecture, Architecture::kGpt);
  EXPECT_EQ(spec.ffn, 256);
  EXPECT_FALSE(spec.dropout);
  const ModelSpec llama = model_from_hf_config_text(
      R"({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
          "vocab_size": 100, "tie_word_embeddings": true})",
      "l.json");
  EXPECT_EQ(llama.architecture, Architecture::kLlama);
  EXPECT_EQ(llama.kv_heads, 4);
  EXPECT_TRUE(llama.tied_embeddings);
  // transformers' LlamaConfig defaults: untied, 2048 positions.
  const ModelSpec untied = model_from_hf_config_text(
      R"({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
          "vocab_size": 100})",
      "l.json");
  EXPECT_FALSE(untied.tied_embeddings);
  EXPECT_EQ(untied.max_positions, 2048);
}

// gpt2-medium's config.json as the Hub publishes it: besides GPT2Config's
// keys it carries "n_special" and "predict_special_tokens" of the older
// OpenAI-GPT-era config, which pipeflow does not read.
TEST(HfConfig, Gpt2MediumsRealConfigReadsWithItsExtraKeys) {
  const ModelSpec spec = model_from_hf_config(sample("gpt2-medium"));
  EXPECT_EQ(spec.layers, 24);
  EXPECT_EQ(spec.hidden, 1024);
  EXPECT_EQ(spec.heads, 16);
  EXPECT_EQ(spec.ffn, 4096);
  EXPECT_EQ(spec.max_positions, 1024);
  EXPECT_TRUE(spec.tied_embeddings);
  // 24 blocks of 12h² + 13h, embeddings (50257 + 1024)·h, final norm 2h.
  EXPECT_EQ(parameter_count(spec), 354'823'168);
  EXPECT_EQ(parameter_count(spec), parameter_count(model_preset("gpt2-355m")));
}

// Keys of other transformers versions and tasks are ignored wherever they are
// far from a shape key.
TEST(HfConfig, KeysThatSetNoShapeAreIgnored) {
  std::string text = read_file(sample("gpt2"));
  text.replace(text.rfind('}'), 1,
               R"(, "output_past": true, "gradient_checkpointing": false, "id2label": {"0": "LABEL_0"},
               "label2id": {"LABEL_0": 0}, "n_special": 0, "predict_special_tokens": true,
               "use_cache": true, "rope_type": "default", "torch_dtype": "float32"})");
  EXPECT_EQ(parameter_count(model_from_hf_config_text(text, "config.json")), 124'439'808);
  std::string llama = read_file(sample("llama-3-8b"));
  llama.replace(llama.rfind('}'), 1, R"(, "output_attentions": false, "id2label": {"0": "A"}, "num_labels": 1})");
  EXPECT_EQ(parameter_count(model_from_hf_config_text(llama, "config.json")), 8'030'261'248);
}

// Within 2 edits of a shape key, a key is taken for a misspelling of it:
// ignored, the shape key would silently take its default (or, required,
// be reported missing instead of misspelt).
TEST(HfConfig, MisspeltShapeKeyIsAnErrorWithASuggestion) {
  std::string text = read_file(sample("llama-3-8b"));
  text.replace(text.find("\"num_key_value_heads\""), 21, "\"num_key_value_head\"");
  EXPECT_EQ(error_of([&] { model_from_hf_config_text(text, "config.json"); }),
            "config.json: unknown key 'num_key_value_head' (did you mean 'num_key_value_heads'?): fix its spelling "
            "(other unknown keys are ignored, but a misspelt known key would silently take its default)");
  std::string required = read_file(sample("llama-3-8b"));
  required.replace(required.find("\"num_hidden_layers\""), 19, "\"num_hidden_layer\"");
  EXPECT_EQ(error_of([&] { model_from_hf_config_text(required, "config.json"); }),
            "config.json: unknown key 'num_hidden_layer' (did you mean 'num_hidden_layers'?): fix its spelling "
            "(other unknown keys are ignored, but a misspelt known key would silently take its default)");
  std::string gpt2 = read_file(sample("gpt2-medium"));
  gpt2.replace(gpt2.find("\"n_layer\""), 9, "\"n_layers\"");
  gpt2.replace(gpt2.find("\"n_head\""), 8, "\"n_heads\"");
  EXPECT_EQ(error_of([&] { model_from_hf_config_text(gpt2, "config.json"); }),
            "config.json: unknown keys 'n_heads' (did you mean 'n_head'?), 'n_layers' (did you mean 'n_layer'?): fix "
            "their spelling (other unknown keys are ignored, but a misspelt known key would silently take its "
            "default)");
  // Without model_type or a family's layer key, both families' keys count.
  EXPECT_EQ(error_of([] {
              model_from_hf_config_text(R"({"n_layers": 4, "n_embd": 128, "n_head": 4, "vocab_size": 256})",
                                        "c.json");
            }),
            "c.json: unknown key 'n_layers' (did you mean 'n_layer'?): fix its spelling (other unknown keys are "
            "ignored, but a misspelt known key would silently take its default)");
}

TEST(HfConfig, BadValuesNameTheKeyAndTheRule) {
  EXPECT_EQ(error_of([] {
              model_from_hf_config_text(R"({"model_type": "gpt2", "n_layer": 0, "n_embd": 8, "n_head": 2,
                                            "vocab_size": 10})",
                                        "c.json");
            }),
            "c.json: n_layer = 0: must be >= 1");
  EXPECT_EQ(error_of([] {
              model_from_hf_config_text(R"({"model_type": "gpt2", "n_layer": "12", "n_embd": 8, "n_head": 2,
                                            "vocab_size": 10})",
                                        "c.json");
            }),
            "c.json: n_layer must be an integer, got \"12\"");
  EXPECT_EQ(error_of([] {
              model_from_hf_config_text(R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                                            "num_attention_heads": 4, "num_key_value_heads": 3,
                                            "intermediate_size": 128, "vocab_size": 100})",
                                        "c.json");
            }),
            "model c.json: kv_heads = 3: must divide heads (4)");
  EXPECT_EQ(error_of([] { model_from_hf_config_text(R"({"model_type": "bert"})", "c.json"); }),
            "c.json: model_type = \"bert\": pipeflow reads \"gpt2\" and \"llama\" configs (or, without model_type, "
            "one with n_layer or num_hidden_layers)");
  EXPECT_EQ(error_of([] {
              model_from_hf_config_text(R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                                            "num_attention_heads": 4, "intermediate_size": 128,
                                            "vocab_size": 100, "attention_bias": true})",
                                        "c.json");
            }),
            "c.json: attention_bias = true: pipeflow models Llama layers without biases");
  EXPECT_EQ(error_of([] { model_from_hf_config_text(R"({"model_type": "gpt2", "n_embd": 8})", "c.json"); }),
            "c.json: n_layer is required but missing");
}

// llava-hf/llava-1.5-7b-hf's config.json: CLIP ViT-L/14-336 (its text_config
// and vision_config give only what differs from LlamaConfig's and
// CLIPVisionConfig's defaults), features from hidden_states[-2], CLS dropped.
TEST(HfConfig, Llava15ConfigReadsTheTowerUpToItsFeatureLayer) {
  const ModelSpec llava = model_from_hf_config(sample("llava-1.5-7b"));
  EXPECT_EQ(llava.architecture, Architecture::kLlama);
  EXPECT_EQ(llava.layers, 32);   // LlamaConfig's default
  EXPECT_EQ(llava.hidden, 4096);  // LlamaConfig's default
  EXPECT_EQ(llava.ffn, 11008);
  EXPECT_EQ(llava.vocab, 32064);
  EXPECT_EQ(llava.max_positions, 4096);
  EXPECT_FALSE(llava.tied_embeddings);
  ASSERT_TRUE(llava.vision.has_value());
  const VisionSpec& v = *llava.vision;
  EXPECT_EQ(v.layers, 23);  // hidden_states[-2]: the output of block 23 of 24
  EXPECT_EQ(v.hidden, 1024);
  EXPECT_EQ(v.heads, 16);
  EXPECT_EQ(v.ffn, 4096);
  EXPECT_EQ(v.image_size, 336);
  EXPECT_EQ(v.patch_size, 14);
  EXPECT_TRUE(v.drop_class_token);
  EXPECT_EQ(image_tokens(v), 576);
  EXPECT_EQ(vision_tokens(v), 577);
  // Llama 2 7B at vocabulary 32064, 6,738,415,616 + 2·64·4096; the tower's
  // patch embedding 1,196,032 and 23 blocks of 12,596,224; the projector
  // 20,979,712.
  const std::int64_t language = 6'738'415'616 + 2 * 64 * 4096;
  const std::int64_t run = language + 1'196'032 + 23 * std::int64_t{12'596'224} + 20'979'712;
  EXPECT_EQ(parameter_count(llava), run);
  EXPECT_EQ(run, 7'050'828'800);
  // The checkpoint also holds block 24 and CLIP's post-LayerNorm (2·1024),
  // which LLaVA never reads: the published 7,063,427,072.
  EXPECT_EQ(run + 12'596'224 + 2 * 1024, 7'063'427'072);
}

TEST(HfConfig, LlavaFeatureLayerAndStrategy) {
  const auto llava = [](const std::string& extra) {
    return model_from_hf_config_text(R"({"model_type": "llava", "text_config": {"num_hidden_layers": 2},
                                         "vision_config": {"num_hidden_layers": 4, "image_size": 64,
                                                           "patch_size": 16})" +
                                         extra + "}",
                                     "c.json");
  };
  EXPECT_EQ(llava("").vision->layers, 3);  // LlavaConfig's default -2
  EXPECT_EQ(llava(R"(, "vision_feature_layer": -1)").vision->layers, 4);
  EXPECT_EQ(llava(R"(, "vision_feature_layer": 2)").vision->layers, 2);
  EXPECT_EQ(image_tokens(*llava("").vision), 16);
  EXPECT_EQ(image_tokens(*llava(R"(, "vision_feature_select_strategy": "full")").vision), 17);
  EXPECT_EQ(llava("").vision->hidden, 768);  // CLIPVisionConfig's default
  EXPECT_EQ(error_of([&] { llava(R"(, "vision_feature_layer": -5)"); }),
            "c.json: vision_feature_layer = -5: must pick the output of one of the tower's 4 layers: 1 .. 4 or -1 "
            ".. -4");
  EXPECT_EQ(error_of([&] { llava(R"(, "vision_feature_layer": [-2, -5])"); }),
            "c.json: vision_feature_layer = [-2,-5]: pipeflow reads one layer's features (an integer, e.g. -2); not "
            "a list of layers");
  EXPECT_EQ(error_of([&] { llava(R"(, "image_seq_length": 576)"); }),
            "c.json: image_seq_length = 576: the vision tower gives 16 tokens per image ((image_size / "
            "patch_size)^2); make them agree");
  EXPECT_EQ(error_of([&] { llava(R"(, "vision_feature_select_strategy": "cls")"); }),
            "c.json: vision_feature_select_strategy = \"cls\": use \"default\" (drops the CLS token) or \"full\"");
  EXPECT_EQ(error_of([] { model_from_hf_config_text(R"({"model_type": "clip_vision_model"})", "c.json"); }),
            "c.json: model_type = \"clip_vision_model\": a CLIP vision tower alone has no language model for "
            "pipeflow to train: give it as the vision_config of a \"llava\" config");
  EXPECT_EQ(error_of([] {
              model_from_hf_config_text(R"({"model_type": "llava", "vision_config": {"num_hidden_layer": 4}})",
                                        "c.json");
            }),
            "c.json vision_config: unknown key 'num_hidden_layer' (did you mean 'num_hidden_layers'?): fix its "
            "spelling (other unknown keys are ignored, but a misspelt known key would silently take its default)");
}

}  // namespace
}  // namespace pipeflow
