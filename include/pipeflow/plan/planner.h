#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_spec.h"
#include "pipeflow/model/partition.h"
#include "pipeflow/sim/inference.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/run_metadata.h"

namespace pipeflow {

// What `pipeflow plan` searches: every layout of `model` on `devices`
// devices of `hardware` for a global batch of `global_batch` sequences of
// `seq_length` tokens.
struct PlanRequest {
  ModelSpec model;
  HardwareProfile hardware;
  int devices = 1;
  int global_batch = 1;
  int seq_length = 0;
  TrainingSpec training;  // what trains (frozen layers, LoRA), in every layout
  // Every layout trains in this precision (mixed bf16 by default, as large
  // models are trained; fp32 for what pipeflow train runs here).
  Precision precision = Precision::kBf16;
  // Host seconds each transformer block pass adds, in every layout (the run
  // key block_launch_overhead_s, sim/layout.h): a layout of more, smaller
  // micro-batches pays it more often.
  double block_launch_overhead_s = 0;
  int top_k = 5;
  // Every stage's predicted peak memory must stay within this share of the
  // device's memory (the course's rule: 0.8).
  double memory_fraction = 0.8;
  // Partition methods tried for every layout, in order: a layout a method
  // cuts as an earlier one did is that layout again (kSameCut).
  std::vector<PartitionMethod> partitions = {PartitionMethod{PartitionMethod::Kind::kParameters, {}, {}},
                                             PartitionMethod{PartitionMethod::Kind::kBalanced, {}, {}}};
  // The most model chunks per rank tried for schedules that take --virtual.
  int max_virtual = 4;
  // Only these schedules (registry names) and recompute modes; empty: all.
  // An export to a framework that runs fewer of them searches within them.
  std::vector<std::string> schedules;
  std::vector<Recompute> recomputes;
  // A measured run of `model` on `hardware` (plan --profile: measured_run_of):
  // every layout is priced as analyze's Resimulator predicts a changed layout
  // (the run's own durations where it does the run's work on the run's cut;
  // elsewhere the cost model's, each action kind's scaled by the run's
  // measured over modelled total), and the time bound and the memory checks
  // read those calibrated costs. Throws Error for a run of another model or
  // hardware.
  std::optional<RunMetadata> measured;
  // Called after each queued candidate is checked (and, if it fits,
  // simulated): (checked so far, queued in all).
  std::function<void(std::int64_t, std::int64_t)> progress;
};

// One layout the simulator priced, with the figures the ranking shows.
struct PlanCandidate {
  Layout layout;
  double step_time_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double tflops_per_device = 0;
  double bubble_ratio = 0;           // pipeflow's: idle share of the step (simulation.h)
  double zero_bubble_rate = 0;       // the zero-bubble paper's bubble rate
  double communication_share = 0;    // ranks' mean communication time / step
  double recompute_overhead = 0;     // recomputed FLOPs / model FLOPs
  std::vector<double> stage_peak_bytes;  // per pipeline rank
  double headroom_bytes = 0;         // memory_fraction × device memory − the largest peak
};

// Why a candidate was not ranked; counted in PlanResult::rejected.
enum class RejectReason {
  kIndivisibleBatch,  // B is not a whole number of micro-batches b on each of the d replicas
  kTensorParallel,    // t does not divide the heads (or kv heads)
  kTooFewLayers,      // p · v stages for fewer pipeline layers
  kSchedule,          // the schedule's constraints reject (p, m, v)
  kOutOfMemory,       // a rank's peak (or its model states alone) over memory_fraction × memory
  kSameCut,           // an earlier partition method cuts the same stages: listed once
  kSameSchedule,      // one stage: an earlier schedule holds as much at once (plan_layouts): listed once
};
inline constexpr int kRejectReasons = 7;
std::string_view to_string(RejectReason reason);  // "indivisible batch", ...

struct PlanResult {
  std::vector<PlanCandidate> best;  // at most top_k, best first
  std::int64_t candidates = 0;      // every combination enumerated
  std::int64_t simulated = 0;       // each within the memory limit (checked first)
  // Skipped by the bound: their lower bound on the step time exceeded the
  // top_k-th best step time already simulated (see plan_layouts).
  std::int64_t pruned = 0;
  std::int64_t rejected[kRejectReasons] = {};
  // candidates = Σ rejected + simulated + pruned.
};

// Searches every dp × tp × pp = devices (t within a node, dividing the
// heads), micro-batch b (powers of two up to B / d), every registered
// schedule whose constraints accept (p, m, v) with m = B / (b · d), v = 1
// or 2..max_virtual for schedules that take chunks (2 for the V-shaped),
// recompute none / selective / full, ZeRO 0 and 1 (1 only with d > 1),
// each partition method; sequence parallelism on whenever t > 1 and t
// divides s (it only removes work and memory in the cost model). Every
// candidate that fits is simulated; ranked by step time, ties by headroom,
// then by enumeration order (the schedule registry's: simplest first).
//
// Listed once: a layout an earlier partition method cuts the same way
// (kSameCut), and at p = 1 with one chunk, a schedule whose rank peaks as an
// earlier schedule's (kSameSchedule): one rank holding the one stage runs
// the same forwards and backwards back to back whatever the order (nothing
// to wait for or send), so the schedules differ only in how many
// micro-batches' activations they hold at once: GPipe's m, 1F1B's one.
//
// Work is skipped, never a candidate that could rank:
//   memory   a rank's model states alone over the limit: out of memory
//            before its schedule is made (a peak is at least the model
//            states); the rest have their ranks' peaks walked from the
//            schedule's action lists, exactly the peaks simulate() reports
//            (peak_memory_bytes: memory follows the order of actions, not
//            their times), and only those that fit are simulated;
//   time     the simulated step is at least, on every rank r, the forwards
//            of stages 0 .. r − 1 (r's first stage waits for them), its
//            compute (m · Σ of its stages' F + B) and its all-reduce and
//            optimizer step, which the simulator runs after its last action;
//            candidates are simulated in increasing order of that bound and
//            the search stops when it exceeds the top_k-th best step found;
//   sharing  the costs are priced once per layout, placement and chunk count
//            (every schedule of that shape shares them), from the shape of
//            the schedule alone, and the layers are cut (layout_partition)
//            once per micro-batch size, tensor parallelism, recompute,
//            partition method and stage count.
// Throws Error when no layout fits, naming the rejection counts.
PlanResult plan_layouts(const PlanRequest& request);

// The same search without the time bound: every candidate that fits is
// simulated (what the tests compare plan_layouts with).
PlanResult plan_layouts_exhaustively(const PlanRequest& request);

// `pipeflow plan --inference`: how many stages (one device each) the setup
// needs to fit, and what each stage count gives. Every P in 1 .. max_stages
// up to the model's pipeline layers (every stage needs one, as in the
// training search) is predicted (predict_inference, setup.stages replaced;
// setup.microbatches 0 picks min(P, sequences) for each); it fits when every
// stage's peak is within memory_fraction × the device's memory, as the
// training plan's rule. The work and the listing are bounded by the model,
// not by max_stages (llama3-70b: 82 stage counts at most, whatever --devices).
struct InferencePlanRequest {
  InferenceSetup setup;
  int max_stages = 1;
  double memory_fraction = 0.8;
  int top_k = 5;  // fitting stage counts listed, as PlanRequest::top_k
};

struct InferenceOption {
  int stages = 0;
  InferencePrediction prediction;  // no stages when the setup cannot run at this P
  std::string rejected;                           // why it does not fit; empty when it fits
};

struct InferencePlan {
  double limit_bytes = 0;                // memory_fraction × device memory
  std::vector<InferenceOption> fitting;  // the top_k best: by tokens/s, then time to first token, then fewer stages
  int more_fitting = 0;                  // stage counts that fit past the top_k listed
  std::vector<InferenceOption> rejected; // in increasing P
  // The stage counts past the pipeline layers, not tried, as one reason
  // ("83 .. 1000000 stages: ..."); empty when max_stages is within them.
  std::string untried;
};

// Throws Error for max_stages < 1, top_k < 1 or a memory fraction outside
// (0, 1]; a setup no P fits is no error (every option says why).
InferencePlan plan_inference(const InferencePlanRequest& request);

}  // namespace pipeflow
