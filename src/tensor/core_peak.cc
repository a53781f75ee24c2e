// Compiled for plain x86-64 (CMakeLists.txt overrides -march for this file):
// each kernel gets its ISA from its target attribute alone, so that the AVX2
// kernel cannot pick up AVX-512 encodings from -march=native on the build
// machine, and the dispatcher itself runs on any x86-64 CPU.
#include "pipeflow/tensor/core_peak.h"

#include <immintrin.h>

#include <algorithm>
#include <array>

#include "pipeflow/core/cpu_time.h"

namespace pipeflow {
namespace {

// Chains per kernel: enough independent accumulators to cover the FMA
// latency (4 cycles) on two FMA ports (8 in flight), with room to spare,
// while staying in registers: 16 of AVX-512's 32 zmm, 12 of AVX2's 16 ymm.
constexpr int kAvx512Chains = 16;
constexpr int kAvx2Chains = 12;

// A round of a kernel is asm whose accumulators are register operands
// ("v": any vector register the target allows), so that the instruction
// stream is exactly these FMAs at any optimisation level and under
// sanitizers (left to intrinsics and the unroller, -O1 with ASan kept the
// chains in memory: 29 instead of 179 GFLOP/s). Four chains a statement:
// GCC allows 30 operands, an in-out one counting twice. AT&T order:
// vfmadd213ps k, k, a is a = k·a + k; vdpbf16ps k, k, a is a += k·k over
// each fp32 lane's two bf16 pairs.
#define PIPEFLOW_FOUR_CHAINS(op, k, a, b, c, d)                                                          \
  asm volatile(op " %4, %4, %0\n\t" op " %4, %4, %1\n\t" op " %4, %4, %2\n\t" op " %4, %4, %3"          \
               : "+v"(a), "+v"(b), "+v"(c), "+v"(d)                                                     \
               : "v"(k))
// One round of `op` on the sixteen zmm chains a0..a15 of an AVX-512 kernel.
#define PIPEFLOW_SIXTEEN_CHAINS(op, k)                 \
  do {                                                 \
    PIPEFLOW_FOUR_CHAINS(op, k, a0, a1, a2, a3);       \
    PIPEFLOW_FOUR_CHAINS(op, k, a4, a5, a6, a7);       \
    PIPEFLOW_FOUR_CHAINS(op, k, a8, a9, a10, a11);     \
    PIPEFLOW_FOUR_CHAINS(op, k, a12, a13, a14, a15);   \
  } while (false)

// The sum of every chain's lanes, through memory: the AVX-512 kernels'
// result, off the timed loop.
__attribute__((target("avx512f"))) float sum_chains(const __m512 (&chains)[kAvx512Chains]) {
  __m512 total = chains[0];
  for (int c = 1; c < kAvx512Chains; ++c) total = _mm512_add_ps(total, chains[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  float sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

__attribute__((target("avx512f"))) float run_fp32_avx512(std::int64_t iterations) {
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
         a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
  for (std::int64_t i = 0; i < iterations; ++i) PIPEFLOW_SIXTEEN_CHAINS("vfmadd213ps", one);
  return sum_chains({a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15});
}

__attribute__((target("avx512f,avx512bf16"))) float run_bf16_avx512(std::int64_t iterations) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512bh ones = _mm512_cvtne2ps_pbh(one, one);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
         a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
  for (std::int64_t i = 0; i < iterations; ++i) PIPEFLOW_SIXTEEN_CHAINS("vdpbf16ps", ones);
  return sum_chains({a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15});
}

// Twelve ymm chains: AVX2 has sixteen ymm registers, one holds the constant.
__attribute__((target("avx2,fma"))) float run_fp32_avx2(std::int64_t iterations) {
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
         a10 = a0, a11 = a0;
  for (std::int64_t i = 0; i < iterations; ++i) {
    PIPEFLOW_FOUR_CHAINS("vfmadd213ps", one, a0, a1, a2, a3);
    PIPEFLOW_FOUR_CHAINS("vfmadd213ps", one, a4, a5, a6, a7);
    PIPEFLOW_FOUR_CHAINS("vfmadd213ps", one, a8, a9, a10, a11);
  }
  const __m256 total = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  float sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

#undef PIPEFLOW_SIXTEEN_CHAINS
#undef PIPEFLOW_FOUR_CHAINS

bool has_avx512(const CpuFeatures& cpu) { return cpu.avx512f; }
bool has_avx2(const CpuFeatures& cpu) { return cpu.avx2_fma; }
bool has_avx512_bf16(const CpuFeatures& cpu) { return cpu.avx512f && cpu.avx512_bf16; }

constexpr std::array<PeakKernel, 3> kKernels = {{
    {"fp32_avx512", "fp32", "avx512", kAvx512Chains, 16, 2, has_avx512, run_fp32_avx512},
    {"fp32_avx2", "fp32", "avx2", kAvx2Chains, 8, 2, has_avx2, run_fp32_avx2},
    {"bf16_avx512", "bf16", "avx512_bf16", kAvx512Chains, 16, 4, has_avx512_bf16, run_bf16_avx512},
}};

// About a millisecond per call at 100 GFLOP/s: long enough to dwarf the
// clock's resolution, short enough that a best-of catches a call with no
// interruption.
constexpr double kFlopsPerCall = 1e8;

}  // namespace

CpuFeatures detect_cpu_features() {
  __builtin_cpu_init();
  // libgcc's answers include the OS's support (XGETBV: the ymm and zmm state saved).
  return CpuFeatures{.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
                     .avx512f = __builtin_cpu_supports("avx512f") != 0,
                     .avx512_bf16 = __builtin_cpu_supports("avx512bf16") != 0};
}

std::span<const PeakKernel> peak_kernels() { return kKernels; }

std::vector<const PeakKernel*> runnable_peak_kernels(const CpuFeatures& cpu) {
  std::vector<const PeakKernel*> runnable;
  for (const PeakKernel& kernel : kKernels) {
    if (kernel.supported(cpu)) runnable.push_back(&kernel);
  }
  return runnable;
}

double best_rate(double seconds, const std::function<double()>& work, double (*clock)()) {
  work();  // the first run's one-time costs (see the header)
  double best = 0;
  const double stop = clock() + seconds;
  do {
    const double start = clock();
    const double units = work();
    const double elapsed = clock() - start;
    if (elapsed > 0) best = std::max(best, units / elapsed);
  } while (clock() < stop);
  return best;
}

double best_cpu_rate(double seconds, const std::function<double()>& work) {
  return best_rate(seconds, work, thread_cpu_seconds);
}

std::vector<CorePeak> measure_core_peaks(const CpuFeatures& cpu, double seconds) {
  const std::vector<const PeakKernel*> kernels = runnable_peak_kernels(cpu);
  std::vector<CorePeak> peaks;
  for (const PeakKernel* kernel : kernels) {
    const auto iterations = static_cast<std::int64_t>(kFlopsPerCall / kernel->flops_per_call(1));
    volatile float sink = 0;
    const double rate = best_cpu_rate(seconds / static_cast<double>(kernels.size()), [&] {
      sink = kernel->run(iterations);
      return kernel->flops_per_call(iterations);
    });
    peaks.push_back({kernel->precision, kernel->isa, rate});
  }
  return peaks;
}

const CorePeak* best_fp32_peak_entry(const std::vector<CorePeak>& peaks) {
  const CorePeak* best = nullptr;
  for (const CorePeak& peak : peaks) {
    if (peak.precision == "fp32" && (best == nullptr || peak.flop_per_s > best->flop_per_s)) best = &peak;
  }
  return best;
}

double best_fp32_peak(const std::vector<CorePeak>& peaks) {
  const CorePeak* best = best_fp32_peak_entry(peaks);
  return best == nullptr ? 0 : best->flop_per_s;
}

}  // namespace pipeflow
