#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/config/run_config.h"
#include "pipeflow/sim/run_metadata.h"

namespace pipeflow {

// `pipeflow sweep`: one or two settings varied over a range, each point
// simulated (and, with a trainer, really trained), as a table, JSON and SVG
// plots of step time, bubble, memory and tokens/s against the setting, and
// for trained points loss against tokens seen (the course's experiment
// comparison in one command).

// One varied setting: KEY=V1,V2,... KEY is a flag's name:
//   microbatches     micro-batches per step, the global batch fixed (the micro-batch size follows)
//   micro-batch      the micro-batch size (train_micro_batch_size_per_gpu), m fixed
//   global-batch     train_batch_size, the learning rate scaled with it (LrRule)
//   schedule         a schedule's name, or NAME:V with its virtual stages (interleaved-1f1b:2)
//   stages, virtual, recompute, partition, comm, tensor-parallel,
//   data-parallel, seq-length   the keys of the flags of the same names
// or a key path of the run configuration (pipeline.stages,
// optimizer.params.lr, model.n_layer of an inline model, ...): each value is
// read as JSON (a number, true, false), else as a string.
struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
};

// Throws Error naming the text and the rule for a malformed axis. Whether a
// key path names a key is checked by run_sweep, against the configuration.
SweepAxis parse_sweep_axis(std::string_view text);

// How a varied global batch B scales the base learning rate lr0 at the base
// batch B0 (advise-batch's rules, plan/advise_batch.h): kSqrt lr0 · √(B/B0)
// (Adam, AdamW: advise-batch's rule for the optimizers pipeflow trains),
// kLinear lr0 · B/B0 (SGD's), kNone lr0.
enum class LrRule { kSqrt, kLinear, kNone };
LrRule parse_lr_rule(std::string_view text);  // "sqrt", "linear", "none"; else an Error listing them
std::string_view to_string(LrRule rule);

// A trained point's figures: those of the last step, as `pipeflow train`
// prints them, and the loss of every step.
struct MeasuredPoint {
  double step_time_s = 0;
  double bubble_ratio = 0;
  double peak_activation_bytes = 0;  // the largest rank's
  double tokens_per_s = 0;
  std::vector<double> tokens_seen;  // after each step: (its index + 1) · B · T
  std::vector<double> loss;         // each step's training loss
  std::optional<double> val_loss;   // the validation loss after the last step
  std::string out_dir;              // where the run's files went
};

// Trains one point's resolved run; `name` ("global-batch=8,schedule=1f1b",
// no '/') tells the runs apart (the command gives each its own out_dir/name).
using PointTrainer = std::function<MeasuredPoint(const ResolvedRun& run, const std::string& name)>;

struct SweepPoint {
  std::vector<std::string> setting;  // one value per axis
  // Empty when the point ran; else why it could not (the schedule's
  // constraint, a batch that does not divide, a failed training run, ...).
  std::string error;
  double lr = 0;            // the optimizer's learning rate the point runs with
  int global_batch = 0;     // B, sequences per optimizer step
  // Predicted: `pipeflow simulate` of the point's configuration.
  double step_time_s = 0;
  double bubble_ratio = 0;
  double peak_memory_bytes = 0;      // the largest rank's
  double peak_activation_bytes = 0;  // the largest rank's activations and weight gradients held at its peak
  double tokens_per_s = 0;
  // With the sweep's noise scale: batch_efficiency at global_batch.
  double samples_over_minimum = 0;
  double steps_over_minimum = 0;
  std::optional<MeasuredPoint> measured;  // trained sweeps
};

struct Sweep {
  std::vector<SweepAxis> axes;     // one or two
  LrRule lr_rule = LrRule::kSqrt;
  bool trained = false;
  // The gradient noise scale B_simple in sequences, when given: each point's
  // samples and steps over their minimum (batch_efficiency, advise_batch.h).
  std::optional<double> noise_scale;
  std::vector<SweepPoint> points;  // every combination, the first axis outermost
};

// The run configuration a set of overrides gives (the command's --config
// and flags, with the point's values written over them).
using ConfigSource = std::function<RunConfig(const RunOverrides&)>;

struct SweepRequest {
  RunOverrides base;  // the command line's flags
  std::vector<SweepAxis> axes;
  LrRule lr_rule = LrRule::kSqrt;
  PointTrainer train;  // empty: simulate only
  std::optional<double> noise_scale;  // Sweep::noise_scale
  // A measured run (measured_run_from: a profile, a trace or a log): every
  // point is re-simulated from its measured durations (analyze's
  // Resimulator), not the cost model alone.
  std::optional<RunMetadata> measured;
};

// Simulates (and with request.train, trains) every combination of the axes'
// values over the base configuration. A point's configuration: the option
// keys as overrides, the key paths written over the configuration's file
// form (run_config_to_json), then microbatches, then the learning rate of a
// varied global batch. Throws Error for no axis, more than two, the same key
// twice, or a key that is neither an option nor a key path of the
// configuration (listing both).
// The names --vary takes besides key paths: microbatches (derived: the
// micro-batch for m micro-batches at the same global batch) and the flag of
// every key run_keys() lets sweep vary, without "--".
std::string sweep_option_names();

Sweep run_sweep(const ConfigSource& config, const SweepRequest& request);

std::string sweep_text(const Sweep& sweep);
std::string sweep_json(const Sweep& sweep);
// Plots side by side against the first axis, one line per value of the
// second: step time, bubble, peak memory (trained: peak activations) and
// tokens/s, the predicted line solid and, trained, the measured one dashed
// beside it; trained, loss against tokens seen with one line per point;
// with a noise scale, the samples and the steps over their minimum with a
// dashed line at 2 (where B = B_noise), and in every plot a black ring round
// each predicted point past the noise scale. Every plotted number is a <circle> whose data-value is
// the JSON's number (data-series "predicted", "measured" or, for the
// factors, "formula"; the loss plot's also carry data-tokens, the points
// past the noise scale data-past-noise-scale="true").
std::string sweep_svg(const Sweep& sweep);

}  // namespace pipeflow
