#pragma once

#include <cstdint>

#include "pipeflow/config/run_config.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/nn/stage.h"

namespace pipeflow::nn {

// AdamW (Loshchilov & Hutter 2019) over one stage's parameters, the
// arithmetic of torch.optim.AdamW: at step t (from 1), for each element,
//   p ← p · (1 − lr·wd)                      (decay tensors only)
//   m ← m + (g − m)(1 − β1);  v ← β2·v + (1 − β2)·g²
//   p ← p − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + ε)
// With OptimizerConfig::adam_w_mode false it is torch.optim.Adam's L2
// instead (DeepSpeed's Adam with adam_w_mode false): no decoupled decay, and
// g ← g + wd·p (decay tensors only) before the moments.
// Which tensors decay is nanoGPT's convention: 2-D weights (wte, wpe and the
// four matrices of each block); biases and LayerNorm parameters do not.
// The moments live beside the parameters, charged to the stage's weight
// account; both copies of a tied wte (embedding and head on different stages)
// see the same summed gradient and therefore stay identical.
//
// Thread safety: one optimizer per stage, used by the stage's thread.
class AdamW {
 public:
  // The stage must outlive the optimizer.
  AdamW(Stage& stage, OptimizerConfig options);

  // One update from the stage's (accumulated, reduced, clipped) gradients.
  void step(double lr);
  std::int64_t steps() const { return steps_; }
  const OptimizerConfig& options() const { return options_; }

  // The moments as "exp_avg.<name>" and "exp_avg_sq.<name>" tensors, the step
  // count as __metadata__ "adamw_step", to save beside the weights. Moments
  // the writer already holds are skipped: the tied wte's copy on another
  // stage, whose moments are equal (the same summed gradients).
  void add_state(SafetensorsWriter& writer) const;
  // Reads this stage's moments by name, so a file written by the optimizers
  // of another partition of the same model loads too.
  void load_state(const SafetensorsFile& file);

 private:
  Stage* stage_;
  OptimizerConfig options_;
  Tensor m_;
  Tensor v_;
  std::int64_t steps_ = 0;
};

}  // namespace pipeflow::nn
