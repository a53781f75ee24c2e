#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pipeflow/schedule/schedule.h"
#include "pipeflow/sim/cost_model.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/profile.h"
#include "pipeflow/sim/simulation.h"

namespace pipeflow {

// What micro-batches of their own lengths and images
// (Layout::variable_seq_lengths, variable_images) do to a step, against the
// uniform case: the same layout with every micro-batch at the mean length
// (rounded; to a multiple of t under sequence parallelism) and the mean
// images (rounded down: a whole number of images that leaves text).
struct VariableLengths {
  std::vector<int> lengths;        // tokens per sequence of each micro-batch of a replica
  std::vector<int> images;         // images per sequence of each (with variable_images)
  int uniform_length = 0;          // the mean, rounded
  int uniform_images = 0;          // the mean, rounded down (0 without a vision tower)
  double uniform_step_time_s = 0;  // the uniform case's step
  // The slowest micro-batch's compute (F + B summed over the stages) over
  // the mean micro-batch's; the busiest rank's compute over the mean rank's,
  // here and in the uniform case.
  double microbatch_imbalance = 0;
  double rank_imbalance = 0;
  double uniform_rank_imbalance = 0;
};

// A layout's predicted step: the simulated schedule, the costs it ran with,
// the result, and the throughput figures derived from them.
struct Prediction {
  Layout layout;
  int microbatches = 0;  // m per replica
  // The schedule simulated: the compute-only one for overlapped
  // communication (each message arrives latency + bytes / bandwidth after its
  // producer ends, without rank time: a communication stream with receives
  // posted early), its insert_send_recv lowering for blocking communication;
  // a lowered schedule file as written.
  Schedule schedule;
  LayoutCosts costs;
  SimulationResult result;  // with its steady state (SteadyState) of back-to-back steps

  double tokens_per_s = 0;                // B · s / step time
  double mfu = 0;                         // model FLOPs / (step · devices · peak)
  double hfu = 0;                         // the same with recomputation counted
  double tflops_per_device = 0;           // model FLOPs / (step · devices), in TFLOP/s
  double hardware_tflops_per_device = 0;  // with recomputation, as Megatron-LM reports
  // One line per rank whose peak memory exceeds the device's, naming the fix.
  std::vector<std::string> warnings;
  std::optional<VariableLengths> variable_lengths;  // with microbatches_differ(layout)
};

// Builds the layout's schedule and costs and simulates one step. With a
// measured profile, its durations, messages and link replace the cost
// model's (apply_profile). Throws Error for an invalid layout, a schedule
// whose constraints the layout breaks, or a profile of another shape.
Prediction predict(const Layout& layout, const MeasuredProfile* profile = nullptr);

}  // namespace pipeflow
