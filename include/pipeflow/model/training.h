#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/model/model_spec.h"
#include "pipeflow/model/pipeline_layers.h"

namespace pipeflow {

// LoRA (Hu et al. 2021): beside each targeted weight matrix W (in → out), a
// trainable A (in × r) and B (r × out), the output x·W + (α/r)·x·A·B. The
// base weights are frozen.
struct LoraSpec {
  int rank = 0;      // r
  double alpha = 0;  // α: scales the update; no effect on counts
  // Matrix names as PEFT's target_modules: Llama q_proj, k_proj, v_proj,
  // o_proj, gate_proj, up_proj, down_proj; GPT-2 c_attn, c_proj (the
  // attention's and the MLP's), c_fc. Adapters go into the language model's
  // blocks.
  std::vector<std::string> targets = {};
  // Layers trained whole beside the adapters (PEFT's modules_to_save, e.g.
  // LLaVA's "projector"): glob patterns over layer names. Every other
  // layer's weights are frozen.
  std::vector<std::string> train = {};

  friend bool operator==(const LoraSpec&, const LoraSpec&) = default;
};

// What trains. Default: everything.
struct TrainingSpec {
  // Glob patterns over pipeline layer names ('*' any run of characters,
  // '?' one, matched against the whole name): "vision.*", "block.1?". Each
  // must match a layer.
  std::vector<std::string> freeze = {};
  std::optional<LoraSpec> lora = std::nullopt;

  bool trains_everything() const { return freeze.empty() && !lora; }
  friend bool operator==(const TrainingSpec&, const TrainingSpec&) = default;
};

// '*' matches any run of characters (none included), '?' one; the rest
// literally; the whole of `name`.
bool glob_matches(std::string_view pattern, std::string_view name);

// The rank, alpha and targets checked against the model: throws Error
// naming the key, the value, the rule and the fix.
void validate_training(const TrainingSpec& training, const ModelSpec& spec);

// Applies `training` to `layers` (pipeline_layers(spec, config)):
//   frozen layer  (a freeze pattern matches it, or LoRA is on and neither
//                 an adapter nor lora.train covers it): no trainable
//                 parameters (no gradients, no optimizer state, no
//                 data-parallel reduction) and no W. Frozen layers before
//                 the first trainable one run no backward at all: nothing
//                 upstream needs their input gradient, as autograd skips a
//                 prefix whose parameters do not require gradients, so
//                 they have no I, no recompute and keep no activations.
//                 Frozen layers after a trainable one still pass the
//                 gradient back (I, their activations kept).
//   LoRA adapters, per targeted matrix in → out of an LM block, ÷t as the
//                 matrix they adapt: r·(in + out) parameters, all trainable;
//                 forward, I and W 2·b·s·r·(in + out) FLOPs each (x·A, then
//                 ·B; the recompute repeats the forward under full
//                 recomputation); e·b·s·r bytes kept (x·A, B's input). The
//                 base matrices are frozen: no W for them, I flows.
void apply_training(std::vector<PipelineLayer>& layers, const ModelSpec& spec, const ParallelConfig& config,
                    const TrainingSpec& training);

}  // namespace pipeflow
