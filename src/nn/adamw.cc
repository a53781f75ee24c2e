#include "pipeflow/nn/adamw.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "pipeflow/core/error.h"
#include <string>
#include <utility>

namespace pipeflow::nn {

OptimizerShard OptimizerShard::of(std::int64_t total, int parts, int index) {
  const std::int64_t chunk = (total + parts - 1) / parts;
  const std::int64_t begin = std::min(total, chunk * index);
  return {begin, std::min(total, begin + chunk)};
}

namespace {

TrainedTensors trained_tensors(Stage& stage) {
  return {stage.options().name, &stage.layout(), [&stage] { return stage.parameters(); }, stage.gradients(),
          &stage.weight_memory()};
}

}  // namespace

AdamW::AdamW(Stage& stage, AdamWOptions options) : AdamW(stage, options, {0, stage.layout().total()}) {}

AdamW::AdamW(Stage& stage, AdamWOptions options, OptimizerShard shard)
    : AdamW(trained_tensors(stage), options, shard) {}

AdamW::AdamW(VlmStage& stage, AdamWOptions options) : AdamW(stage, options, {0, stage.layout().total()}) {}

AdamW::AdamW(VlmStage& stage, AdamWOptions options, OptimizerShard shard)
    : AdamW(TrainedTensors{stage.options().name, &stage.layout(), [&stage] { return stage.parameters(); },
                           stage.gradients(), &stage.weight_memory()},
            options, shard) {}

AdamW::AdamW(TrainedTensors tensors, AdamWOptions options, OptimizerShard shard)
    : tensors_(std::move(tensors)),
      options_(options),
      shard_(shard),
      m_({shard.size()}, {nullptr, tensors_.account}),
      v_({shard.size()}, {nullptr, tensors_.account}) {
  if (shard.begin < 0 || shard.begin > shard.end || shard.end > tensors_.layout->total()) {
    fail("{}: optimizer shard [{}, {}) lies outside its {} parameters", tensors_.name, shard.begin, shard.end,
         tensors_.layout->total());
  }
}

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
  float* params = tensors_.parameters().data();
  const float* grads = tensors_.gradients.data();
  // moments are indexed from the shard's start
  float* m = m_.data() - shard_.begin;
  float* v = v_.data() - shard_.begin;
  for (const ParameterInfo& info : tensors_.layout->entries()) {
    const std::int64_t first = std::max(info.offset, shard_.begin);
    const std::int64_t last = std::min(info.offset + info.numel(), shard_.end);
    if (first >= last) continue;
    const double decay = info.decay ? options_.weight_decay : 0.0;
    // Decoupled (AdamW) shrinks the weight; L2 (Adam) adds decay · p to the gradient.
    const float keep = options_.decoupled_decay ? static_cast<float>(1 - lr * decay) : 1.0f;
    const float l2 = options_.decoupled_decay ? 0.0f : static_cast<float>(decay);
    float* __restrict p = params + first;
    const float* __restrict g = grads + first;
    float* __restrict mi = m + first;
    float* __restrict vi = v + first;
    for (std::int64_t i = 0; i < last - first; ++i) {
      const float gi = g[i] + l2 * p[i];
      mi[i] = mi[i] + one_minus_beta1 * (gi - mi[i]);
      vi[i] = vi[i] * beta2 + one_minus_beta2 * gi * gi;
      const float denom = std::sqrt(vi[i]) / correction2 + eps;
      p[i] = p[i] * keep - step_size * mi[i] / denom;
    }
  }
}

void AdamW::add_state(SafetensorsWriter& writer) const {
  if (shard_.size() != tensors_.layout->total()) {
    fail("{}: the optimizer holds moments of elements [{}, {}) only; gather the shards to save them", tensors_.name,
         shard_.begin, shard_.end);
  }
  for (const ParameterInfo& info : tensors_.layout->entries()) {
    if (info.split()) fail("{}: the stage is split over tensor-parallel ranks; gather its parts to save them", tensors_.name);
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
  std::vector<float> whole;
  std::vector<float> mine;  // the tensor-parallel rank's part of `whole`
  for (const ParameterInfo& info : tensors_.layout->entries()) {
    const std::int64_t first = std::max(info.offset, shard_.begin);
    const std::int64_t last = std::min(info.offset + info.numel(), shard_.end);
    if (first >= last) continue;
    whole.resize(static_cast<std::size_t>(info.whole.numel()));
    mine.resize(static_cast<std::size_t>(info.numel()));
    const auto part = std::span<const float>(mine).subspan(static_cast<std::size_t>(first - info.offset),
                                                         static_cast<std::size_t>(last - first));
    const auto into = static_cast<std::size_t>(first - shard_.begin);
    file.read_floats("exp_avg." + info.name, info.whole, whole);
    copy_part<float>(info, whole, mine);
    std::copy(part.begin(), part.end(), m_.span().begin() + static_cast<std::ptrdiff_t>(into));
    file.read_floats("exp_avg_sq." + info.name, info.whole, whole);
    copy_part<float>(info, whole, mine);
    std::copy(part.begin(), part.end(), v_.span().begin() + static_cast<std::ptrdiff_t>(into));
  }
  steps_ = steps;
}

}  // namespace pipeflow::nn
