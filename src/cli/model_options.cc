#include "model_options.h"

namespace pipeflow::cli {

void ModelOptions::add_to(CLI::App& command) {
  command.add_option("--model", model, "Preset name (e.g. gpt3-175b) or path of a Hugging Face config.json")
      ->required();
  command.add_option("--seq-length,--seq", seq_length, "Tokens per sequence (default: the model's context length)");
  command.add_option("--micro-batch", micro_batch, "Sequences per micro-batch")->capture_default_str();
  command.add_option("--tensor-parallel,--tp", tensor_parallel, "Tensor-parallel size")->capture_default_str();
  command.add_flag("--sequence-parallel", sequence_parallel, "Megatron sequence parallelism");
  command.add_option("--recompute", recompute, "none, selective or full")->capture_default_str();
  command.add_option("--bytes-per-element", bytes_per_element, "Activation element size (2: bf16)")
      ->capture_default_str();
}

ModelSpec ModelOptions::spec() const { return resolve_model(model); }

ParallelConfig ModelOptions::config(const ModelSpec& model_spec) const {
  ParallelConfig config;
  config.micro_batch = micro_batch;
  config.seq_length = seq_length != 0 ? seq_length : model_spec.max_positions;
  config.tensor_parallel = tensor_parallel;
  config.sequence_parallel = sequence_parallel;
  config.recompute = parse_recompute(recompute);
  config.bytes_per_element = bytes_per_element;
  return config;
}

}  // namespace pipeflow::cli
