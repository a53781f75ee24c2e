#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "pipeflow/runtime/engine.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/schedule/schedule.h"
#include "pipeflow/sim/profile.h"
#include "pipeflow/sim/simulation.h"
#include "pipeflow/trace/event.h"

namespace pipeflow::runtime {

// What the engine's records of a step say, in the trace module's terms and
// as the figures a report shows beside the simulator's prediction.

// The step as a timeline, one track per rank: every action as an event of
// its kind (a SEND or RECV that blocked: a wait event for the blocked part,
// then its own event), the tensor-parallel collectives inside the actions
// (tensor_parallel events, which bubble_stats does not count as compute),
// and with `with_flush` the flush after the pipeline (tied gradients and the
// norm as allreduce events, each stage's update as an optimizer event).
// Times are seconds since the step's start.
Timeline measured_timeline(const StepResult& step, int num_ranks, std::string title, bool with_flush);

// One rank's share of a step. compute + comm + wait + other = pipeline_end_s.
struct RankFigures {
  double compute_s = 0;       // F, B, I, W
  // The part of compute_s the rank's thread was off its core: the actions'
  // wall time less their thread CPU time (ActionTiming::cpu_s), less the
  // part of the tensor-parallel collectives inside them that was not CPU
  // time (their wait asleep for the peers: CollectiveTiming::cpu_s), each
  // term at least 0: Σ_a max(0, wall_a − cpu_a) − Σ_c max(0, wall_c − cpu_c),
  // at least 0. Time another process or thread took the core, or page-ins;
  // the pipeline itself sleeps inside a compute action only in a collective.
  double off_core_s = 0;
  double comm_s = 0;          // SEND and RECV outside their waits (the hand-offs)
  double wait_s = 0;          // blocked in a RECV for the message
  // The part of wait_s after the peer's SEND of that message had ended: the
  // hand-off's own latency, mostly a sleeping thread's wake-up (longer when
  // another process holds the rank's core). A RECV whose SEND is not in the
  // step's records (another replica's, another process's) adds nothing.
  double wake_s = 0;
  double other_s = 0;         // the rest: thread start, bookkeeping between actions
  double pipeline_end_s = 0;  // end of the rank's last action
  double flush_s = 0;         // after pipeline_end_s: tied gradients, data parallel, norm, optimizer
  double optimizer_s = 0;
  // The data-parallel reduction (kDataParallel* phases, each stage's
  // reduction from its posting, and ZeRO-1's weight all-gather), and the
  // part of it before the rank's last action ended: posted early, in flight
  // while the rank still computed (MPI advances it between actions).
  double data_parallel_s = 0;
  double data_parallel_early_s = 0;
  double bubble = 0;          // 1 − compute_s / pipeline_s (bubble_stats per rank)
  // The tensor-parallel collectives inside compute_s: their time, the bytes
  // of the rank's buffers and how many.
  double tensor_parallel_s = 0;
  std::int64_t tensor_parallel_bytes = 0;
  int tensor_parallel_collectives = 0;
  std::int64_t peak_activation_bytes = 0;
};

struct StepFigures {
  double wall_s = 0;        // the whole step, flush included
  double pipeline_s = 0;    // the pipeline's makespan: earliest action start to latest action end
  double tokens_per_s = 0;  // step.tokens / wall_s
  // The idle share of the pipeline part, bubble_stats of measured_timeline
  // without the flush: 1 − Σ compute / (ranks · pipeline_s), exactly the
  // definition of the simulator's pipeline bubble.
  double bubble = 0;
  std::vector<RankFigures> ranks;
};

StepFigures step_figures(const StepResult& step, int num_ranks);

// What the simulator prices a rank's tensor-parallel collectives at: each a
// ring all-reduce of their mean bytes over `tensor_parallel` members on the
// link between devices 0 and t − 1 of `hardware` (× its collective
// efficiency), as simulate prices a layer's (sim/cost_model.h).
double predicted_tensor_parallel_s(const RankFigures& rank, int tensor_parallel, const HardwareProfile& hardware);

// Per-action costs measured over some steps, as sim/profile.h states them
// (medians): for every (stage, compute kind) its duration, the bytes an F
// (an I) left held, the working bytes of F and the largest of B's, I's and
// W's, and the optimizer time per stage. A kind the schedule did not run on
// a stage costs 0. output_bytes and model_state_bytes are the engine's
// (measured_profile), not measured here.
class CostProfile {
 public:
  explicit CostProfile(int num_stages);

  void add(const StepResult& step);
  int steps() const { return steps_; }
  int num_stages() const { return static_cast<int>(samples_.size()); }
  StageCosts stage(StageId s) const;
  // stage(action.stage).duration(action.kind); 0 for communication actions.
  double duration(const Action& action) const;

 private:
  struct Samples {
    // Indexed by ActionKind; only the compute kinds are filled.
    std::array<std::vector<double>, kNumActionKinds> seconds;
    std::array<std::vector<double>, kNumActionKinds> working_bytes;
    std::vector<double> optimizer;
    std::vector<double> activation_bytes;
    std::vector<double> weight_gradient_bytes;
  };
  std::vector<Samples> samples_;
  std::vector<StageCosts> medians_;
  int steps_ = 0;
};

// The measured costs in the simulator's profile format (sim/profile.h), for
// the engine they were measured on (either kind of stage): durations, the
// bytes each stage sends per micro-batch (the activation at its cut,
// StageTraits::boundary_elements: b·T·C floats for a GPT; 0 from the last
// stage), activation and weight-gradient bytes held per micro-batch,
// model-state bytes (parameters, gradients, AdamW moments) and optimizer
// time per stage. The link is free: the in-process transport hands over a
// pointer.
template <class StageT>
MeasuredProfile measured_profile(const CostProfile& costs, const BasicPipelineEngine<StageT>& engine,
                                 std::string source);

// The step the measured costs predict: the simulator run on the engine's
// lowered schedule with measured_profile's costs, communication overlapped.
template <class StageT>
SimulationResult predict_step(const BasicPipelineEngine<StageT>& engine, const CostProfile& costs);

// The emulated pipeline: a step run serially (RunMode::kSerial, every
// action timed alone) replayed through execute() with each action's own
// measured duration -- the timeline a machine with one core per rank would
// have had.
Execution replay(const Schedule& schedule, const StepResult& serial_step);

}  // namespace pipeflow::runtime
