#include "pipeflow/runtime/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace pipeflow::runtime {

LossScaler::LossScaler(const LossScaleConfig& config) : config_(config) {
  state_.scale = dynamic() ? std::ldexp(1.0, config.initial_scale_power) : config.loss_scale;
  state_.hysteresis_left = config.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (dynamic()) {
    if (overflow) {
      if (state_.hysteresis_left <= 1) {
        state_.scale = std::max(state_.scale / 2, config_.min_loss_scale);
      } else {
        --state_.hysteresis_left;
      }
      state_.last_overflow = state_.iteration;
    } else if ((state_.iteration - state_.last_overflow) % config_.loss_scale_window == 0) {
      state_.hysteresis_left = config_.hysteresis;
      state_.scale *= 2;
    }
  }
  ++state_.iteration;
}

}  // namespace pipeflow::runtime
