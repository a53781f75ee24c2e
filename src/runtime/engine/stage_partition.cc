#include "pipeflow/runtime/stage_partition.h"

#include <fmt/format.h>

#include "pipeflow/core/error.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/nn/shape_captions.h"

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

nn::ModelConfig runtime_model(const ModelSpec& spec, const std::string& source) {
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
    if (spec.ffn != 4 * spec.hidden || !spec.tied_embeddings || spec.dropout || spec.kv_heads != spec.heads) {
      fail("{}: model {} is a GPT that pipeflow train does not run (it runs GPT-2 with a GELU MLP of 4 x n_embd, the "
           "LM head tied to wte, no dropout): give the model as {{\"n_layer\", \"n_head\", \"n_embd\", "
           "\"n_ctx\", \"vocab_size\"}}, a Llama, or set its dropout to 0",
           source, spec.name);
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
    refuse("text_config model_type = \"llama\"",
           "the language model behind the tower is GPT-2's; set text_config's model_type to \"gpt2\" with n_layer, "
           "n_head, n_embd, n_positions, vocab_size and attn_pdrop, resid_pdrop, embd_pdrop 0");
  }
  if (!v.class_token) refuse("vision class_token = false", "the tower is CLIP's, a class token before the patches");
  if (!v.drop_class_token) {
    refuse("vision_feature_select_strategy = \"full\"", "the projector takes the patch tokens alone (\"default\")");
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
                       .text = runtime_model(text, source)};
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
