#include "pipeflow/runtime/stage_partition.h"

#include "pipeflow/model/pipeline_layers.h"

namespace pipeflow::runtime {

ModelSpec model_spec(const nn::ModelConfig& config) {
  return gpt_model("gpt2", config.n_layer, config.n_embd, config.n_head, config.vocab_size, config.context);
}

std::vector<int> partition_model(const nn::ModelConfig& config, int stages, const PartitionMethod& method,
                                 int micro_batch, int seq_length, const HardwareProfile& hardware) {
  const ParallelConfig parallel{.micro_batch = micro_batch, .seq_length = seq_length, .bytes_per_element = 4};
  return partition_layers(pipeline_layers(model_spec(config), parallel), stages, method, hardware).boundaries;
}

}  // namespace pipeflow::runtime
