#include "pipeflow/model/hardware.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "../support/error_of.h"
#include "../support/temp_dir.h"
#include "pipeflow/core/file.h"

namespace pipeflow {
namespace {

using testing::error_of;

// A complete profile; `extra` is inserted before its keys.
std::string profile_json(const std::string& extra = "", const std::string& devices_key = "devices_per_node",
                         const std::string& peak = "1e12") {
  return "{" + extra + R"("name": "x", "peak_flop_per_s": )" + peak + R"(, "memory_bytes": 1e9,
  "memory_bandwidth_bytes_per_s": 1e11, ")" + devices_key + R"(": 4,
  "intra_node_bandwidth_bytes_per_s": 5e10, "intra_node_latency_s": 2e-6,
  "inter_node_bandwidth_bytes_per_s": 1e10, "inter_node_latency_s": 1e-5})";
}

TEST(Hardware, BuiltinsAreValidAndCarryTheDatasheetFigures) {
  for (const HardwareProfile& profile : hardware_presets()) validate_hardware(profile);
  EXPECT_EQ(hardware_preset("a100-80g").peak_flop_per_s, 312e12);
  EXPECT_EQ(hardware_preset("a100-80g").memory_bytes, 80.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(hardware_preset("a100-40g").memory_bandwidth_bytes_per_s, 1555e9);
  EXPECT_EQ(hardware_preset("h100").peak_flop_per_s, 989e12);
  EXPECT_EQ(hardware_preset("h100").intra_node_bandwidth_bytes_per_s, 450e9);  // NVLink4 900 GB/s both ways
  EXPECT_EQ(hardware_preset("h100").inter_node_bandwidth_bytes_per_s, 50e9);   // NDR 400 Gb/s
  EXPECT_EQ(hardware_preset("h200").memory_bandwidth_bytes_per_s, 4800e9);
  EXPECT_EQ(hardware_preset("ascend-910b").peak_flop_per_s, 24 * 4096 * 2 * 1.8e9);
  EXPECT_EQ(hardware_preset("cpu").peak_flop_per_s, 89e9);
  // fp32 without TF32, the datasheets' figures.
  EXPECT_EQ(hardware_preset("a100-40g").peak_fp32_flop_per_s, 19.5e12);
  EXPECT_EQ(hardware_preset("a100-80g").peak_at(Precision::kFp32), 19.5e12);
  EXPECT_EQ(hardware_preset("a100-80g").peak_at(Precision::kBf16), 312e12);
  EXPECT_EQ(hardware_preset("h100").peak_fp32_flop_per_s, 67e12);
  EXPECT_EQ(hardware_preset("h200").peak_fp32_flop_per_s, 67e12);
  EXPECT_EQ(hardware_preset("cpu").peak_fp32_flop_per_s, 89e9);
  EXPECT_EQ(hardware_preset("h100").at_precision(Precision::kFp32).peak_flop_per_s, 67e12);
  EXPECT_EQ(hardware_preset("a100-80g").efficiency, 0.745);  // fitted: docs/VALIDATION.md
  EXPECT_EQ(hardware_preset("a100-80g").matmul_half_size, 60);
  EXPECT_EQ(hardware_preset("h100").efficiency, 0.66);
}

TEST(Hardware, UnofficialFiguresAreMarked) {
  const HardwareProfile ascend = hardware_preset("ascend-910b");
  for (const char* key : {"peak_flop_per_s", "memory_bandwidth_bytes_per_s", "intra_node_bandwidth_bytes_per_s"}) {
    EXPECT_NE(std::find(ascend.estimated.begin(), ascend.estimated.end(), key), ascend.estimated.end()) << key;
  }
  const HardwareProfile a100 = hardware_preset("a100-80g");
  EXPECT_EQ(std::find(a100.estimated.begin(), a100.estimated.end(), "peak_flop_per_s"), a100.estimated.end());
}

TEST(Hardware, JsonRoundTripsEveryBuiltin) {
  for (const HardwareProfile& profile : hardware_presets()) {
    const std::string json = hardware_to_json(profile);
    const HardwareProfile back = hardware_from_json(json, profile.name + ".json");
    EXPECT_EQ(hardware_to_json(back), json);
    EXPECT_EQ(back.peak_flop_per_s, profile.peak_flop_per_s);
    EXPECT_EQ(back.estimated, profile.estimated);
  }
}

TEST(Hardware, MeasuredLimitsRoundTrip) {
  HardwareProfile profile = hardware_from_json(profile_json(), "x.json");
  profile.peak_fp32_flop_per_s_by_isa = {{"avx512", 1.234567891e11}, {"avx2", 6.1e10}};
  profile.peak_bf16_flop_per_s_by_isa = {{"avx512_bf16", 2.5e11}};
  profile.gemm_flop_per_s_at_shapes = {{.gemm = "qkv", .m = 512, .k = 128, .n = 384, .flop_per_s = 7.25e10},
                                       {.gemm = "fc_proj", .m = 8, .k = 512, .n = 128, .flop_per_s = 1.5e10}};
  validate_hardware(profile);
  const std::string json = hardware_to_json(profile);
  const HardwareProfile back = hardware_from_json(json, "x.json");
  EXPECT_EQ(back.peak_fp32_flop_per_s_by_isa, profile.peak_fp32_flop_per_s_by_isa);
  EXPECT_EQ(back.peak_bf16_flop_per_s_by_isa, profile.peak_bf16_flop_per_s_by_isa);
  EXPECT_EQ(back.gemm_flop_per_s_at_shapes, profile.gemm_flop_per_s_at_shapes);
  EXPECT_EQ(hardware_to_json(back), json);
  EXPECT_EQ(back.best_core_fp32_peak(), 1.234567891e11);
  EXPECT_EQ(back.best_core_fp32_isa(), "avx512");
  // A datasheet profile has none of them, and writes none.
  EXPECT_EQ(hardware_preset("a100-80g").best_core_fp32_peak(), 0);
  EXPECT_EQ(hardware_to_json(hardware_preset("cpu")).find("by_isa"), std::string::npos);
}

TEST(Hardware, MeasuredLimitErrorsNameTheKey) {
  EXPECT_EQ(error_of([] { hardware_from_json(profile_json(R"("peak_fp32_flop_per_s_by_isa": {"avx2": 0}, )"), "h.json"); }),
            "h.json: peak_fp32_flop_per_s_by_isa = {\"avx2\":0}: 'avx2' must be a positive number of FLOP/s");
  EXPECT_EQ(error_of([] { hardware_from_json(profile_json(R"("peak_bf16_flop_per_s_by_isa": 3, )"), "h.json"); }),
            "h.json: peak_bf16_flop_per_s_by_isa = 3: must be an object of ISA name -> FLOP/s, e.g. "
            "{\"avx512\": 1.2e11}");
  const std::string rule =
      ": must be a list of {\"gemm\": NAME, \"m\": M, \"k\": K, \"n\": N, \"flop_per_s\": RATE} with positive "
      "integer m, k, n and a positive rate";
  EXPECT_EQ(error_of([] {
              hardware_from_json(profile_json(R"("gemm_flop_per_s_at_shapes": [{"gemm": "qkv", "m": 0, "k": 1, )"
                                              R"("n": 1, "flop_per_s": 1}], )"),
                                 "h.json");
            }),
            "h.json: gemm_flop_per_s_at_shapes = [{\"flop_per_s\":1,\"gemm\":\"qkv\",\"k\":1,\"m\":0,\"n\":1}]" + rule);
  EXPECT_NE(error_of([] {
              hardware_from_json(profile_json(R"("gemm_flop_per_s_at_shapes": [{"gemm": "qkv", "m": 1, "k": 1, )"
                                              R"("n": 1, "flop_per_s": 1, "extra": 2}], )"),
                                 "h.json");
            }).find(rule),
            std::string::npos);
}

TEST(Hardware, ExampleFilesEqualTheBuiltins) {
  for (const HardwareProfile& profile : hardware_presets()) {
    const std::string path = std::string(PIPEFLOW_SOURCE_DIR) + "/examples/hardware/" + profile.name + ".json";
    EXPECT_EQ(read_file(path), hardware_to_json(profile)) << path;
  }
}

TEST(Hardware, MinimalJsonTakesTheDefaultEfficiency) {
  const HardwareProfile profile = hardware_from_json(profile_json(), "x.json");
  EXPECT_EQ(profile.efficiency, kDefaultEfficiency);
  EXPECT_EQ(profile.devices_per_node, 4);
  EXPECT_EQ(profile.achieved_flop_per_s(), 0.5e12);
  EXPECT_EQ(compute_seconds(1e12, profile), 2.0);
  // Without the curve's keys: flat, and the bandwidths as written.
  EXPECT_EQ(profile.matmul_half_size, 0);
  EXPECT_EQ(profile.memory_efficiency, 1);
  EXPECT_EQ(profile.collective_efficiency, 1);
  EXPECT_EQ(matmul_efficiency(profile, 64, 64, 64), 0.5);
  // Without peak_fp32_flop_per_s: fp32 as fast as bf16, and said to be an estimate.
  EXPECT_EQ(profile.peak_fp32_flop_per_s, profile.peak_flop_per_s);
  EXPECT_EQ(profile.estimated, std::vector<std::string>{"peak_fp32_flop_per_s"});
}

TEST(Hardware, JsonErrorsNameTheKey) {
  EXPECT_EQ(error_of([] { hardware_from_json(profile_json("", "devices_per_nodes"), "h.json"); }),
            "h.json: devices_per_node is required but missing");
  EXPECT_EQ(error_of([] { hardware_from_json(profile_json(R"("colour": "green", )"), "h.json"); }),
            "h.json: unknown key 'colour': remove it or fix its spelling");
  EXPECT_EQ(error_of([] { hardware_from_json(profile_json("", "devices_per_node", "0"), "h.json"); }),
            "h.json: peak_flop_per_s = 0: must be a positive number");
  EXPECT_EQ(error_of([] { hardware_from_json(profile_json(R"("efficiency": 1.5, )"), "h.json"); }),
            "h.json: efficiency = 1.5: must be in (0, 1]: the achieved share of peak FLOP/s");
  EXPECT_EQ(error_of([] { hardware_from_json(profile_json(R"("memory_efficiency": 1.5, )"), "h.json"); }),
            "h.json: memory_efficiency = 1.5: must be in (0, 1]: a share of bandwidth");
  EXPECT_EQ(error_of([] { hardware_from_json(profile_json(R"("matmul_half_size": -1, )"), "h.json"); }),
            "h.json: matmul_half_size = -1: must be >= 0: 0 runs every GEMM at `efficiency`");
  EXPECT_EQ(error_of([] { hardware_from_json(profile_json(R"("estimated": ["speed"], )"), "h.json"); }),
            "h.json: estimated = [\"speed\"]: 'speed' is not a figure of a hardware profile");
}

TEST(Hardware, ResolveTakesANameOrAFile) {
  EXPECT_EQ(resolve_hardware("h200").name, "h200");
  const std::string dir = testing::make_temp_dir();
  write_file_atomic(dir + "/lab.json", profile_json());
  EXPECT_EQ(resolve_hardware(dir + "/lab.json").name, "x");
  EXPECT_EQ(error_of([] { resolve_hardware("tpu"); }),
            "unknown hardware \"tpu\": use one of a100-40g, a100-80g, h100, h200, ascend-910b, cpu or the path of a "
            "hardware JSON file");
}

TEST(Hardware, LinksAreIntraNodeWithinANodeAndInterNodeAcross) {
  const HardwareProfile a100 = hardware_preset("a100-80g");
  const Link same = link_between(a100, 0, 7);
  EXPECT_TRUE(same.intra_node);
  EXPECT_EQ(same.bandwidth_bytes_per_s, 300e9);
  EXPECT_EQ(same.latency_s, 3e-6);
  const Link across = link_between(a100, 7, 8);
  EXPECT_FALSE(across.intra_node);
  EXPECT_EQ(across.bandwidth_bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(across.transfer_seconds(25e6), 8e-6 + 1e-3);
  EXPECT_TRUE(link_between(a100, 9, 15).intra_node);
}

}  // namespace
}  // namespace pipeflow
