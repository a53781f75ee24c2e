#include "pipeflow/model/hf_config.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipeflow/core/config.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"

namespace pipeflow {
namespace {

// The keys each family reads: the ones that set the shape pipeflow counts.
// Any other key of a config.json (token ids, "architectures", "id2label",
// "task_specific_params", ...) is ignored unless it is a likely misspelling
// of one of these; for a config of no known family, of either family's.
std::vector<std::string> shape_keys(const std::string& type) {
  const std::vector<std::string> gpt2 = {"n_layer",    "n_embd",      "n_head",     "n_inner",
                                         "vocab_size", "n_positions", "n_ctx",      "tie_word_embeddings",
                                         "attn_pdrop", "resid_pdrop", "embd_pdrop", "activation_function",
                                         "layer_norm_epsilon"};
  const std::vector<std::string> llama = {
      "num_hidden_layers", "hidden_size", "num_attention_heads",     "num_key_value_heads",
      "intermediate_size", "vocab_size",  "max_position_embeddings", "tie_word_embeddings",
      "attention_dropout", "head_dim",    "attention_bias",          "mlp_bias",
      "rope_theta",        "rope_scaling", "rms_norm_eps"};
  if (type == "gpt2") return gpt2;
  if (type == "llama") return llama;
  std::vector<std::string> both = gpt2;
  both.insert(both.end(), llama.begin(), llama.end());
  return both;
}

int positive(const Config& config, std::string_view key, int value) {
  if (value < 1) config.fail_value(key, "must be >= 1");
  return value;
}

int require_positive(const Config& config, std::string_view key) {
  return positive(config, key, config.require<int>(key));
}

double probability(const Config& config, std::string_view key, double fallback) {
  const double p = config.get(key, fallback);
  if (p < 0 || p >= 1) config.fail_value(key, "must be a probability in [0, 1)");
  return p;
}

ModelSpec gpt2_from(const Config& config, std::string name) {
  ModelSpec spec;
  spec.name = std::move(name);
  spec.architecture = Architecture::kGpt;
  spec.layers = require_positive(config, "n_layer");
  spec.hidden = require_positive(config, "n_embd");
  spec.heads = require_positive(config, "n_head");
  spec.kv_heads = spec.heads;
  spec.ffn = positive(config, "n_inner", config.get("n_inner", gpt_ffn(spec.hidden)));
  spec.vocab = require_positive(config, "vocab_size");
  const int context = config.get("n_ctx", 1024);
  spec.max_positions = positive(config, "n_positions", config.get("n_positions", context));
  spec.tied_embeddings = config.get("tie_word_embeddings", true);
  double dropout = 0;
  for (const char* key : {"attn_pdrop", "resid_pdrop", "embd_pdrop"}) dropout += probability(config, key, 0.1);
  spec.dropout = dropout > 0;
  spec.gpt_activation = config.get("activation_function", "gelu_new");
  spec.layer_norm_eps = config.get("layer_norm_epsilon", 1e-5);
  return spec;
}

ModelSpec llama_from(const Config& config, std::string name) {
  ModelSpec spec;
  spec.name = std::move(name);
  spec.architecture = Architecture::kLlama;
  spec.layers = require_positive(config, "num_hidden_layers");
  spec.hidden = require_positive(config, "hidden_size");
  spec.heads = require_positive(config, "num_attention_heads");
  spec.kv_heads = positive(config, "num_key_value_heads", config.get("num_key_value_heads", spec.heads));
  spec.ffn = require_positive(config, "intermediate_size");
  spec.vocab = require_positive(config, "vocab_size");
  spec.max_positions = positive(config, "max_position_embeddings", config.get("max_position_embeddings", 2048));
  spec.tied_embeddings = config.get("tie_word_embeddings", false);
  spec.dropout = probability(config, "attention_dropout", 0.0) > 0;
  if (config.has("head_dim") && config.get("head_dim", 0) * spec.heads != spec.hidden) {
    config.fail_value("head_dim", fmt::format("pipeflow needs head_dim = hidden_size / num_attention_heads = {}",
                                              spec.hidden / spec.heads));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (config.get(key, false)) config.fail_value(key, "pipeflow models Llama layers without biases");
  }
  LlamaNumerics& numerics = spec.llama;
  numerics.rope_theta = config.get("rope_theta", 10000.0);
  if (!(numerics.rope_theta > 0)) config.fail_value("rope_theta", "must be > 0");
  numerics.rms_norm_eps = config.get("rms_norm_eps", 1e-6);
  if (!(numerics.rms_norm_eps > 0 && numerics.rms_norm_eps < 1)) config.fail_value("rms_norm_eps", "must be in (0, 1)");
  if (config.is_object("rope_scaling")) {
    const Config scaling = config.object("rope_scaling");
    // transformers wrote "type" before 4.45 and "rope_type" since.
    numerics.rope_type = scaling.get("rope_type", scaling.get("type", "default"));
    if (numerics.rope_type == "llama3") {
      numerics.rope_factor = scaling.require<double>("factor");
      numerics.rope_low_freq_factor = scaling.require<double>("low_freq_factor");
      numerics.rope_high_freq_factor = scaling.require<double>("high_freq_factor");
      numerics.rope_original_context = scaling.require<int>("original_max_position_embeddings");
      if (!(numerics.rope_factor >= 1)) scaling.fail_value("factor", "must be >= 1");
      if (!(numerics.rope_low_freq_factor > 0 && numerics.rope_high_freq_factor > numerics.rope_low_freq_factor)) {
        scaling.fail_value("high_freq_factor", "needs 0 < low_freq_factor < high_freq_factor");
      }
      if (numerics.rope_original_context < 1) scaling.fail_value("original_max_position_embeddings", "must be >= 1");
    }
  }
  return spec;
}

// A language model's config: gpt2 or llama, by model_type or the keys.
ModelSpec language_model_from(const Config& config, std::string name) {
  const std::string type =
      config.get("model_type", config.has("n_layer") ? "gpt2" : config.has("num_hidden_layers") ? "llama" : "");
  // Before the values: a misspelt required key is a misspelling, not missing.
  config.check_no_misspelt_keys(shape_keys(type));
  if (type == "gpt2") return gpt2_from(config, std::move(name));
  if (type == "llama") return llama_from(config, std::move(name));
  config.fail_value("model_type", "pipeflow reads \"gpt2\" and \"llama\" configs (or, without model_type, "
                                  "one with n_layer or num_hidden_layers)");
}

// A nested config (LLaVA's text_config, vision_config) as transformers reads
// it: an absent key takes its config class's default (an absent object: all
// of them). Published LLaVA
// configs give only what differs, e.g. llava-1.5-7b-hf's text_config names
// no width or depth (LlamaConfig's 4096 and 32 apply).
Config with_defaults(const Config& parent, std::string_view key, const nlohmann::json& defaults) {
  if (parent.has(key) && !parent.is_object(key)) parent.fail_value(key, "must be an object (a nested config)");
  nlohmann::json merged = defaults;
  merged.update(parent.object(key).json());
  return Config::from_json(std::move(merged), parent.source() + " " + parent.path(key));
}

// transformers' defaults of the config classes a LLaVA config nests.
const nlohmann::json& transformers_defaults(std::string_view type) {
  static const nlohmann::json llama = {{"model_type", "llama"},          {"num_hidden_layers", 32},
                                       {"hidden_size", 4096},            {"num_attention_heads", 32},
                                       {"intermediate_size", 11008},     {"vocab_size", 32000},
                                       {"max_position_embeddings", 2048}};
  static const nlohmann::json gpt2 = {{"model_type", "gpt2"}, {"n_layer", 12},      {"n_embd", 768},
                                      {"n_head", 12},         {"vocab_size", 50257}, {"n_positions", 1024}};
  static const nlohmann::json clip = {{"model_type", "clip_vision_model"},
                                      {"num_hidden_layers", 12},
                                      {"hidden_size", 768},
                                      {"num_attention_heads", 12},
                                      {"intermediate_size", 3072},
                                      {"image_size", 224},
                                      {"patch_size", 32},
                                      {"num_channels", 3}};
  if (type == "gpt2") return gpt2;
  if (type == "clip_vision_model") return clip;
  return llama;
}

const std::vector<std::string> kClipVisionKeys = {"num_hidden_layers", "hidden_size", "num_attention_heads",
                                                  "intermediate_size", "image_size",  "patch_size",
                                                  "num_channels",      "hidden_act",  "layer_norm_eps"};
const std::vector<std::string> kLlavaKeys = {"text_config",
                                             "vision_config",
                                             "vision_feature_layer",
                                             "vision_feature_select_strategy",
                                             "image_seq_length",
                                             "projector_hidden_act",
                                             "multimodal_projector_bias"};

// CLIP's vision tower (CLIPVisionConfig, model_type "clip_vision_model"),
// all num_hidden_layers of it.
VisionSpec clip_vision_from(const Config& config) {
  config.check_no_misspelt_keys(kClipVisionKeys);
  const std::string type = config.get("model_type", "clip_vision_model");
  if (type != "clip_vision_model") {
    config.fail_value("model_type", "pipeflow reads a CLIP vision tower (\"clip_vision_model\")");
  }
  VisionSpec v;
  v.layers = require_positive(config, "num_hidden_layers");
  v.hidden = require_positive(config, "hidden_size");
  v.heads = require_positive(config, "num_attention_heads");
  v.ffn = require_positive(config, "intermediate_size");
  v.image_size = require_positive(config, "image_size");
  v.patch_size = require_positive(config, "patch_size");
  v.channels = require_positive(config, "num_channels");
  v.activation = config.get("hidden_act", "quick_gelu");
  v.layer_norm_eps = config.get("layer_norm_eps", 1e-5);
  return v;
}

// LlavaForConditionalGeneration's config: the vision tower up to
// vision_feature_layer (hidden_states[i]: the output of the first i blocks,
// a negative i counting from L + 1), the projector, the language model.
ModelSpec llava_from(const Config& config, std::string name) {
  config.check_no_misspelt_keys(kLlavaKeys);
  const Config text_json = config.object("text_config");
  const Config text = with_defaults(config, "text_config",
                                    transformers_defaults(text_json.get("model_type", "llama")));
  ModelSpec spec = language_model_from(text, name);
  VisionSpec v = clip_vision_from(with_defaults(config, "vision_config", transformers_defaults("clip_vision_model")));
  if (config.has("vision_feature_layer") && !config.raw("vision_feature_layer").is_number_integer()) {
    config.fail_value("vision_feature_layer",
                      "pipeflow reads one layer's features (an integer, e.g. -2); not a list of layers");
  }
  const int feature_layer = config.get("vision_feature_layer", -2);
  const int run = feature_layer >= 0 ? feature_layer : v.layers + 1 + feature_layer;
  if (run < 1 || run > v.layers) {
    config.fail_value("vision_feature_layer",
                      fmt::format("must pick the output of one of the tower's {} layers: 1 .. {} or -1 .. -{}",
                                  v.layers, v.layers, v.layers));
  }
  v.layers = run;
  const std::string strategy = config.get("vision_feature_select_strategy", "default");
  if (strategy != "default" && strategy != "full") {
    config.fail_value("vision_feature_select_strategy", "use \"default\" (drops the CLS token) or \"full\"");
  }
  v.drop_class_token = strategy == "default";
  if (!config.get("multimodal_projector_bias", true)) {
    config.fail_value("multimodal_projector_bias", "pipeflow counts the projector's linear layers with biases");
  }
  v.projector_activation = config.get("projector_hidden_act", "gelu");
  if (config.has("image_seq_length") && config.get("image_seq_length", 0) != image_tokens(v)) {
    config.fail_value("image_seq_length",
                      fmt::format("the vision tower gives {} tokens per image ((image_size / patch_size)^2{}); "
                                  "make them agree",
                                  image_tokens(v), v.drop_class_token ? "" : " + 1 for CLS"));
  }
  spec.vision = v;
  return spec;
}

}  // namespace

ModelSpec model_from_hf_config_text(std::string_view json_text, std::string name) {
  const Config config = Config::parse(json_text, name);
  const std::string type = config.get("model_type", "");
  if (type == "clip_vision_model") {
    config.fail_value("model_type", "a CLIP vision tower alone has no language model for pipeflow to train: give "
                                    "it as the vision_config of a \"llava\" config");
  }
  ModelSpec spec = type == "llava" ? llava_from(config, name) : language_model_from(config, name);
  validate_model(spec);
  check_head_width(spec);
  return spec;
}

nlohmann::json llama_hf_config(const ModelSpec& spec) {
  const LlamaNumerics& n = spec.llama;
  nlohmann::json json = {{"model_type", "llama"},
                         {"num_hidden_layers", spec.layers},
                         {"hidden_size", spec.hidden},
                         {"num_attention_heads", spec.heads},
                         {"num_key_value_heads", spec.kv_heads},
                         {"intermediate_size", spec.ffn},
                         {"vocab_size", spec.vocab},
                         {"max_position_embeddings", spec.max_positions},
                         {"tie_word_embeddings", spec.tied_embeddings},
                         {"rope_theta", n.rope_theta},
                         {"rms_norm_eps", n.rms_norm_eps},
                         {"rope_scaling", nullptr}};
  if (spec.dropout) json["attention_dropout"] = 0.1;
  if (n.rope_type == "llama3") {
    json["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", n.rope_factor},
                            {"low_freq_factor", n.rope_low_freq_factor},
                            {"high_freq_factor", n.rope_high_freq_factor},
                            {"original_max_position_embeddings", n.rope_original_context}};
  } else if (n.rope_type != "default") {
    json["rope_scaling"] = {{"rope_type", n.rope_type}};
  }
  return json;
}

ModelSpec model_from_hf_config(const std::filesystem::path& path) {
  return model_from_hf_config_text(read_file(path, kMaxConfigFileBytes, "Hugging Face config.json"), path.string());
}

}  // namespace pipeflow
