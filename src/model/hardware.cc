#include "pipeflow/model/hardware.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>

#include "pipeflow/core/config.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

constexpr double kGB = 1e9;                          // bandwidths are quoted in decimal GB/s
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;  // "80GB" HBM is 80 GiB (81920 MiB reported)

// NVLink figures are per GPU, both directions together (A100 600 GB/s, H100
// 900 GB/s): one direction is half. An InfiniBand HCA per GPU: HDR 200 Gb/s
// = 25 GB/s, NDR 400 Gb/s = 50 GB/s per direction. Latencies are not on any
// datasheet: 3 µs within a node and 8 µs across nodes are typical NCCL
// point-to-point small-message figures, marked as estimates.
// The compute curve of a GPU preset (hardware.h; sources in docs/VALIDATION.md).
struct ComputeCurve {
  double efficiency = kDefaultEfficiency;
  double matmul_half_size = 0;
  double memory_efficiency = 1;
  double collective_efficiency = 1;
};

HardwareProfile eight_device_node(std::string name, double tflops, double fp32_tflops, double memory_gib,
                                  double hbm_gb_per_s, double nvlink_total, double ib_gbit, ComputeCurve curve,
                                  std::string note) {
  return HardwareProfile{.name = std::move(name),
                         .peak_flop_per_s = tflops * 1e12,
                         .peak_fp32_flop_per_s = fp32_tflops * 1e12,
                         .memory_bytes = memory_gib * kGiB,
                         .memory_bandwidth_bytes_per_s = hbm_gb_per_s * kGB,
                         .devices_per_node = 8,
                         .intra_node_bandwidth_bytes_per_s = nvlink_total / 2 * kGB,
                         .intra_node_latency_s = 3e-6,
                         .inter_node_bandwidth_bytes_per_s = ib_gbit / 8 * kGB,
                         .inter_node_latency_s = 8e-6,
                         .efficiency = curve.efficiency,
                         .matmul_half_size = curve.matmul_half_size,
                         .memory_efficiency = curve.memory_efficiency,
                         .collective_efficiency = curve.collective_efficiency,
                         .estimated = {"intra_node_latency_s", "inter_node_latency_s", "efficiency",
                                       "matmul_half_size", "memory_efficiency", "collective_efficiency"},
                         .note = std::move(note)};
}

// A100: efficiency and matmul_half_size fitted on two published runs, the
// narrowest and the widest (Narayanan et al. 2021 Table 1's 1.7B, 137 TFLOP/s;
// Korthikanti et al. 2022 Table 5's 1T with full recomputation, 94.42 s);
// the 16 other rows of both tables held out (docs/VALIDATION.md);
// memory_efficiency 0.85: streaming kernels (BabelStream-class copy/triad)
// reach about 85% of the HBM datasheet figure; collective_efficiency 0.77:
// nccl-tests all_reduce_perf on DGX A100 reaches about 230 GB/s bus bandwidth
// of NVLink3's 300 GB/s per direction. H100/H200 and Ascend: no run to fit:
// the A100's fitted plateau scaled by the ratio of large bf16 GEMM
// benchmarks' share of peak (about 0.75 on H100 SXM against 0.85 on A100:
// 0.745 × 0.75 / 0.85 = 0.66; the 910B assumed 0.5), the A100's half size,
// streaming and bus efficiencies carried over. All estimates.
constexpr ComputeCurve kA100Curve{.efficiency = 0.745, .matmul_half_size = 60, .memory_efficiency = 0.85,
                                  .collective_efficiency = 0.77};
constexpr ComputeCurve kH100Curve{.efficiency = 0.66, .matmul_half_size = 60, .memory_efficiency = 0.85,
                                  .collective_efficiency = 0.77};
constexpr ComputeCurve kAscendCurve{.efficiency = 0.5, .matmul_half_size = 60, .memory_efficiency = 0.85,
                                    .collective_efficiency = 0.77};

