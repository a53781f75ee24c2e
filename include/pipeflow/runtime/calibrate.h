#pragma once

#include <chrono>

#include "pipeflow/model/hardware.h"

namespace pipeflow::runtime {

// What `pipeflow calibrate` measures on this machine, each the best of
// repeated runs over about `seconds_per_measurement`:
struct Calibration {
  double sgemm_flop_per_s = 0;    // one thread, 512³ float matrix products through tensor/gemm.h
  double memcpy_bytes_per_s = 0;  // bytes copied per second, 64 MiB buffers, one thread
  double handoff_latency_s = 0;   // one message between two threads through the in-process transport (kHandoffSpin)
  // Model FLOP/s of one training micro-batch (forward + backward) of a small
  // GPT-2 (4 layers, width 128, context 64, 8 sequences) on one thread: what
  // the cost model's efficiency turns peak into.
  double model_flop_per_s = 0;
  int cores = 0;                  // usable_cores() (report.h): the process's CPU affinity
  double memory_bytes = 0;        // physical memory
};

// Each measurement keeps the best of repeated runs, the slowest of which (the
// training step) takes tens of milliseconds on one core: the default 0.5 s
// repeats it about ten times, and past a minute the best no longer moves.
inline constexpr double kMaxSecondsPerMeasurement = 60;

struct CalibrationOptions {
  double seconds_per_measurement = 0.5;  // in (0, kMaxSecondsPerMeasurement]
};

// Throws Error for seconds_per_measurement outside (0, kMaxSecondsPerMeasurement]
// (naming --seconds), before measuring anything.
Calibration calibrate(const CalibrationOptions& options = {});

// One message between two threads through an InProcessTransport whose waits
// spin for `spin` before they sleep: the best over about `seconds` of
// ping-pong rounds, in seconds per hand-off.
double measure_handoff_latency(std::chrono::nanoseconds spin, double seconds);

// The profile the model module reads (hardware_to_json / load_hardware):
// peak = single-thread sgemm (a core is a pipeline device), efficiency =
// model / sgemm FLOP/s, memory bandwidth and the link between devices = the
// memcpy rate (what a copying transport achieves; the in-process one moves
// pointers), latency = the hand-off, devices per node = cores. There is no
// network: the inter-node figures repeat the intra-node ones and are marked
// estimated.
HardwareProfile calibrated_profile(const Calibration& calibration, std::string name = "calibrated");

}  // namespace pipeflow::runtime
