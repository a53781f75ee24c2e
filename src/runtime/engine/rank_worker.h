#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pipeflow/core/ids.h"
#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/shape_captions.h"
#include "pipeflow/nn/stage.h"
#include "pipeflow/nn/vision_language_model.h"
#include "pipeflow/runtime/batch_source.h"
#include "pipeflow/runtime/engine_options.h"
#include "pipeflow/runtime/stage_traits.h"
#include "pipeflow/runtime/step_record.h"
#include "pipeflow/runtime/transport.h"
#include "pipeflow/schedule/schedule.h"

namespace pipeflow::runtime {

// Where every rank of a step is: the index of the action it runs or waits at
// (its list's size once done), for the timeout message. One atomic per rank;
// kInAnotherProcess for a rank this process does not run (under MPI).
using Progress = std::vector<std::atomic<std::size_t>>;
inline constexpr std::size_t kInAnotherProcess = static_cast<std::size_t>(-1);

enum class WorkerOutcome { kDone, kNotReady, kAborted };

// One pipeline rank: executes its action list of a lowered schedule on the
// nn stages it holds, one action at a time, and then does its part of the
// flush (tied gradients, global norm, optimizer step). The engine drives
// workers from one thread each (PipelineEngine::step) or all from one thread
// in a valid order (the emulated run); the arithmetic is the same.
//
// Per action (stage s, micro-batch j, b = micro_batch):
//   F  the stages that load data (StageTraits::load: the first stage, the
//      last for its targets, the VLM's LM embedding for its text) take
//      samples j·b … (j+1)·b − 1 of the step from the source (replica d of
//      a data-parallel run: micro-batch d·m + j); the others take the
//      activation received (or handed over on the rank); the last stage's
//      forward gives micro-batch j's loss.
//   B/I the last stage starts from loss_scale · loss with loss_scale =
//      1/(m·d) (the mean over the global batch of m·d equal micro-batches,
//      d data-parallel replicas); the others from the gradient received.
//   W  adds micro-batch j's weight gradients.
//   SEND/RECV move the output / gradient through the transport, keyed
//      (source, destination, stage, micro-batch, direction).
// An output whose consumer stage is on the same rank (V turn, one rank) is
// handed over directly, as the lowered schedule has no SEND/RECV for it.
//
// Memory: every tensor is charged to the activation account of the stage
// that holds it; a message in flight is charged to nobody (the sender
// uncharges it, the receiver charges it on arrival), so only a rank's own
// thread changes its stages' accounts and each action's bytes can be measured.
//
// Ownership: the worker borrows the stages, optimizers, transport and source;
// it owns the micro-batch states and the tensors in flight on its side, which
// must be destroyed (release() or the destructor) before the stages.
//
// Thread safety: one thread at a time per worker. Stages are not shared
// between workers.
template <class StageT>
class BasicRankWorker {
 public:
  using Outcome = WorkerOutcome;
  using Traits = StageTraits<StageT>;
  using Source = typename Traits::Source;

  // `stages` and `optimizers` are indexed by global stage; only this rank's
  // entries are used. `embedding_stage`: the stage holding the tied
  // embedding (StageTraits::embedding_stage; the head's is the last).
  // `progress` has one entry per rank.
  BasicRankWorker(const Schedule& schedule, RankId rank, std::span<StageT* const> stages,
                  std::span<nn::AdamW* const> optimizers, StageId embedding_stage, Transport& transport,
                  const EngineOptions& options, Progress& progress);

  RankId rank() const { return rank_; }
  std::size_t size() const { return actions_->size(); }

  // Clears what an earlier (possibly failed) step left and starts the
  // step's records at `epoch`; zero_gradients() next, before the first action.
  // `loss_scale`: fp16's, which the last stage's backward starts from (1: none).
  void begin_step(std::int64_t step, const Source& source, Clock::time_point epoch, double loss_scale = 1);
  // Zeroes the rank's stages' gradients. Called on the rank's own thread
  // (threaded), so that the ranks zero theirs at once, each on the core that
  // then accumulates into them: in begin_step, on the caller's thread one
  // rank after another, it was most of the 60-100 µs before either rank
  // could start (bench_runtime_pipeline's small model, a 7-9 ms step). What
  // the core's cache gains from it was not measured apart.
  void zero_gradients();

  // Runs action `index` of the list. A RECV whose message has not arrived
  // returns kNotReady at once unless `block` (then it waits up to the
  // timeout). kAborted: the transport was aborted. Throws Error on a timeout
  // (naming the rank, the action, the message it waited for and where every
  // rank is, with the schedule grid and the cell marked) and on any failure
  // of the action itself.
  Outcome run(std::size_t index, bool block);

