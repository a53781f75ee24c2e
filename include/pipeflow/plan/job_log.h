#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/config/run_config.h"

namespace pipeflow {

// The timers real jobs print into their logs, read for `pipeflow analyze`
// (docs/ANALYZE.md, "Logs"):
//
// Megatron-LM (--timing-log-level 2): every log interval
//   "times across ranks (ms):" then per timer "  NAME:" and "     rank  R: MS"
//   (--timing-log-option all: each rank's value), or "(min, max) time across
//   ranks (ms):" / "max time across ranks (ms):" (the spread only); values
//   are per iteration (Megatron divides by the log interval). Timers read:
//   forward-compute, backward-compute, the send and receive timers
//   (forward-recv, backward-send, forward-send-backward-recv, ...) and
//   optimizer. The iteration line "iteration N/ M | ... | elapsed time per
//   iteration (ms): T |" gives the step; "[Rank r] (after N iterations)
//   memory (MB) | allocated: ... | max allocated: M" the memory; the
//   "arguments" block Megatron prints at its start the run (its model,
//   layout and batch, as --megatron-args reads them) and the world, which
//   maps a global rank to its pipeline rank in Megatron's order (tensor
//   fastest, then data, then pipeline).
//
// DeepSpeed's pipeline engine (wall_clock_breakdown): only global rank 0,
// the first stage, prints "[Rank 0] time (ms) | NAME: MS | ..." (before
// v0.10.1 "rank=0 time (ms) | ..."): fwd_microstep (forward_microstep),
// bwd_microstep (backward_microstep), step_microstep, pipe_send_output,
// pipe_send_grad, pipe_recv_input, pipe_recv_grad, accumulated over the
// steps_per_print steps since the last print; "steps: N loss: L iter time
// (s): T samples/sec: S" gives the step; "RANK=r STAGE=s LAYERS=n [a, b)
// STAGE_PARAMS=..." the partition; the printed configuration
// ("gradient_accumulation_steps ... 8") the micro-batches.

// Ascend (torch_npu's step_trace_time.csv of one device, msprof-analyze's
// cluster_step_trace_time.csv of a job): a CSV whose header has Step,
// Computing, Communication(Not Overlapped) and Free, in microseconds; a
// cluster's rows are per step and rank or stage (Type, Index): the stage rows
// where there are any. Where the header has them: Bubble, the time in receive
// operators (in a pipeline job, a stage's waits for its neighbours' data:
// its bubble), Stage, the step less those receives, and Device_id.

// One pipeline rank's timers, per step.
struct RankTimes {
  double forward_s = 0;
  double backward_s = 0;
  double comm_s = 0;  // send and receive timers: the transfers and the waits for the peer
  double optimizer_s = 0;
  std::optional<double> peak_memory_bytes;
  std::optional<double> receive_s;  // Ascend's Bubble column: time in receive operators
  std::optional<double> stage_s;    // Ascend's Stage column: the step less its receives
};

struct TimerLog {
  std::string format;                           // "Megatron-LM log", "DeepSpeed log"
  std::vector<double> step_s;                   // per printed interval, its mean step
  std::vector<std::optional<RankTimes>> ranks;  // per pipeline rank; none: the log has no timers of it
  std::optional<RunConfig> run;                 // the run the log states (Megatron's arguments block)
  std::vector<int> stage_layers;                // DeepSpeed's partition lines: layers per stage
  int microbatches = 0;                         // per step; 0: the log does not say
  std::vector<std::string> notes;               // what the log could not show
  // torch_npu's step_trace_time.csv: one device's steps (no Type column), and
  // its Device_id where the file has one (the device's index on its node).
  bool one_device = false;
  std::optional<int> device_id;
};

// Whether `text` is one of the logs above (a line only such a log prints).
bool is_timer_log(std::string_view text);

// Reads a log; throws Error naming `source` and the line for a malformed
// timer line, and for a log with no step time.
TimerLog read_timer_log(std::string_view text, const std::string& source);

// One device's log of a job (torch_npu writes a step_trace_time.csv per
// device) and the device's global rank.
struct DeviceLog {
  int rank = 0;
  TimerLog log;
  std::string source;
};

// The devices' logs as one job's: global rank r is stage r / replicas
// (Megatron's order, which MindSpeed keeps: tensor fastest, then data, then
// pipeline; replicas = tensor × data), a stage's replicas averaged; `stages`
// 0: the largest rank's + 1. A step is its slowest device's. Throws Error
// naming the files for two devices of one rank, devices whose step counts
// differ, and a rank past the stages.
TimerLog merge_device_logs(std::vector<DeviceLog> devices, int replicas, int stages);

}  // namespace pipeflow
