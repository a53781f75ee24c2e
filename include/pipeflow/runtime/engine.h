#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/gpt_config.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/nn/stage.h"
#include "pipeflow/runtime/batch_source.h"
#include "pipeflow/runtime/engine_options.h"
#include "pipeflow/runtime/transport.h"
#include "pipeflow/runtime/rank_worker.h"
#include "pipeflow/runtime/step_record.h"
#include "pipeflow/schedule/schedule.h"

namespace pipeflow::runtime {

// What a step does after the pipeline flush.
//   kTrain:          tied gradients summed, global norm, clipping, AdamW.
//   kGradientsOnly:  tied gradients summed and the norm measured; no clipping,
//                    no update (what `pipeflow grad` reports).
enum class StepMode { kTrain, kGradientsOnly };

// How the ranks run.
//   kThreaded: one worker thread per rank, all at once: the real pipeline.
//              The threads start at the engine's first threaded step and
//              serve every later one (RankThreads: pinned one per core when
//              the process may use at least p cores).
//   kSerial:   every rank's actions on the calling thread, one at a time, in
//              a valid order (each pass over the ranks runs every rank as far
//              as its messages allow); each action timed alone, for the
//              emulated timeline of a machine with one core per rank.
// Both compute exactly the same numbers.
enum class RunMode { kThreaded, kSerial };

struct StepResult {
  std::int64_t step = 0;
  double loss = 0;              // mean over the global batch (of the m micro-batch means)
  std::vector<double> microbatch_losses;
  double grad_norm = 0;         // global, over all stages, tied wte once, before clipping
  double clip_coefficient = 1;  // applied to every gradient (1: not clipped)
  // On a step measuring the gradient noise scale (EngineOptions::
  // noise_scale_interval): |G_small|², the squared norm of the gradient of
  // the mean loss over one micro-batch (b sequences: micro-batch j* of
  // runtime/noise_scale.h, of data-parallel replica 0 at world rank 0), tied
  // wte once, before clipping; the big batch's is grad_norm².
  std::optional<double> grad_square_small;
  // kTrain: the loss or the gradient norm was not finite, so no rank updated
  // (weights, moments and the optimizer's step count as before the step).
  bool skipped = false;
  double lr = 0;                // the learning rate of this step's update
  std::int64_t tokens = 0;      // m · b · T
  double wall_s = 0;            // from the step's start until every rank had finished
  RunMode mode = RunMode::kThreaded;
  std::vector<RankRecord> ranks;
};

// The pipeline engine: p·v nn stages cut from a GPT-2 by layer boundaries,
// placed on the ranks of a schedule, one RankWorker per rank over an
// in-process transport, and an AdamW per stage.
//
// A step runs the lowered schedule: gradients accumulate over the m
// micro-batches (loss scale 1/m), then the flush of RankWorker, so that the
// loss, every gradient and the weights after the update equal those of one
// unpipelined step on the same global batch (up to float rounding), whatever
// the schedule, stage count or recompute setting. Reruns with the same seed
// and layout give the same bits, threaded or serial.
//
// Errors: a worker that fails (an exception in an action, a timeout) aborts
// the transport, every other worker stops at its next action or wait, step()
// waits until every rank has returned and throws the first failure's error
// (the threads stay for the next step). The next
// step starts clean (states and messages of the failed step are dropped),
// unless the failure came after an optimizer update had begun on some rank:
// then the weights are inconsistent and every later step throws.
//
// BLAS: each worker's matrix products run on its own thread (tensor/gemm.h
// pins OpenBLAS to one thread), so p workers use p cores.
//
// Under MPI (an MpiGroups given): this process runs one pipeline rank of one
// data-parallel replica (MpiGroups::pipeline_rank, data_rank) on the calling
// thread (mpirun binds the process to its core), holds only that rank's
// stages and optimizers, and reaches the other ranks through an
// MpiTransport. Each stage's gradients are summed over the data-parallel
// replicas (the loss scale 1/(m·d) makes the sum the mean) by a
// reduce-scatter (ReduceScatterParts), then an all-gather: of the gradients,
// or under ZeRO-1 of the weights each replica updated from its part. A
// stage's reduce-scatter is posted as soon as the rank has run the stage's
// last B or W, so it is under way during the rank's remaining actions
// (another stage's backward, on a rank of several stages), unless the
// stage holds one side of the tied wte: that one waits for the tied
// exchange at the flush. The gradient norm adds every replica's part, in
// replica order, so ZeRO-1 on and off give the same bits.
// A step ends with every process holding the loss and world rank 0 holding
// every rank's record of its replica (clocks aligned by
// MpiGroups::clock_offset_s). The whole-model operations (write_checkpoint,
// assemble_model) are collective: every process calls them. A checkpoint is
// written as shards by replica 0's processes, one per pipeline rank, and
// indexed by world rank 0; for assemble_model replica 0's processes send
// their tensors by name, and world rank 0 alone gets the result. A failure ends the job (the caller's MpiWorld::abort_job): peers
// cannot be told to stop a step half done.
//
// Thread safety: one thread drives the engine; stages may be read between
// steps. The destructor stops and joins the rank threads.
class RankThreads;
class MpiGroups;
class ReduceScatterParts;

class PipelineEngine {
 public:
  // `schedule`: compute-only (then lowered with insert_send_recv) or already
  // lowered; it must pass validate(). `boundaries`: num_stages + 1 pipeline
  // layer indices 0 = b0 < … < b_S = L + 2 (see model/partition.h); stage s
  // holds layers [b_s, b_{s+1}). Parameters start zero: init_gpt2 or
  // load_parameters fill them. Throws Error naming what does not fit.
  PipelineEngine(const nn::GptConfig& config, const Schedule& schedule, std::vector<int> boundaries,
                 EngineOptions options, const MpiGroups* processes = nullptr);
  ~PipelineEngine();
  PipelineEngine(const PipelineEngine&) = delete;
  PipelineEngine& operator=(const PipelineEngine&) = delete;

