#pragma once

#include <cstdint>

#include "pipeflow/config/run_config.h"

namespace pipeflow::runtime {

// fp16's loss scale, as DeepSpeed's fp16 section sets it (LossScaleConfig).
// The backward starts from scale · loss, so that small gradients survive
// fp16; the update divides the gradients by the scale again. A step whose
// gradients overflowed (a non-finite norm) is skipped, and then:
//   dynamic (loss_scale 0): the scale starts at 2^initial_scale_power; an
//     overflow uses up one of `hysteresis` chances, and the one that finds
//     none left halves the scale (never below min_loss_scale); after
//     loss_scale_window steps without an overflow the scale doubles and the
//     chances are restored (DeepSpeed's DynamicLossScaler, its default
//     non-consecutive hysteresis);
//   static (loss_scale > 0): the scale never changes.
// Every rank sees the same gradient norm, so every rank's scaler takes the
// same path.
class LossScaler {
 public:
  // The scale's whole state, for checkpoints: a resumed run continues it.
  struct State {
    double scale = 1;
    int hysteresis_left = 1;
    std::int64_t last_overflow = -1;  // the iteration of the last overflow (-1: none)
    std::int64_t iteration = 0;       // steps taken (updated or skipped)
    bool operator==(const State&) const = default;
  };

  explicit LossScaler(const LossScaleConfig& config);

  double scale() const { return state_.scale; }
  bool dynamic() const { return config_.loss_scale == 0; }
  // Whether an overflow now lowers the scale: a dynamic scale above its
  // minimum. Otherwise a skipped step is a numerical failure like any other.
  bool can_lower() const { return dynamic() && state_.scale > config_.min_loss_scale; }
  // After each step: `overflow` when its gradients were not finite.
  void update(bool overflow);

  const State& state() const { return state_; }
  void restore(const State& state) { state_ = state; }

 private:
  LossScaleConfig config_;
  State state_;
};

}  // namespace pipeflow::runtime
