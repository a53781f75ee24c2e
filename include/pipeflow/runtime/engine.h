#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/model_config.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/nn/stage.h"
#include "pipeflow/runtime/batch_source.h"
#include "pipeflow/runtime/engine_options.h"
#include "pipeflow/runtime/loss_scaler.h"
#include "pipeflow/runtime/rank_group.h"
#include "pipeflow/runtime/stage_traits.h"
#include "pipeflow/runtime/transport.h"
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
  // fp16: the loss scale this step's backward ran with (1 without one), and
  // the next step's. A skipped step whose scale the scaler could still lower
  // was an overflow: the scaler halves the scale, or spends one of its
  // hysteresis chances and keeps it (LossScaler).
  double loss_scale = 1;
  double next_loss_scale = 1;
  bool overflow = false;
  std::int64_t tokens = 0;      // m · b · T
  double wall_s = 0;            // from the step's start until every rank had finished
  RunMode mode = RunMode::kThreaded;
  std::vector<RankRecord> ranks;
};

// The pipeline engine: p·v nn stages of one kind (StageT: nn::Stage, a
// GPT-2 or Llama; nn::VlmStage, the vision-language model; what differs
// between them is StageTraits') cut from a model by layer boundaries,
// placed on the ranks of a schedule, d data-parallel replicas of that
// pipeline, one RankWorker per rank and an AdamW per stage, on the ranks of a
// RankGroup (threads of this process, or MPI processes: the engine is written
// once, as what each rank does, and never asks which).
//
// A step runs the lowered schedule: gradients accumulate over the m
// micro-batches (loss scale 1/(m·d)), then the flush of RankWorker, so that
// the loss, every gradient and the weights after the update equal those of
// one unpipelined step on the same global batch (up to float rounding),
// whatever the schedule, stage count, replica count or recompute setting.
// Reruns with the same seed and layout give the same bits, threaded or
// serial.
//
// Data parallelism: each stage's gradients are summed over the replicas by
// a reduce-scatter over the data-parallel group (Communicator::
// reduce_scatter_parts), then an all-gather: of the gradients, or under
// ZeRO-1 of the weights each replica updated from its part. A stage's
// reduce-scatter is posted as soon as the rank has run the stage's last B or
// W, so it may advance during the rank's remaining actions, unless the stage
// holds one side of the tied wte: that one waits for the tied exchange at
// the flush. The gradient norm adds every replica's part, in replica order,
// so ZeRO-1 on and off give the same bits.
//
// A step ends with every process holding the loss and the process of world
// rank 0 holding every rank's record of replica 0 (clocks aligned by
// RankGroup::clock_offset_s). The whole-model operations (write_checkpoint,
// assemble_model) are collective: every process calls them.
//
// Errors: a rank that fails (an exception in an action, a timeout) ends the
// step as the rank group's failure policy says: in threads, every other rank
// stops at its next action or wait, step() throws the first failure's error
// and the next step starts clean (states and messages of the failed step are
// dropped), unless the failure came after an optimizer update had begun on
// some rank: then the weights are inconsistent and every later step throws.
// Under mpirun the job ends, naming the process.
//
// GEMMs: each worker's matrix products run on its own thread (tensor/gemm.h
// sets each calling thread's oneDNN/OpenMP threads to one), so N ranks use N
// cores.
//
// Thread safety: one thread drives the engine; stages may be read between
// steps.
class PartsReduction;

template <class StageT>
class BasicPipelineEngine {
 public:
  using Traits = StageTraits<StageT>;
  using Config = typename Traits::Config;
  using Source = typename Traits::Source;

  // `schedule`: compute-only (then lowered with insert_send_recv) or already
  // lowered; it must pass validate(). `boundaries`: num_stages + 1 pipeline
  // layer indices 0 = b0 < … < b_S = L + 2 (see model/partition.h); stage s
  // holds layers [b_s, b_{s+1}). Parameters start zero: init_parameters or
  // load_parameters fill them. Throws Error naming what does not fit.
  // On the ranks of `group` (pipeline p = the schedule's ranks, d replicas;
  // it must outlive the engine):
  BasicPipelineEngine(const Config& config, const Schedule& schedule, std::vector<int> boundaries,
                      EngineOptions options, RankGroup& group);
  // On threads of this process (options.data_parallel replicas):
  BasicPipelineEngine(const Config& config, const Schedule& schedule, std::vector<int> boundaries,
                      EngineOptions options);
  ~BasicPipelineEngine();
  BasicPipelineEngine(const BasicPipelineEngine&) = delete;
  BasicPipelineEngine& operator=(const BasicPipelineEngine&) = delete;

