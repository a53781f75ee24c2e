#pragma once

#include <cstdint>
#include <string>

namespace pipeflow::nn {

// The learning rate of each optimizer step, DeepSpeed's schedulers (their
// names and params; deepspeed/runtime/lr_schedules.py). `step` counts from 0:
// it is DeepSpeed's last_batch_iteration during that step. With
// W = max(2, warmup_num_steps) and the warmup factor
//   γ(s) = ln(s + 1) / ln W   (warmup_type "log", DeepSpeed's default)
//   γ(s) = s / W              (warmup_type "linear")           for s < W:
// - WarmupLR:       lr = warmup_min_lr + (warmup_max_lr − warmup_min_lr)·γ(s), then warmup_max_lr.
// - WarmupDecayLR:  as WarmupLR, then linear decay to warmup_min_lr at total_num_steps:
//                   γ = max(0, (total_num_steps − s) / max(1, total_num_steps − W)).
// - WarmupCosineLR: a ratio of the optimizer's lr: warmup_min_ratio + (1 − warmup_min_ratio)·γ(s),
//                   then cos_min_ratio + (1 − cos_min_ratio)·(1 + cos(π·(s − W + 1)/(total − W)))/2.
// - no scheduler:   the optimizer's lr, constant.
class LrSchedule {
 public:
  enum class Kind { kConstant, kWarmup, kWarmupDecay, kWarmupCosine };
  enum class Warmup { kLog, kLinear };

  // The warm-up of W = max(2, steps) steps (DeepSpeed's floor: ln W must be > 0).
  struct WarmupSteps {
    std::int64_t steps = 1000;
    Warmup shape = Warmup::kLog;
  };

  static LrSchedule constant(double lr);
  static LrSchedule warmup(double min_lr, double max_lr, WarmupSteps warmup);
  static LrSchedule warmup_decay(double min_lr, double max_lr, WarmupSteps warmup, std::int64_t total_steps);
  static LrSchedule warmup_cosine(double lr, double warmup_min_ratio, double cos_min_ratio, WarmupSteps warmup,
                                  std::int64_t total_steps);

  double lr(std::int64_t step) const;
  Kind kind() const { return kind_; }
  // One line for logs, e.g. "WarmupLR(0 -> 0.001 over 100 log steps)".
  std::string describe() const;

 private:
  double warmup_factor(std::int64_t step) const;

  Kind kind_ = Kind::kConstant;
  Warmup warmup_ = Warmup::kLog;
  double min_ = 0;         // WarmupLR/WarmupDecayLR: min lr; WarmupCosineLR: min ratio
  double max_ = 0;         // WarmupLR/WarmupDecayLR: max lr; WarmupCosineLR and constant: the lr
  double cos_min_ratio_ = 0;
  std::int64_t warmup_steps_ = 2;
  std::int64_t total_steps_ = 0;
};

}  // namespace pipeflow::nn
