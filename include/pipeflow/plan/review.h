#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pipeflow/config/run_config.h"
#include "pipeflow/config/run_keys.h"

namespace pipeflow {

// `pipeflow review`: a pre-flight review of a run configuration before
// hardware is spent (docs/REVIEW.md). Each check reads the simulator's
// prediction of the configured run; a fix that the simulator can price is
// re-simulated and its gain given.

enum class Severity { kError, kWarning, kNote };
const char* to_string(Severity severity);  // "error", "warning", "note"

struct Finding {
  Severity severity = Severity::kWarning;
  std::string check;    // the check's name: "memory", "bubble", ...
  std::string finding;  // what is wrong, with its number
  double value = 0;     // the number behind it
  double limit = 0;     // the line it crossed
  std::string fix;      // the key and value to change (empty: none known)
  // The fix re-simulated: tokens/s over the configured run's, minus 1.
  std::optional<double> gain;
};

struct ReviewOptions {
  // The gradient noise scale B_simple in sequences (McCandlish et al. 2018):
  // past it a larger global batch wastes samples. Unknown: not checked.
  std::optional<double> noise_scale;
  // A reference run that trains well (its global batch and learning rate):
  // the configured learning rate is compared with advise_batch's rule
  // scaled from it. Unknown: not checked.
  std::optional<long long> base_batch;
  std::optional<double> base_lr;
};

// The lines the checks draw.
inline constexpr double kMemoryLine = 0.8;       // of the device's memory (error past 1)
inline constexpr double kBubbleLine = 0.15;      // of the step
inline constexpr int kMicrobatchesPerStage = 4;  // m >= 4 · p
inline constexpr double kImbalanceLine = 1.1;    // slowest stage's compute over the mean
inline constexpr double kOverlapGainLine = 0.01; // overlapping must gain at least this
inline constexpr double kLaunchOverheadLine = 0.1;  // block_launch_overhead_s's share of the step
// The configured learning rate may differ from the scaling rule's by this
// factor either way: the rules are approximate, a tuned rate differs.
inline constexpr double kLearningRateTolerance = 1.5;

struct Review {
  std::vector<Finding> findings;     // errors first, then warnings, then notes
  std::vector<std::string> skipped;  // checks not run, and why
  bool has_error() const;
};

// A configuration read for review: the reader's refusal of ZeRO-2/3 with
// pipeline parallelism becomes an error finding, and the rest is reviewed
// with zero_optimization.stage 1 instead. Any other refusal is thrown.
struct ReviewedConfig {
  RunConfig config;
  std::optional<Finding> refusal;
};
ReviewedConfig read_for_review(const std::filesystem::path& path, const RunOverrides& overrides);

// Every check on the resolved run (and the refusal, first). Throws Error for
// a run the simulator cannot predict, and for bad options (naming the flag).
Review review(const ResolvedRun& run, const ReviewOptions& options = {},
              const std::optional<Finding>& refusal = std::nullopt);

// One line per finding ("warning bubble: ...; fix: ... (+12.3% tokens/s)"),
// and the JSON form: {"findings": [{severity, check, finding, value, limit,
// fix, gain}], "skipped": [...], "errors": N, "warnings": N, "notes": N}.
std::string finding_line(const Finding& finding);
std::string review_text(const Review& review);
std::string review_json(const Review& review);

}  // namespace pipeflow
