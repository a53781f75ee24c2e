#pragma once

#include "pipeflow/runtime/progress.h"
#include "pipeflow/runtime/trainer.h"

namespace pipeflow::runtime {

// train() for settings.vision_language: the model cut by settings.partition
// over its layers (frozen ones priced as frozen), run by the pipeline engine
// (VlmPipelineEngine) under settings.schedule on the ranks of `group` (its
// data_parallel replicas; threads of this process), AdamW with the engine's
// optimizer, learning-rate schedule and gradient clipping, on the shape
// captions of settings.seed (training split; the validation loss on the
// held-out split's first step of as many samples as a step trains on, every
// eval_interval steps and after the last). At the end the whole model
// captions settings.vision_language->caption_images held-out images
// (TrainOutcome::captions; TrainOutcome::sample is the first one's caption).
// Writes into out_dir (a run's own, as RunFolders claims it):
// metrics.jsonl (untraced StepLogs), run_config.json and weights.safetensors
// (the whole model's tensors, trained and frozen, by name; no model header:
// it is not a language model's weights file).
TrainOutcome train_vision_language(const TrainSettings& settings, ProgressPrinter& progress,
                                   const StopRequest* stop, RankGroup& group);

}  // namespace pipeflow::runtime
