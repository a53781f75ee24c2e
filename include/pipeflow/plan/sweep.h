#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/config/run_config.h"

namespace pipeflow {

// `pipeflow sweep`: one or two settings varied over a range, each point
// simulated, as a table, JSON and SVG plots of step time, bubble, peak
// memory and tokens/s against the setting (the course's experiment
// comparison in one command).

// One varied setting: KEY=V1,V2,... KEY is a flag's name:
//   microbatches     micro-batches per step, the global batch fixed (the micro-batch size follows)
//   micro-batch      the micro-batch size (train_micro_batch_size_per_gpu), m fixed
//   global-batch     train_batch_size
//   schedule         a schedule's name, or NAME:V with its virtual stages (interleaved-1f1b:2)
//   stages, virtual, recompute, partition, comm, tensor-parallel,
//   data-parallel, seq-length   the keys of the flags of the same names
struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
};

// Throws Error naming the text, the rule and the keys for a malformed axis
// or an unknown key.
SweepAxis parse_sweep_axis(std::string_view text);

struct SweepPoint {
  std::vector<std::string> setting;  // one value per axis
  // Empty when the point was simulated; else why it could not be (the
  // schedule's constraint, a batch that does not divide, ...).
  std::string error;
  double step_time_s = 0;
  double bubble_ratio = 0;
  double peak_memory_bytes = 0;  // the largest rank's
  double tokens_per_s = 0;
};

struct Sweep {
  std::vector<SweepAxis> axes;    // one or two
  std::vector<SweepPoint> points;  // every combination, the first axis outermost
};

// The run configuration a set of overrides gives (the command's --config
// and flags, with the point's values written over them).
using ConfigSource = std::function<RunConfig(const RunOverrides&)>;

// Simulates every combination of the axes' values over `base` (the
// command line's overrides). Throws Error for no axis, more than two, or
// the same key twice.
Sweep run_sweep(const ConfigSource& config, const RunOverrides& base, const std::vector<SweepAxis>& axes);

std::string sweep_text(const Sweep& sweep);
std::string sweep_json(const Sweep& sweep);
// Four plots side by side (step time, bubble, peak memory, tokens/s) against
// the first axis, one line per value of the second. Every point is a
// <circle> whose data-value holds its exact number as the JSON has it.
std::string sweep_svg(const Sweep& sweep);

}  // namespace pipeflow
