#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/core/ids.h"
#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/model_config.h"
#include "pipeflow/nn/parameter_layout.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/nn/shape_captions.h"
#include "pipeflow/nn/stage.h"
#include "pipeflow/nn/tensor_group.h"
#include "pipeflow/nn/vision_language_model.h"
#include "pipeflow/runtime/batch_source.h"
#include "pipeflow/runtime/engine_options.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::runtime {

// A vision-language model as the engine trains it: its shape and what of it
// trains (nn::VlmStageOptions without the stage's name).
struct VlmTraining {
  nn::VlmConfig model;
  bool freeze_vision = false;
  std::optional<nn::LoraOptions> lora = std::nullopt;
  bool operator==(const VlmTraining&) const = default;
};

// What the engine and its rank worker ask of a kind of stage beyond its
// passes, in one place per kind: the model's description (Config) and where
// a micro-batch's data come from (Source); building a stage from them and a
// layer range, and what the kind refuses; what of the stage a checkpoint
// holds; where a micro-batch's data go in the stage, whether it takes an
// activation, the shape of a message it receives, which of its boundaries
// carry a gradient, and its side of the tied embedding. Defined for
// nn::Stage (a GPT-2 or Llama) and nn::VlmStage (the vision-language model).
template <class StageT>
struct StageTraits;

template <>
struct StageTraits<nn::Stage> {
  using Config = nn::ModelConfig;
  using Source = BatchSource;

  // --- The engine ---
  // Error naming what the model, the options and `tensor_parallel` ranks do not fit.
  static void validate(const Config& config, const EngineOptions& options, int tensor_parallel);
  static int pipeline_layers(const Config& config) { return config.pipeline_layers(); }
  static std::unique_ptr<nn::Stage> make_stage(const Config& config, nn::LayerRange range,
                                               const EngineOptions& options, std::string name,
                                               nn::TensorGroup* tensor);
  static std::unique_ptr<nn::Stage> whole_model(const Config& config);
  // Every tensor name of a range (the tied wte on both its stages), and the
  // trained parameters a tensor-parallel rank of it holds.
  static nn::ParameterLayout range_layout(const Config& config, nn::LayerRange range) { return {config, range}; }
  static std::int64_t parameter_count(const Config& config, nn::LayerRange range, int tensor_parallel);
  // What a checkpoint holds of a stage beyond its trained tensors: nothing.
  static std::vector<const nn::ParameterLayout*> saved_layouts(const nn::Stage& st) { return {&st.layout()}; }
  // The model's shape in a weights file's metadata, and the check that a file's is the run's.
  static void write_config(nn::SafetensorsWriter& writer, const Config& config);
  static void check_file(const nn::SafetensorsFile& file, const Config& config);
  static void load(nn::Stage& st, const nn::SafetensorsFile& file);

  // --- The rank worker ---
  // The embedding's tokens and the head's targets of samples first … first
  // + count − 1 of step `step`.
  static void load(nn::Stage& st, const Source& source, std::int64_t step, std::int64_t first, int count,
                   nn::StageInput& input);
  static bool takes_activation(const nn::Stage& st) { return !st.has_embedding(); }
  // A received activation ([b, T, C], T/t under sequence parallelism) or
  // gradient of the stage's output: the same shape.
  static Shape message_shape(const nn::Stage& st, const EngineOptions& options, bool gradient);
  // The elements of the activation into layer `layer` of one micro-batch
  // ([b, T, C]): what a stage cut before it sends, as the simulator prices it.
  static std::int64_t boundary_elements(const Config& config, const EngineOptions& options, int /*layer*/) {
    return std::int64_t{options.micro_batch} * options.seq_length * config.n_embd;
  }
  static bool sends_gradient(const nn::Stage& st) { return !st.has_embedding(); }
  static bool receives_gradient(const nn::Stage& st) { return !st.has_head(); }
  static bool holds_embedding(const nn::Stage& st) { return st.has_embedding(); }
  // The stage holding the embedding (its copy of the tied wte), from the
  // cut alone, so that every process knows it: the first.
  static StageId embedding_stage(const Config&, std::span<const int>) { return StageId(0); }
  static Shape tied_shape(const nn::Stage& st);  // [V or its tensor-parallel part, C]
};