  void init_gpt2(std::uint64_t seed);
  // Whole-model weights by name (pipeflow init's or a checkpoint's file);
  // Error naming the file when its model's shape differs from the engine's,
  // and naming the file and the tensor when a float in it is not finite (or
  // a second moment exp_avg_sq.* is negative): nothing is loaded then.
  void load_parameters(const nn::SafetensorsFile& file);

  // A training checkpoint: the whole model's weights as load_parameters reads
  // them (so it also serves as --weights), every stage's AdamW moments by
  // parameter name, the optimizer's step count and `steps_done` (__metadata__
  // "steps_done": the next step to run). Names, not stage numbers, make it
  // independent of the layout: a run may resume under another schedule,
  // stage count or partition. Written atomically; refused (Error naming the
  // tensor) when a parameter is not finite. Collective under MPI: `path` is
  // then a folder of Hugging Face-style shards (nn/safetensors_index.h): each
  // pipeline rank of replica 0 writes its stages' tensors (the tied wte once,
  // the embedding's) and moments (ZeRO-1: gathered from the replicas to it)
  // as model-0000{r+1}-of-0000{p}.safetensors, atomically; after every shard
  // is written world rank 0 writes model.safetensors.index.json, atomically,
  // last (it removes an older index first, and shards of another layout).
  void write_checkpoint(const std::filesystem::path& path, std::int64_t steps_done) const;
  // Loads weights and moments from such a file (or the shards merged:
  // checkpoint_search.h read_checkpoint); returns its steps_done.
  std::int64_t load_checkpoint(const nn::SafetensorsFile& file);

  StepResult step(std::int64_t step, const BatchSource& source, StepMode mode = StepMode::kTrain,
                  RunMode run = RunMode::kThreaded);

  const nn::GptConfig& config() const { return config_; }
  const Schedule& schedule() const { return schedule_; }  // lowered
  const std::vector<int>& boundaries() const { return boundaries_; }
  const EngineOptions& options() const { return options_; }
  int num_stages() const { return static_cast<int>(stages_.size()); }
  // A stage this process holds (all of them in one process; Error for
  // another process's under MPI).
  nn::Stage& stage(StageId s);
  const nn::Stage& stage(StageId s) const;
  // Parameters of stage s, wherever it runs.
  std::int64_t stage_parameter_count(StageId s) const;
  // The AdamW moments this process holds (8 bytes per element of each
  // optimizer's shard), and its stages' parameters Ψ.
  std::int64_t optimizer_state_bytes() const;
  std::int64_t local_parameter_count() const;
  // Under MPI: this process's groups; nullptr in one process.
  const MpiGroups* processes() const { return processes_; }
  // Whether this process reports the run (prints, writes the files): always
  // in one process, world rank 0 under MPI.
  bool is_reporter() const;
  // Sequences per step (m · b) and tokens per step (m · b · T).
  std::int64_t global_batch() const;
  std::int64_t tokens_per_step() const;

