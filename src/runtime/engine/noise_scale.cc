#include "pipeflow/runtime/noise_scale.h"

#include <cmath>
#include <vector>

#include "pipeflow/core/error.h"

namespace pipeflow::runtime {

NoiseScaleSample noise_scale_sample(double small_square, std::int64_t b_small, double big_square,
                                    std::int64_t b_big) {
  if (b_small < 1 || b_big <= b_small) {
    fail("noise scale: batches of {} and {} sequences: needs 1 <= B_small < B_big (a step of more than one "
         "micro-batch, or data_parallel > 1)",
         b_small, b_big);
  }
  if (!(small_square >= 0) || !(big_square >= 0) || !std::isfinite(small_square) || !std::isfinite(big_square)) {
    fail("noise scale: squared gradient norms {} (small batch) and {} (big batch) must be finite and >= 0",
         small_square, big_square);
  }
  const double small = static_cast<double>(b_small);
  const double big = static_cast<double>(b_big);
  return {.grad_square = (big * big_square - small * small_square) / (big - small),
          .trace = (small_square - big_square) / (1 / small - 1 / big)};
}

void NoiseScaleAverage::add(const NoiseScaleSample& sample) {
  grad_square_ = kDecay * grad_square_ + (1 - kDecay) * sample.grad_square;
  trace_ = kDecay * trace_ + (1 - kDecay) * sample.trace;
  ++samples_;
}

std::optional<double> NoiseScaleAverage::value() const {
  if (samples_ == 0 || !(grad_square_ > 0)) return std::nullopt;
  return trace_ / grad_square_;
}

bool measures_noise_scale(std::int64_t step, int interval) { return interval > 0 && step % interval == 0; }

NoiseMicrobatch noise_microbatch(const Schedule& schedule, int data_parallel, bool sequence_parallel) {
  if (sequence_parallel) {
    return {.microbatch = std::nullopt,
            .obstacle = "under sequence parallelism each tensor-parallel rank holds only its positions' part of the "
                        "norms' gradients until the step's flush sums them"};
  }
  if (schedule.num_microbatches() == 1 && data_parallel == 1) {
    return {.microbatch = std::nullopt,
            .obstacle = "a step of one micro-batch (gradient_accumulation_steps 1, data_parallel 1) has no smaller "
                        "batch to compare its gradient with"};
  }
  // Per stage, the micro-batch of its first B or W (-1: none yet).
  std::vector<int> first(static_cast<std::size_t>(schedule.num_stages()), -1);
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    for (const Action& a : schedule.actions(RankId(r))) {
      if (a.kind != ActionKind::kBackward && a.kind != ActionKind::kBackwardWeight) continue;
      int& j = first[static_cast<std::size_t>(a.stage.value())];
      if (j < 0) j = a.microbatch.value();
    }
  }
  for (std::size_t s = 1; s < first.size(); ++s) {
    if (first[s] != first[0]) {
      return {.microbatch = std::nullopt,
              .obstacle = fmt::format("schedule {} completes the weight gradient of micro-batch {} first on stage 0 "
                                      "and of micro-batch {} on stage {}: no stage-by-stage snapshot is one "
                                      "micro-batch's gradient",
                                      schedule.name(), first[0], first[s], s)};
    }
  }
  return {.microbatch = first[0], .obstacle = ""};
}

}  // namespace pipeflow::runtime
