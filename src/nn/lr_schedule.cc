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

LrSchedule LrSchedule::from_config(const SchedulerConfig& s, double optimizer_lr) {
  if (s.type.empty()) return constant(optimizer_lr);
  LrSchedule schedule;
  if (s.type == "WarmupLR") {
    schedule.kind_ = Kind::kWarmup;
  } else if (s.type == "WarmupDecayLR") {
    schedule.kind_ = Kind::kWarmupDecay;
  } else {
    schedule.kind_ = Kind::kWarmupCosine;
  }
  schedule.warmup_ = s.warmup_type == "linear" ? Warmup::kLinear : Warmup::kLog;
  schedule.warmup_steps_ = std::max(2, s.warmup_num_steps);  // DeepSpeed's floor (ln W must be > 0)
  if (schedule.kind_ == Kind::kWarmupCosine) {
    schedule.min_ = s.warmup_min_ratio;
    schedule.max_ = optimizer_lr;
    schedule.cos_min_ratio_ = s.cos_min_ratio;
  } else {
    schedule.min_ = s.warmup_min_lr;
    schedule.max_ = s.warmup_max_lr;
  }
  if (schedule.kind_ != Kind::kWarmup) schedule.total_steps_ = s.total_num_steps;
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
