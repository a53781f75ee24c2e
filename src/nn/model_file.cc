#include "pipeflow/nn/model_file.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <string_view>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/parameter_layout.h"

namespace pipeflow::nn {
namespace {

int metadata_int(const SafetensorsFile& file, const char* key) {
  const std::int64_t value = file.metadata_count(key);
  if (value > std::numeric_limits<int>::max()) fail("{}: __metadata__ {} = {} is too large", file.source(), key, value);
  return static_cast<int>(value);
}

bool metadata_flag(const SafetensorsFile& file, const char* key) {
  const std::string& text = file.metadata(key);
  if (text != "true" && text != "false") fail("{}: __metadata__ {} = \"{}\" must be true or false", file.source(), key, text);
  return text == "true";
}

// A parameter's name for `name`: itself, or the name of the parameter
// whose AdamW moment or gradient it holds.
std::string_view parameter_of(std::string_view name) {
  for (const std::string_view state : {"exp_avg_sq.", "exp_avg.", "grad."}) {
    if (name.starts_with(state)) return name.substr(state.size());
  }
  return name;
}

// `name` with a block's index written 0: the name the family's one-block
// model gives the same tensor of its block.
std::string in_first_block(std::string_view name, const ModelConfig& config) {
  const std::string_view block = config.llama() ? "model.layers." : "h.";
  if (!name.starts_with(block)) return std::string(name);
  const std::size_t dot = name.find('.', block.size());
  if (dot == name.npos) return std::string(name);
  const std::string_view index = name.substr(block.size(), dot - block.size());
  if (index.empty() || index.find_first_not_of("0123456789") != index.npos) return std::string(name);
  return fmt::format("{}0{}", block, name.substr(dot));
}

// Shortest text that reads back as the same double.
std::string number_text(double value) { return fmt::format("{}", value); }

}  // namespace

std::map<std::string, std::string> config_metadata(const ModelConfig& config) {
  std::map<std::string, std::string> m = {{"n_layer", std::to_string(config.n_layer)},
                                          {"n_head", std::to_string(config.n_head)},
                                          {"n_embd", std::to_string(config.n_embd)},
                                          {"n_ctx", std::to_string(config.context)},
                                          {"vocab_size", std::to_string(config.vocab_size)}};
  if (!config.llama()) return m;
  const RopeScaling& r = config.rope_scaling;
  m["model_type"] = "llama";
  m["n_kv_head"] = std::to_string(config.kv_heads());
  m["intermediate_size"] = std::to_string(config.ffn());
  m["rope_theta"] = number_text(config.rope_theta);
  m["rms_norm_eps"] = number_text(config.norm_eps);
  m["tie_word_embeddings"] = config.tied_embeddings ? "true" : "false";
  m["rope_scaling.factor"] = number_text(r.factor);
  m["rope_scaling.low_freq_factor"] = number_text(r.low_freq_factor);
  m["rope_scaling.high_freq_factor"] = number_text(r.high_freq_factor);
  m["rope_scaling.original_max_position_embeddings"] = std::to_string(r.original_context);
  return m;
}

void write_config(SafetensorsWriter& writer, const ModelConfig& config) {
  for (auto& [key, value] : config_metadata(config)) writer.set_metadata(key, value);
}

ModelConfig read_config(const SafetensorsFile& file) {
  ModelConfig config{.vocab_size = metadata_int(file, "vocab_size"),
                     .context = metadata_int(file, "n_ctx"),
                     .n_layer = metadata_int(file, "n_layer"),
                     .n_head = metadata_int(file, "n_head"),
                     .n_embd = metadata_int(file, "n_embd")};
  const auto type = file.metadata().find("model_type");
  if (type != file.metadata().end() && type->second != "gpt2") {
    if (type->second != "llama") {
      fail("{}: __metadata__ model_type = \"{}\": pipeflow reads \"gpt2\" and \"llama\" weights", file.source(),
           type->second);
    }
    config.family = Family::kLlama;
    config.n_kv_head = metadata_int(file, "n_kv_head");
    config.intermediate = metadata_int(file, "intermediate_size");
    config.rope_theta = file.metadata_number("rope_theta");
    config.norm_eps = file.metadata_number("rms_norm_eps");
    config.tied_embeddings = metadata_flag(file, "tie_word_embeddings");
    config.rope_scaling = {.factor = file.metadata_number("rope_scaling.factor"),
                           .low_freq_factor = file.metadata_number("rope_scaling.low_freq_factor"),
                           .high_freq_factor = file.metadata_number("rope_scaling.high_freq_factor"),
                           .original_context = metadata_int(file, "rope_scaling.original_max_position_embeddings")};
  }
  try {
    config.validate();
  } catch (const Error& error) {
    fail("{}: {}", file.source(), error.what());
  }
  return config;
}

void add_parameters(SafetensorsWriter& writer, const Stage& stage) {
  for (const ParameterInfo& info : stage.layout().entries()) writer.add(info.name, stage.parameter(info.name), info.shape);
}

void add_gradients(SafetensorsWriter& writer, const Stage& stage) {
  for (const ParameterInfo& info : stage.layout().entries()) writer.add(info.name, stage.gradient(info.name), info.shape);
}

void load_parameters(Stage& stage, const SafetensorsFile& file) {
  std::vector<float> whole;
  for (const ParameterInfo& info : stage.layout().entries()) {
    if (!info.split()) {
      file.read_floats(info.name, info.shape, stage.parameter(info.name));
      continue;
    }
    whole.resize(static_cast<std::size_t>(info.whole.numel()));
    file.read_floats(info.name, info.whole, whole);
    copy_part<float>(info, whole, stage.parameter(info.name));
  }
}

void check_values(const SafetensorsFile& file) {
  for (const std::string& name : file.names()) {
    if (file.entry(name).dtype == Dtype::kI32) continue;
    const Tensor values = file.floats(name);
    const bool second_moment = name.starts_with("exp_avg_sq.");
    for (std::int64_t i = 0; i < values.numel(); ++i) {
      const float v = values.data()[i];
      if (std::isfinite(v) && !(second_moment && v < 0)) continue;
      fail("{}: tensor {} holds {} at index {}: {}; start from another file or an earlier checkpoint", file.source(),
           name, v, i, second_moment ? "a second moment must be finite and >= 0" : "values must be finite");
    }
  }
}

void check_tensors_taken(const SafetensorsFile& file, const ModelConfig& config) {
  ModelConfig one_block = config;
  one_block.n_layer = 1;
  one_block.tied_embeddings = !config.llama();  // an untied Llama: lm_head.weight too
  const auto names = [](const ModelConfig& model) {
    const ParameterLayout layout(model, all_layers(model));
    std::set<std::string, std::less<>> out;
    for (const ParameterInfo& info : layout.entries()) out.insert(info.name);
    return out;
  };
  const auto family = names(one_block), taken = names(config);
  for (const std::string& name : file.names()) {
    const std::string_view parameter = parameter_of(name);
    if (taken.contains(parameter) || !family.contains(in_first_block(parameter, config))) continue;
    fail("{}: tensor {} is not a parameter of the model its metadata describes ({}): a file whose tensors the model "
         "does not all take is another model's, or its metadata is wrong; give this model's weights, or correct {} "
         "in its metadata (a Hugging Face checkpoint's: in the config.json beside it)",
         file.source(), name, describe(config), config.llama() ? "n_layer or tie_word_embeddings" : "n_layer");
  }
}

void write_weights(const std::filesystem::path& path, const Stage& stage, ComputeFormat trained_in) {
  SafetensorsWriter writer;
  write_config(writer, stage.config());
  writer.set_metadata("precision", to_string(trained_in));
  add_parameters(writer, stage);
  writer.write(path);
}

}  // namespace pipeflow::nn
