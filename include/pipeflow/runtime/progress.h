#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include "pipeflow/runtime/trainer.h"

namespace pipeflow::runtime {

// How a training run reports progress. On a terminal: one status line
// redrawn in place,
//   step  37/200 [=====>              ] loss 2.3140  12.3k tok/s  bubble 11.2% (pred 10.9%)  ETA 1m12s
// with messages (validation, warnings) printed above it. Elsewhere (a log
// file, a pipe): plain lines, the first and last steps, every validation
// step and every `every`-th step (DeepSpeed's steps_per_print, which
// resolve() makes about 50 lines a run when it is absent) (validation as "after N steps: validation
// loss L", the metrics' step N − 1),
//   step 37/200 loss 2.3140 lr 0.001 grad_norm 0.84 12.3k tok/s step 52.1 ms bubble 11.2% (predicted 10.9%) ETA 1m12s
// "emulated" labels the figures of an --emulate run. A printer without a
// file (`out` nullptr) prints nothing: the other processes of an MPI job.
//
// Thread safety: one thread.
class ProgressPrinter {
 public:
  ProgressPrinter(std::FILE* out, bool terminal, int total_steps, bool emulated, int every = 1);

  void message(std::string_view line);
  // A run resumed from a checkpoint starts after `steps_done` steps (the ETA
  // counts the time of the steps this run has made).
  void start(int steps_done) { first_ = steps_done; }
  // After the step `log.step` (from 0), `elapsed_s` since start().
  void step(const StepLog& log, double elapsed_s);
  // Ends the status line.
  void finish();

 private:
  std::string figures(const StepLog& log, double eta_s) const;

  std::FILE* out_;
  bool terminal_;
  int total_;
  int every_;
  bool emulated_;
  int first_ = 0;
  bool line_open_ = false;
};

// "1m12s", "45s", "2h03m".
std::string format_eta(double seconds);

}  // namespace pipeflow::runtime
