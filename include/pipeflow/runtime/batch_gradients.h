#pragma once

#include <memory>
#include <string>

#include "pipeflow/model/partition.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/nn/stage.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::runtime {

// How `pipeflow grad --schedule` lays the pipeline out.
struct GradientPipeline {
  std::string schedule;  // a generator name (pipeflow schedule --list)
  int stages = 1;        // pipeline ranks p
  int microbatches = 1;  // m: the batch is cut into m equal micro-batches
  int chunks = 1;
  PartitionMethod partition;
};

// The loss and every gradient of one batch.
struct BatchGradients {
  std::unique_ptr<nn::Stage> model;  // the whole model, parameters and gradients filled
  double loss = 0;                   // mean cross-entropy over the batch
  std::string how;                   // "unpipelined", or the layout it ran under
};

// `tokens` [B, T + 1] (checked by nn::check_sequences) through the whole
// model in one piece with `weights` loaded: the reference the pipelined
// gradients are compared with.
BatchGradients unpipelined_gradients(const nn::SafetensorsFile& weights, IntTensor tokens);

// The same batch cut into `pipeline.microbatches` equal micro-batches and
// run through the pipeline runtime (PipelineEngine, StepMode::kGradientsOnly):
// the tied wte gradient summed, nothing clipped, no update. Throws Error
// when the micro-batches do not divide the batch, or the layout does not fit.
BatchGradients pipelined_gradients(const nn::SafetensorsFile& weights, IntTensor tokens,
                                   const GradientPipeline& pipeline);

}  // namespace pipeflow::runtime
