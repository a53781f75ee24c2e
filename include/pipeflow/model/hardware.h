#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace pipeflow {

// A device and its interconnect, as the cost model sees them. All figures in
// SI base units: FLOP/s, bytes, bytes/s, seconds. A plain value.
//
// JSON form (every key below; `efficiency`, `estimated` and `note` optional;
// unknown keys are errors naming their path):
//   {"name": "a100-80g",
//    "peak_flop_per_s": 312e12,                 dense bf16/fp16 tensor peak
//    "memory_bytes": 85899345920,
//    "memory_bandwidth_bytes_per_s": 2039e9,
//    "devices_per_node": 8,
//    "intra_node_bandwidth_bytes_per_s": 300e9, one direction, device to device
//    "intra_node_latency_s": 3e-6,
//    "inter_node_bandwidth_bytes_per_s": 25e9,  one direction, per device
//    "inter_node_latency_s": 8e-6,
//    "efficiency": 0.5,                         achieved / peak FLOP/s
//    "estimated": ["intra_node_latency_s"],     keys that are not datasheet figures
//    "note": "free text"}
//
// efficiency: the share of peak a large training run sustains on matmul
// work, i.e. MFU. kDefaultEfficiency = 0.5 sits in the published range:
// Narayanan et al. 2021 (Megatron-LM, A100) 44-52% of peak for 175B-1T
// models; Korthikanti et al. 2022 (A100, selective recompute) ≈ 54-56% MFU;
// Chowdhery et al. 2022 (PaLM, TPU v4) 46.2% MFU; Dubey et al. 2024 (Llama 3
// 405B, H100) 38-43% MFU — hence 0.4 for the H100/H200 built-ins.
struct HardwareProfile {
  std::string name;
  double peak_flop_per_s = 0;
  double memory_bytes = 0;
  double memory_bandwidth_bytes_per_s = 0;
  int devices_per_node = 1;
  double intra_node_bandwidth_bytes_per_s = 0;
  double intra_node_latency_s = 0;
  double inter_node_bandwidth_bytes_per_s = 0;
  double inter_node_latency_s = 0;
  double efficiency = 0.5;
  std::vector<std::string> estimated;  // JSON keys whose values are estimates, not datasheet figures
  std::string note;

  // FLOP/s sustained on model FLOPs: peak × efficiency.
  double achieved_flop_per_s() const { return peak_flop_per_s * efficiency; }
};

inline constexpr double kDefaultEfficiency = 0.5;

// Throws Error naming the field when a figure is not positive (or
// efficiency not in (0, 1]).
void validate_hardware(const HardwareProfile& profile);

// Built-ins: a100-40g, a100-80g, h100, h200, ascend-910b, cpu. Compiled in,
// so the binary needs no data files; examples/hardware/ holds the same
// profiles as JSON to copy and edit.
const std::vector<HardwareProfile>& hardware_presets();
HardwareProfile hardware_preset(std::string_view name);

HardwareProfile hardware_from_json(std::string_view json_text, std::string source);
HardwareProfile load_hardware(const std::filesystem::path& path);
// Pretty JSON (2-space indent) with the keys above, in that order.
std::string hardware_to_json(const HardwareProfile& profile);

// A built-in name, or a path to a JSON file (contains '/' or ends in ".json").
HardwareProfile resolve_hardware(std::string_view name_or_path);

// The link between two devices numbered 0.. in node-major order (device d
// sits on node d / devices_per_node): intra-node if they share a node,
// inter-node otherwise.
struct Link {
  double bandwidth_bytes_per_s = 0;
  double latency_s = 0;
  bool intra_node = true;
  // latency + bytes / bandwidth.
  double transfer_seconds(double bytes) const { return latency_s + bytes / bandwidth_bytes_per_s; }
};

Link link_between(const HardwareProfile& profile, int device_a, int device_b);

// Seconds to run `flops` model FLOPs at the achieved rate.
double compute_seconds(double flops, const HardwareProfile& profile);

}  // namespace pipeflow
