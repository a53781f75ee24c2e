#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>

#include "commands.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/error.h"
#include "pipeflow/nn/batch.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/runtime/batch_gradients.h"
#include "pipeflow/runtime/checkpoint_search.h"

namespace pipeflow::cli {
namespace {

struct GradCommand {
  std::string weights;
  std::string batch;
  std::string out;
  std::string schedule;  // empty: unpipelined
  int stages = 1;
  int microbatches = 1;
  int chunks = 1;
  std::string partition = "parameters";
};

}  // namespace

void add_grad_command(CLI::App& app) {
  auto command = std::make_shared<GradCommand>();
  CLI::App* sub = app.add_subcommand(
      "grad", "Loss and every gradient of one batch, unpipelined or through the pipeline runtime with a schedule");
  sub->add_option("--weights", command->weights,
                  "Weights (safetensors with the model shape in __metadata__), or a checkpoint of train: a "
                  "sharded step_N folder or its model.safetensors.index.json")
      ->required();
  sub->add_option("--batch", command->batch, "safetensors file with int32 tokens [B, T+1]")->required();
  sub->add_option("--out", command->out, "Gradients file to write (same names as the weights)")->required();
  sub->add_option("--schedule", command->schedule, "Run through the pipeline runtime with this schedule (see "
                                                   "pipeflow schedule --list)");
  sub->add_option("--stages", command->stages, "Pipeline ranks")->capture_default_str();
  sub->add_option("--microbatches", command->microbatches, "Micro-batches the batch is cut into")->capture_default_str();
  sub->add_option("--virtual", command->chunks, "Model chunks per rank")->capture_default_str();
  sub->add_option("--partition", command->partition, "How to cut the layers into stages (uniform, parameters, "
                                                     "type:REGEX, balanced, counts:..., bounds:...)")
      ->capture_default_str();
  sub->callback([command, sub] {
    refuse_overwriting({"--out", command->out}, {{"--weights", command->weights}, {"--batch", command->batch}});
    const nn::SafetensorsFile weights = runtime::read_checkpoint(command->weights);
    const nn::ModelConfig config = nn::read_config(weights);
    IntTensor tokens = nn::SafetensorsFile::read(command->batch).ints("tokens");
    nn::check_sequences(tokens);
    const auto b = tokens.dim(0);
    const auto t = tokens.dim(1) - 1;
    if (command->schedule.empty()) {
      for (const char* flag : {"--stages", "--microbatches", "--virtual", "--partition"}) {
        if (sub->count(flag) > 0) fail("{} lays out a pipeline: give --schedule too, or leave it out", flag);
      }
    }
    const runtime::BatchGradients g =
        command->schedule.empty()
            ? runtime::unpipelined_gradients(weights, std::move(tokens))
            : runtime::pipelined_gradients(weights, std::move(tokens),
                                           {.schedule = command->schedule,
                                            .stages = command->stages,
                                            .microbatches = command->microbatches,
                                            .chunks = command->chunks,
                                            .partition = parse_partition_method(command->partition)});
    if (!std::isfinite(g.loss)) {
      fail("loss = {}: the forward produced a non-finite value from the (finite) weights in {}; {} was not written",
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
