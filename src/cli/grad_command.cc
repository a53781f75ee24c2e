#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <string>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/nn/batch.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/stage.h"
#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/stage_partition.h"
#include "pipeflow/schedule/generators.h"

namespace pipeflow::cli {
namespace {

struct GradCommand {
  std::string weights;
  std::string batch;
  std::string out;
  std::string schedule;  // empty: unpipelined
  int stages = 1;
  int microbatches = 1;
  int virtual_stages = 1;
  std::string partition = "parameters";
};

struct Gradients {
  std::unique_ptr<nn::Stage> model;  // whole model, gradients filled
  double loss = 0;
  std::string how;
};

Gradients unpipelined(const nn::GptConfig& config, const nn::SafetensorsFile& weights, IntTensor tokens) {
  Gradients g{std::make_unique<nn::Stage>(config, nn::all_layers(config), nn::StageOptions{0, "model"}), 0,
              "unpipelined"};
  nn::load_parameters(*g.model, weights);
  nn::Batch batch = nn::split_sequences(tokens);
  nn::MicrobatchState state;
  g.model->forward(state, {.tokens = std::move(batch.inputs), .targets = std::move(batch.targets)});
  g.model->backward_from_loss(state, 1.0);
  g.loss = state.loss();
  return g;
}

// The global batch cut into micro-batches and run through the pipeline
// runtime: the tied wte gradient summed, nothing clipped, no update.
Gradients pipelined(const GradCommand& c, const nn::GptConfig& config, const nn::SafetensorsFile& weights,
                    IntTensor tokens) {
  // The schedule first: it rejects microbatches < 1 before they divide anything.
  const Schedule schedule = make_schedule(c.schedule, c.stages, c.microbatches, c.virtual_stages);
  const auto sequences = static_cast<int>(tokens.dim(0));
  if (sequences % c.microbatches != 0) {
    fail("--microbatches {} does not divide the batch of {} sequences: micro-batches must be equal; use a divisor "
         "of {}",
         c.microbatches, sequences, sequences);
  }
  runtime::EngineOptions options;
  options.micro_batch = sequences / c.microbatches;
  options.sequence_length = static_cast<int>(tokens.dim(1)) - 1;
  const auto boundaries = runtime::partition_model(config, schedule.num_stages(), parse_partition_method(c.partition),
                                                   options.micro_batch, options.sequence_length, hardware_preset("cpu"));
  runtime::PipelineEngine engine(config, schedule, boundaries, options);
  engine.load_parameters(weights);
  const runtime::StepResult step =
      engine.step(0, runtime::TokenSource(std::move(tokens)), runtime::StepMode::kGradientsOnly);
  return {engine.assemble_model(true), step.loss,
          fmt::format("{} on {} ranks ({} stages), {} micro-batches of {}", c.schedule, c.stages,
                      schedule.num_stages(), c.microbatches, options.micro_batch)};
}

}  // namespace

void add_grad_command(CLI::App& app) {
  auto command = std::make_shared<GradCommand>();
  CLI::App* sub = app.add_subcommand(
      "grad", "Loss and every gradient of one batch, unpipelined or through the pipeline runtime with a schedule");
  sub->add_option("--weights", command->weights, "Weights (safetensors with the model shape in __metadata__)")
      ->required();
  sub->add_option("--batch", command->batch, "safetensors file with int32 tokens [B, T+1]")->required();
  sub->add_option("--out", command->out, "Gradients file to write (same names as the weights)")->required();
  sub->add_option("--schedule", command->schedule, "Run through the pipeline runtime with this schedule (see "
                                                   "pipeflow schedule --list)");
  sub->add_option("--stages", command->stages, "Pipeline ranks")->capture_default_str();
  sub->add_option("--microbatches", command->microbatches, "Micro-batches the batch is cut into")->capture_default_str();
  sub->add_option("--virtual", command->virtual_stages, "Model chunks per rank")->capture_default_str();
  sub->add_option("--partition", command->partition, "How to cut the layers into stages (uniform, parameters, "
                                                     "type:REGEX, balanced, counts:..., bounds:...)")
      ->capture_default_str();
  sub->callback([command, sub] {
    const nn::SafetensorsFile weights = nn::SafetensorsFile::read(command->weights);
    const nn::GptConfig config = nn::read_config(weights);
    IntTensor tokens = nn::SafetensorsFile::read(command->batch).ints("tokens");
    nn::check_sequences(tokens);
    const auto b = tokens.dim(0);
    const auto t = tokens.dim(1) - 1;
    if (command->schedule.empty()) {
      for (const char* flag : {"--stages", "--microbatches", "--virtual", "--partition"}) {
        if (sub->count(flag) > 0) fail("{} lays out a pipeline: give --schedule too, or leave it out", flag);
      }
    }
    const Gradients g = command->schedule.empty() ? unpipelined(config, weights, std::move(tokens))
                                                  : pipelined(*command, config, weights, std::move(tokens));
    if (!std::isfinite(g.loss)) {
      fail("loss = {}: the weights in {} or the forward produced a non-finite value; {} was not written",
           g.loss, command->weights, command->out);
    }
    nn::SafetensorsWriter writer;
    nn::write_config(writer, config);
    writer.set_metadata("loss", fmt::format("{:.17g}", g.loss));
    writer.set_metadata("batch", std::to_string(b));
    writer.set_metadata("sequence", std::to_string(t));
    nn::add_gradients(writer, *g.model);
    writer.write(command->out);
    fmt::print("loss {:.9f} (mean cross-entropy over {} sequences of {} tokens, {})\n", g.loss, b, t, g.how);
    fmt::print("wrote {}: gradients of {} tensors\n", command->out, g.model->layout().entries().size());
  });
}

}  // namespace pipeflow::cli
