#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/shape_captions.h"
#include "pipeflow/nn/vision_language_model.h"
#include "pipeflow/schedule/schedule.h"

namespace pipeflow::runtime {

// A vision-language model (nn/vision_language_model.h) cut into pipeline
// stages and trained on ShapeCaptions through a schedule of the existing
// generators, one thread per rank, messages through the in-process
// transport. What a message holds depends on the boundary it crosses
// ([b, N, D] inside the encoder, [b, N, C] after the projector,
// [b, N + T_c, C] in the language model); the stage holding the patch
// embedding loads the images of its micro-batch, the one holding the LM's
// embedding the text tokens, the head's the targets.
//
// A step: the lowered schedule's actions on every rank by the engine's
// worker (RankWorker, its VLM kind: StageTraits<nn::VlmStage>), one thread
// per rank, the last stage's backward scaled by 1/m; then each rank's part
// of the worker's flush: the tied wte's gradients summed across its two
// stages, the global norm, clipping, AdamW on each stage. Micro-batch j of
// step n is samples j·b … (j+1)·b − 1 of the data's step n, so any cut and
// schedule sees the same batches.
//
// With freeze_vision the boundaries into the frozen encoder carry no
// gradient; with LoRA the wte is frozen and no tied gradient is summed.
//
// Thread safety: one step at a time.
class VlmPipeline {
 public:
  // `stages`: contiguous ranges covering the model, one per schedule stage;
  // `schedule`: compute-only (a generator's, lowered here) or lowered.
  VlmPipeline(const nn::VlmConfig& config, const std::vector<nn::LayerRange>& stages, const Schedule& schedule,
              int micro_batch, nn::VlmStageOptions options, nn::AdamWOptions adam);
  ~VlmPipeline();
  VlmPipeline(const VlmPipeline&) = delete;
  VlmPipeline& operator=(const VlmPipeline&) = delete;

  void init_parameters(std::uint64_t seed);
  // One optimizer step on the data's step `step`: the mean loss of its
  // micro-batches and the global gradient norm (tied wte once) before
  // clipping; with max_norm > 0 the gradients are clipped to it first
  // (nn::clip_coefficient), as the engine's gradient_clipping.
  struct StepResult {
    double loss = 0;
    double grad_norm = 0;
  };
  StepResult step(const nn::ShapeCaptions& data, std::int64_t step, double lr, double max_norm = 0);
  int num_stages() const { return static_cast<int>(stages_.size()); }
  nn::VlmStage& stage(int s) { return *stages_[static_cast<std::size_t>(s)]; }
  const Schedule& schedule() const { return schedule_; }  // lowered
  // The whole model in one stage (for captions, validation and saving):
  // every stage's tensors, trained and frozen, by name.
  std::unique_ptr<nn::VlmStage> assemble_model() const;

 private:
  nn::VlmConfig config_;
  Schedule schedule_;
  int micro_batch_;
  std::vector<std::unique_ptr<nn::VlmStage>> stages_;
  std::vector<std::unique_ptr<nn::AdamW>> optimizers_;
};

}  // namespace pipeflow::runtime
