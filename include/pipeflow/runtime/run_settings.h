#pragma once

#include "pipeflow/nn/gpt_config.h"
#include "pipeflow/nn/lr_schedule.h"
#include "pipeflow/runtime/trainer.h"
#include "pipeflow/sim/run_config.h"

namespace pipeflow::runtime {

// The run configuration (sim/run_config.h, shared with `pipeflow simulate`)
// as training settings. What the runtime cannot train yet is an Error naming
// the key and what to use instead: a model that is not a GPT-2 (pipeflow's nn
// runs GPT-2: GELU MLP of 4·n_embd, tied head, no dropout), tensor or data
// parallelism, selective recompute.
TrainSettings train_settings(const RunConfig& run);

// The GPT-2 a model spec describes (Error naming the source otherwise).
nn::GptConfig gpt_config(const ModelSpec& spec, const std::string& source);

// DeepSpeed's scheduler section as RunConfig read it, for the optimizer's lr.
nn::LrSchedule lr_schedule(const SchedulerConfig& scheduler, double lr);

}  // namespace pipeflow::runtime
