#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/sim/simulation.h"

namespace pipeflow {

// Per-action costs measured on a real run: what the runtime writes after its
// first steps and `pipeflow simulate --profile FILE` reads, so that the
// simulator predicts the step from measurements instead of FLOPs.
//
// JSON form (unknown keys are errors naming their path):
//   {"pipeflow_profile": 1,                   format version
//    "source": "pipeflow train, steps 2-4",    optional, free text
//    "stages": [                               one per (virtual) stage, in stage order
//      {"forward_s": 0.012, "backward_s": 0.024,
//       "backward_input_s": 0.013, "backward_weight_s": 0.011,   optional, 0 if the run had no I/W
//       "output_bytes": 65536,                 the message to the next stage
//       "activation_bytes": 1.2e7,             optional memory figures, per micro-batch
//       "weight_gradient_bytes": 4e6,          optional
//       "forward_working_bytes": 3e6,          optional: the most an F (a B/I/W) holds
//       "backward_working_bytes": 2e6,         above what the stage held when it began
//       "model_state_bytes": 3.2e7,            optional
//       "optimizer_s": 0.004}],                optional: the stage's optimizer step
//    "link": {"latency_s": 2e-6, "bandwidth_bytes_per_s": 7e9}}   every rank pair; optional:
//                                              absent, messages are free (an in-process hand-off)
// Seconds and bytes are per micro-batch (the optimizer's seconds per step):
// for each stage and action kind, the median over the measured steps (runtime::CostProfile
// computes them) -- the median, not the mean, because a step on a shared
// machine has outliers. A key left out of a stage means "not measured".

// One stage of a profile: its costs, and which of them the run measured. The
// durations (F, B, I, W; I and W 0 if the run had none) and output_bytes are
// always part of a profile; the memory figures and the optimizer time only
// where `measured` names them, and for the rest apply_profile keeps the
// simulated layout's own figure.
struct ProfiledStage {
  StageCosts costs;
  std::vector<double StageCosts::*> measured;  // e.g. &StageCosts::activation_bytes

  bool was_measured(double StageCosts::*field) const;
  // Sets costs.*field and marks it measured.
  void set_measured(double StageCosts::*field, double value);
  // `costs` with every figure a profile can carry marked measured.
  static ProfiledStage all_measured(const StageCosts& costs);
};

struct MeasuredProfile {
  std::string source;
  std::vector<ProfiledStage> stages;
  LinkCost link;
};

inline constexpr int kProfileFormatVersion = 1;

// Throws Error naming the source and key path of any missing, unknown or
// negative value.
MeasuredProfile profile_from_json(std::string_view json_text, const std::string& source);
MeasuredProfile load_profile(const std::filesystem::path& path);
// Pretty JSON (2-space indent) in the form above; figures not measured are left out.
std::string profile_to_json(const MeasuredProfile& profile);

// SimulationCosts with the measured durations, messages and link; memory and
// optimizer time where measured, else 0. The runtime's prediction:
//   simulate(schedule_it_ran, costs_from_profile(profile))
SimulationCosts costs_from_profile(const MeasuredProfile& profile);

// Replaces the durations, message bytes and links of `costs` by the
// measured ones, and its memory figures and optimizer time where measured;
// keeps the rest (data parallelism, buffers). Throws Error unless the profile
// has one stage per stage of `costs`.
void apply_profile(const MeasuredProfile& profile, SimulationCosts& costs);

}  // namespace pipeflow
