#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace pipeflow {

// The core's arithmetic peak per instruction set, measured: a register-only
// kernel per ISA (many independent FMA accumulator chains, no loads or
// stores), so that nothing but the FMA units' throughput limits it. Every
// kernel is compiled for its own ISA with a target attribute and is called
// only where the CPU (and the OS's saved register state) supports that ISA,
// as __builtin_cpu_supports says at run time: the build machine's CPU
// decides nothing, and the code runs on an AVX2-only CPU.
//
// Thread safety: every function may be called from any thread; the kernels
// touch no shared state.

// The instruction-set features the kernels need, as the CPU reports them.
// A plain value, so that a test can pass a CPU it does not run on.
struct CpuFeatures {
  bool avx2_fma = false;     // AVX2 and FMA3 (the fp32 AVX2 kernel)
  bool avx512f = false;      // AVX-512 F (the fp32 AVX-512 kernel)
  bool avx512_bf16 = false;  // AVX-512 BF16 (vdpbf16ps)
};

// This CPU's features (__builtin_cpu_supports).
CpuFeatures detect_cpu_features();

// One register-only kernel. A call runs `iterations` rounds; each round
// issues one instruction per accumulator chain, and each instruction does
// `flops_per_lane` FLOPs in each of `lanes` lanes (an FMA: 2; vdpbf16ps: two
// bf16 products summed into the fp32 lane, 4). So a call does, in closed form,
//   FLOPs = iterations × chains × lanes × flops_per_lane.
// The kernel returns the sum of its accumulators, which start at 0 and gain
// `flops_per_lane / 2` per instruction (x·1 + 1, or 1·1 + 1·1): the count of
// FMAs it really issued, FLOPs / 2 (exact while a lane's count stays below
// 2^24, float's integer range).
struct PeakKernel {
  const char* name;       // "fp32_avx512", "fp32_avx2", "bf16_avx512"
  const char* precision;  // "fp32" or "bf16"
  const char* isa;        // "avx512", "avx2", "avx512_bf16": the profile's key
  int chains;
  int lanes;
  int flops_per_lane;
  bool (*supported)(const CpuFeatures& cpu);
  float (*run)(std::int64_t iterations);

  double flops_per_call(std::int64_t iterations) const {
    return static_cast<double>(iterations) * chains * lanes * flops_per_lane;
  }
};

// Every kernel compiled in, best ISA first within each precision.
std::span<const PeakKernel> peak_kernels();
// The kernels `cpu` can run, in peak_kernels()'s order: the dispatcher's
// choice, and the only kernels measure_core_peaks calls.
std::vector<const PeakKernel*> runnable_peak_kernels(const CpuFeatures& cpu);

struct CorePeak {
  std::string precision;  // "fp32" or "bf16"
  std::string isa;        // "avx512", "avx2", "avx512_bf16"
  double flop_per_s = 0;
};

// Each of runnable_peak_kernels(cpu)'s kernels: the best rate of repeated
// calls (about a millisecond each) over `seconds` in all, by the calling
// thread's CPU time (best_cpu_rate). Empty where the CPU runs none.
std::vector<CorePeak> measure_core_peaks(const CpuFeatures& cpu, double seconds);
// The highest fp32 rate among `peaks` (0 if none): the ceiling of any fp32
// FMA code on this core, sgemm included.
double best_fp32_peak(const std::vector<CorePeak>& peaks);
const CorePeak* best_fp32_peak_entry(const std::vector<CorePeak>& peaks);

// Runs `work` (which returns the units it did) once untimed, then
// repeatedly for about `seconds` by `clock` (seconds, any origin), at least
// once, and returns the best units per second of `clock`. The untimed run
// pays what only a first run pays (a library's JIT and buffers, first-touch
// page faults): timed, a first run longer than `seconds` was the only one,
// and its rate the result (calibrate's first GEMM shape read 1.3 GFLOP/s,
// 0.6% of the peak).
double best_rate(double seconds, const std::function<double()>& work, double (*clock)());
// best_rate by the calling thread's CPU time: on a shared machine other
// processes time-sliced in do not count against the measurement.
double best_cpu_rate(double seconds, const std::function<double()>& work);

}  // namespace pipeflow
