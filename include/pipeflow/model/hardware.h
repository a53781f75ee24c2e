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
//    "efficiency": 0.5,                         matmul FLOP/s achieved / peak
//    "estimated": ["intra_node_latency_s"],     keys that are not datasheet figures
//    "note": "free text"}
//
// efficiency: the share of peak the layers' matrix multiplications sustain
// while a stage computes (kernel efficiency). It is not the end-to-end MFU:
// the simulator adds the pipeline bubble, communication and the optimizer on
// top, so MFU comes out lower. The GPU figures are fitted, not measured:
// a100 0.65 reproduces Megatron-LM's 1T run (Narayanan et al. 2021: 163
// TFLOP/s per GPU, 52% of peak) and Korthikanti et al. 2022's 530B run (54.2%
// MFU) within a few percent once the simulated bubble and communication are
// added, and the narrower models of Narayanan's Table 1 11-20% optimistic
// (one factor cannot follow GEMM efficiency growing with the width;
// docs/SIMULATOR.md); h100/h200 0.5 and ascend-910b 0.4 scale that by
// the lower end-to-end MFU published for them (Llama 3 405B on H100: 38-43%,
// Dubey et al. 2024). kDefaultEfficiency = 0.5 fills a profile without one.
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

  // FLOP/s a layer sustains while computing: peak × efficiency.
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
  double latency_s = 0;  // in the order of sim::LinkCost's fields
  double bandwidth_bytes_per_s = 0;
  bool intra_node = true;
  // latency + bytes / bandwidth.
  double transfer_seconds(double bytes) const { return latency_s + bytes / bandwidth_bytes_per_s; }
};

Link link_between(const HardwareProfile& profile, int device_a, int device_b);

// Seconds to run `flops` model FLOPs at the achieved rate.
double compute_seconds(double flops, const HardwareProfile& profile);

}  // namespace pipeflow