  void init_parameters(std::uint64_t seed);
  // Whole-model weights by name (pipeflow init's or a checkpoint's file, as
  // checkpoint_search.h read_checkpoint reads and checks it); Error naming
  // the file when its model's shape differs from the engine's: nothing is
  // loaded then.
  void load_parameters(const nn::SafetensorsFile& file);

  // A training checkpoint: the whole model's weights as load_parameters reads
  // them (so it also serves as --weights), every stage's AdamW moments by
  // parameter name (ZeRO-1: gathered from the replicas), the optimizer's
  // step count and `steps_done` (__metadata__ "steps_done": the next step to
  // run). Names, not stage numbers, make it independent of the layout: a run
  // may resume under another schedule, stage count, replica count or
  // partition. Refused (Error naming the tensor) when a parameter is not
  // finite. Collective. Written atomically: by one process, one file; when
  // the ranks are spread over processes, `path` is a folder of Hugging
  // Face-style shards (nn/safetensors_index.h): each pipeline rank of
  // replica 0 writes its stages' tensors (the tied wte once, the
  // embedding's) and moments as model-0000{r+1}-of-0000{p}.safetensors; after
  // every shard is written world rank 0 writes model.safetensors.index.json,
  // last (it removes an older index first, and shards of another layout).
  // The metadata also says the precision the run computed in ("precision":
  // fp32, bf16, fp16; the weights are its fp32 masters either way) and, in
  // fp16, the loss scaler's state ("loss_scale.*"), and "run_id": the run
  // that wrote it (the trainer's; "" writes none).
  void write_checkpoint(const std::filesystem::path& path, std::int64_t steps_done,
                        std::string_view run_id = "") const;
  // Loads weights and moments from such a file (or the shards merged:
  // checkpoint_search.h read_checkpoint); returns its steps_done. An fp16 run
  // continues the file's loss scale when it has one (a run of another
  // precision, or none, starts the scale afresh).
  std::int64_t load_checkpoint(const nn::SafetensorsFile& file);

  StepResult step(std::int64_t step, const Source& source, StepMode mode = StepMode::kTrain,
                  RunMode run = RunMode::kThreaded);

  const Config& config() const { return config_; }
  const Schedule& schedule() const { return schedule_; }  // lowered
  const std::vector<int>& boundaries() const { return boundaries_; }
  const EngineOptions& options() const { return options_; }
  int num_stages() const { return schedule_.num_stages(); }
  RankGroup& group() const { return *group_; }
  // A stage of the first replica this process holds (Error for a stage
  // held in other processes only).
  StageT& stage(StageId s);
  const StageT& stage(StageId s) const;
  // Parameters of stage s a rank holds, wherever it runs (with tensor
  // parallelism, each tensor-parallel rank's part).
  std::int64_t stage_parameter_count(StageId s) const;
  // The AdamW moments of the first replica this process holds (8 bytes per
  // element of each optimizer's shard), and its stages' parameters Ψ.
  std::int64_t optimizer_state_bytes() const;
  std::int64_t local_parameter_count() const;
  // Whether this process reports the run (prints, writes the files).
  bool is_reporter() const;
  // Sequences per step (m · b · d) and tokens per step (m · b · d · T).
  std::int64_t global_batch() const;
  std::int64_t tokens_per_step() const;

  // The first tensor holding a NaN or Inf, as "stage S's parameter NAME" or
  // "stage S's gradient of NAME" (the gradients of the last step), or none.
  enum class Values { kParameters, kGradients };
  std::optional<std::string> first_non_finite(Values values) const;

  // A tensor by name from the first replica's stage holding it (the
  // embedding's copy for wte); with tensor parallelism tensor-parallel rank
  // 0's part of a split tensor (assemble_model gathers whole ones).
  std::span<const float> parameter(std::string_view name) const;
  std::span<const float> gradient(std::string_view name) const;
  // The whole model in one stage (for sampling, evaluation and saving), with
  // the gradients too if `with_gradients` (the tied wte's from the
  // embedding's stage). Collective: nullptr except at world rank 0's process.
  std::unique_ptr<StageT> assemble_model(bool with_gradients = false) const;

