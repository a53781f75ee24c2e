#include "pipeflow/sim/stage_costs.h"

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

// The one kind → field map, shared by the reader and the writer.
template <typename Costs>
auto* duration_field(Costs& costs, ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return &costs.forward_s;
    case ActionKind::kBackward:
      return &costs.backward_s;
    case ActionKind::kBackwardInput:
      return &costs.backward_input_s;
    case ActionKind::kBackwardWeight:
      return &costs.backward_weight_s;
    default:
      return static_cast<decltype(&costs.forward_s)>(nullptr);
  }
}

}  // namespace

double StageCosts::duration(ActionKind kind) const {
  const double* field = duration_field(*this, kind);
  return field != nullptr ? *field : 0.0;
}

void StageCosts::set_duration(ActionKind kind, double seconds) {
  double* field = duration_field(*this, kind);
  if (field == nullptr) {
    fail("a stage's cost of {} is its link's, not a duration of the stage: set durations of F, B, I or W only",
         kind_token(kind));
  }
  *field = seconds;
}

}  // namespace pipeflow
