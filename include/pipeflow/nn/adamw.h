#pragma once

#include <cstdint>

#include "pipeflow/core/config.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/nn/stage.h"

namespace pipeflow::nn {

struct AdamWOptions {
  double lr = 1e-3;  // the base learning rate (a schedule gives each step's)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled; applied to ParameterInfo::decay tensors only

  // DeepSpeed's "optimizer" section: {"type": "AdamW", "params": {"lr",
  // "betas": [b1, b2], "eps", "weight_decay"}}; absent params keep the
  // defaults above (DeepSpeed's and torch's). "Adam" is accepted as DeepSpeed
  // means it (adam_w_mode defaults to true: AdamW); other types are an Error.
  static AdamWOptions from_config(const Config& optimizer);
};

// AdamW (Loshchilov & Hutter 2019) over one stage's parameters, the
// arithmetic of torch.optim.AdamW: at step t (from 1), for each element,
//   p ← p · (1 − lr·wd)                      (decay tensors only)
//   m ← m + (g − m)(1 − β1);  v ← β2·v + (1 − β2)·g²
//   p ← p − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + ε)
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
  AdamW(Stage& stage, AdamWOptions options);

  // One update from the stage's (accumulated, reduced, clipped) gradients.
  void step(double lr);
  std::int64_t steps() const { return steps_; }
  const AdamWOptions& options() const { return options_; }

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
  AdamWOptions options_;
  Tensor m_;
  Tensor v_;
  std::int64_t steps_ = 0;
};

}  // namespace pipeflow::nn