std::vector<HardwareProfile> make_presets() {
  std::vector<HardwareProfile> presets = {
      eight_device_node("a100-40g", 312, 19.5, 40, 1555, 600, 200, kA100Curve,
             "A100 SXM 40GB datasheet; NVLink3, one HDR InfiniBand HCA per GPU (DGX A100)"),
      eight_device_node("a100-80g", 312, 19.5, 80, 2039, 600, 200, kA100Curve,
             "A100 SXM 80GB datasheet; NVLink3, one HDR InfiniBand HCA per GPU (DGX A100)"),
      eight_device_node("h100", 989, 67, 80, 3350, 900, 400, kH100Curve,
             "H100 SXM datasheet (dense bf16); NVLink4, one NDR InfiniBand HCA per GPU (DGX H100)"),
      eight_device_node("h200", 989, 67, 141, 4800, 900, 400, kH100Curve,
             "H200 SXM datasheet (dense bf16); NVLink4, one NDR InfiniBand HCA per GPU"),
  };
  // Ascend 910B (B2): no official dense figures. Peak = 24 AI cores × 4096
  // fp16 MAC × 2 × 1.8 GHz; HBM and HCCS as reported by third parties; HCCS
  // total 392 GB/s halved for one direction like NVLink. No fp32 figure is
  // published: a quarter of the fp16 peak is assumed.
  const double ascend_tflops = 24 * 4096 * 2 * 1.8e9 / 1e12;
  HardwareProfile ascend =
      eight_device_node("ascend-910b", ascend_tflops, ascend_tflops / 4, 64, 1600, 392, 200, kAscendCurve,
                        "Ascend 910B (B2): unofficial figures; 8 × 200 Gb/s RoCE per node");
  ascend.estimated = {"peak_flop_per_s",      "peak_fp32_flop_per_s", "memory_bandwidth_bytes_per_s",
                      "intra_node_bandwidth_bytes_per_s",
                      "intra_node_latency_s", "inter_node_latency_s",         "efficiency",
                      "matmul_half_size",     "memory_efficiency",            "collective_efficiency"};
  presets.push_back(ascend);
  // The development machine as measured (shared/REFERENCE.md): one device is
  // one core running OpenBLAS sgemm (fp32) at 85-93 GFLOP/s; OpenMPI
  // shared-memory P2P 4-10 GB/s, 0.3-2.5 µs. One node: the inter-node figures
  // repeat the intra-node ones. `pipeflow calibrate` measures a fresh profile.
  // pipeflow's runtime computes in fp32 only, so bf16 is priced at that rate too.
  presets.push_back(HardwareProfile{
      .name = "cpu",
      .peak_flop_per_s = 89e9,
      .peak_fp32_flop_per_s = 89e9,
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

// The positive real figures, in JSON order; devices_per_node follows the first four.
struct Figure {
  const char* key;
  double HardwareProfile::*field;
};
constexpr std::array<Figure, 8> kFigures = {{
    {"peak_flop_per_s", &HardwareProfile::peak_flop_per_s},
    {"peak_fp32_flop_per_s", &HardwareProfile::peak_fp32_flop_per_s},
    {"memory_bytes", &HardwareProfile::memory_bytes},
    {"memory_bandwidth_bytes_per_s", &HardwareProfile::memory_bandwidth_bytes_per_s},
    {"intra_node_bandwidth_bytes_per_s", &HardwareProfile::intra_node_bandwidth_bytes_per_s},
    {"intra_node_latency_s", &HardwareProfile::intra_node_latency_s},
    {"inter_node_bandwidth_bytes_per_s", &HardwareProfile::inter_node_bandwidth_bytes_per_s},
    {"inter_node_latency_s", &HardwareProfile::inter_node_latency_s},
}};

// The compute curve's keys, optional in JSON, in JSON order after `efficiency`.
struct CurveKey {
  const char* key;
  double HardwareProfile::*field;
  double json_default;
};
constexpr std::array<CurveKey, 3> kCurveKeys = {{
    {"matmul_half_size", &HardwareProfile::matmul_half_size, 0},
    {"memory_efficiency", &HardwareProfile::memory_efficiency, 1},
    {"collective_efficiency", &HardwareProfile::collective_efficiency, 1},
}};

bool is_figure_key(std::string_view key) {
  if (key == "devices_per_node" || key == "efficiency") return true;
  if (std::any_of(kCurveKeys.begin(), kCurveKeys.end(), [&](const CurveKey& c) { return key == c.key; })) return true;
  return std::any_of(kFigures.begin(), kFigures.end(), [&](const Figure& f) { return key == f.key; });
}

// The measured limits' keys (hardware.h), each optional.
constexpr const char* kFp32ByIsaKey = "peak_fp32_flop_per_s_by_isa";
constexpr const char* kBf16ByIsaKey = "peak_bf16_flop_per_s_by_isa";
constexpr const char* kGemmShapesKey = "gemm_flop_per_s_at_shapes";

bool positive_finite(double value) { return value > 0 && std::isfinite(value); }

std::map<std::string, double> read_peaks_by_isa(const Config& config, const char* key) {
  std::map<std::string, double> peaks;
  const nlohmann::json& json = config.raw(key);
  if (json.is_null()) return peaks;
  if (!json.is_object()) config.fail_value(key, "must be an object of ISA name -> FLOP/s, e.g. {\"avx512\": 1.2e11}");
  for (const auto& item : json.items()) {
    if (!item.value().is_number() || !positive_finite(item.value().get<double>())) {
      config.fail_value(key, fmt::format("'{}' must be a positive number of FLOP/s", item.key()));
    }
    peaks[item.key()] = item.value().get<double>();
  }
  return peaks;
}

std::vector<GemmRate> read_gemm_rates(const Config& config) {
  std::vector<GemmRate> rates;
  const nlohmann::json& json = config.raw(kGemmShapesKey);
  if (json.is_null()) return rates;
  constexpr const char* kRule =
      "must be a list of {\"gemm\": NAME, \"m\": M, \"k\": K, \"n\": N, \"flop_per_s\": RATE} with positive "
      "integer m, k, n and a positive rate";
  if (!json.is_array()) config.fail_value(kGemmShapesKey, kRule);
  for (const nlohmann::json& entry : json) {
    const auto positive_int = [&](const char* name) {
      const auto found = entry.find(name);
      return found != entry.end() && found->is_number_integer() && found->get<std::int64_t>() > 0 &&
             found->get<std::int64_t>() <= std::numeric_limits<int>::max();
    };
    const bool valid = entry.is_object() && entry.size() == 5 && entry.contains("gemm") &&
                       entry["gemm"].is_string() && positive_int("m") && positive_int("k") && positive_int("n") &&
                       entry.contains("flop_per_s") && entry["flop_per_s"].is_number() &&
                       positive_finite(entry["flop_per_s"].get<double>());
    if (!valid) config.fail_value(kGemmShapesKey, kRule);
    rates.push_back({.gemm = entry["gemm"].get<std::string>(),
                     .m = entry["m"].get<int>(),
                     .k = entry["k"].get<int>(),
                     .n = entry["n"].get<int>(),
                     .flop_per_s = entry["flop_per_s"].get<double>()});
  }
  return rates;
}

void write_measured_limits(const HardwareProfile& profile, nlohmann::ordered_json& json) {
  if (!profile.peak_fp32_flop_per_s_by_isa.empty()) json[kFp32ByIsaKey] = profile.peak_fp32_flop_per_s_by_isa;
  if (!profile.peak_bf16_flop_per_s_by_isa.empty()) json[kBf16ByIsaKey] = profile.peak_bf16_flop_per_s_by_isa;
  if (profile.gemm_flop_per_s_at_shapes.empty()) return;
  nlohmann::ordered_json rates = nlohmann::ordered_json::array();
  for (const GemmRate& rate : profile.gemm_flop_per_s_at_shapes) {
    rates.push_back({{"gemm", rate.gemm}, {"m", rate.m}, {"k", rate.k}, {"n", rate.n}, {"flop_per_s", rate.flop_per_s}});
  }
  json[kGemmShapesKey] = rates;
}

}  // namespace

double HardwareProfile::best_core_fp32_peak() const {
  double best = 0;
  for (const auto& [isa, rate] : peak_fp32_flop_per_s_by_isa) best = std::max(best, rate);
  return best;
}

std::string HardwareProfile::best_core_fp32_isa() const {
  for (const auto& [isa, rate] : peak_fp32_flop_per_s_by_isa) {
    if (rate == best_core_fp32_peak()) return isa;
  }
  return "";
}

void validate_hardware(const HardwareProfile& profile) {
  for (const Figure& figure : kFigures) require_positive(profile, figure.key, profile.*figure.field);
  if (profile.devices_per_node < 1) {
    fail("hardware {}: devices_per_node = {}: must be >= 1", profile.name, profile.devices_per_node);
  }
  if (!(profile.efficiency > 0 && profile.efficiency <= 1)) {
    fail("hardware {}: efficiency = {}: must be in (0, 1] (the achieved share of peak, e.g. {})", profile.name,
         profile.efficiency, kDefaultEfficiency);
  }
  if (!(profile.matmul_half_size >= 0) || !std::isfinite(profile.matmul_half_size)) {
    fail("hardware {}: matmul_half_size = {}: must be >= 0 (0: every GEMM at `efficiency`)", profile.name,
         profile.matmul_half_size);
  }
  for (const auto& [key, value] : {std::pair{"memory_efficiency", profile.memory_efficiency},
                                   std::pair{"collective_efficiency", profile.collective_efficiency}}) {
    if (!(value > 0 && value <= 1)) fail("hardware {}: {} = {}: must be in (0, 1]", profile.name, key, value);
  }
  for (const auto* peaks : {&profile.peak_fp32_flop_per_s_by_isa, &profile.peak_bf16_flop_per_s_by_isa}) {
    for (const auto& [isa, rate] : *peaks) require_positive(profile, "peak FLOP/s of " + isa, rate);
  }
  for (const GemmRate& rate : profile.gemm_flop_per_s_at_shapes) {
    if (rate.m < 1 || rate.k < 1 || rate.n < 1) {
      fail("hardware {}: GEMM {} of {}x{}x{}: every size must be >= 1", profile.name, rate.gemm, rate.m, rate.k,
           rate.n);
    }
    require_positive(profile, "flop_per_s of GEMM " + rate.gemm, rate.flop_per_s);
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
  fail("unknown hardware {}: use one of {} or the path of a hardware JSON file", quoted_excerpt(name),
       preset_names());
}

HardwareProfile hardware_from_json(std::string_view json_text, std::string source) {
  const Config config = Config::parse(json_text, source);
  HardwareProfile profile;
  profile.name = config.get("name", std::filesystem::path(source).stem().string());
  for (const Figure& figure : kFigures) {
    if (figure.field == &HardwareProfile::peak_fp32_flop_per_s && !config.has(figure.key)) continue;
    profile.*figure.field = config.require<double>(figure.key);
    if (!(profile.*figure.field > 0)) config.fail_value(figure.key, "must be a positive number");
  }
  profile.devices_per_node = config.require<int>("devices_per_node");
  if (profile.devices_per_node < 1) config.fail_value("devices_per_node", "must be >= 1");
  profile.efficiency = config.get("efficiency", kDefaultEfficiency);
  if (!(profile.efficiency > 0 && profile.efficiency <= 1)) {
    config.fail_value("efficiency", "must be in (0, 1]: the achieved share of peak FLOP/s");
  }
  for (const CurveKey& curve : kCurveKeys) {
    profile.*curve.field = config.get(curve.key, curve.json_default);
    const double value = profile.*curve.field;
    const bool is_size = curve.field == &HardwareProfile::matmul_half_size;
    if (is_size && !(value >= 0)) config.fail_value(curve.key, "must be >= 0: 0 runs every GEMM at `efficiency`");
    if (!is_size && !(value > 0 && value <= 1)) config.fail_value(curve.key, "must be in (0, 1]: a share of bandwidth");
  }
  profile.estimated = config.get("estimated", std::vector<std::string>{});
  for (const std::string& key : profile.estimated) {
    if (!is_figure_key(key)) {
      config.fail_value("estimated", fmt::format("'{}' is not a figure of a hardware profile", key));
    }
  }
  profile.note = config.get("note", "");
  profile.peak_fp32_flop_per_s_by_isa = read_peaks_by_isa(config, kFp32ByIsaKey);
  profile.peak_bf16_flop_per_s_by_isa = read_peaks_by_isa(config, kBf16ByIsaKey);
  profile.gemm_flop_per_s_at_shapes = read_gemm_rates(config);
  config.check_no_unknown_keys();
  if (profile.peak_fp32_flop_per_s == 0) {  // a profile from before the key: fp32 as fast as bf16, said so
    profile.peak_fp32_flop_per_s = profile.peak_flop_per_s;
    profile.estimated.emplace_back("peak_fp32_flop_per_s");
  }
  return profile;
}

HardwareProfile load_hardware(const std::filesystem::path& path) {
  return hardware_from_json(read_file(path, kMaxConfigFileBytes, "hardware profile"), path.string());
}

std::string hardware_to_json(const HardwareProfile& profile) {
  nlohmann::ordered_json json;
  json["name"] = profile.name;
  for (std::size_t i = 0; i < kFigures.size(); ++i) {
    if (i == 4) json["devices_per_node"] = profile.devices_per_node;
    json[kFigures[i].key] = profile.*kFigures[i].field;
  }
  json["efficiency"] = profile.efficiency;
  for (const CurveKey& curve : kCurveKeys) json[curve.key] = profile.*curve.field;
  json["estimated"] = profile.estimated;
  json["note"] = profile.note;
  write_measured_limits(profile, json);
  return json_text(json, 2) + "\n";
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

double matmul_efficiency(const HardwareProfile& profile, double m, double n, double k) {
  if (profile.matmul_half_size <= 0) return profile.efficiency;
  const double size = 1 / (1 / m + 1 / n + 1 / k);
  return profile.efficiency * size / (size + profile.matmul_half_size);
}

double matmul_seconds(const HardwareProfile& profile, double m, double n, double k, double count) {
  return count * 2 * m * n * k / (profile.peak_flop_per_s * matmul_efficiency(profile, m, n, k));
}

double memory_seconds(const HardwareProfile& profile, double bytes) {
  return bytes / (profile.memory_bandwidth_bytes_per_s * profile.memory_efficiency);
}

}  // namespace pipeflow
