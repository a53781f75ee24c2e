#include "pipeflow/sim/run_metadata.h"

#include "pipeflow/core/config.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/model/hardware.h"

namespace pipeflow {

nlohmann::json run_metadata_json(const RunConfig& config, const MeasuredProfile& costs, bool costs_measured,
                                 const std::string& producer) {
  return {{"format", kRunMetadataFormat},
          {"producer", producer},
          {"config", nlohmann::json::parse(run_config_to_json(config))},
          {"hardware", nlohmann::json::parse(hardware_to_json(config.hardware))},
          {"costs", nlohmann::json::parse(profile_to_json(costs))},
          {"costs_measured", costs_measured}};
}

MeasuredProfile profile_of_costs(const SimulationCosts& costs, std::string source) {
  MeasuredProfile profile;
  profile.source = std::move(source);
  for (const StageCosts& stage : costs.stages) profile.stages.push_back(ProfiledStage::all_measured(stage));
  profile.link = costs.links.at(RankId(0), RankId(1));
  return profile;
}

RunMetadata read_run_metadata(const nlohmann::json& json, const std::string& source) {
  const std::string where = source + ": otherData.pipeflow";
  if (!json.is_object()) fail("{}: not an object", where);
  for (const char* key : {"format", "producer", "config", "hardware", "costs", "costs_measured"}) {
    if (!json.contains(key)) fail("{}: no \"{}\": a trace of pipeflow train or simulate has it", where, key);
  }
  if (!json["format"].is_number_integer() || json["format"].get<int>() != kRunMetadataFormat) {
    fail("{}.format = {}: this pipeflow reads format {}", where, short_dump(json["format"]), kRunMetadataFormat);
  }
  if (!json["producer"].is_string() || !json["costs_measured"].is_boolean() || !json["config"].is_object()) {
    fail("{}: producer must be a string, costs_measured a boolean and config an object", where);
  }
  RunMetadata metadata;
  metadata.producer = json["producer"].get<std::string>();
  metadata.costs_measured = json["costs_measured"].get<bool>();
  const HardwareProfile hardware = hardware_from_json(json["hardware"].dump(), where + ".hardware");
  // The configuration names its hardware by preset or path; the trace carries the profile itself.
  nlohmann::json config = json["config"];
  config["hardware"] = "cpu";
  metadata.config = parse_run_config(Config::from_json(std::move(config), where + ".config"));
  metadata.config.hardware = hardware;
  metadata.config.hardware_source = hardware.name;
  metadata.costs = profile_from_json(json["costs"].dump(), where + ".costs");
  return metadata;
}

}  // namespace pipeflow
