#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "pipeflow/schedule/schedule.h"

namespace pipeflow::runtime {

// The gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al. 2018,
// Appendix A), from the squared norms of the gradient of the mean loss over a
// small and a big batch of the same step:
//   |G|²  ≈ (B_big·|G_big|² − B_small·|G_small|²) / (B_big − B_small)
//   tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)
// Both are unbiased and noisy, so (as the paper does) each is smoothed by its
// own exponential moving average over the measured steps and B_simple is the
// ratio of the averages. Batches count sequences, so B_simple does too.
//
// In pipeflow train the small batch is one micro-batch (b sequences, of
// data-parallel replica 0) and the big one the step's global batch
// (m · b · d): see PipelineEngine's `grad_square_small`.
struct NoiseScaleSample {
  double grad_square;  // the estimate of |G|²
  double trace;        // the estimate of tr(Σ)
};

// Error unless 1 <= b_small < b_big and both squares are finite and >= 0.
NoiseScaleSample noise_scale_sample(double small_square, std::int64_t b_small, double big_square,
                                    std::int64_t b_big);

class NoiseScaleAverage {
 public:
  // The weight of the history in each update (avg ← decay·avg + (1 − decay)·x).
  static constexpr double kDecay = 0.9;

  void add(const NoiseScaleSample& sample);
  // tr(Σ)/|G|² of the averages; none before the first sample or while the
  // averaged |G|² is not > 0 (early on the noise can make it negative).
  std::optional<double> value() const;
  int samples() const { return samples_; }

 private:
  // Both start at 0 without bias correction: the same factor 1 − decay^n
  // scales both, so their ratio is unbiased.
  double grad_square_ = 0;
  double trace_ = 0;
  int samples_ = 0;
};

// Whether step `step` measures the noise scale with metrics.noise_scale_interval
// `interval` (0: never; k: every k-th step, from step 0).
bool measures_noise_scale(std::int64_t step, int interval);

// The micro-batch j* whose gradient is the small batch: the one each stage
// of `schedule` (lowered or not) completes its first weight gradient (B or
// W) for, which must be the same on every stage, so that each stage's
// gradient right after it is j*'s alone (j* = 0 for every built-in schedule
// but looped-bfs, which runs its backwards in reverse: j* = m − 1). None,
// with the reason, when the stages complete different micro-batches first,
// or when a step has one micro-batch and `data_parallel` is 1 (no batch
// smaller than the step's), or under sequence parallelism (each rank holds
// only its part of the norms' gradients until the flush sums them).
struct NoiseMicrobatch {
  std::optional<int> microbatch;
  std::string obstacle;  // why not, when no micro-batch
};
NoiseMicrobatch noise_microbatch(const Schedule& schedule, int data_parallel, bool sequence_parallel = false);

}  // namespace pipeflow::runtime
