#include "pipeflow/runtime/stage_partition.h"

#include <fmt/format.h>

#include "pipeflow/core/error.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/nn/shape_captions.h"
#include "pipeflow/tensor/layernorm.h"

namespace pipeflow::runtime {

ModelSpec model_spec(const nn::ModelConfig& config, std::string name) {
  if (name.empty()) name = fmt::format("{}-{}x{}", nn::to_string(config.family), config.n_layer, config.n_embd);
  if (!config.llama()) {
    return gpt_model(std::move(name), config.n_layer, config.n_embd, config.n_head, config.vocab_size,
                     config.context);
  }
  const nn::RopeScaling& r = config.rope_scaling;
  return ModelSpec{.name = std::move(name),
                   .architecture = Architecture::kLlama,
                   .layers = config.n_layer,
                   .hidden = config.n_embd,
                   .heads = config.n_head,
                   .kv_heads = config.kv_heads(),
                   .ffn = config.ffn(),
                   .vocab = config.vocab_size,
                   .max_positions = config.context,
                   .tied_embeddings = config.tied_embeddings,
                   .dropout = false,
                   .llama = {.rope_theta = config.rope_theta,
                             .rope_type = r.factor == 1 ? "default" : "llama3",
                             .rope_factor = r.factor,
                             .rope_low_freq_factor = r.low_freq_factor,
                             .rope_high_freq_factor = r.high_freq_factor,
                             .rope_original_context = r.original_context,
                             .rms_norm_eps = config.norm_eps}};
}

namespace {

// transformers' names of the activation nn computes: GPT-2's tanh
// approximation of GELU (tensor/gelu.h).
bool names_tanh_gelu(std::string_view activation) {
  return activation == "gelu_new" || activation == "gelu_pytorch_tanh";
}

}  // namespace

nn::ModelConfig runtime_model(const ModelSpec& spec, const std::string& source, std::string_view section) {
  if (spec.vision) {
    fail("{}: model {} is a vision-language model: nn runs it as nn::VlmConfig (runtime_vlm_model), not as a "
         "language model",
         source, spec.name);
  }
  nn::ModelConfig config{.vocab_size = spec.vocab,
                         .context = spec.max_positions,
                         .n_layer = spec.layers,
                         .n_head = spec.heads,
                         .n_embd = spec.hidden};
  if (spec.architecture == Architecture::kGpt) {
    // Each thing pipeflow's GPT-2 does otherwise, by the config.json key that sets it.
    const auto refuse = [&](std::string_view key_and_value, std::string_view fix) {
      fail("{}: model {}: {}{}: pipeflow train runs GPT-2 with a GELU MLP of 4 x n_embd, the LM head tied to wte and "
           "no dropout; in its config.json{}, {}{}",
           source, spec.name, section.empty() ? "" : fmt::format("{} ", section), key_and_value,
           section.empty() ? "" : fmt::format("'s {}", section), fix,
           section.empty() ? " (or give the model inline as {\"n_layer\", \"n_head\", \"n_embd\", \"n_ctx\", "
                             "\"vocab_size\"})"
                           : "");
    };
    if (!spec.tied_embeddings) refuse("tie_word_embeddings = false", "set tie_word_embeddings to true or remove it");
    if (spec.ffn != gpt_ffn(spec.hidden)) {
      refuse(fmt::format("n_inner = {}", spec.ffn), fmt::format("set n_inner to {} or remove it", gpt_ffn(spec.hidden)));
    }
    if (spec.dropout) refuse("dropout > 0", "set attn_pdrop, resid_pdrop and embd_pdrop to 0");
    if (!names_tanh_gelu(spec.gpt_activation)) {
      refuse(fmt::format("activation_function = \"{}\"", spec.gpt_activation),
             "set activation_function to \"gelu_new\" (GPT-2's tanh GELU, which pipeflow computes)");
    }
    if (spec.layer_norm_eps != kLayerNormEpsilon) {
      refuse(fmt::format("layer_norm_epsilon = {:g}", spec.layer_norm_eps),
             fmt::format("set layer_norm_epsilon to {:g} (GPT-2's, which pipeflow computes)", kLayerNormEpsilon));
    }
    if (spec.kv_heads != spec.heads) {
      refuse(fmt::format("{} key-value heads of {} heads", spec.kv_heads, spec.heads),
             "give GPT-2's multi-head attention (as many key-value heads as heads)");
    }
  } else {
    const LlamaNumerics& n = spec.llama;
    if (spec.dropout) {
      fail("{}: model {} has attention_dropout > 0: pipeflow train runs Llama without dropout; set it to 0", source,
           spec.name);
    }
    if (n.rope_type != "default" && n.rope_type != "llama3") {
      fail("{}: model {} has rope_scaling of type \"{}\": pipeflow train computes Llama 3's \"llama3\" scaling "
           "or none; remove rope_scaling or use llama3",
           source, spec.name, n.rope_type);
    }
    config.family = nn::Family::kLlama;
    config.n_kv_head = spec.kv_heads;
    config.intermediate = spec.ffn;
    config.rope_theta = n.rope_theta;
    config.norm_eps = n.rms_norm_eps;
    config.tied_embeddings = spec.tied_embeddings;
    if (n.rope_type == "llama3") {
      config.rope_scaling = {.factor = n.rope_factor,
                             .low_freq_factor = n.rope_low_freq_factor,
                             .high_freq_factor = n.rope_high_freq_factor,
                             .original_context = n.rope_original_context};
    }
  }
  try {
    config.validate();
  } catch (const Error& error) {
    fail("{}: model {}: {}", source, spec.name, error.what());
  }
  return config;
}

nn::VlmConfig runtime_vlm_model(const ModelSpec& spec, const std::string& source) {
  if (!spec.vision) fail("{}: model {} has no vision tower: it is a language model", source, spec.name);
  try {  // the model module's rules first, in the run configuration's keys (the context above the image tokens)
    validate_model(spec);
  } catch (const Error& error) {
    fail("{}: {}", source, error.what());
  }
  const VisionSpec& v = *spec.vision;
  const auto refuse = [&](std::string_view key_and_value, std::string_view rule) {
    fail("{}: model {}: {}: {}. pipeflow train's vision-language model is CLIP's tower of GPT-2 blocks (MLP 4 x "
         "width) over one {} x {} RGB image of the generated shape captions, its patch tokens projected into a "
         "GPT-2: give a LLaVA config.json of that shape (examples/models/tiny-llava/config.json) or the model inline "
         "as {{\"n_layer\", \"n_head\", \"n_embd\", \"n_ctx\", \"vision\": {{\"n_layer\", \"n_head\", \"n_embd\", "
         "\"image_size\": {}, \"patch_size\"}}}} (simulate and plan price any LLaVA)",
         source, spec.name, key_and_value, rule, nn::ShapeCaptions::kImageSize, nn::ShapeCaptions::kImageSize,
         nn::ShapeCaptions::kImageSize);
  };
  if (spec.architecture != Architecture::kGpt) {
    refuse("text_config model_type = \"llama\" (transformers' default where text_config or its model_type is "
           "absent)",
           "the language model behind the tower is GPT-2's; give a text_config with model_type \"gpt2\", n_layer, "
           "n_head, n_embd, n_positions, vocab_size and attn_pdrop, resid_pdrop, embd_pdrop 0");
  }
  if (!v.drop_class_token) {
    refuse("vision_feature_select_strategy = \"full\"", "the projector takes the patch tokens alone (\"default\")");
  }
  if (!names_tanh_gelu(v.activation)) {
    refuse(fmt::format("vision_config hidden_act = \"{}\"{}", v.activation,
                       v.activation == "quick_gelu" ? " (CLIP's activation, and CLIPVisionConfig's default)" : ""),
           "the tower computes GPT-2's tanh GELU; set vision_config's hidden_act to \"gelu_new\"");
  }
  if (!names_tanh_gelu(v.projector_activation)) {
    refuse(fmt::format("projector_hidden_act = \"{}\"{}", v.projector_activation,
                       v.projector_activation == "gelu" ? " (LlavaConfig's default)" : ""),
           "the projector computes GPT-2's tanh GELU; set projector_hidden_act to \"gelu_new\"");
  }
  if (v.layer_norm_eps != kLayerNormEpsilon) {
    refuse(fmt::format("vision_config layer_norm_eps = {:g}", v.layer_norm_eps),
           fmt::format("the tower's LayerNorms add {:g}; set layer_norm_eps to {:g}", kLayerNormEpsilon,
                       kLayerNormEpsilon));
  }
  if (v.ffn != gpt_ffn(v.hidden)) {
    refuse(fmt::format("vision_config intermediate_size = {}", v.ffn),
           fmt::format("the tower's MLP is 4 x hidden_size = {}", gpt_ffn(v.hidden)));
  }
  if (v.channels != nn::ShapeCaptions::kChannels) {
    refuse(fmt::format("vision_config num_channels = {}", v.channels),
           fmt::format("the images have {} colour planes", nn::ShapeCaptions::kChannels));
  }
  if (v.image_size != nn::ShapeCaptions::kImageSize) {
    refuse(fmt::format("vision image_size = {}", v.image_size),
           fmt::format("the generated images are {} pixels a side", nn::ShapeCaptions::kImageSize));
  }
  if (v.images != 1) refuse(fmt::format("{} images per sequence", v.images), "each caption has one image");
  ModelSpec text = spec;
  text.vision.reset();
  nn::VlmConfig config{.vision = {.geometry = {.image_size = v.image_size,
                                               .patch_size = v.patch_size,
                                               .channels = v.channels},
                                  .width = v.hidden,
                                  .heads = v.heads,
                                  .layers = v.layers},
                       .text = runtime_model(text, source, "text_config")};
  try {
    config.validate();
  } catch (const Error& error) {
    fail("{}: model {}: {}", source, spec.name, error.what());
  }
  return config;
}

std::vector<int> partition_model(const nn::ModelConfig& config, int stages, const PartitionMethod& method,
                                 int micro_batch, int seq_length, const HardwareProfile& hardware) {
  const ParallelConfig parallel{.micro_batch = micro_batch, .seq_length = seq_length, .bytes_per_element = 4};
  return partition_layers(pipeline_layers(model_spec(config), parallel), stages, method, hardware).boundaries;
}

}  // namespace pipeflow::runtime
