#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/model/precision.h"

namespace pipeflow {

// A device and its interconnect, as the cost model sees them. All figures in
// SI base units: FLOP/s, bytes, bytes/s, seconds. A plain value.
//
// JSON form (every key below; `efficiency`, `matmul_half_size`,
// `memory_efficiency`, `collective_efficiency`, `estimated` and `note`
// optional; unknown keys are errors naming their path):
//   {"name": "a100-80g",
//    "peak_flop_per_s": 312e12,                 dense bf16/fp16 tensor peak
//    "peak_fp32_flop_per_s": 19.5e12,           dense fp32 peak (no TF32); absent: taken
//                                               as peak_flop_per_s and listed as estimated
//    "memory_bytes": 85899345920,
//    "memory_bandwidth_bytes_per_s": 2039e9,
//    "devices_per_node": 8,
//    "intra_node_bandwidth_bytes_per_s": 300e9, one direction, device to device
//    "intra_node_latency_s": 3e-6,
//    "inter_node_bandwidth_bytes_per_s": 25e9,  one direction, per device
//    "inter_node_latency_s": 8e-6,
//    "efficiency": 0.745,                       large-GEMM FLOP/s achieved / peak
//    "matmul_half_size": 60,                    GEMM size at half that efficiency (0: flat)
//    "memory_efficiency": 0.85,                 streaming kernels' share of HBM bandwidth
//    "collective_efficiency": 0.77,             all-reduce bus bandwidth / link bandwidth
//    "estimated": ["intra_node_latency_s"],     keys that are not datasheet figures
//    "note": "free text",
//    -- measured by `pipeflow calibrate` only, each optional (absent: not measured):
//    "peak_fp32_flop_per_s_by_isa": {"avx2": 60e9, "avx512": 120e9},
//                                               one core's register-only FMA peak per ISA it has
//    "peak_bf16_flop_per_s_by_isa": {"avx512_bf16": 240e9},  vdpbf16ps, where the CPU has it
//    "gemm_flop_per_s_at_shapes": [{"gemm": "qkv", "m": 512, "k": 128, "n": 384,
//                                   "flop_per_s": 70e9}, ...]}
//                                               the GEMM library's rate at a model's shapes
// The measured keys are informative: the cost model prices with peak_*,
// efficiency and the curve, not with them. Their shares (a GEMM's rate over
// the best fp32 peak) are what `calibrate` prints and bench/ reports.
//
// The compute model (docs/VALIDATION.md has every constant's source and the
// published runs it reproduces):
//   matmul       a GEMM of m×k by k×n runs at peak × efficiency × x/(x + x½),
//                with x = 1/(1/m + 1/n + 1/k) — proportional to the GEMM's
//                arithmetic intensity (FLOPs per byte moved = 2x/e) — and
//                x½ = matmul_half_size. Large square GEMMs approach
//                `efficiency`; thin ones (the attention core's, k = head
//                width) fall well below it. matmul_half_size = 0 makes the
//                curve flat (every GEMM at `efficiency`), what `calibrate`
//                writes: its efficiency is a measured step's.
//   memory-bound bytes / (memory bandwidth × memory_efficiency).
//   collectives  ring all-reduce at link bandwidth × collective_efficiency
//                (NCCL's bus bandwidth); point-to-point at link bandwidth.
// A file without these keys: efficiency kDefaultEfficiency, a flat curve,
// memory_efficiency and collective_efficiency 1.
// One GEMM C[m, n] = A[m, k] · B[k, n] (fp32, row-major, the forward's layout)
// of a model, at the rate the GEMM library ran it here.
struct GemmRate {
  std::string gemm;  // "qkv", "proj", "fc", "fc_proj"
  int m = 0;         // rows: micro-batch × sequence, or a decode group
  int k = 0;
  int n = 0;
  double flop_per_s = 0;  // 2·m·k·n per second

  bool operator==(const GemmRate&) const = default;
};

struct HardwareProfile {
  std::string name;
  double peak_flop_per_s = 0;       // bf16/fp16
  double peak_fp32_flop_per_s = 0;  // fp32
  double memory_bytes = 0;
  double memory_bandwidth_bytes_per_s = 0;
  int devices_per_node = 1;
  double intra_node_bandwidth_bytes_per_s = 0;
  double intra_node_latency_s = 0;
  double inter_node_bandwidth_bytes_per_s = 0;
  double inter_node_latency_s = 0;
  double efficiency = 0.5;
  double matmul_half_size = 0;
  double memory_efficiency = 1;
  double collective_efficiency = 1;
  std::vector<std::string> estimated;  // JSON keys whose values are estimates, not datasheet figures
  std::string note;
  // Measured limits (calibrate): ISA name -> FLOP/s, and GEMMs at a model's shapes.
  std::map<std::string, double> peak_fp32_flop_per_s_by_isa = {};
  std::map<std::string, double> peak_bf16_flop_per_s_by_isa = {};
  std::vector<GemmRate> gemm_flop_per_s_at_shapes = {};

  // The highest of peak_fp32_flop_per_s_by_isa (0 if not measured), and its ISA.
  double best_core_fp32_peak() const;
  std::string best_core_fp32_isa() const;

  // FLOP/s a layer sustains while computing: peak × efficiency.
  double achieved_flop_per_s() const { return peak_flop_per_s * efficiency; }
  // The peak of GEMMs in `precision`.
  double peak_at(Precision precision) const {
    return precision == Precision::kFp32 ? peak_fp32_flop_per_s : peak_flop_per_s;
  }
  // The profile as the cost model prices a run in `precision`: its GEMMs at
  // that precision's peak (peak_flop_per_s replaced).
  HardwareProfile at_precision(Precision precision) const {
    HardwareProfile priced = *this;
    priced.peak_flop_per_s = peak_at(precision);
    return priced;
  }
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

// Seconds to run `flops` model FLOPs at the achieved rate (peak ×
// efficiency, the curve's plateau): the partitioner's balance of stages.
double compute_seconds(double flops, const HardwareProfile& profile);

// The share of peak a GEMM of m×k by k×n sustains: efficiency × x/(x + x½)
// (the curve above).
double matmul_efficiency(const HardwareProfile& profile, double m, double n, double k);
// Seconds for `count` independent GEMMs of that shape (a batched GEMM).
double matmul_seconds(const HardwareProfile& profile, double m, double n, double k, double count = 1);
// Seconds for a memory-bound kernel that moves `bytes` through HBM.
double memory_seconds(const HardwareProfile& profile, double bytes);

}  // namespace pipeflow
