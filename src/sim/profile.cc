#include "pipeflow/sim/profile.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "pipeflow/core/config.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"

namespace pipeflow {
namespace {

double non_negative(const Config& config, std::string_view key, bool required) {
  const double value = required ? config.require<double>(key) : config.get(key, 0.0);
  if (!std::isfinite(value) || value < 0) config.fail_value(key, "must be a finite number >= 0");
  return value;
}

std::optional<double> optional_non_negative(const Config& config, std::string_view key) {
  if (!config.has(key)) return std::nullopt;
  return non_negative(config, key, true);
}

StageMeasurement read_stage(const nlohmann::json& json, const std::string& source) {
  const Config config = Config::from_json(json, source);
  StageMeasurement stage;
  stage.forward_s = non_negative(config, "forward_s", true);
  stage.backward_s = non_negative(config, "backward_s", true);
  stage.backward_input_s = non_negative(config, "backward_input_s", false);
  stage.backward_weight_s = non_negative(config, "backward_weight_s", false);
  stage.output_bytes = non_negative(config, "output_bytes", true);
  stage.activation_bytes = optional_non_negative(config, "activation_bytes");
  stage.weight_gradient_bytes = optional_non_negative(config, "weight_gradient_bytes");
  stage.forward_working_bytes = optional_non_negative(config, "forward_working_bytes");
  stage.backward_working_bytes = optional_non_negative(config, "backward_working_bytes");
  stage.model_state_bytes = optional_non_negative(config, "model_state_bytes");
  stage.optimizer_s = optional_non_negative(config, "optimizer_s");
  config.check_no_unknown_keys();
  return stage;
}

}  // namespace

MeasuredProfile profile_from_json(std::string_view json_text, const std::string& source) {
  const Config config = Config::parse(json_text, source);
  const int version = config.require<int>("pipeflow_profile");
  if (version != kProfileFormatVersion) {
    config.fail_value("pipeflow_profile", fmt::format("this pipeflow reads version {}", kProfileFormatVersion));
  }
  MeasuredProfile profile;
  profile.source = config.get("source", "");
  const nlohmann::json& stages = config.raw("stages");
  if (!stages.is_array() || stages.empty()) config.fail_value("stages", "must be a non-empty list of stages");
  for (std::size_t i = 0; i < stages.size(); ++i) {
    profile.stages.push_back(read_stage(stages[i], fmt::format("{} stages[{}]", source, i)));
  }
  if (config.has("link")) {
    const Config link = config.object("link");
    profile.link.latency_s = non_negative(link, "latency_s", true);
    profile.link.bandwidth_bytes_per_s = link.require<double>("bandwidth_bytes_per_s");
    if (!(profile.link.bandwidth_bytes_per_s > 0)) link.fail_value("bandwidth_bytes_per_s", "must be > 0");
  }
  config.check_no_unknown_keys();
  return profile;
}

MeasuredProfile load_profile(const std::filesystem::path& path) {
  return profile_from_json(read_file(path), path.string());
}

std::string profile_to_json(const MeasuredProfile& profile) {
  nlohmann::ordered_json json;
  json["pipeflow_profile"] = kProfileFormatVersion;
  if (!profile.source.empty()) json["source"] = profile.source;
  json["stages"] = nlohmann::ordered_json::array();
  for (const StageMeasurement& s : profile.stages) {
    nlohmann::ordered_json stage;
    stage["forward_s"] = s.forward_s;
    stage["backward_s"] = s.backward_s;
    stage["backward_input_s"] = s.backward_input_s;
    stage["backward_weight_s"] = s.backward_weight_s;
    stage["output_bytes"] = s.output_bytes;
    if (s.activation_bytes) stage["activation_bytes"] = *s.activation_bytes;
    if (s.weight_gradient_bytes) stage["weight_gradient_bytes"] = *s.weight_gradient_bytes;
    if (s.forward_working_bytes) stage["forward_working_bytes"] = *s.forward_working_bytes;
    if (s.backward_working_bytes) stage["backward_working_bytes"] = *s.backward_working_bytes;
    if (s.model_state_bytes) stage["model_state_bytes"] = *s.model_state_bytes;
    if (s.optimizer_s) stage["optimizer_s"] = *s.optimizer_s;
    json["stages"].push_back(stage);
  }
  if (std::isfinite(profile.link.bandwidth_bytes_per_s) || profile.link.latency_s > 0) {
    json["link"] = {{"latency_s", profile.link.latency_s},
                    {"bandwidth_bytes_per_s", profile.link.bandwidth_bytes_per_s}};
  }
  return json.dump(2) + "\n";
}

SimulationCosts costs_from_profile(const MeasuredProfile& profile) {
  SimulationCosts costs;
  costs.stages.resize(profile.stages.size());
  apply_profile(profile, costs);
  return costs;
}

void apply_profile(const MeasuredProfile& profile, SimulationCosts& costs) {
  if (profile.stages.size() != costs.stages.size()) {
    fail("profile{} has {} stages but the simulated layout has {}: measure the same pipeline stages × virtual "
         "stages",
         profile.source.empty() ? "" : " (" + profile.source + ")", profile.stages.size(), costs.stages.size());
  }
  for (std::size_t s = 0; s < profile.stages.size(); ++s) {
    const StageMeasurement& measured = profile.stages[s];
    StageCosts& stage = costs.stages[s];
    stage.forward_s = measured.forward_s;
    stage.backward_s = measured.backward_s;
    stage.backward_input_s = measured.backward_input_s;
    stage.backward_weight_s = measured.backward_weight_s;
    stage.output_bytes = measured.output_bytes;
    if (measured.activation_bytes) stage.activation_bytes = *measured.activation_bytes;
    if (measured.weight_gradient_bytes) stage.weight_gradient_bytes = *measured.weight_gradient_bytes;
    if (measured.forward_working_bytes) stage.forward_working_bytes = *measured.forward_working_bytes;
    if (measured.backward_working_bytes) stage.backward_working_bytes = *measured.backward_working_bytes;
    if (measured.model_state_bytes) stage.model_state_bytes = *measured.model_state_bytes;
    if (measured.optimizer_s) stage.optimizer_s = *measured.optimizer_s;
  }
  costs.links = LinkTable(profile.link);
}

}  // namespace pipeflow