// The VLM: the first stage loads its micro-batch's images, the LM
// embedding's stage its text, the head's its targets; a message is
// [b, N, D] into a layer of the encoder or the projector, [b, N, C] into
// the LM's embedding, [b, N + T_c, C] after it; the boundaries into a
// frozen encoder carry no gradient (their SEND_B and RECV_B move nothing).
// Its stages are whole, fp32 and keep every activation: the engine refuses
// tensor parallelism, 16-bit formats, a loss scale and recomputation.
// A checkpoint holds its frozen tensors too (by name, as the trained ones).
template <>
struct StageTraits<nn::VlmStage> {
  using Config = VlmTraining;
  using Source = nn::ShapeCaptions;  // its training split

  static void validate(const Config& config, const EngineOptions& options, int tensor_parallel);
  static int pipeline_layers(const Config& config) { return config.model.pipeline_layers(); }
  static std::unique_ptr<nn::VlmStage> make_stage(const Config& config, nn::LayerRange range,
                                                  const EngineOptions& options, std::string name,
                                                  nn::TensorGroup* tensor);
  static std::unique_ptr<nn::VlmStage> whole_model(const Config& config);
  static nn::ParameterLayout range_layout(const Config& config, nn::LayerRange range) {
    return nn::vlm_layout(config.model, range);
  }
  static std::int64_t parameter_count(const Config& config, nn::LayerRange range, int tensor_parallel);
  static std::vector<const nn::ParameterLayout*> saved_layouts(const nn::VlmStage& st) {
    return {&st.layout(), &st.frozen_layout()};
  }
  // A file's __metadata__ model_type says it holds this kind's tensors
  // (LLaVA's name for the kind); the model's shape is checked tensor by
  // tensor, by name and shape, as they are read. A file without it (a
  // language model's) is an Error naming it, the key and the fix.
  static constexpr std::string_view kModelType = "llava";
  static void write_config(nn::SafetensorsWriter& writer, const Config& config);
  static void check_file(const nn::SafetensorsFile& file, const Config& config);
  static void load(nn::VlmStage& st, const nn::SafetensorsFile& file);

  static void load(nn::VlmStage& st, const Source& source, std::int64_t step, std::int64_t first, int count,
                   nn::VlmInput& input);
  static bool takes_activation(const nn::VlmStage& st) { return !st.has_images(); }
  static Shape message_shape(const nn::VlmStage& st, const EngineOptions& options, bool gradient);
  static std::int64_t boundary_elements(const Config& config, const EngineOptions& options, int layer) {
    return nn::vlm_activation_shape(config.model, layer, options.micro_batch,
                                    options.seq_length - config.model.vision.tokens())
        .numel();
  }
  static bool sends_gradient(const nn::VlmStage& st) {
    return !st.has_images() && !frozen_below(st, st.layers().first);
  }
  static bool receives_gradient(const nn::VlmStage& st) {
    return !st.has_head() && !frozen_below(st, st.layers().last);
  }
  static bool holds_embedding(const nn::VlmStage& st) { return st.has_text_embedding(); }
  // The stage whose layers hold the LM's embedding, wherever the cut puts it.
  static StageId embedding_stage(const Config& config, std::span<const int> boundaries);
  static Shape tied_shape(const nn::VlmStage& st) { return st.layout().at("wte.weight").shape; }

 private:
  // Whether the input of layer `layer` is inside a frozen encoder (no gradient reaches it).
  static bool frozen_below(const nn::VlmStage& st, int layer) {
    return st.options().freeze_vision && layer <= st.config().projector_layer();
  }
};

}  // namespace pipeflow::runtime
