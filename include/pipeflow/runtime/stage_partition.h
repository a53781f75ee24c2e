#pragma once

#include <vector>

#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_spec.h"
#include "pipeflow/model/partition.h"
#include "pipeflow/nn/model_config.h"

namespace pipeflow::runtime {

// The model module's description of an nn GPT-2 (same layers, same names:
// embedding, block.i, head), to cut it with the model module's partitioners.
ModelSpec model_spec(const nn::ModelConfig& config);

// The layer boundaries (stages + 1 of them, see model/partition.h) that
// `method` gives for the GPT-2 run in float32 with micro-batches of
// `micro_batch` sequences of `sequence` tokens; `hardware` prices the layers
// for "balanced". Errors name the method and the rule (more stages than layers, ...).
std::vector<int> partition_model(const nn::ModelConfig& config, int stages, const PartitionMethod& method,
                                 int micro_batch, int seq_length, const HardwareProfile& hardware);

}  // namespace pipeflow::runtime
