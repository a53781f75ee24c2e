#include "pipeflow/runtime/stage_traits.h"

#include <fmt/format.h>

#include <utility>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/model_file.h"

namespace pipeflow::runtime {

void StageTraits<nn::Stage>::validate(const Config& config, const EngineOptions& options, int tensor_parallel) {
  config.validate();
  if (options.seq_length < 1 || options.seq_length > config.context) {
    fail("seq_length {} must lie in [1, {}] (the model's context)", options.seq_length, config.context);
  }
  nn::validate_tensor_parallel(config, tensor_parallel);
}

std::unique_ptr<nn::Stage> StageTraits<nn::Stage>::make_stage(const Config& config, nn::LayerRange range,
                                                              const EngineOptions& options, std::string name,
                                                              nn::TensorGroup* tensor) {
  return std::make_unique<nn::Stage>(config, range,
                                     nn::StageOptions{.recompute_interval = options.recompute_interval,
                                                      .name = std::move(name),
                                                      .format = options.format,
                                                      .tensor = tensor,
                                                      .sequence_parallel = options.sequence_parallel});
}

std::unique_ptr<nn::Stage> StageTraits<nn::Stage>::whole_model(const Config& config) {
  return std::make_unique<nn::Stage>(config, nn::all_layers(config), nn::StageOptions{0, "model"});
}

// Every tensor-parallel rank holds equal parts: tensor rank 0's count.
std::int64_t StageTraits<nn::Stage>::parameter_count(const Config& config, nn::LayerRange range, int tensor_parallel) {
  return nn::ParameterLayout(config, range, {.size = tensor_parallel, .rank = 0}).total();
}

void StageTraits<nn::Stage>::write_config(nn::SafetensorsWriter& writer, const Config& config) {
  nn::write_config(writer, config);
}

void StageTraits<nn::Stage>::check_file(const nn::SafetensorsFile& file, const Config& config) {
  const nn::ModelConfig stored = nn::read_config(file);
  if (!(stored == config)) {
    fail("{}: holds a model {}; the run's model is a {}", file.source(), nn::describe(stored), nn::describe(config));
  }
}

void StageTraits<nn::Stage>::load(nn::Stage& st, const nn::SafetensorsFile& file) { nn::load_parameters(st, file); }

void StageTraits<nn::VlmStage>::validate(const Config& config, const EngineOptions& options, int tensor_parallel) {
  config.model.validate();
  const auto refuse = [](std::string_view key_and_value, std::string_view fix) {
    fail("{}: pipeflow runs a vision-language model {}", key_and_value, fix);
  };
  const int sequence = config.model.vision.tokens() + nn::ShapeCaptions::kCaptionBytes;
  if (options.seq_length != sequence) {
    // seq_length defaults to the language model's context, which must hold the sequence too.
    const int context = config.model.text.context;
    refuse(fmt::format("seq_length = {}", options.seq_length),
           fmt::format("over its {} image tokens and a caption of {} bytes; {}", config.model.vision.tokens(),
                       nn::ShapeCaptions::kCaptionBytes,
                       context < sequence ? fmt::format("raise the language model's context (n_ctx, or a config.json's "
                                                        "n_positions) from {} to {} and set seq_length to {} or leave "
                                                        "it out",
                                                        context, sequence, sequence)
                                          : fmt::format("set seq_length to {}", sequence)));
  }
  if (tensor_parallel > 1) {
    refuse(fmt::format("tensor_parallel = {}", tensor_parallel), "with its stages whole; set tensor_parallel to 1");
  }
  if (options.format != ComputeFormat::kFp32 || options.loss_scale) {
    refuse(fmt::format("{}.enabled = true", to_string(options.format)),
           "in fp32; remove the section (pipeflow simulate prices 16-bit formats)");
  }
  if (options.recompute_interval > 0) {
    refuse(fmt::format("pipeline.activation_checkpoint_interval = {}", options.recompute_interval),
           "keeping every activation; set it to 0");
  }
}

std::unique_ptr<nn::VlmStage> StageTraits<nn::VlmStage>::make_stage(const Config& config, nn::LayerRange range,
                                                                    const EngineOptions&, std::string name,
                                                                    nn::TensorGroup*) {
  return std::make_unique<nn::VlmStage>(
      config.model, range,
      nn::VlmStageOptions{.name = std::move(name), .freeze_vision = config.freeze_vision, .lora = config.lora});
}

std::unique_ptr<nn::VlmStage> StageTraits<nn::VlmStage>::whole_model(const Config& config) {
  return make_stage(config, {0, config.model.pipeline_layers()}, {}, "the whole model", nullptr);
}

// The stage's trained tensors (frozen ones left out, LoRA adapters in), counted without building it.
std::int64_t StageTraits<nn::VlmStage>::parameter_count(const Config& config, nn::LayerRange range, int) {
  return nn::vlm_stage_layouts(config.model, range, {.freeze_vision = config.freeze_vision, .lora = config.lora})
      .trained.total();
}

namespace {

// What of the model a run trains, as its checkpoint's metadata records it:
// a checkpoint holds the optimizer state of exactly those tensors.
std::string trained_part(const VlmTraining& config) {
  return fmt::format("freeze {}, lora {}", config.freeze_vision ? "[\"vision.*\"]" : "[]",
                     config.lora ? fmt::format("{{r {}, alpha {:g}}}", config.lora->r, config.lora->alpha) : "none");
}

}  // namespace

void StageTraits<nn::VlmStage>::write_config(nn::SafetensorsWriter& writer, const Config& config) {
  writer.set_metadata("model_type", std::string(kModelType));
  writer.set_metadata("trained", trained_part(config));
}

void StageTraits<nn::VlmStage>::check_file(const nn::SafetensorsFile& file, const Config& config) {
  const auto type = file.metadata().find("model_type");
  if (type == file.metadata().end() || type->second != kModelType) {
    fail("{}: __metadata__ model_type = {}: not a vision-language model's weights (model_type \"{}\"), so the "
         "run's model cannot load them; give checkpoint.load (--resume) a checkpoint a vision-language run wrote, or "
         "train the file's model with its own configuration",
         file.source(), type == file.metadata().end() ? std::string("absent") : fmt::format("\"{}\"", type->second),
         kModelType);
  }
  const auto trained = file.metadata().find("trained");
  if (trained == file.metadata().end() || trained->second == trained_part(config)) return;
  fail("{}: __metadata__ trained = \"{}\": the checkpoint holds the optimizer state of what its run trained, and "
       "this run trains another part of the model ({}); resume with the checkpoint's freeze and lora",
       file.source(), trained->second, trained_part(config));
}

void StageTraits<nn::VlmStage>::load(nn::VlmStage& st, const nn::SafetensorsFile& file) {
  for (const nn::ParameterLayout* layout : saved_layouts(st)) {
    for (const nn::ParameterInfo& info : layout->entries()) {
      file.read_floats(info.name, info.shape, st.parameter(info.name));
    }
  }
}

void StageTraits<nn::Stage>::load(nn::Stage& st, const Source& source, std::int64_t step, std::int64_t first,
                                  int count, nn::StageInput& input) {
  if (!st.has_embedding() && !st.has_head()) return;
  nn::Batch batch = source.batch(step, first, count, st.allocator());
  if (st.has_embedding()) input.tokens = std::move(batch.inputs);
  if (st.has_head()) input.targets = std::move(batch.targets);
}

Shape StageTraits<nn::Stage>::message_shape(const nn::Stage& st, const EngineOptions& options, bool) {
  return {options.micro_batch, st.positions_held(options.seq_length), st.config().n_embd};
}

// The rows of the stage's copy of the tied embedding: the vocabulary, or
// its tensor-parallel rank's part of it.
Shape StageTraits<nn::Stage>::tied_shape(const nn::Stage& st) {
  return {st.layout().at(st.config().embedding_name()).shape[0], st.config().n_embd};
}

void StageTraits<nn::VlmStage>::load(nn::VlmStage& st, const Source& source, std::int64_t step, std::int64_t first,
                                     int count, nn::VlmInput& input) {
  if (!st.has_images() && !st.has_text_embedding() && !st.has_head()) return;
  nn::ShapeCaptions::Batch batch = source.batch(nn::Split::kTrain, step, first, count, st.allocator());
  if (st.has_images()) input.images = std::move(batch.images);
  if (st.has_text_embedding()) input.tokens = std::move(batch.tokens);
  if (st.has_head()) input.targets = std::move(batch.targets);
}

// The input of the stage's first layer (an activation), or of the layer
// after its last (the gradient of its output).
Shape StageTraits<nn::VlmStage>::message_shape(const nn::VlmStage& st, const EngineOptions& options, bool gradient) {
  const nn::VlmConfig& c = st.config();
  const int layer = gradient ? st.layers().last : st.layers().first;
  return nn::vlm_activation_shape(c, layer, options.micro_batch, options.seq_length - c.vision.tokens());
}

StageId StageTraits<nn::VlmStage>::embedding_stage(const Config& config, std::span<const int> boundaries) {
  const int layer = config.model.embedding_layer();
  for (std::size_t s = 0; s + 1 < boundaries.size(); ++s) {
    if (boundaries[s] <= layer && layer < boundaries[s + 1]) return StageId(static_cast<int>(s));
  }
  fail("no stage holds the language model's embedding (layer {}) in a cut of {} layers", layer, boundaries.back());
}

}  // namespace pipeflow::runtime
