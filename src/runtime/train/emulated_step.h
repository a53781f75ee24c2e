#pragma once

#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/measurement.h"
#include "pipeflow/schedule/schedule.h"

namespace pipeflow::runtime {

// The figures of an emulated step (--emulate): `serial` (a RunMode::kSerial
// step, every action timed alone) replayed with one core per rank, then each
// rank's measured flush after its last action. `measured`: step_figures of
// `serial`, whose pipeline part is replaced.
StepFigures emulated_figures(const Schedule& schedule, const StepResult& serial, StepFigures measured);

}  // namespace pipeflow::runtime