  // The flush, in this order on every rank (each returns kAborted if the
  // transport was aborted):
  //   post_tied_gradients: a stage holding only one side of the tied wte
  //     sends a copy of its gradient to the stage holding the other side;
  //   reduce_tied_gradients: adds the other side's copy (received, or on
  //     this rank), so both copies hold the sum;
  //   gradient_square_sum: Σ g² over the rank's stages, tied counted once
  //     (of a data-parallel replica's part of each stage, the one
  //     nn::OptimizerShard::of gives it: the engine adds the replicas'),
  //     then (threaded) all_reduce_sum over the ranks, in rank order;
  //     small_square_sum likewise on a step that measures the noise scale;
  //   apply_update: scales the gradients by `factor` (the clip coefficient
  //     over fp16's loss scale; unless 1) and runs AdamW
  //     with `lr` on every stage (each recorded as a kOptimizer phase).
  Outcome post_tied_gradients();
  Outcome reduce_tied_gradients(bool block);
  double gradient_square_sum() const;
  // The gradient noise scale (runtime/noise_scale.h): on a step that
  // measures it (EngineOptions::noise_scale_interval), each stage's
  // gradient is read right after its weight gradient of the noise
  // micro-batch j* completes (the first B or W of the stage, so the
  // gradient is j*'s alone): Σ g² but for the tied wte, whose two halves
  // (embedding a, head b) are kept and the head's sent along with its tied
  // copy, so that the embedding's rank adds |a + b|². small_square_sum is
  // the rank's part of |g_j*|² (with the loss scale of the step).
  bool measures_noise_scale() const { return measuring_noise_; }
  double small_square_sum() const { return small_square_sum_; }
  Outcome all_reduce_sum(double& value);
  void apply_update(double factor, double lr);
  // After the flush (threaded): waits until every message the rank sent has
  // left it; Error naming the step on a timeout.
  void complete_sends();
  // Records a flush phase of the rank (of its stage `s`) that ran from `start` to now.
  void record_phase(FlushPhase phase, Clock::time_point start);
  void record_phase(FlushPhase phase, StageId s, Clock::time_point start);

  // Micro-batch j's loss (the rank holding the last stage; NaN elsewhere).
  double microbatch_loss(int j) const { return losses_[static_cast<std::size_t>(j)]; }
  bool holds_last_stage() const;
  const RankRecord& record() const { return record_; }
  double seconds_since_epoch(Clock::time_point t) const;

  // Destroys every micro-batch state and tensor the worker holds.
  void release();

 private:
  struct Slot {
    typename StageT::State state;
    Tensor activation_in;   // the stage's input, received or handed over
    Tensor gradient_in;     // ∂L/∂output, received or handed over
    Tensor activation_out;  // the output, until its SEND_F
    Tensor gradient_out;    // ∂L/∂input, until its SEND_B
    std::int64_t held_bytes = 0;  // what its F left held (ActionTiming::held_bytes)
  };

  StageT& stage(StageId s) const;
  Slot& slot(StageId s, MicrobatchId j);
  Deadline deadline() const;
  std::int64_t live_bytes() const;
  void note_memory(std::int64_t others, StageT& active);

  void forward(const Action& a, ActionTiming& timing);
  void backward_input(const Action& a, bool with_weight, ActionTiming& timing);
  Outcome send(std::size_t index, const Action& a);
  Outcome receive(std::size_t index, const Action& a, bool block, ActionTiming& timing);
  void hand_over(Tensor tensor, StageId to, MicrobatchId j, bool gradient);
  MessageKey message_of(const Action& a) const;
  StageId tied_partner(StageId s) const;
  std::size_t own_index(StageId s) const;
  bool sends_small_tied(StageId s) const;
  void note_small_gradient(StageId s);
  void add_small_tied(StageId embedding, std::span<const float> head_small);
  std::string where_others_are() const;
  [[noreturn]] void fail_timeout(std::size_t index, const std::string& waited_for) const;
  [[noreturn]] void fail_flush_timeout(const char* phase, const std::string& waited_for) const;

  const Schedule* schedule_;
  RankId rank_;
  const std::vector<Action>* actions_;
  std::vector<StageT*> stages_;  // global stage -> stage (nullptr: another rank's)
  std::vector<nn::AdamW*> optimizers_;
  std::vector<StageId> own_;        // this rank's stages
  Transport* transport_;
  const EngineOptions* options_;
  double loss_scale_ = 1;  // this step's (begin_step)
  Progress* progress_;
  std::vector<Slot> slots_;  // [chunk * m + j]
  std::vector<double> losses_;
  // The noise scale: the micro-batch measured (none: never), whether this
  // step measures it, the rank's part of |g_j*|², and per own stage holding
  // one side of the tied wte, that side's gradient of j*.
  std::optional<int> noise_microbatch_;
  bool measuring_noise_ = false;
  double small_square_sum_ = 0;
  std::vector<std::vector<float>> small_tied_;
  StageId embedding_stage_;  // the one holding the tied embedding (the head is on the last)
  const Source* source_ = nullptr;
  std::int64_t step_ = 0;
  Clock::time_point epoch_;
  RankRecord record_;
};

using RankWorker = BasicRankWorker<nn::Stage>;
using VlmRankWorker = BasicRankWorker<nn::VlmStage>;

extern template class BasicRankWorker<nn::Stage>;
extern template class BasicRankWorker<nn::VlmStage>;

}  // namespace pipeflow::runtime
