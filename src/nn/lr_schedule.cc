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

LrSchedule LrSchedule::from_config(const Config& scheduler, double optimizer_lr) {
  if (!scheduler.has("type")) return constant(optimizer_lr);
  const std::string type = scheduler.require<std::string>("type");
  const Config params = scheduler.object("params");
  LrSchedule schedule;
  if (type == "WarmupLR") {
    schedule.kind_ = Kind::kWarmup;
  } else if (type == "WarmupDecayLR") {
    schedule.kind_ = Kind::kWarmupDecay;
  } else if (type == "WarmupCosineLR") {
    schedule.kind_ = Kind::kWarmupCosine;
  } else {
    scheduler.fail_value("type", "pipeflow runs DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR");
  }
  const std::string warmup_type = params.get("warmup_type", "log");
  if (warmup_type == "linear") {
    schedule.warmup_ = Warmup::kLinear;
  } else if (warmup_type != "log") {
    params.fail_value("warmup_type", "must be \"log\" or \"linear\"");
  }
  const int warmup_steps = params.get("warmup_num_steps", 1000);
  if (warmup_steps < 0) params.fail_value("warmup_num_steps", "must be >= 0");
  schedule.warmup_steps_ = std::max(2, warmup_steps);  // DeepSpeed's floor (ln W must be > 0)
  if (schedule.kind_ == Kind::kWarmupCosine) {
    schedule.min_ = params.get("warmup_min_ratio", 0.0);
    schedule.max_ = optimizer_lr;
    schedule.cos_min_ratio_ = params.get("cos_min_ratio", 0.0001);
  } else {
    schedule.min_ = params.get("warmup_min_lr", 0.0);
    schedule.max_ = params.get("warmup_max_lr", 0.001);
    if (schedule.max_ < schedule.min_) params.fail_value("warmup_max_lr", "must be >= warmup_min_lr");
  }
  if (schedule.kind_ != Kind::kWarmup) {
    schedule.total_steps_ = params.require<int>("total_num_steps");
    if (schedule.total_steps_ <= schedule.warmup_steps_ && schedule.kind_ == Kind::kWarmupCosine) {
      params.fail_value("total_num_steps", "must exceed warmup_num_steps (the cosine phase needs steps)");
    }
    if (schedule.total_steps_ < 1) params.fail_value("total_num_steps", "must be >= 1");
  }
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
