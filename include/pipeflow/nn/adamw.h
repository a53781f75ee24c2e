#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "pipeflow/nn/safetensors.h"
#include "pipeflow/nn/stage.h"
#include "pipeflow/nn/vision_language_model.h"

namespace pipeflow::nn {

// AdamW (Loshchilov & Hutter 2019) over one stage's parameters, the
// arithmetic of torch.optim.AdamW: at step t (from 1), for each element,
//   p ← p · (1 − lr·wd)                      (decay tensors only)
//   m ← m + (g − m)(1 − β1);  v ← β2·v + (1 − β2)·g²
//   p ← p − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + ε)
// With AdamWOptions::decoupled_decay false it is torch.optim.Adam's L2
// instead (DeepSpeed's Adam with adam_w_mode false): no decoupled decay, and
// g ← g + wd·p (decay tensors only) before the moments.
// Which tensors decay is nanoGPT's convention: 2-D weights (wte, wpe and the
// four matrices of each block); biases and LayerNorm parameters do not.
// The moments live beside the parameters, charged to the stage's weight
// account; both copies of a tied wte (embedding and head on different stages)
// see the same summed gradient and therefore stay identical.
//
// ZeRO stage 1: an optimizer may own a shard of the stage's flat parameter
// vector (elements [begin, end)): it keeps moments for those elements only
// (8 bytes each instead of 8 per parameter) and updates only them; the
// caller all-gathers the updated shards of the data-parallel replicas.
//
// Thread safety: one optimizer per stage, used by the stage's thread.
struct AdamWOptions {
  // Decoupled weight decay (AdamW); false: Adam with L2.
  bool decoupled_decay = true;
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.01;
};

struct OptimizerShard {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
  // Part `index` of `parts` equal contiguous parts of `total` elements (the
  // last ones shorter, or empty, when `parts` does not divide it).
  static OptimizerShard of(std::int64_t total, int parts, int index);
};

// What an optimizer updates: a stage's trained tensors, laid out in one
// buffer of parameters and one of gradients.
struct TrainedTensors {
  std::string name;  // the stage's, for errors
  const ParameterLayout* layout = nullptr;
  // Called before each update: the parameters to write (a half-precision
  // stage marks its rounded copy stale).
  std::function<std::span<float>()> parameters;
  std::span<const float> gradients;
  MemoryAccount* account = nullptr;  // the moments' bytes
};

class AdamW {
 public:
  // The stage must outlive the optimizer. Without a shard: every element.
  AdamW(Stage& stage, AdamWOptions options);
  AdamW(Stage& stage, AdamWOptions options, OptimizerShard shard);
  // A vision-language stage's trained tensors: a frozen encoder's have no moments.
  AdamW(VlmStage& stage, AdamWOptions options);
  AdamW(VlmStage& stage, AdamWOptions options, OptimizerShard shard);
  AdamW(TrainedTensors tensors, AdamWOptions options, OptimizerShard shard);

  // One update from the stage's (accumulated, reduced, clipped) gradients,
  // of the shard's elements.
  void step(double lr);
  std::int64_t steps() const { return steps_; }
  const AdamWOptions& options() const { return options_; }
  const OptimizerShard& shard() const { return shard_; }
  // The moments of the shard's elements.
  std::span<const float> exp_avg() const { return m_.span(); }
  std::span<const float> exp_avg_sq() const { return v_.span(); }

  // The moments as "exp_avg.<name>" and "exp_avg_sq.<name>" tensors, the step
  // count as __metadata__ "adamw_step", to save beside the weights. Moments
  // the writer already holds are skipped: the tied wte's copy on another
  // stage, whose moments are equal (the same summed gradients). The
  // optimizer must own every element (the engine gathers a sharded or
  // tensor-parallel one's moments itself) of a stage that is not split.
  void add_state(SafetensorsWriter& writer) const;
  // Reads this stage's moments by name (those of the shard's elements), so a
  // file written by the optimizers of another partition, or another shard
  // count, of the same model loads too.
  void load_state(const SafetensorsFile& file);

 private:
  TrainedTensors tensors_;
  AdamWOptions options_;
  OptimizerShard shard_;
  Tensor m_;
  Tensor v_;
  std::int64_t steps_ = 0;
};

}  // namespace pipeflow::nn
