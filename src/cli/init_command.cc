#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/stage.h"

namespace pipeflow::cli {
namespace {

struct InitCommand {
  nn::ModelConfig config;
  std::string arch = "gpt2";
  bool untied = false;
  std::uint64_t seed = 0;
  std::string out;
};

// SwiGLU's width that keeps the parameters of a GELU MLP of 4·C: 8C/3,
// rounded up to a multiple of 16 (as Llama rounds it up to 256 at scale).
int default_intermediate(int width) {
  const std::int64_t wide = (8 * static_cast<std::int64_t>(width) + 2) / 3;
  return static_cast<int>((wide + 15) / 16 * 16);
}

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
  CLI::App* sub =
      app.add_subcommand("init", "Write a GPT-2's or a Llama's initial weights (safetensors, Hugging Face names)");
  sub->add_option("--arch", command->arch, "Model family")
      ->check(CLI::IsMember({"gpt2", "llama"}))
      ->capture_default_str();
  sub->add_option("--layers", command->config.n_layer, "Transformer blocks (n_layer)")->required();
  sub->add_option("--heads", command->config.n_head, "Attention heads (n_head)")->required();
  sub->add_option("--width", command->config.n_embd, "Hidden size (n_embd)")->required();
  sub->add_option("--context", command->config.context, "Positions (n_ctx, block size)")->required();
  sub->add_option("--vocab", command->config.vocab_size, "Vocabulary size (256: bytes)")->capture_default_str();
  sub->add_option("--kv-heads", command->config.n_kv_head,
                  "Llama: key/value heads, dividing --heads (grouped-query attention; 0: one per head)")
      ->capture_default_str();
  sub->add_option("--intermediate", command->config.intermediate,
                  "Llama: SwiGLU width (0: 8 x width / 3 rounded up to a multiple of 16)")
      ->capture_default_str();
  sub->add_option("--rope-theta", command->config.rope_theta, "Llama: rotary base")->capture_default_str();
  sub->add_option("--norm-eps", command->config.norm_eps, "Llama: RMSNorm epsilon (rms_norm_eps)")
      ->capture_default_str();
  sub->add_flag("--untied", command->untied, "Llama: an LM head of its own (lm_head.weight) instead of the embedding");
  sub->add_option("--seed", command->seed, "Seed of the initialisation")
      ->check(non_negative_seed())
      ->capture_default_str();
  sub->add_option("--out", command->out, "Weights file to write")->required();
  sub->callback([command] {
    nn::ModelConfig& c = command->config;
    if (command->arch == "llama") {
      c.family = nn::Family::kLlama;
      c.tied_embeddings = !command->untied;
      if (c.intermediate == 0 && c.n_embd > 0) c.intermediate = default_intermediate(c.n_embd);
    } else if (c.n_kv_head != 0 || c.intermediate != 0 || command->untied || c.rope_theta != 10000 ||
               c.norm_eps != 1e-5) {
      fail("--kv-heads, --intermediate, --rope-theta, --norm-eps and --untied shape a Llama: add --arch llama, or "
           "leave them out for GPT-2");
    }
    c.validate();
    nn::Stage model(c, nn::all_layers(c));
    model.init_parameters(command->seed);
    nn::write_weights(command->out, model);
    fmt::print("wrote {}: {}: {} parameters (seed {})\n", command->out, nn::describe(c), c.parameter_count(),
               command->seed);
  });
}

}  // namespace pipeflow::cli
