#include "pipeflow/sim/profile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "pipeflow/core/config.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

// Bounds far above any real measurement, so that a corrupt figure (1e308)
// fails here by key instead of overflowing the simulation into "inf".
constexpr double kMaxSeconds = 1e6;         // an action of 11.6 days
constexpr double kMaxBytes = 0x1p50;        // 1 PiB

// A duration (a key ending in "_s") or a byte count.
double non_negative(const Config& config, std::string_view key, bool required) {
  const double value = required ? config.require<double>(key) : config.get(key, 0.0);
  const bool seconds = key.ends_with("_s");
  const double bound = seconds ? kMaxSeconds : kMaxBytes;
  if (!std::isfinite(value) || value < 0 || value > bound) {
    config.fail_value(key, fmt::format("must be a finite number in [0, {:g}] {}: re-measure the profile or correct the value",
                                       bound, seconds ? "seconds" : "bytes"));
  }
  return value;
}

// Every figure a profile's stage can carry, in the order written: one table
// for reading, writing and applying a profile.
enum class Presence { kRequired, kZeroIfAbsent, kOptional };
struct ProfileField {
  std::string_view key;
  double StageCosts::*member;
  Presence presence;
};
constexpr ProfileField kProfileFields[] = {
    {"forward_s", &StageCosts::forward_s, Presence::kRequired},
    {"backward_s", &StageCosts::backward_s, Presence::kRequired},
    {"backward_input_s", &StageCosts::backward_input_s, Presence::kZeroIfAbsent},
    {"backward_weight_s", &StageCosts::backward_weight_s, Presence::kZeroIfAbsent},
    {"output_bytes", &StageCosts::output_bytes, Presence::kRequired},
    {"activation_bytes", &StageCosts::activation_bytes, Presence::kOptional},
    {"weight_gradient_bytes", &StageCosts::weight_gradient_bytes, Presence::kOptional},
    {"forward_working_bytes", &StageCosts::forward_working_bytes, Presence::kOptional},
    {"backward_working_bytes", &StageCosts::backward_working_bytes, Presence::kOptional},
    {"model_state_bytes", &StageCosts::model_state_bytes, Presence::kOptional},
    {"optimizer_s", &StageCosts::optimizer_s, Presence::kOptional},
};

bool in_profile(const ProfiledStage& stage, const ProfileField& field) {
  return field.presence != Presence::kOptional || stage.was_measured(field.member);
}

ProfiledStage read_stage(const nlohmann::json& json, const std::string& source) {
  const Config config = Config::from_json(json, source);
  ProfiledStage stage;
  for (const ProfileField& field : kProfileFields) {
    if (field.presence == Presence::kOptional) {
      if (config.has(field.key)) stage.set_measured(field.member, non_negative(config, field.key, true));
    } else {
      stage.costs.*field.member = non_negative(config, field.key, field.presence == Presence::kRequired);
    }
  }
  config.check_no_unknown_keys();
  return stage;
}

}  // namespace

bool ProfiledStage::was_measured(double StageCosts::*field) const {
  return std::find(measured.begin(), measured.end(), field) != measured.end();
}

void ProfiledStage::set_measured(double StageCosts::*field, double value) {
  costs.*field = value;
  if (!was_measured(field)) measured.push_back(field);
}

ProfiledStage ProfiledStage::all_measured(const StageCosts& costs) {
  ProfiledStage stage{costs, {}};
  for (const ProfileField& field : kProfileFields) {
    if (field.presence == Presence::kOptional) stage.measured.push_back(field.member);
  }
  return stage;
}

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
  return profile_from_json(read_file(path, kMaxConfigFileBytes, "profile"), path.string());
}

std::string profile_to_json(const MeasuredProfile& profile) {
  nlohmann::ordered_json json;
  json["pipeflow_profile"] = kProfileFormatVersion;
  if (!profile.source.empty()) json["source"] = profile.source;
  json["stages"] = nlohmann::ordered_json::array();
  for (const ProfiledStage& s : profile.stages) {
    nlohmann::ordered_json stage;
    for (const ProfileField& field : kProfileFields) {
      if (in_profile(s, field)) stage[std::string(field.key)] = s.costs.*field.member;
    }
    json["stages"].push_back(stage);
  }
  if (std::isfinite(profile.link.bandwidth_bytes_per_s) || profile.link.latency_s > 0) {
    json["link"] = {{"latency_s", profile.link.latency_s},
                    {"bandwidth_bytes_per_s", profile.link.bandwidth_bytes_per_s}};
  }
  return json_text(json, 2) + "\n";
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
    for (const ProfileField& field : kProfileFields) {
      if (in_profile(profile.stages[s], field)) costs.stages[s].*field.member = profile.stages[s].costs.*field.member;
    }
  }
  costs.links = LinkTable(profile.link);
}

}  // namespace pipeflow
