#include "pipeflow/nn/model_file.h"

#include <cmath>
#include <limits>
#include <string>

#include "pipeflow/core/error.h"

namespace pipeflow::nn {
namespace {

int metadata_int(const SafetensorsFile& file, const char* key) {
  const std::int64_t value = file.metadata_count(key);
  if (value > std::numeric_limits<int>::max()) fail("{}: __metadata__ {} = {} is too large", file.source(), key, value);
  return static_cast<int>(value);
}

}  // namespace

void write_config(SafetensorsWriter& writer, const ModelConfig& config) {
  writer.set_metadata("n_layer", std::to_string(config.n_layer));
  writer.set_metadata("n_head", std::to_string(config.n_head));
  writer.set_metadata("n_embd", std::to_string(config.n_embd));
  writer.set_metadata("n_ctx", std::to_string(config.context));
  writer.set_metadata("vocab_size", std::to_string(config.vocab_size));
}

ModelConfig read_config(const SafetensorsFile& file) {
  ModelConfig config{.vocab_size = metadata_int(file, "vocab_size"),
                   .context = metadata_int(file, "n_ctx"),
                   .n_layer = metadata_int(file, "n_layer"),
                   .n_head = metadata_int(file, "n_head"),
                   .n_embd = metadata_int(file, "n_embd")};
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
  for (const ParameterInfo& info : stage.layout().entries()) {
    file.read_floats(info.name, info.shape, stage.parameter(info.name));
  }
}

void check_values(const SafetensorsFile& file) {
  for (const std::string& name : file.names()) {
    if (file.entry(name).dtype != Dtype::kF32) continue;
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

void write_weights(const std::filesystem::path& path, const Stage& stage) {
  SafetensorsWriter writer;
  write_config(writer, stage.config());
  add_parameters(writer, stage);
  writer.write(path);
}

}  // namespace pipeflow::nn
