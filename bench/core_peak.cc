// The core's peak FLOP/s per ISA this CPU has (tensor/core_peak.h: a
// register-only FMA kernel per ISA, picked at run time), on one thread by
// CPU time: the ceiling that bench/train_step.sh sets a training step's
// GFLOP/s against, beside sgemm's.
//
//   bench_core_peak [--seconds S]     S in (0, 60], default 1: all kernels together
//
// Prints one line per kernel, "core peak fp32 avx512: G GFLOP/s (...)", then
// "best fp32 peak: G GFLOP/s (ISA)", which bench/common.sh's core_peak reads.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flags.h"
#include "pipeflow/tensor/core_peak.h"

int main(int argc, char** argv) {
  double seconds = 1;
  pipeflow::bench::parse_flags(argc, argv, {{"--seconds", &seconds}});
  if (!(seconds > 0 && seconds <= 60)) {
    std::fprintf(stderr,
                 "--seconds %g: must be a number in (0, 60] (CPU seconds for all the kernels together; "
                 "each keeps its best millisecond-long run): try --seconds 1\n",
                 seconds);
    return 2;
  }
  const pipeflow::CpuFeatures cpu = pipeflow::detect_cpu_features();
  const std::vector<pipeflow::CorePeak> peaks = pipeflow::measure_core_peaks(cpu, seconds);
  for (const pipeflow::PeakKernel* kernel : pipeflow::runnable_peak_kernels(cpu)) {
    for (const pipeflow::CorePeak& peak : peaks) {
      if (peak.isa != kernel->isa || peak.precision != kernel->precision) continue;
      std::printf("core peak %s %s: %.1f GFLOP/s (%d chains x %d lanes x %d FLOPs, one thread, CPU time)\n",
                  kernel->precision, kernel->isa, peak.flop_per_s / 1e9, kernel->chains, kernel->lanes,
                  kernel->flops_per_lane);
    }
  }
  const pipeflow::CorePeak* best = pipeflow::best_fp32_peak_entry(peaks);
  if (best == nullptr) {
    std::printf("best fp32 peak: none (this CPU has neither AVX2+FMA nor AVX-512)\n");
    return 1;
  }
  std::printf("best fp32 peak: %.1f GFLOP/s (%s)\n", best->flop_per_s / 1e9, best->isa.c_str());
  return 0;
}
