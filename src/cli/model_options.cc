#include "model_options.h"

#include <fmt/format.h>

namespace pipeflow::cli {

void ModelOptions::add_to(CLI::App& command) {
  command.add_option("--model", model, "Preset name (e.g. gpt3-175b) or path of a Hugging Face config.json")
      ->required();
  command.add_option("--seq", sequence, "Tokens per sequence (default: the model's context length)");
  command.add_option("--micro-batch", micro_batch, "Sequences per micro-batch")->capture_default_str();
  command.add_option("--tp", tensor_parallel, "Tensor-parallel size")->capture_default_str();
  command.add_flag("--sequence-parallel", sequence_parallel, "Megatron sequence parallelism");
  command.add_option("--recompute", recompute, "none, selective or full")->capture_default_str();
  command.add_option("--bytes-per-element", bytes_per_element, "Activation element size (2: bf16)")
      ->capture_default_str();
}

ModelSpec ModelOptions::spec() const { return resolve_model(model); }

ParallelConfig ModelOptions::config(const ModelSpec& model_spec) const {
  ParallelConfig config;
  config.micro_batch = micro_batch;
  config.sequence = sequence != 0 ? sequence : model_spec.max_positions;
  config.tensor_parallel = tensor_parallel;
  config.sequence_parallel = sequence_parallel;
  config.recompute = parse_recompute(recompute);
  config.bytes_per_element = bytes_per_element;
  return config;
}

std::string format_parameters(double count) {
  if (count >= 1e9) return fmt::format("{:.2f}B", count / 1e9);
  if (count >= 1e6) return fmt::format("{:.1f}M", count / 1e6);
  if (count >= 1e3) return fmt::format("{:.1f}K", count / 1e3);
  return fmt::format("{:.0f}", count);
}

}  // namespace pipeflow::cli
