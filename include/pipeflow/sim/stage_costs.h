#pragma once

#include "pipeflow/schedule/action.h"

namespace pipeflow {

// What one (virtual) stage costs, per micro-batch, on one device: the one
// record of per-action costs. The cost model (cost_model.h) computes it from a
// layout, a profile (profile.h) carries it as measured, and the runtime's
// measurement (runtime/measurement.h) fills it from the actions it timed.
struct StageCosts {
  // Durations of the compute actions: F, the full backward B, and its
  // zero-bubble halves I (input gradient, including any recomputation) and W
  // (weight gradient). A schedule uses either B or I and W for a stage.
  double forward_s = 0;
  double backward_s = 0;
  double backward_input_s = 0;
  double backward_weight_s = 0;
  // DualPipe's overlapped F&B: a B that directly follows, among its rank's
  // compute actions, an F of another of the rank's stages (how the schedule
  // module writes an F&B pair) takes backward_s − this. 0: no overlap, the
  // pair costs F + B.
  double forward_backward_overlap_s = 0;
  // Bytes of this stage's output, sent to the next stage per micro-batch; the
  // gradient that returns in the backward has the same size.
  double output_bytes = 0;

  // Memory on the device, in bytes.
  double model_state_bytes = 0;      // weights, gradients, optimizer states
  double activation_bytes = 0;       // held per micro-batch from its F until its B (or I) ends
  double weight_gradient_bytes = 0;  // held per micro-batch from its I until its W ends
  // The most an F (a B, I or W) of this stage holds, while it runs, above
  // what the stage held when it began: its temporaries, the output not yet
  // handed on, the segment a recomputing backward rebuilds.
  double forward_working_bytes = 0;
  double backward_working_bytes = 0;
  double comm_buffer_bytes = 0;      // send and receive buffers, held for the whole step

  // After the pipeline: this stage's gradient bytes all-reduced across the
  // data-parallel replicas (ZeRO-3: reduce-scattered only, so half of them
  // here), and the optimizer step over its parameters.
  double gradient_bytes = 0;
  double optimizer_s = 0;

  // The duration of a compute action of `kind` (forward_s for F, backward_s
  // for B, backward_input_s for I, backward_weight_s for W); 0 for SEND and
  // RECV, whose time is the link's.
  double duration(ActionKind kind) const;
  // Sets the field duration(kind) reads; throws Error for SEND and RECV.
  void set_duration(ActionKind kind, double seconds);
};

}  // namespace pipeflow
