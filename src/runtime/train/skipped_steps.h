#pragma once

#include "pipeflow/runtime/trainer.h"

namespace pipeflow::runtime {

// The steps a run skipped in a row for a non-finite loss or gradient norm
// (numerics.max_skipped_steps stops the run there): a finite step ends the
// streak; an fp16 overflow that the loss scaler absorbs (StepLog::overflow)
// neither counts nor ends it.
class SkippedInARow {
 public:
  // After each step; returns the streak up to it.
  int after(const StepLog& log) {
    if (!log.overflow) streak_ = log.skipped ? streak_ + 1 : 0;
    return streak_;
  }

 private:
  int streak_ = 0;
};

}  // namespace pipeflow::runtime
