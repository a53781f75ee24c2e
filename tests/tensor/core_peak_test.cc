#include "pipeflow/tensor/core_peak.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "pipeflow/core/cpu_time.h"
#include "pipeflow/tensor/gemm.h"

namespace pipeflow {
namespace {

const PeakKernel& kernel_named(const std::string& name) {
  for (const PeakKernel& kernel : peak_kernels()) {
    if (kernel.name == name) return kernel;
  }
  ADD_FAILURE() << "no kernel " << name;
  return peak_kernels().front();
}

std::vector<std::string> names(const std::vector<const PeakKernel*>& kernels) {
  std::vector<std::string> result;
  for (const PeakKernel* kernel : kernels) result.emplace_back(kernel->name);
  return result;
}

TEST(CorePeak, FlopsPerCallInClosedForm) {
  // iterations × chains × lanes × FLOPs per lane: an FMA is 2, vdpbf16ps 4.
  EXPECT_EQ(kernel_named("fp32_avx512").flops_per_call(1000), 1000.0 * 16 * 16 * 2);
  EXPECT_EQ(kernel_named("fp32_avx2").flops_per_call(1000), 1000.0 * 12 * 8 * 2);
  EXPECT_EQ(kernel_named("bf16_avx512").flops_per_call(1000), 1000.0 * 16 * 16 * 4);
}

TEST(CorePeak, EachRunnableKernelIssuesTheFmasItCounts) {
  // The accumulators count the instructions' products (x·1 + 1 per FMA):
  // their sum is FLOPs / 2, exactly, far below float's 2^24 per lane.
  for (const PeakKernel* kernel : runnable_peak_kernels(detect_cpu_features())) {
    for (const std::int64_t iterations : {1, 7, 1000}) {
      EXPECT_EQ(static_cast<double>(kernel->run(iterations)), kernel->flops_per_call(iterations) / 2)
          << kernel->name << ", " << iterations << " iterations";
    }
  }
}

TEST(CorePeak, TheDispatcherPicksOnlyWhatTheCpuHas) {
  EXPECT_EQ(names(runnable_peak_kernels({})), std::vector<std::string>{});
  EXPECT_EQ(names(runnable_peak_kernels({.avx2_fma = true})), std::vector<std::string>{"fp32_avx2"});
  EXPECT_EQ(names(runnable_peak_kernels({.avx2_fma = true, .avx512f = true})),
            (std::vector<std::string>{"fp32_avx512", "fp32_avx2"}));
  EXPECT_EQ(names(runnable_peak_kernels({.avx2_fma = true, .avx512f = true, .avx512_bf16 = true})),
            (std::vector<std::string>{"fp32_avx512", "fp32_avx2", "bf16_avx512"}));
  // avx512_bf16 is an AVX-512 extension: without AVX-512 F it is not run.
  EXPECT_EQ(names(runnable_peak_kernels({.avx2_fma = true, .avx512_bf16 = true})),
            std::vector<std::string>{"fp32_avx2"});
}

TEST(CorePeak, AnAvx2OnlyCpuGetsNoAvx512Entry) {
  const CpuFeatures here = detect_cpu_features();
  if (!here.avx2_fma) {
    GTEST_SKIP() << "this CPU has no AVX2+FMA";
  }
  // This CPU, told it has AVX2 only: the dispatcher measures the AVX2 kernel alone.
  const std::vector<CorePeak> peaks = measure_core_peaks({.avx2_fma = true}, 0.02);
  ASSERT_EQ(peaks.size(), 1u);
  EXPECT_EQ(peaks[0].isa, "avx2");
  EXPECT_EQ(peaks[0].precision, "fp32");
  EXPECT_GT(peaks[0].flop_per_s, 0);
  EXPECT_EQ(measure_core_peaks({}, 0.02).size(), 0u);
  EXPECT_EQ(best_fp32_peak({}), 0);
}

// Busy for `seconds` of this thread's CPU time.
void spin_cpu(double seconds) {
  const double stop = thread_cpu_seconds() + seconds;
  while (thread_cpu_seconds() < stop) {
  }
}

// A work whose first run pays a one-time cost (as a GEMM library's JIT does)
// longer than the whole budget: that run is not the measurement. Counted, it
// was the only run, and the rate read 1 unit per 50 ms where the work does 1
// per millisecond. By CPU time, which the spins are measured in: no timing
// margin to lose on a loaded machine.
TEST(CorePeak, TheBestRateLeavesOutTheFirstRunsOneTimeCost) {
  int runs = 0;
  const double rate = best_cpu_rate(0.01, [&] {
    spin_cpu(++runs == 1 ? 0.05 : 0.001);
    return 1.0;
  });
  EXPECT_GE(runs, 3);  // the untimed one, then at least two
  EXPECT_GT(rate, 200.0) << "units per CPU second";
  EXPECT_LE(rate, 1000.0);
}

// Not a timing assertion on speed: sgemm is made of the same fp32 FMA
// instructions, so no GEMM can beat the best ISA's register-only FMA rate on
// the same core. On an AVX2-only CPU whose library runs AVX2 kernels the two
// come close (the issue's Zen: 106-111 of 112 GFLOP/s), so the bound allows
// 25% for what differs between two timed runs in one process on a shared VM
// (clock and frequency changes, a sibling hyperthread's load, steal time the
// guest counts as CPU time: 20-40% here). It catches a peak kernel that
// measures what it does not run (its FLOPs are checked in closed form above);
// both are best-of measurements by CPU time, the peak taken before and after.
TEST(CorePeak, TheMeasuredPeakIsPositiveAndBoundsTheGemmRate) {
  const CpuFeatures here = detect_cpu_features();
  if (!here.avx2_fma && !here.avx512f) {
    GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  }
  const std::vector<CorePeak> peaks = measure_core_peaks(here, 0.2);
  ASSERT_FALSE(peaks.empty());
  for (const CorePeak& peak : peaks) EXPECT_GT(peak.flop_per_s, 0) << peak.isa;
  if (here.avx512f) {
    EXPECT_EQ(best_fp32_peak_entry(peaks)->isa, "avx512");
  }
  const int m = 512, k = 128, n = 512;  // the fc GEMM of a width-128 model's 8 × 64-token micro-batch
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n, 0.0f);
  const double gemm_rate = best_cpu_rate(0.1, [&] {
    gemm<float>(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    return 2.0 * m * n * k;
  });
  EXPECT_EQ(c[0], 0.5f * 0.25f * k);  // the GEMM ran
  EXPECT_GT(gemm_rate, 0);
  const double peak = std::max(best_fp32_peak(peaks), best_fp32_peak(measure_core_peaks(here, 0.2)));
  EXPECT_LE(gemm_rate, 1.25 * peak) << "sgemm " << gemm_rate / 1e9 << " GFLOP/s, peak " << peak / 1e9;
}

}  // namespace
}  // namespace pipeflow
