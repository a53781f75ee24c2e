#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_spec.h"
#include "pipeflow/model/partition.h"
#include "pipeflow/nn/model_config.h"
#include "pipeflow/nn/vision_language_model.h"

namespace pipeflow::runtime {

// The two descriptions of a model, the planner's (ModelSpec: what it
// counts) and nn's (ModelConfig: what it computes), one from the other.
// model_spec gives the same layers under the same names (embedding, block.i,
// head), to cut an nn model with the model module's partitioners and to
// predict it. runtime_model gives the GPT-2 or Llama nn trains, or an Error
// naming `source`, the key and what nn runs: a GPT with dropout, an MLP
// other than 4·n_embd, an untied head, an activation_function other than
// the tanh GELU or a layer_norm_epsilon other than 1e-5; a Llama with
// attention dropout or a rope_scaling type other than llama3. `section`:
// the config.json section the keys are in ("text_config" of a LLaVA).
ModelSpec model_spec(const nn::ModelConfig& config, std::string name = "");
nn::ModelConfig runtime_model(const ModelSpec& spec, const std::string& source, std::string_view section = "");
// The small vision-language model nn trains (nn/vision_language_model.h) of
// a spec with a vision tower, the run configuration's inline
// {..., vision {...}} or a LLaVA config.json: CLIP's tower (class token,
// MLP 4 x width, one RGB image of the shape captions' 16 x 16 pixels, the
// patch tokens projected: vision_feature_select_strategy "default") in
// front of a GPT-2 that runtime_model runs, the tower's and projector's
// activation the tanh GELU and its LayerNorms' eps 1e-5; an Error naming
// `source`, the key, the value and what nn runs otherwise (a Llama
// text_config among them, transformers' default without one).
nn::VlmConfig runtime_vlm_model(const ModelSpec& spec, const std::string& source);

// The layer boundaries (stages + 1 of them, see model/partition.h) that
// `method` gives for the model run in float32 with micro-batches of
// `micro_batch` sequences of `sequence` tokens; `hardware` prices the layers
// for "balanced". Errors name the method and the rule (more stages than layers, ...).
std::vector<int> partition_model(const nn::ModelConfig& config, int stages, const PartitionMethod& method,
                                 int micro_batch, int seq_length, const HardwareProfile& hardware);

}  // namespace pipeflow::runtime