  // The first tensor holding a NaN or Inf, as "stage S's parameter NAME" or
  // "stage S's gradient of NAME" (the gradients of the last step), or none.
  enum class Values { kParameters, kGradients };
  std::optional<std::string> first_non_finite(Values values) const;

  // A tensor by name from the stage holding it (the embedding's copy for wte).
  std::span<const float> parameter(std::string_view name) const;
  std::span<const float> gradient(std::string_view name) const;
  // The whole model in one stage (for sampling, evaluation and saving), with
  // the gradients too if `with_gradients` (the tied wte's from the embedding's
  // stage; in one process only). Collective under MPI: nullptr except on
  // world rank 0.
  std::unique_ptr<nn::Stage> assemble_model(bool with_gradients = false) const;

 private:
  enum class FlushStep;
  static const FlushStep kFlushOrder[5];
  struct Flush;

  const nn::Stage& holder(std::string_view name) const;
  // The tensors of this process's stages by name, each once (the tied wte:
  // the embedding stage's copy), with the optimizer's moments if
  // `with_optimizer` (ZeRO-1: gathered at data-parallel rank 0, a collective
  // of the data-parallel group); the whole model in one process.
  nn::SafetensorsWriter local_state(bool with_optimizer) const;
  // Under MPI: replica 0's local_state(false) merged at world rank 0 (a
  // collective; none elsewhere).
  std::optional<nn::SafetensorsFile> gathered_parameters() const;
  // Advances the reductions under way and posts the data-parallel
  // reduce-scatter of the stages whose gradients are complete once action
  // `index` of this process's rank has run.
  void post_reductions_after(std::size_t index);
  void plan_early_reductions(RankId rank);
  void post_reduction(StageId s);
  void reduce_data_parallel(RankWorker& w);
  // ZeRO-1 in force: the optimizers hold shards (EngineOptions::shard_optimizer, d > 1).
  bool sharded() const;
  void gather_parameters(RankWorker& w);
  void gather_results(StepResult& result, Clock::time_point epoch) const;
  void run_threaded(StepMode mode, double lr, Flush& flush);
  void run_serial(StepMode mode, double lr, Flush& flush);
  RankWorker::Outcome flush_step(FlushStep step, RankWorker& w, StepMode mode, RunMode run, double lr, Flush& flush);
  double clip_coefficient(StepMode mode, double grad_norm) const;
  void finish(StepResult& result, Clock::time_point epoch);

  nn::GptConfig config_;
  Schedule schedule_;
  std::vector<int> boundaries_;
  EngineOptions options_;
  // Destroyed last: the workers' and the transport's tensors come from their pools.
  std::vector<std::unique_ptr<nn::Stage>> stages_;  // by stage; nullptr: another process's
  std::vector<std::unique_ptr<nn::AdamW>> optimizers_;  // by stage; nullptr: another process's
  const MpiGroups* processes_;
  std::unique_ptr<Transport> transport_;
  Progress progress_;
  std::vector<std::unique_ptr<RankWorker>> workers_;  // this process's ranks, in rank order
  // Under MPI with d > 1: by action index of this process's rank, the stages
  // whose reduce-scatter may be posted after it; the reductions of this
  // step under way, in the order they were posted (the same on every
  // replica, as MPI requires of a communicator's collectives).
  std::vector<std::vector<StageId>> reduce_after_;
  struct Reduction {
    StageId stage;
    std::unique_ptr<ReduceScatterParts> parts;
    Clock::time_point posted;
  };
  std::vector<Reduction> reductions_;
  // Started at the first threaded step; destroyed (stopped and joined) first.
  std::unique_ptr<RankThreads> threads_;
  std::int64_t current_step_ = 0;
  bool update_failed_ = false;
};

// The in-process inbox capacity for each rank: every message a step of
// `schedule` (lowered) sends it, plus the tied-gradient copy.
std::vector<int> inbox_capacities(const Schedule& schedule);

}  // namespace pipeflow::runtime
