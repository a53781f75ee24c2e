#include "pipeflow/model/hardware.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>

#include "pipeflow/core/config.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"

namespace pipeflow {
namespace {

constexpr double kGB = 1e9;                          // bandwidths are quoted in decimal GB/s
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;  // "80GB" HBM is 80 GiB (81920 MiB reported)

// NVLink figures are per GPU, both directions together (A100 600 GB/s, H100
// 900 GB/s): one direction is half. An InfiniBand HCA per GPU: HDR 200 Gb/s
// = 25 GB/s, NDR 400 Gb/s = 50 GB/s per direction. Latencies are not on any
// datasheet: 3 µs within a node and 8 µs across nodes are typical NCCL
// point-to-point small-message figures, marked as estimates.
HardwareProfile eight_device_node(std::string name, double tflops, double memory_gib, double hbm_gb_per_s,
                                  double nvlink_total, double ib_gbit, double efficiency, std::string note) {
  return HardwareProfile{.name = std::move(name),
                         .peak_flop_per_s = tflops * 1e12,
                         .memory_bytes = memory_gib * kGiB,
                         .memory_bandwidth_bytes_per_s = hbm_gb_per_s * kGB,
                         .devices_per_node = 8,
                         .intra_node_bandwidth_bytes_per_s = nvlink_total / 2 * kGB,
                         .intra_node_latency_s = 3e-6,
                         .inter_node_bandwidth_bytes_per_s = ib_gbit / 8 * kGB,
                         .inter_node_latency_s = 8e-6,
                         .efficiency = efficiency,
                         .estimated = {"intra_node_latency_s", "inter_node_latency_s", "efficiency"},
                         .note = std::move(note)};
}

std::vector<HardwareProfile> make_presets() {
  std::vector<HardwareProfile> presets = {
      eight_device_node("a100-40g", 312, 40, 1555, 600, 200, 0.65,
             "A100 SXM 40GB datasheet; NVLink3, one HDR InfiniBand HCA per GPU (DGX A100)"),
      eight_device_node("a100-80g", 312, 80, 2039, 600, 200, 0.65,
             "A100 SXM 80GB datasheet; NVLink3, one HDR InfiniBand HCA per GPU (DGX A100)"),
      eight_device_node("h100", 989, 80, 3350, 900, 400, 0.5,
             "H100 SXM datasheet (dense bf16); NVLink4, one NDR InfiniBand HCA per GPU (DGX H100)"),
      eight_device_node("h200", 989, 141, 4800, 900, 400, 0.5,
             "H200 SXM datasheet (dense bf16); NVLink4, one NDR InfiniBand HCA per GPU"),
  };
  // Ascend 910B (B2): no official dense figures. Peak = 24 AI cores × 4096
  // fp16 MAC × 2 × 1.8 GHz; HBM and HCCS as reported by third parties; HCCS
  // total 392 GB/s halved for one direction like NVLink.
  HardwareProfile ascend =
      eight_device_node("ascend-910b", 24 * 4096 * 2 * 1.8e9 / 1e12, 64, 1600, 392, 200, 0.4,
                        "Ascend 910B (B2): unofficial figures; 8 × 200 Gb/s RoCE per node");
  ascend.estimated = {"peak_flop_per_s", "memory_bandwidth_bytes_per_s", "intra_node_bandwidth_bytes_per_s",
                      "intra_node_latency_s", "inter_node_latency_s", "efficiency"};
  presets.push_back(ascend);
  // The development machine as measured (shared/REFERENCE.md): one device is
  // one core running OpenBLAS sgemm (fp32) at 85-93 GFLOP/s; OpenMPI
  // shared-memory P2P 4-10 GB/s, 0.3-2.5 µs. One node: the inter-node figures
  // repeat the intra-node ones. `pipeflow calibrate` measures a fresh profile.
  presets.push_back(HardwareProfile{
      .name = "cpu",
      .peak_flop_per_s = 89e9,
      .memory_bytes = 8 * kGiB,
      .memory_bandwidth_bytes_per_s = 10 * kGB,
      .devices_per_node = 2,
      .intra_node_bandwidth_bytes_per_s = 7 * kGB,
      .intra_node_latency_s = 1e-6,
      .inter_node_bandwidth_bytes_per_s = 7 * kGB,
      .inter_node_latency_s = 1e-6,
      .efficiency = kDefaultEfficiency,
      .estimated = {"memory_bytes", "memory_bandwidth_bytes_per_s", "efficiency"},
      .note = "2-core development machine, fp32 sgemm peak per core; run pipeflow calibrate for this machine"});
  return presets;
}

std::string preset_names() {
  std::string names;
  for (const HardwareProfile& profile : hardware_presets()) names += (names.empty() ? "" : ", ") + profile.name;
  return names;
}

void require_positive(const HardwareProfile& p, std::string_view field, double value) {
  if (!(value > 0) || !std::isfinite(value)) {
    fail("hardware {}: {} = {}: must be a positive number", p.name, field, value);
  }
}

// The positive real figures, in JSON order; devices_per_node follows the first three.
struct Figure {
  const char* key;
  double HardwareProfile::*field;
};
constexpr std::array<Figure, 7> kFigures = {{
    {"peak_flop_per_s", &HardwareProfile::peak_flop_per_s},
    {"memory_bytes", &HardwareProfile::memory_bytes},
    {"memory_bandwidth_bytes_per_s", &HardwareProfile::memory_bandwidth_bytes_per_s},
    {"intra_node_bandwidth_bytes_per_s", &HardwareProfile::intra_node_bandwidth_bytes_per_s},
    {"intra_node_latency_s", &HardwareProfile::intra_node_latency_s},
    {"inter_node_bandwidth_bytes_per_s", &HardwareProfile::inter_node_bandwidth_bytes_per_s},
    {"inter_node_latency_s", &HardwareProfile::inter_node_latency_s},
}};

bool is_figure_key(std::string_view key) {
  if (key == "devices_per_node" || key == "efficiency") return true;
  return std::any_of(kFigures.begin(), kFigures.end(), [&](const Figure& f) { return key == f.key; });
}

}  // namespace

void validate_hardware(const HardwareProfile& profile) {
  for (const Figure& figure : kFigures) require_positive(profile, figure.key, profile.*figure.field);
  if (profile.devices_per_node < 1) {
    fail("hardware {}: devices_per_node = {}: must be >= 1", profile.name, profile.devices_per_node);
  }
  if (!(profile.efficiency > 0 && profile.efficiency <= 1)) {
    fail("hardware {}: efficiency = {}: must be in (0, 1] (the achieved share of peak, e.g. {})", profile.name,
         profile.efficiency, kDefaultEfficiency);
  }
}

const std::vector<HardwareProfile>& hardware_presets() {
  static const std::vector<HardwareProfile> presets = make_presets();
  return presets;
}

HardwareProfile hardware_preset(std::string_view name) {
  for (const HardwareProfile& profile : hardware_presets()) {
    if (profile.name == name) return profile;
  }
  fail("unknown hardware '{}': use one of {} or the path of a hardware JSON file", name, preset_names());
}

HardwareProfile hardware_from_json(std::string_view json_text, std::string source) {
  const Config config = Config::parse(json_text, source);
  HardwareProfile profile;
  profile.name = config.get("name", std::filesystem::path(source).stem().string());
  for (const Figure& figure : kFigures) {
    profile.*figure.field = config.require<double>(figure.key);
    if (!(profile.*figure.field > 0)) config.fail_value(figure.key, "must be a positive number");
  }
  profile.devices_per_node = config.require<int>("devices_per_node");
  if (profile.devices_per_node < 1) config.fail_value("devices_per_node", "must be >= 1");
  profile.efficiency = config.get("efficiency", kDefaultEfficiency);
  if (!(profile.efficiency > 0 && profile.efficiency <= 1)) {
    config.fail_value("efficiency", "must be in (0, 1]: the achieved share of peak FLOP/s");
  }
  profile.estimated = config.get("estimated", std::vector<std::string>{});
  for (const std::string& key : profile.estimated) {
    if (!is_figure_key(key)) {
      config.fail_value("estimated", fmt::format("'{}' is not a figure of a hardware profile", key));
    }
  }
  profile.note = config.get("note", "");
  config.check_no_unknown_keys();
  return profile;
}

HardwareProfile load_hardware(const std::filesystem::path& path) {
  return hardware_from_json(read_file(path, kMaxConfigFileBytes, "hardware profile"), path.string());
}

std::string hardware_to_json(const HardwareProfile& profile) {
  nlohmann::ordered_json json;
  json["name"] = profile.name;
  for (std::size_t i = 0; i < kFigures.size(); ++i) {
    if (i == 3) json["devices_per_node"] = profile.devices_per_node;
    json[kFigures[i].key] = profile.*kFigures[i].field;
  }
  json["efficiency"] = profile.efficiency;
  json["estimated"] = profile.estimated;
  json["note"] = profile.note;
  return json.dump(2) + "\n";
}

HardwareProfile resolve_hardware(std::string_view name_or_path) {
  const bool is_path = name_or_path.find('/') != std::string_view::npos || name_or_path.ends_with(".json");
  return is_path ? load_hardware(std::filesystem::path(name_or_path)) : hardware_preset(name_or_path);
}

Link link_between(const HardwareProfile& profile, int device_a, int device_b) {
  if (device_a < 0 || device_b < 0) fail("internal: negative device index {} / {}", device_a, device_b);
  const bool same_node = device_a / profile.devices_per_node == device_b / profile.devices_per_node;
  if (same_node) return Link{profile.intra_node_latency_s, profile.intra_node_bandwidth_bytes_per_s, true};
  return Link{profile.inter_node_latency_s, profile.inter_node_bandwidth_bytes_per_s, false};
}

double compute_seconds(double flops, const HardwareProfile& profile) { return flops / profile.achieved_flop_per_s(); }

}  // namespace pipeflow
