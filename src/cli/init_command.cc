#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/stage.h"

namespace pipeflow::cli {
namespace {

struct InitCommand {
  nn::ModelConfig config;
  std::uint64_t seed = 0;
  std::string out;
};

}  // namespace

CLI::Validator non_negative_seed() {
  return CLI::Validator(
      [](const std::string& value) {
        return value.starts_with('-') ? "seed " + value + " is negative: give an integer >= 0" : std::string();
      },
      "SEED >= 0");
}

void add_init_command(CLI::App& app) {
  auto command = std::make_shared<InitCommand>();
  CLI::App* sub = app.add_subcommand("init", "Write GPT-2 initial weights (safetensors, Hugging Face names)");
  sub->add_option("--layers", command->config.n_layer, "Transformer blocks (n_layer)")->required();
  sub->add_option("--heads", command->config.n_head, "Attention heads (n_head)")->required();
  sub->add_option("--width", command->config.n_embd, "Hidden size (n_embd)")->required();
  sub->add_option("--context", command->config.context, "Positions (n_ctx, block size)")->required();
  sub->add_option("--vocab", command->config.vocab_size, "Vocabulary size (256: bytes)")->capture_default_str();
  sub->add_option("--seed", command->seed, "Seed of the GPT-2 initialisation")
      ->check(non_negative_seed())
      ->capture_default_str();
  sub->add_option("--out", command->out, "Weights file to write")->required();
  sub->callback([command] {
    command->config.validate();
    nn::Stage model(command->config, nn::all_layers(command->config));
    model.init_parameters(command->seed);
    nn::write_weights(command->out, model);
    const nn::ModelConfig& c = command->config;
    fmt::print("wrote {}: GPT-2 with {} layers, {} heads, width {}, context {}, vocab {}: {} parameters (seed {})\n",
               command->out, c.n_layer, c.n_head, c.n_embd, c.context, c.vocab_size, c.parameter_count(),
               command->seed);
  });
}

}  // namespace pipeflow::cli
