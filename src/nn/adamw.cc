#include "pipeflow/nn/adamw.h"

#include <cmath>
#include <string>

namespace pipeflow::nn {

AdamW::AdamW(Stage& stage, OptimizerConfig options)
    : stage_(&stage),
      options_(options),
      m_({stage.layout().total()}, {nullptr, &stage.weight_memory()}),
      v_({stage.layout().total()}, {nullptr, &stage.weight_memory()}) {}

void AdamW::step(double lr) {
  ++steps_;
  const double t = static_cast<double>(steps_);
  const double beta1 = options_.betas[0];
  const double beta2_d = options_.betas[1];
  const float beta2 = static_cast<float>(beta2_d);
  const float one_minus_beta1 = static_cast<float>(1 - beta1);
  const float one_minus_beta2 = static_cast<float>(1 - beta2_d);
  const float step_size = static_cast<float>(lr / (1 - std::pow(beta1, t)));
  const float correction2 = static_cast<float>(std::sqrt(1 - std::pow(beta2_d, t)));
  const float eps = static_cast<float>(options_.eps);
  float* params = stage_->parameters().data();
  const float* grads = stage_->gradients().data();
  float* m = m_.data();
  float* v = v_.data();
  for (const ParameterInfo& info : stage_->layout().entries()) {
    const double decay = info.decay ? options_.weight_decay : 0.0;
    // Decoupled (AdamW) shrinks the weight; L2 (Adam) adds decay · p to the gradient.
    const float keep = options_.adam_w_mode ? static_cast<float>(1 - lr * decay) : 1.0f;
    const float l2 = options_.adam_w_mode ? 0.0f : static_cast<float>(decay);
    float* __restrict p = params + info.offset;
    const float* __restrict g = grads + info.offset;
    float* __restrict mi = m + info.offset;
    float* __restrict vi = v + info.offset;
    for (std::int64_t i = 0; i < info.numel(); ++i) {
      const float gi = g[i] + l2 * p[i];
      mi[i] = mi[i] + one_minus_beta1 * (gi - mi[i]);
      vi[i] = vi[i] * beta2 + one_minus_beta2 * gi * gi;
      const float denom = std::sqrt(vi[i]) / correction2 + eps;
      p[i] = p[i] * keep - step_size * mi[i] / denom;
    }
  }
}

void AdamW::add_state(SafetensorsWriter& writer) const {
  for (const ParameterInfo& info : stage_->layout().entries()) {
    const auto offset = static_cast<std::size_t>(info.offset);
    const auto count = static_cast<std::size_t>(info.numel());
    std::string name = "exp_avg." + info.name;
    if (writer.contains(name)) continue;
    writer.add(std::move(name), m_.span().subspan(offset, count), info.shape);
    writer.add("exp_avg_sq." + info.name, v_.span().subspan(offset, count), info.shape);
  }
  writer.set_metadata("adamw_step", std::to_string(steps_));
}

void AdamW::load_state(const SafetensorsFile& file) {
  const std::int64_t steps = file.metadata_count("adamw_step");
  for (const ParameterInfo& info : stage_->layout().entries()) {
    const auto offset = static_cast<std::size_t>(info.offset);
    const auto count = static_cast<std::size_t>(info.numel());
    file.read_floats("exp_avg." + info.name, info.shape, m_.span().subspan(offset, count));
    file.read_floats("exp_avg_sq." + info.name, info.shape, v_.span().subspan(offset, count));
  }
  steps_ = steps;
}

}  // namespace pipeflow::nn
