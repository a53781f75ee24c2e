#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "pipeflow/nn/batch.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/stage.h"

namespace pipeflow::cli {
namespace {

struct GradCommand {
  std::string weights;
  std::string batch;
  std::string out;
};

}  // namespace

void add_grad_command(CLI::App& app) {
  auto command = std::make_shared<GradCommand>();
  CLI::App* sub = app.add_subcommand(
      "grad", "Loss and every gradient of one batch (unpipelined), to check pipeflow against other implementations");
  sub->add_option("--weights", command->weights, "Weights (safetensors with the model shape in __metadata__)")
      ->required();
  sub->add_option("--batch", command->batch, "safetensors file with int32 tokens [B, T+1]")->required();
  sub->add_option("--out", command->out, "Gradients file to write (same names as the weights)")->required();
  sub->callback([command] {
    const nn::SafetensorsFile weights = nn::SafetensorsFile::read(command->weights);
    const nn::GptConfig config = nn::read_config(weights);
    nn::Stage model(config, nn::all_layers(config), {.name = "model"});
    nn::load_parameters(model, weights);
    nn::Batch batch = nn::split_sequences(nn::SafetensorsFile::read(command->batch).ints("tokens"));
    const auto b = batch.inputs.dim(0);
    const auto t = batch.inputs.dim(1);
    nn::MicrobatchState state;
    model.forward(state, {.tokens = std::move(batch.inputs), .targets = std::move(batch.targets)});
    model.backward_from_loss(state, 1.0);

    nn::SafetensorsWriter writer;
    nn::write_config(writer, config);
    writer.set_metadata("loss", fmt::format("{:.17g}", state.loss()));
    writer.set_metadata("batch", std::to_string(b));
    writer.set_metadata("sequence", std::to_string(t));
    nn::add_gradients(writer, model);
    writer.write(command->out);
    fmt::print("loss {:.9f} (mean cross-entropy over {} sequences of {} tokens)\n", state.loss(), b, t);
    fmt::print("wrote {}: gradients of {} tensors\n", command->out, model.layout().entries().size());
  });
}

}  // namespace pipeflow::cli
