#pragma once

#include <cstdint>
#include <vector>

#include "pipeflow/core/ids.h"
#include "pipeflow/schedule/action.h"

namespace pipeflow::runtime {

// What one rank did in one step, as the steady clock saw it. Times are
// seconds since the step's common start (the same epoch on every rank).

// One action of the rank's lowered list.
struct ActionTiming {
  Action action;
  double start_s = 0;
  double end_s = 0;
  // The part of [start_s, end_s), at its beginning, a RECV spent blocked
  // waiting for its message; 0 for compute and SEND (the engine sizes every
  // inbox for a step's messages, so a send never waits for room; if one did,
  // its time would count as communication).
  double wait_s = 0;
  // A compute action's thread CPU time (user + system) from its start to its
  // end; 0 for SEND and RECV. Its wall time less this is time the rank's
  // thread was off its core (another process or thread ran there) or
  // asleep in a tensor-parallel collective (RankFigures::off_core_s tells
  // them apart by the collectives' own CPU time).
  double cpu_s = 0;
  // Activation bytes the action leaves held on its stage for later passes:
  // an F, what its micro-batch keeps until its B or I; an I, what it keeps
  // until its W (measured on the stage's account, without the tensor sent
  // on); 0 for other actions.
  std::int64_t held_bytes = 0;
  // The most the stage held during a compute action above what it held when
  // the action began (temporaries, a recomputed segment, the output); 0 for
  // communication.
  std::int64_t working_bytes = 0;

  double duration_s() const { return end_s - start_s; }
};

// The work after the pipeline flush.
enum class FlushPhase {
  kDataParallelGradients,  // a stage's gradients summed over its data-parallel replicas (from its posting)
  kDataParallelWeights,    // ZeRO-1: a stage's updated weights all-gathered from the replicas
  kTiedGradients,          // ReduceTiedGrads: exchange and sum the wte copies
  kSequenceParallelGradients,  // a stage's whole tensors' gradients summed over its tensor-parallel ranks
  kGradientNorm,   // the global norm: all-reduce of the square sums
  kOptimizer,      // clipping and the AdamW step of the rank's stages
};

struct PhaseTiming {
  FlushPhase phase = FlushPhase::kOptimizer;
  StageId stage;  // kOptimizer, kDataParallel*: the stage; otherwise the rank's first stage
  double start_s = 0;
  double end_s = 0;
};

// A collective of the rank's tensor-parallel group inside a compute action
// (an all-reduce of a layer's activations or their gradients).
struct CollectiveTiming {
  double start_s = 0;
  double end_s = 0;
  std::int64_t bytes = 0;  // the rank's buffer
  // The rank thread's CPU time inside it (as ActionTiming::cpu_s): its wall
  // time less this is the part it waited asleep for its peers (or was off
  // its core), which RankFigures::off_core_s leaves out.
  double cpu_s = 0;
};

struct RankRecord {
  std::vector<ActionTiming> actions;  // in list order
  std::vector<PhaseTiming> phases;    // in the order they ran
  std::vector<CollectiveTiming> collectives;  // in the order they ran
  // The most activation bytes the rank's stages held together at any moment
  // of the step (each action's own temporaries included).
  std::int64_t peak_activation_bytes = 0;
};

}  // namespace pipeflow::runtime