 private:
  // The flush after the pipeline part, as the phases every rank runs in
  // order. The tied exchange (within a replica) comes before the
  // data-parallel reduction: after a reduce-scatter a replica holds only its
  // part of a stage's gradient, and the two sides' parts of wte are not the
  // same elements.
  enum class FlushStep {
    kPostTiedGradients,
    kReduceTiedGradients,
    kReduceSequenceParallel,
    kReduceDataParallel,
    kGradientNorm,
    kUpdate
  };
  static constexpr FlushStep kFlushOrder[] = {FlushStep::kPostTiedGradients,      FlushStep::kReduceTiedGradients,
                                              FlushStep::kReduceSequenceParallel, FlushStep::kReduceDataParallel,
                                              FlushStep::kGradientNorm,           FlushStep::kUpdate};
  struct Flush;
  struct Replica;
  struct LocalRank;

  BasicPipelineEngine(const Config& config, const Schedule& schedule, std::vector<int> boundaries,
                      EngineOptions options, RankGroup* group, std::unique_ptr<RankGroup> own_group);
  Replica& first_replica() const { return *replicas_.front(); }
  std::size_t local_index(int world_rank) const;  // in ranks_
  LocalRank& local(int world_rank) const;
  const StageT& holder(std::string_view name) const;
  // The tensors of rank r's stages by name, each once (the tied wte: the
  // embedding stage's copy), with its gradients (`with_gradients`) or with
  // the optimizer's moments (`with_optimizer`; ZeRO-1: gathered at
  // data-parallel rank 0, a collective of the data-parallel group).
  nn::SafetensorsWriter rank_state(LocalRank& r, bool with_optimizer, bool with_gradients = false) const;
  // Every pipeline rank's `part` at world rank 0 (empty elsewhere): a
  // collective of r's pipeline; `what` names it.
  std::vector<nn::SafetensorsFile> gather_at_world_rank_0(LocalRank& r, const nn::SafetensorsWriter& part,
                                                          std::string_view what) const;
  void write_checkpoint_rank(LocalRank& r, const std::filesystem::path& path, std::int64_t steps_done,
                             std::string_view run_id) const;
  // Advances the reductions under way and posts the data-parallel
  // reduce-scatter of the stages whose gradients are complete once action
  // `index` of the rank has run.
  void post_reductions_after(LocalRank& r, std::size_t index);
  void plan_early_reductions(LocalRank& r);
  void post_reduction(LocalRank& r, StageId s);
  void reduce_data_parallel(LocalRank& r);
  // Sequence parallelism in force (tensor_parallel > 1): the whole tensors'
  // gradients are summed over the tensor-parallel ranks in the flush.
  bool sequence_parallel() const;
  void reduce_sequence_parallel(LocalRank& r);
  // ZeRO-1 in force: the optimizers hold shards (EngineOptions::shard_optimizer, d > 1).
  bool sharded() const;
  void gather_parameters(LocalRank& r);
  // The step's losses over the world and replica 0's records at world rank
  // 0, into `result` where it is given (the process's first rank).
  void gather_results(LocalRank& r, StepResult* result, Clock::time_point epoch) const;
  void run_threaded(StepMode mode, double lr, Flush& flush, StepResult& result, Clock::time_point epoch);
  void run_serial(StepMode mode, double lr, Flush& flush);
  void abort_transports() const;
  // False when the rank group was aborted (another rank failed).
  bool flush_step(FlushStep step, LocalRank& r, std::size_t index, StepMode mode, RunMode run, double lr, Flush& flush);
  double clip_coefficient(StepMode mode, double grad_norm) const;
  void finish_serial(StepResult& result) const;

  Config config_;
  Schedule schedule_;
  std::vector<int> boundaries_;
  EngineOptions options_;
  std::unique_ptr<RankGroup> own_group_;  // the threads of the in-process constructor
  RankGroup* group_;
  // Destroyed last: the workers' and the transports' tensors come from the stages' pools.
  std::vector<std::unique_ptr<Replica>> replicas_;  // those with a rank here, by data rank
  std::vector<std::unique_ptr<LocalRank>> ranks_;   // this process's ranks, by world rank
  std::int64_t current_step_ = 0;
  bool update_failed_ = false;
  std::optional<LossScaler> scaler_;  // fp16 (EngineOptions::loss_scale)
};

using PipelineEngine = BasicPipelineEngine<nn::Stage>;
using VlmPipelineEngine = BasicPipelineEngine<nn::VlmStage>;

extern template class BasicPipelineEngine<nn::Stage>;
extern template class BasicPipelineEngine<nn::VlmStage>;

// The in-process inbox capacity for each rank: every message a step of
// `schedule` (lowered) sends it, plus the tied-gradient copy.
std::vector<int> inbox_capacities(const Schedule& schedule);

}  // namespace pipeflow::runtime
