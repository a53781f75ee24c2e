#pragma once

#include <chrono>
#include <vector>

#include "pipeflow/model/hardware.h"
#include "pipeflow/tensor/core_peak.h"
#include "pipeflow/tensor/gemm.h"

namespace pipeflow::runtime {

// What `pipeflow calibrate` measures on this machine, each the best of
// repeated runs over about `seconds_per_measurement`:
struct Calibration {
  double sgemm_flop_per_s = 0;    // one thread, 512³ float matrix products through tensor/gemm.h
  // The same products as a bf16 run multiplies them here (tensor/gemm.h's
  // resolve(Bf16Gemm::kAuto)): oneDNN's bf16 matmul where the CPU has bf16
  // instructions, sgemm elsewhere; and which of the two that was.
  double bf16_gemm_flop_per_s = 0;
  GemmPrecision bf16_gemm = GemmPrecision::kFp32;
  double memcpy_bytes_per_s = 0;  // bytes copied per second, 64 MiB buffers, one thread
  double handoff_latency_s = 0;   // one message between two threads through the in-process transport (kHandoffSpin)
  // Model FLOP/s of one training micro-batch (forward + backward) of a small
  // GPT-2 (4 layers, width 128, context 64, 8 sequences) on one thread: what
  // the cost model's efficiency turns peak into.
  double model_flop_per_s = 0;
  int cores = 0;                  // usable_cores() (report.h): the process's CPU affinity
  double memory_bytes = 0;        // physical memory
  // The limits (docs/RUNTIME.md), by the calling thread's CPU time:
  std::vector<CorePeak> core_peaks;  // measure_core_peaks: each ISA's register-only FMA peak this CPU has
  std::vector<GemmRate> gemm_rates;  // sgemm at the model's shapes (model_gemm_shapes)
  // A streaming triad a[i] = b[i] + s·c[i] over three float arrays that
  // together span at least 3× the last-level cache (64 MiB each at least),
  // counted as STREAM counts it: 12 bytes per element (two reads, one write).
  double triad_bytes_per_s = 0;
};

// Each measurement keeps the best of repeated runs, the slowest of which (the
// training step) takes tens of milliseconds on one core: the default 0.5 s
// repeats it about ten times, and past a minute the best no longer moves.
inline constexpr double kMaxSecondsPerMeasurement = 60;

// The model whose GEMMs calibrate times, by default make run's (and the
// calibration step's) GPT-2: width 128, micro-batches of 8 × 64 tokens, and a
// decode group of 8 rows.
inline constexpr int kMinGemmWidth = 8;
inline constexpr int kMaxGemmWidth = 4096;  // fc's weight 4096 × 16384 floats: 256 MiB
inline constexpr int kMaxGemmRows = 8192;

struct CalibrationOptions {
  double seconds_per_measurement = 0.5;  // in (0, kMaxSecondsPerMeasurement]
  int gemm_width = 128;                  // C, in [kMinGemmWidth, kMaxGemmWidth]
  std::vector<int> gemm_rows = {512, 8};  // M of each GEMM, each in [1, kMaxGemmRows]
};

// A GPT block's four weight GEMMs at width C for each row count M (in that
// order, M outer): qkv [M, C]·[C, 3C], proj [M, C]·[C, C], fc [M, C]·[C, 4C],
// fc_proj [M, 4C]·[4C, C]; flop_per_s left 0.
std::vector<GemmRate> model_gemm_shapes(int width, const std::vector<int>& rows);

// Throws Error for an option outside its range (naming its flag: --seconds,
// --gemm-width, --gemm-rows), before measuring anything.
Calibration calibrate(const CalibrationOptions& options = {});

// One message between two threads through an InProcessTransport whose waits
// spin for `spin` before they sleep: the best over about `seconds` of
// ping-pong rounds, in seconds per hand-off.
double measure_handoff_latency(std::chrono::nanoseconds spin, double seconds);

// The profile the model module reads (hardware_to_json / load_hardware):
// peak = single-thread sgemm (a core is a pipeline device), efficiency =
// model / sgemm FLOP/s, memory bandwidth = the triad, the link between
// devices = the memcpy rate (what a copying transport achieves; the
// in-process one moves pointers), latency = the hand-off, devices per node =
// cores, and the measured limits: the core peaks per ISA and the GEMMs at the
// model's shapes. There is no network: the inter-node figures repeat the
// intra-node ones and are marked estimated.
HardwareProfile calibrated_profile(const Calibration& calibration, std::string name = "calibrated");

}  // namespace pipeflow::runtime
