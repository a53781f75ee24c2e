#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "pipeflow/model/hardware.h"
#include "pipeflow/tensor/core_peak.h"
#include "pipeflow/tensor/gemm.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

TEST(CalibrateCommand, WritesAProfileTheSimulatorLoadsWithPositiveFigures) {
  const std::string dir = make_temp_dir();
  const CommandResult result = run_pipeflow("calibrate --seconds 0.05 --name here -o " + dir + "/here.json");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("sgemm 512³, one thread:"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("memory, triad:"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("wrote " + dir + "/here.json"), std::string::npos) << result.err;
  const HardwareProfile profile = load_hardware(dir + "/here.json");
  EXPECT_EQ(profile.name, "here");
  EXPECT_GT(profile.peak_flop_per_s, 1e9);
  // A bf16 run's GEMM rate is the bf16 matmul's where this CPU has bf16
  // instructions, else sgemm's (the fp32 rate, to the bit).
  if (resolve(Bf16Gemm::kAuto) == GemmPrecision::kBf16) {
    EXPECT_NE(result.err.find("FLOP/s (bf16 matmul) = "), std::string::npos) << result.err;
  } else {
    EXPECT_NE(result.err.find("FLOP/s (sgemm) = "), std::string::npos) << result.err;
    EXPECT_EQ(profile.peak_flop_per_s, profile.peak_fp32_flop_per_s);
  }
  EXPECT_GT(profile.memory_bytes, 0);
  EXPECT_GT(profile.memory_bandwidth_bytes_per_s, 0);
  EXPECT_GT(profile.intra_node_latency_s, 0);
  EXPECT_LT(profile.intra_node_latency_s, 1e-2);
  EXPECT_GT(profile.efficiency, 0);
  EXPECT_LE(profile.efficiency, 1);
  EXPECT_EQ(profile.devices_per_node, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(profile.estimated, (std::vector<std::string>{"inter_node_bandwidth_bytes_per_s", "inter_node_latency_s"}));
  // The limits: a peak per ISA this CPU has (each printed as a share), and the
  // four GEMMs of a width-128 block at 512 and 8 rows.
  const CpuFeatures cpu = detect_cpu_features();
  EXPECT_EQ(profile.peak_fp32_flop_per_s_by_isa.contains("avx512"), cpu.avx512f);
  EXPECT_EQ(profile.peak_fp32_flop_per_s_by_isa.contains("avx2"), cpu.avx2_fma);
  EXPECT_EQ(profile.peak_bf16_flop_per_s_by_isa.contains("avx512_bf16"), cpu.avx512f && cpu.avx512_bf16);
  if (cpu.avx512f) {
    EXPECT_NE(result.err.find("core peak, fp32 avx512:"), std::string::npos) << result.err;
  }
  ASSERT_EQ(profile.gemm_flop_per_s_at_shapes.size(), 8u);
  EXPECT_EQ(profile.gemm_flop_per_s_at_shapes[2],
            (GemmRate{.gemm = "fc", .m = 512, .k = 128, .n = 512,
                      .flop_per_s = profile.gemm_flop_per_s_at_shapes[2].flop_per_s}));
  EXPECT_EQ(profile.gemm_flop_per_s_at_shapes[7].gemm, "fc_proj");
  EXPECT_EQ(profile.gemm_flop_per_s_at_shapes[7].m, 8);
  EXPECT_EQ(profile.gemm_flop_per_s_at_shapes[7].k, 512);
  EXPECT_NE(result.err.find("  sgemm fc m512 k128 n512:  "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find(" of the " + profile.best_core_fp32_isa() + " fp32 peak"), std::string::npos)
      << result.err;
  const CommandResult simulated = run_pipeflow("simulate --model gpt-tiny --hardware " + dir +
                                               "/here.json --pp 2 --global-batch 16 --micro-batch 2 --json");
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  EXPECT_NE(simulated.out.find("\"hardware\": \"here\""), std::string::npos) << simulated.out;
}

TEST(CalibrateCommand, WithoutAFileItPrintsTheProfile) {
  const CommandResult result = run_pipeflow("calibrate --seconds 0.02");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(hardware_from_json(result.out, "stdout").name, "calibrated");
}

}  // namespace
}  // namespace pipeflow::testing
