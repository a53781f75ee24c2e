#include "pipeflow/plan/advise_batch.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"

namespace pipeflow {

OptimizerFamily parse_optimizer_family(const std::string& text) {
  if (text == "adam" || text == "adamw") return OptimizerFamily::kAdam;
  if (text == "sgd") return OptimizerFamily::kSgd;
  fail("optimizer {}: use adam (Adam, AdamW: the square-root rule) or sgd (SGD with momentum: the linear rule)",
       quoted_excerpt(text));
}

BatchAdvice advise_batch(const BatchAdviceRequest& r) {
  if (r.base_batch < 1) fail("--base-batch {}: must be >= 1 sequence", r.base_batch);
  if (r.target_batch < 1) fail("--target-batch {}: must be >= 1 sequence", r.target_batch);
  if (!(r.base_lr > 0) || !std::isfinite(r.base_lr)) {
    fail("--base-lr {}: must be a positive learning rate (the one the base batch trains well with)", r.base_lr);
  }
  if (r.base_warmup_steps < 0) fail("--base-warmup {}: must be >= 0 steps", r.base_warmup_steps);
  if (r.noise_scale && !(*r.noise_scale > 0)) {
    fail("--noise-scale {}: must be a positive number of sequences (B_simple)", *r.noise_scale);
  }
  BatchAdvice advice;
  const double k = static_cast<double>(r.target_batch) / static_cast<double>(r.base_batch);
  advice.scale = k;
  if (r.optimizer == OptimizerFamily::kAdam) {
    advice.lr = r.base_lr * std::sqrt(k);
    advice.rule = "square-root scaling (Malladi et al. 2022)";
    advice.why = fmt::format(
        "Adam normalises the update by the gradient's second moment, so the gradient noise that a {:.3g}x batch "
        "divides by {:.3g} shrinks the step like its square root; the linear rule overshoots for adaptive "
        "optimizers (Malladi et al. 2022 also scale 1 - beta1 and 1 - beta2 by {:.3g} and epsilon by {:.3g})",
        k, k, k, 1 / std::sqrt(k));
  } else {
    advice.lr = r.base_lr * k;
    advice.rule = "linear scaling with warmup (Goyal et al. 2017)";
    advice.why = fmt::format(
        "for SGD, k = {:.3g} steps at batch B and one step at batch kB with k times the learning rate move the "
        "weights alike while the gradient changes slowly; a gradual warmup covers the first steps where it does not",
        k);
  }
  // The same number of warmup samples.
  advice.warmup_steps = std::llround(static_cast<double>(r.base_warmup_steps) / k);
  if (k > 1 && r.base_warmup_steps == 0) {
    advice.warnings.push_back(fmt::format(
        "no warmup for a {}x batch at a higher learning rate: Goyal et al. 2017 needed a gradual warmup "
        "(5 epochs) for the scaled rate to train; give --base-warmup or add one",
        k));
  }
  if (r.noise_scale) {
    const double b = static_cast<double>(r.target_batch);
    const BatchEfficiency efficiency = batch_efficiency(b, *r.noise_scale);
    advice.steps_over_minimum = efficiency.steps_over_minimum;
    advice.samples_over_minimum = efficiency.samples_over_minimum;
    if (b > *r.noise_scale) {
      advice.warnings.push_back(fmt::format(
          "target batch {} is past the critical batch size (gradient noise scale {:.6g}, McCandlish et al. 2018): "
          "it needs {:.2f}x the minimum samples to reach the same loss, and doubling the batch to it saves only "
          "{:.0f}% of the steps; no learning-rate rule holds far past it",
          r.target_batch, *r.noise_scale, *advice.samples_over_minimum,
          100 * (1 - (1 + *r.noise_scale / b) / (1 + *r.noise_scale / (b / 2)))));
    }
  } else {
    advice.warnings.push_back(
        "the critical batch size is unknown: past the gradient noise scale (McCandlish et al. 2018) a larger batch "
        "wastes samples; measure it and pass --noise-scale");
  }
  return advice;
}

BatchEfficiency batch_efficiency(double batch, double noise_scale) {
  return {.steps_over_minimum = 1 + noise_scale / batch, .samples_over_minimum = 1 + batch / noise_scale};
}

double noise_scale_of_metrics(const std::filesystem::path& path) {
  // Every failure names the file and the key it was read for.
  const auto failure = [&](const std::string& what) {
    fail("--metrics {}: {}; it should be pipeflow train's metrics.jsonl, whose last \"noise_scale\" is the "
         "measured gradient noise scale",
         path.string(), what);
  };
  std::string text;
  try {
    text = read_file(path, kMaxMetricsFileBytes, "metrics file");
  } catch (const Error& error) {
    failure(error.what());
  }
  std::istringstream lines(text);
  // Only the last value counts: the smoothed estimate of the first steps may
  // be negative (B_simple's two terms are noisy) and settle later.
  std::optional<std::pair<nlohmann::json, std::string>> last;  // the value, where it was
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const std::string where = fmt::format("{} line {}", path.string(), number);
    nlohmann::json json;
    try {
      json = parse_json(line, where);
    } catch (const Error& error) {
      failure(error.what());
    }
    if (!json.is_object()) failure(fmt::format("line {} is not a JSON object", number));
    if (json.contains("noise_scale")) last = {json["noise_scale"], where};
  }
  if (!last) {
    fail("{}: no line has \"noise_scale\" (the gradient noise scale pipeflow train measures): train with "
         "metrics.noise_scale_interval >= 1 and more than one micro-batch per step, or pass --noise-scale",
         path.string());
  }
  const auto& [value, where] = *last;
  if (!value.is_number() || !(value.get<double>() > 0) || !std::isfinite(value.get<double>())) {
    fail("{}: \"noise_scale\" = {}: must be a positive number of sequences (B_simple); the estimate is noisy "
         "over few steps: train longer, or pass --noise-scale",
         where, short_dump(value));
  }
  return value.get<double>();
}

}  // namespace pipeflow
