#include "pipeflow/sim/run_metadata.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "pipeflow/core/config.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
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

namespace {

// A trace travels between people, and re-simulating its run reads the files
// its configuration names: only those beside the trace or under the working
// directory, so that a trace cannot make analyze open (and quote in an
// error) any other file its user can read. A preset's name, taken as a
// path, lies under the working directory.
void check_named_files(const nlohmann::json& config, const std::string& trace, const std::string& where) {
  std::filesystem::path beside = std::filesystem::path(trace).parent_path();
  if (beside.empty()) beside = ".";
  for (const char* pointer : kRunConfigFileKeys) {
    const nlohmann::json::json_pointer key(pointer);
    if (!config.contains(key) || !config[key].is_string()) continue;
    const std::string path = config[key].get<std::string>();
    if (is_within(path, beside) || is_within(path, std::filesystem::current_path())) continue;
    std::string name = key.to_string().substr(1);
    std::replace(name.begin(), name.end(), '/', '.');
    fail("{}.config.{} = {}: a trace names only files beside it ({} or below) or under the working directory: copy "
         "the file beside the trace and name it so",
         where, name, quoted_excerpt(path), beside.string());
  }
}

}  // namespace

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
  const HardwareProfile hardware = hardware_from_json(json_text(json["hardware"]), where + ".hardware");
  // The configuration names its hardware by preset or path; the trace carries the profile itself.
  nlohmann::json config = json["config"];
  config["hardware"] = "cpu";
  check_named_files(config, source, where);
  metadata.config = parse_run_config(Config::from_json(std::move(config), where + ".config"));
  metadata.config.hardware = hardware;
  metadata.config.hardware_source = hardware.name;
  metadata.costs = profile_from_json(json_text(json["costs"]), where + ".costs");
  return metadata;
}

}  // namespace pipeflow
