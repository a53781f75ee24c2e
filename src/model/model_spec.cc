#include "pipeflow/model/model_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/model/hf_config.h"
#include "pipeflow/model/pipeline_layers.h"

namespace pipeflow {
namespace {

ModelSpec gpt_preset(std::string name, int layers, int hidden, int heads, int max_positions) {
  ModelSpec spec = gpt_model(std::move(name), layers, hidden, heads, 50257, max_positions);
  spec.dropout = true;  // GPT-2 and GPT-3 trained with dropout 0.1
  return spec;
}

// Llama 2: rope_theta 10000; Llama 3: 500000 (3.1 at 128K positions with
// the llama3 rope_scaling of its config.json); rms_norm_eps 1e-5 in both.
ModelSpec llama_preset(std::string name, int layers, int hidden, int heads, int kv_heads, int ffn, int vocab,
                       int max_positions, double rope_theta, bool llama3_scaling = false) {
  LlamaNumerics numerics{.rope_theta = rope_theta, .rms_norm_eps = 1e-5};
  if (llama3_scaling) {
    numerics.rope_type = "llama3";
    numerics.rope_factor = 8;
    numerics.rope_low_freq_factor = 1;
    numerics.rope_high_freq_factor = 4;
    numerics.rope_original_context = 8192;
  }
  return ModelSpec{.name = std::move(name),
                   .architecture = Architecture::kLlama,
                   .layers = layers,
                   .hidden = hidden,
                   .heads = heads,
                   .kv_heads = kv_heads,
                   .ffn = ffn,
                   .vocab = vocab,
                   .max_positions = max_positions,
                   .tied_embeddings = false,
                   .dropout = false,
                   .llama = numerics};
}

std::vector<ModelSpec> make_presets() {
  // GPT-2 (Radford et al. 2019; sizes as OpenAI's released checkpoints name
  // them: 124M, 355M, 774M, 1558M), context 1024.
  // GPT-3 (Brown et al. 2020, Table 2.1), context 2048. The table's heads ×
  // d_head (128) does not always equal d_model (XL: 24 × 128 for 2048; 13B:
  // 40 × 128 for 5140); pipeflow keeps d_model and n_heads as listed, since
  // d_model sets the parameter count (13B: 12.95B; 5120 would give 12.85B)
  // and gpt counts never use the head width.
  // Llama 2 (Touvron et al. 2023) and Llama 3 / 3.1 405B (Dubey et al. 2024),
  // shapes as their config.json files.
  return {
      gpt_preset("gpt2-124m", 12, 768, 12, 1024),
      gpt_preset("gpt2-355m", 24, 1024, 16, 1024),
      gpt_preset("gpt2-774m", 36, 1280, 20, 1024),
      gpt_preset("gpt2-1.5b", 48, 1600, 25, 1024),
      gpt_preset("gpt3-1.3b", 24, 2048, 24, 2048),
      gpt_preset("gpt3-6.7b", 32, 4096, 32, 2048),
      gpt_preset("gpt3-13b", 40, 5140, 40, 2048),
      gpt_preset("gpt3-175b", 96, 12288, 96, 2048),
      llama_preset("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 10000),
      llama_preset("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, 10000),
      llama_preset("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 10000),
      llama_preset("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000),
      llama_preset("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000),
      llama_preset("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 131072, 500000, true),
      // The byte-level model pipeflow trains on this machine (DESIGN.md).
      gpt_model("gpt-tiny", 4, 128, 4, 256, 64),
  };
}

std::string preset_names() {
  std::string names;
  for (const ModelSpec& spec : model_presets()) names += (names.empty() ? "" : ", ") + spec.name;
  return names;
}

void require_in_range(const ModelSpec& spec, std::string_view field, int value, int most) {
  if (value < 1) fail("model {}: {} = {}: must be >= 1", spec.name, field, value);
  if (value > most) {
    fail("model {}: {} = {}: must be at most {}, far above any published model: check the value", spec.name, field,
         value, most);
  }
}

void validate_vision(const ModelSpec& spec, const VisionSpec& v) {
  require_in_range(spec, "vision layers", v.layers, kMaxModelLayers);
  require_in_range(spec, "vision hidden", v.hidden, kMaxModelWidth);
  require_in_range(spec, "vision heads", v.heads, kMaxModelWidth);
  require_in_range(spec, "vision ffn", v.ffn, kMaxModelFfn);
  require_in_range(spec, "image_size", v.image_size, kMaxImageSize);
  require_in_range(spec, "patch_size", v.patch_size, v.image_size);
  require_in_range(spec, "channels", v.channels, 16);
  require_in_range(spec, "images", v.images, kMaxModelLayers);
  if (v.image_size % v.patch_size != 0) {
    fail("model {}: image_size = {}: must be a multiple of patch_size ({}), the image being cut into whole "
         "patches; change image_size or patch_size",
         spec.name, v.image_size, v.patch_size);
  }
  if (v.hidden % v.heads != 0) {
    fail("model {}: vision hidden = {}: must be a multiple of the vision heads ({}); change hidden_size or "
         "num_attention_heads of the vision tower",
         spec.name, v.hidden, v.heads);
  }
  const std::int64_t images = static_cast<std::int64_t>(v.images) * image_tokens(v);
  if (spec.max_positions <= images) {
    fail("model {}: max_positions = {} (the language model's context: n_ctx, or a config.json's n_positions or "
         "max_position_embeddings): must exceed the {} image tokens in front of the text ({} image(s) of {}); raise "
         "it above {}, or the vision tower's patch_size",
         spec.name, spec.max_positions, images, v.images, image_tokens(v), images);
  }
}

}  // namespace

int gpt_ffn(int hidden) {
  return static_cast<int>(std::min<std::int64_t>(std::int64_t{4} * hidden, std::numeric_limits<int>::max()));
}

std::string_view to_string(Architecture architecture) {
  return architecture == Architecture::kGpt ? "gpt" : "llama";
}

ModelSpec gpt_model(std::string name, int layers, int hidden, int heads, int vocab, int max_positions) {
  return ModelSpec{.name = std::move(name),
                   .architecture = Architecture::kGpt,
                   .layers = layers,
                   .hidden = hidden,
                   .heads = heads,
                   .kv_heads = heads,
                   .ffn = gpt_ffn(hidden),
                   .vocab = vocab,
                   .max_positions = max_positions,
                   .tied_embeddings = true,
                   .dropout = false};
}

void validate_model(const ModelSpec& spec) {
  require_in_range(spec, "layers", spec.layers, kMaxModelLayers);
  require_in_range(spec, "hidden", spec.hidden, kMaxModelWidth);
  require_in_range(spec, "heads", spec.heads, kMaxModelWidth);
  require_in_range(spec, "kv_heads", spec.kv_heads, kMaxModelWidth);
  require_in_range(spec, "ffn", spec.ffn, kMaxModelFfn);
  require_in_range(spec, "vocab", spec.vocab, kMaxModelVocab);
  require_in_range(spec, "max_positions", spec.max_positions, kMaxModelPositions);
  if (spec.architecture == Architecture::kGpt && spec.kv_heads != spec.heads) {
    fail("model {}: kv_heads = {}: a gpt model has multi-head attention, kv_heads must equal heads ({}); "
         "use a llama model for grouped-query attention",
         spec.name, spec.kv_heads, spec.heads);
  }
  if (spec.architecture == Architecture::kLlama) check_head_width(spec);
  if (spec.heads % spec.kv_heads != 0) {
    fail("model {}: kv_heads = {}: must divide heads ({})", spec.name, spec.kv_heads, spec.heads);
  }
  if (spec.vision) validate_vision(spec, *spec.vision);
}

int patch_tokens(const VisionSpec& vision) {
  const int side = vision.image_size / vision.patch_size;
  return side * side;
}

int vision_tokens(const VisionSpec& vision) { return patch_tokens(vision) + (vision.class_token ? 1 : 0); }

int image_tokens(const VisionSpec& vision) {
  return patch_tokens(vision) + (vision.class_token && !vision.drop_class_token ? 1 : 0);
}

void check_head_width(const ModelSpec& spec) {
  if (spec.hidden % spec.heads != 0) {
    fail("model {}: hidden = {}: must be a multiple of heads ({}), each head being hidden/heads wide: change "
         "hidden (n_embd) or heads (n_head)",
         spec.name, spec.hidden, spec.heads);
  }
}

double kv_width(const ModelSpec& spec) {
  return 2.0 * spec.kv_heads * (static_cast<double>(spec.hidden) / spec.heads);
}

std::int64_t parameter_count(const ModelSpec& spec) {
  ParallelConfig config;
  // Parameters do not depend on the sequence: the shortest it may be.
  config.seq_length = image_tokens_per_sequence(spec) + 1;
  return sum_layers(pipeline_layers(spec, config)).parameters;
}

const std::vector<ModelSpec>& model_presets() {
  static const std::vector<ModelSpec> presets = make_presets();
  return presets;
}

ModelSpec model_preset(std::string_view name) {
  for (const ModelSpec& spec : model_presets()) {
    if (spec.name == name) return spec;
  }
  fail("unknown model {}: use one of {} or the path of a Hugging Face config.json", quoted_excerpt(name),
       preset_names());
}

ModelSpec resolve_model(std::string_view name_or_path) {
  const bool is_path = name_or_path.find('/') != std::string_view::npos || name_or_path.ends_with(".json");
  return is_path ? model_from_hf_config(std::filesystem::path(name_or_path)) : model_preset(name_or_path);
}

}  // namespace pipeflow
