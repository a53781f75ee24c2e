#include "pipeflow/runtime/batch_gradients.h"

#include <fmt/format.h>

#include "pipeflow/core/error.h"
#include "pipeflow/core/units.h"
#include "pipeflow/model/hardware.h"
#include "pipeflow/nn/batch.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/stage_partition.h"
#include "pipeflow/schedule/generators.h"

namespace pipeflow::runtime {

BatchGradients unpipelined_gradients(const nn::SafetensorsFile& weights, IntTensor tokens) {
  const nn::ModelConfig config = nn::read_config(weights);
  BatchGradients g{std::make_unique<nn::Stage>(config, nn::all_layers(config), nn::StageOptions{0, "model"}), 0,
                   "unpipelined"};
  nn::load_parameters(*g.model, weights);
  nn::Batch batch = nn::split_sequences(tokens);
  nn::MicrobatchState state;
  g.model->forward(state, {.tokens = std::move(batch.inputs), .targets = std::move(batch.targets)});
  g.model->backward_from_loss(state, 1.0);
  g.loss = state.loss();
  return g;
}

BatchGradients pipelined_gradients(const nn::SafetensorsFile& weights, IntTensor tokens,
                                   const GradientPipeline& pipeline) {
  const nn::ModelConfig config = nn::read_config(weights);
  // The schedule first: it rejects microbatches < 1 before they divide anything.
  const Schedule schedule =
      make_schedule(pipeline.schedule, pipeline.stages, pipeline.microbatches, pipeline.chunks);
  const auto sequences = static_cast<int>(tokens.dim(0));
  if (sequences % pipeline.microbatches != 0) {
    fail("--microbatches {} does not divide the batch of {} sequences: micro-batches must be equal; use a divisor "
         "of {}",
         pipeline.microbatches, sequences, sequences);
  }
  EngineOptions options;
  options.micro_batch = sequences / pipeline.microbatches;
  options.seq_length = static_cast<int>(tokens.dim(1)) - 1;
  const auto boundaries = partition_model(config, schedule.num_stages(), pipeline.partition, options.micro_batch,
                                          options.seq_length, hardware_preset("cpu"));
  PipelineEngine engine(config, schedule, boundaries, options);
  engine.load_parameters(weights);
  const StepResult step = engine.step(0, TokenSource(std::move(tokens)), StepMode::kGradientsOnly);
  return {engine.assemble_model(true), step.loss,
          fmt::format("{} on {} ({}), {} of {}", pipeline.schedule, format_count(pipeline.stages, "rank"),
                      format_count(schedule.num_stages(), "stage"),
                      format_count(pipeline.microbatches, "micro-batch", "micro-batches"), options.micro_batch)};
}

}  // namespace pipeflow::runtime
