#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pipeflow/core/config.h"

namespace pipeflow {

// DeepSpeed's configuration as users write it (its documented reference,
// docs/SIMULATOR.md "DeepSpeed's keys"): every key DeepSpeed documents is
// either modelled by pipeflow (run_keys.h) or in this table, read and listed
// once as not modelled with what DeepSpeed uses it for. A path names the key
// and everything below it.
struct DeepSpeedKey {
  std::string_view path;  // "zero_optimization.offload_optimizer", "flops_profiler"
  std::string_view use;   // what DeepSpeed does with it
};
std::span<const DeepSpeedKey> deepspeed_keys_not_modelled();

// The configuration as DeepSpeed and Hugging Face's Trainer would run it:
//   - "auto" values resolved as the Trainer resolves them from its
//     TrainingArguments' defaults (per-device batch 8, accumulation 1,
//     learning rate 5e-5, betas (0.9, 0.999), epsilon 1e-8, weight decay 0,
//     gradient clipping 1.0, fp16 and bf16 off, warm-up 0 steps to the
//     learning rate over the run's steps); train_batch_size "auto" is derived
//     from the other two as DeepSpeed does;
//   - bfloat16, DeepSpeed's old name of bf16, read as bf16;
//   - the spellings courses and tutorials use for PipelineModule's arguments
//     (num_stages, pipe_partition_method, partition_method at the top level or
//     in "pipeline", activation_checkpointing in "pipeline") moved to pipeflow's
//     keys.
// Each resolution and move is said in `notes`. Throws Error for "auto" where
// neither resolves it, naming the key.
nlohmann::json deepspeed_as_written(nlohmann::json json, const std::string& source, std::vector<std::string>& notes);

// Reads every key of the table present in `config` (so that it is not an
// unknown key) and returns "KEY (use)" for each, in the table's order.
std::vector<std::string> read_keys_not_modelled(const Config& config);

}  // namespace pipeflow
