#pragma once

#include <filesystem>

#include "pipeflow/config/run_config.h"
#include "pipeflow/nn/model_config.h"
#include "pipeflow/runtime/trainer.h"

namespace pipeflow::runtime {

// The resolved run configuration (config/run_config.h, shared with
// `pipeflow simulate`) as training settings: a projection. What the runtime
// cannot train is an Error naming the key and what to use instead: a model
// nn does not run (runtime_model in stage_partition.h), tensor parallelism,
// ZeRO past stage 1, blocking sends, selective recompute, freeze and lora
// on a language model. A model with a vision tower gives
// TrainSettings::vision_language (runtime_vlm_model), with freeze and lora
// as it trains them (the whole encoder frozen or not; LoRA on every LM
// block's c_attn, the projector trained) and refuses the rest by key:
// checkpoints, data paths, and what StageTraits<nn::VlmStage>::validate
// refuses (tensor parallelism, bf16/fp16, recompute, a seq_length other
// than its image tokens + 18 caption bytes).
TrainSettings train_settings(const ResolvedRun& run);

// The optimizer and the learning rate of each step that the configuration's
// optimizer and scheduler sections (DeepSpeed's, already checked) describe;
// no scheduler type: constant at the optimizer's lr.
nn::AdamWOptions adamw_options(const OptimizerConfig& optimizer);
nn::LrSchedule lr_schedule(const SchedulerConfig& scheduler, double optimizer_lr);

// The model shape a weights file or checkpoint carries (its header alone is
// read); Error naming the file when it has none.
ModelFromFile model_of_file(const std::filesystem::path& path);


}  // namespace pipeflow::runtime
