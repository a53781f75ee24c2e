#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace pipeflow {

enum class OptimizerFamily { kAdam, kSgd };
// "adam" (Adam, AdamW) or "sgd" (SGD with momentum); anything else is an Error.
OptimizerFamily parse_optimizer_family(const std::string& text);

// From a run that trains well (base batch, learning rate, warmup) to another
// global batch.
struct BatchAdviceRequest {
  long long base_batch = 0;      // sequences per optimizer step
  double base_lr = 0;
  long long base_warmup_steps = 0;
  long long target_batch = 0;
  OptimizerFamily optimizer = OptimizerFamily::kAdam;
  // The gradient noise scale B_simple (McCandlish et al. 2018), measured; unknown if empty.
  std::optional<double> noise_scale;
};

struct BatchAdvice {
  double scale = 0;  // k = target / base
  double lr = 0;
  long long warmup_steps = 0;
  std::string rule;        // "linear scaling with warmup (Goyal et al. 2017)", ...
  std::string why;         // one sentence: why this rule for this optimizer
  // With a noise scale: McCandlish et al. 2018's trade-off at the target,
  // steps / minimum steps = 1 + B_noise / B and samples / minimum samples =
  // 1 + B / B_noise.
  std::optional<double> steps_over_minimum;
  std::optional<double> samples_over_minimum;
  std::vector<std::string> warnings;
};

// McCandlish et al. 2018's trade-off at a global batch of `batch` sequences
// for a gradient noise scale B_noise of `noise_scale` sequences: the steps to
// a given loss over their minimum, 1 + B_noise / B, and the samples over
// theirs, 1 + B / B_noise (past B = B_noise, more than twice the minimum).
struct BatchEfficiency {
  double steps_over_minimum = 0;
  double samples_over_minimum = 0;
};
BatchEfficiency batch_efficiency(double batch, double noise_scale);

// Adam: the square-root rule, lr · √k (Malladi et al. 2022, the SDE scaling
// rule for adaptive methods; they also scale 1 − β₁, 1 − β₂ by k and ε by
// 1/√k). SGD: the linear rule, lr · k (Goyal et al. 2017). Both keep the
// warmup's length in samples (steps · base / target), and a larger batch
// without warmup is warned about (Goyal's gradual warmup is what made the
// linear rule hold early in training). Past the critical batch size (the
// noise scale, when known) a warning says how many more samples the target
// needs than the minimum; without it, a warning that it is unknown.
// Throws Error naming the option for non-positive batches or learning rate,
// a negative warmup or noise scale.
BatchAdvice advise_batch(const BatchAdviceRequest& request);

// The noise scale `pipeflow train` measured: the key "noise_scale" of the
// last line of its metrics.jsonl at `path` that has it (B_simple in
// sequences, smoothed over the run's measured steps; runtime/noise_scale.h).
// Throws Error naming the file (and the line, and the key) when it cannot be
// read, a line is not a JSON object, no line has the key, or the last value
// is not a positive number.
double noise_scale_of_metrics(const std::filesystem::path& path);

}  // namespace pipeflow
