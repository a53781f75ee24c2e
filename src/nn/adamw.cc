#include "pipeflow/nn/adamw.h"

#include <cmath>
#include <string>
#include <vector>

#include "pipeflow/core/error.h"

namespace pipeflow::nn {

AdamWOptions AdamWOptions::from_config(const Config& optimizer) {
  const std::string type = optimizer.get("type", "AdamW");
  if (type != "AdamW" && type != "Adam") {
    optimizer.fail_value("type", "pipeflow's optimizer is AdamW (decoupled weight decay): set \"type\": \"AdamW\"");
  }
  const Config params = optimizer.object("params");
  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false (its default is true).
  if (type == "Adam" && !params.get("adam_w_mode", true)) {
    params.fail_value("adam_w_mode", "pipeflow implements decoupled weight decay (AdamW) only: remove it or set true");
  }
  AdamWOptions options;
  options.lr = params.get("lr", options.lr);
  const auto betas = params.get<std::vector<double>>("betas", {options.beta1, options.beta2});
  if (betas.size() != 2) params.fail_value("betas", "must be [beta1, beta2]");
  options.beta1 = betas[0];
  options.beta2 = betas[1];
  options.eps = params.get("eps", options.eps);
  options.weight_decay = params.get("weight_decay", options.weight_decay);
  if (options.lr < 0) params.fail_value("lr", "must be >= 0");
  for (const double beta : betas) {
    if (beta < 0 || beta >= 1) params.fail_value("betas", "each beta must lie in [0, 1)");
  }
  if (options.eps <= 0) params.fail_value("eps", "must be > 0");
  if (options.weight_decay < 0) params.fail_value("weight_decay", "must be >= 0");
  return options;
}

AdamW::AdamW(Stage& stage, AdamWOptions options)
    : stage_(&stage),
      options_(options),
      m_({stage.layout().total()}, {nullptr, &stage.weight_memory()}),
      v_({stage.layout().total()}, {nullptr, &stage.weight_memory()}) {}

void AdamW::step(double lr) {
  ++steps_;
  const double t = static_cast<double>(steps_);
  const float beta2 = static_cast<float>(options_.beta2);
  const float one_minus_beta1 = static_cast<float>(1 - options_.beta1);
  const float one_minus_beta2 = static_cast<float>(1 - options_.beta2);
  const float step_size = static_cast<float>(lr / (1 - std::pow(options_.beta1, t)));
  const float correction2 = static_cast<float>(std::sqrt(1 - std::pow(options_.beta2, t)));
  const float eps = static_cast<float>(options_.eps);
  float* params = stage_->parameters().data();
  const float* grads = stage_->gradients().data();
  float* m = m_.data();
  float* v = v_.data();
  for (const ParameterInfo& info : stage_->layout().entries()) {
    const float keep = info.decay ? static_cast<float>(1 - lr * options_.weight_decay) : 1.0f;
    float* __restrict p = params + info.offset;
    const float* __restrict g = grads + info.offset;
    float* __restrict mi = m + info.offset;
    float* __restrict vi = v + info.offset;
    for (std::int64_t i = 0; i < info.numel(); ++i) {
      mi[i] = mi[i] + one_minus_beta1 * (g[i] - mi[i]);
      vi[i] = vi[i] * beta2 + one_minus_beta2 * g[i] * g[i];
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
