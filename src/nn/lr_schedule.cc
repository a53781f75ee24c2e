#include "pipeflow/nn/lr_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace pipeflow::nn {

LrSchedule LrSchedule::constant(double lr) {
  LrSchedule schedule;
  schedule.max_ = lr;
  return schedule;
}

LrSchedule LrSchedule::warmup(double min_lr, double max_lr, WarmupSteps warmup) {
  LrSchedule schedule;
  schedule.kind_ = Kind::kWarmup;
  schedule.warmup_ = warmup.shape;
  schedule.warmup_steps_ = std::max<std::int64_t>(2, warmup.steps);
  schedule.min_ = min_lr;
  schedule.max_ = max_lr;
  return schedule;
}

LrSchedule LrSchedule::warmup_decay(double min_lr, double max_lr, WarmupSteps warmup, std::int64_t total_steps) {
  LrSchedule schedule = LrSchedule::warmup(min_lr, max_lr, warmup);
  schedule.kind_ = Kind::kWarmupDecay;
  schedule.total_steps_ = total_steps;
  return schedule;
}

LrSchedule LrSchedule::warmup_cosine(double lr, double warmup_min_ratio, double cos_min_ratio, WarmupSteps warmup,
                                     std::int64_t total_steps) {
  LrSchedule schedule = LrSchedule::warmup(warmup_min_ratio, lr, warmup);
  schedule.kind_ = Kind::kWarmupCosine;
  schedule.cos_min_ratio_ = cos_min_ratio;
  schedule.total_steps_ = total_steps;
  return schedule;
}

double LrSchedule::warmup_factor(std::int64_t step) const {
  const double s = static_cast<double>(step);
  if (warmup_ == Warmup::kLog) return std::log(s + 1) / std::log(static_cast<double>(warmup_steps_));
  return s / static_cast<double>(warmup_steps_);
}

double LrSchedule::lr(std::int64_t step) const {
  const bool warming = step < warmup_steps_;
  switch (kind_) {
    case Kind::kConstant:
      return max_;
    case Kind::kWarmup:
      return min_ + (max_ - min_) * (warming ? warmup_factor(step) : 1.0);
    case Kind::kWarmupDecay: {
      const double decay = std::max(0.0, static_cast<double>(total_steps_ - step) /
                                             std::max<double>(1.0, static_cast<double>(total_steps_ - warmup_steps_)));
      return min_ + (max_ - min_) * (warming ? warmup_factor(step) : decay);
    }
    case Kind::kWarmupCosine: {
      if (warming) return max_ * (min_ + (1 - min_) * warmup_factor(step));
      const double progress = static_cast<double>(step - warmup_steps_ + 1) /
                              static_cast<double>(total_steps_ - warmup_steps_);
      const double ratio = (1 + std::cos(std::numbers::pi * progress)) / 2;
      return max_ * std::max(0.0, cos_min_ratio_ + (1 - cos_min_ratio_) * ratio);
    }
  }
  return max_;
}

std::string LrSchedule::describe() const {
  const char* warmup = warmup_ == Warmup::kLog ? "log" : "linear";
  switch (kind_) {
    case Kind::kConstant:
      return fmt::format("constant {:g}", max_);
    case Kind::kWarmup:
      return fmt::format("WarmupLR({:g} -> {:g} over {} {} steps)", min_, max_, warmup_steps_, warmup);
    case Kind::kWarmupDecay:
      return fmt::format("WarmupDecayLR({:g} -> {:g} over {} {} steps, linear back to {:g} at step {})", min_, max_,
                         warmup_steps_, warmup, min_, total_steps_);
    case Kind::kWarmupCosine:
      return fmt::format("WarmupCosineLR({:g} x ratio {:g} -> 1 over {} {} steps, cosine to {:g} at step {})", max_,
                         min_, warmup_steps_, warmup, cos_min_ratio_, total_steps_);
  }
  return "";
}

}  // namespace pipeflow::nn
