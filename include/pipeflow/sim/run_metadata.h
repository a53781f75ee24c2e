#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "pipeflow/config/run_config.h"
#include "pipeflow/sim/profile.h"
#include "pipeflow/sim/simulation.h"

namespace pipeflow {

// What `pipeflow train` and `pipeflow simulate` write about their run into
// the trace they make (Timeline::run_metadata, otherData.pipeflow of the
// Chrome trace), so that `pipeflow analyze` can re-simulate the run from the
// trace file alone:
//   {"format": 1,
//    "producer": "pipeflow simulate",       or "pipeflow train"
//    "config": {...},                       the resolved run configuration in its file's form
//                                           (run_config_to_json: the model written in)
//    "hardware": {...},                     the hardware profile (hardware_to_json), so a
//                                           profile file need not travel with the trace
//    "costs": {...},                        per-stage costs in the profile form (profile.h)
//    "costs_measured": false}               true: measured (train, simulate --profile), and a
//                                           re-simulation runs with them; false: the cost
//                                           model's, which the configuration gives again
// A schedule file (pipeline.schedule_file) is named by its path, which must
// still be there to re-simulate.
inline constexpr int kRunMetadataFormat = 1;

struct RunMetadata {
  std::string producer;
  RunConfig config;  // parsed again, its hardware the trace's
  MeasuredProfile costs;
  bool costs_measured = false;
};

// `config`: a resolved run's (ResolvedRun::config, which holds the model
// that runs).
nlohmann::json run_metadata_json(const RunConfig& config, const MeasuredProfile& costs, bool costs_measured,
                                 const std::string& producer);

// The cost model's (or any) SimulationCosts as a profile: every figure of
// every stage, and the link between ranks 0 and 1.
MeasuredProfile profile_of_costs(const SimulationCosts& costs, std::string source);

// Throws Error naming `source` and the key for a malformed record or a
// format other than kRunMetadataFormat.
RunMetadata read_run_metadata(const nlohmann::json& json, const std::string& source);

}  // namespace pipeflow
