#include "engine/rank_worker.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "pipeflow/core/cpu_time.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/units.h"
#include "pipeflow/runtime/noise_scale.h"
#include "pipeflow/schedule/grid.h"

namespace pipeflow::runtime {
namespace {

// After a wait that did not time out.
WorkerOutcome outcome_of(WaitStatus status) {
  return status == WaitStatus::kOk ? WorkerOutcome::kDone : WorkerOutcome::kAborted;
}

double dot(std::span<const float> a, std::span<const float> b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

}  // namespace

template <class StageT>
BasicRankWorker<StageT>::BasicRankWorker(const Schedule& schedule, RankId rank, std::span<StageT* const> stages,
                                         std::span<nn::AdamW* const> optimizers, StageId embedding_stage,
                                         Transport& transport, const EngineOptions& options, Progress& progress)
    : schedule_(&schedule),
      rank_(rank),
      actions_(&schedule.actions(rank)),
      stages_(stages.begin(), stages.end()),
      optimizers_(optimizers.begin(), optimizers.end()),
      own_(schedule.stages_of(rank)),
      transport_(&transport),
      options_(&options),
      progress_(&progress),
      embedding_stage_(embedding_stage) {
  const auto m = static_cast<std::size_t>(schedule.num_microbatches());
  slots_.resize(static_cast<std::size_t>(schedule.chunks_per_rank()) * m);
  losses_.assign(m, std::numeric_limits<double>::quiet_NaN());
  small_tied_.resize(own_.size());
  if (options.noise_scale_interval > 0) {
    noise_microbatch_ = noise_microbatch(schedule, options.data_parallel, options.sequence_parallel).microbatch;
  }
  record_.actions.reserve(actions_->size());
}

template <class StageT>
StageT& BasicRankWorker<StageT>::stage(StageId s) const { return *stages_[static_cast<std::size_t>(s.value())]; }

template <class StageT>
typename BasicRankWorker<StageT>::Slot& BasicRankWorker<StageT>::slot(StageId s, MicrobatchId j) {
  const auto chunk = static_cast<std::size_t>(schedule_->chunk_of(s));
  return slots_[chunk * static_cast<std::size_t>(schedule_->num_microbatches()) + static_cast<std::size_t>(j.value())];
}

template <class StageT>
Deadline BasicRankWorker<StageT>::deadline() const { return deadline_after(options_->timeout); }

template <class StageT>
double BasicRankWorker<StageT>::seconds_since_epoch(Clock::time_point t) const {
  return std::chrono::duration<double>(t - epoch_).count();
}

template <class StageT>
std::int64_t BasicRankWorker<StageT>::live_bytes() const {
  std::int64_t total = 0;
  for (const StageId s : own_) total += stage(s).activation_memory().live_bytes();
  return total;
}

template <class StageT>
bool BasicRankWorker<StageT>::holds_last_stage() const {
  return std::any_of(own_.begin(), own_.end(), [&](StageId s) { return schedule_->is_last_stage(s); });
}

template <class StageT>
void BasicRankWorker<StageT>::release() {
  for (Slot& s : slots_) s = Slot();
}

template <class StageT>
void BasicRankWorker<StageT>::begin_step(std::int64_t step, const Source& source, Clock::time_point epoch,
                            double loss_scale) {
  release();
  source_ = &source;
  loss_scale_ = loss_scale;
  step_ = step;
  epoch_ = epoch;
  std::fill(losses_.begin(), losses_.end(), std::numeric_limits<double>::quiet_NaN());
  for (const StageId s : own_) stage(s).activation_memory().reset_peak();
  record_.actions.clear();
  record_.phases.clear();
  record_.peak_activation_bytes = live_bytes();
  measuring_noise_ = noise_microbatch_ && runtime::measures_noise_scale(step, options_->noise_scale_interval);
  small_square_sum_ = 0;
  for (auto& tied : small_tied_) tied.clear();
  (*progress_)[static_cast<std::size_t>(rank_.value())].store(0, std::memory_order_relaxed);
}

template <class StageT>
void BasicRankWorker<StageT>::zero_gradients() {
  for (const StageId s : own_) stage(s).zero_gradients();
}

template <class StageT>
void BasicRankWorker<StageT>::note_memory(std::int64_t others, StageT& active) {
  record_.peak_activation_bytes =
      std::max(record_.peak_activation_bytes, others + active.activation_memory().peak_bytes());
}

template <class StageT>
WorkerOutcome BasicRankWorker<StageT>::run(std::size_t index, bool block) {
  if (transport_->aborted()) return Outcome::kAborted;
  const Action& a = (*actions_)[index];
  (*progress_)[static_cast<std::size_t>(rank_.value())].store(index, std::memory_order_relaxed);
  if (options_->before_action) options_->before_action(rank_, a);
  StageT& st = stage(a.stage);
  const std::int64_t own = st.activation_memory().live_bytes();
  const std::int64_t others = live_bytes() - own;
  st.activation_memory().reset_peak();
  ActionTiming timing{.action = a};
  const bool compute = is_compute(a.kind);
  const Clock::time_point start = Clock::now();
  const double cpu_start = compute ? thread_cpu_seconds() : 0;  // inside the wall-clock interval
  Outcome outcome = Outcome::kDone;
  switch (a.kind) {
    case ActionKind::kForward:
      forward(a, timing);
      break;
    case ActionKind::kBackward:
      backward_input(a, true, timing);
      break;
    case ActionKind::kBackwardInput:
      backward_input(a, false, timing);
      break;
    case ActionKind::kBackwardWeight:
      st.backward_weight(slot(a.stage, a.microbatch).state);
      break;
    case ActionKind::kSendForward:
    case ActionKind::kSendBackward:
      outcome = send(index, a);
      break;
    case ActionKind::kRecvForward:
    case ActionKind::kRecvBackward:
      outcome = receive(index, a, block, timing);
      break;
  }
  if (outcome != Outcome::kDone) return outcome;
  if (measuring_noise_ && (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) &&
      a.microbatch.value() == *noise_microbatch_) {
    note_small_gradient(a.stage);
  }
  if (compute) timing.cpu_s = thread_cpu_seconds() - cpu_start;
  timing.start_s = seconds_since_epoch(start);
  timing.end_s = seconds_since_epoch(Clock::now());
  if (compute) timing.working_bytes = st.activation_memory().peak_bytes() - own;
  record_.actions.push_back(timing);
  note_memory(others, st);
  if (index + 1 == actions_->size()) {
    (*progress_)[static_cast<std::size_t>(rank_.value())].store(actions_->size(), std::memory_order_relaxed);
  }
  return Outcome::kDone;
}

template <class StageT>
void BasicRankWorker<StageT>::forward(const Action& a, ActionTiming& timing) {
  Slot& sl = slot(a.stage, a.microbatch);
  StageT& st = stage(a.stage);
  const std::int64_t before = st.activation_memory().live_bytes();
  std::int64_t input_bytes = 0;
  typename StageT::Input input;
  const int b = options_->micro_batch;
  // Replica d's micro-batch j is micro-batch d · m + j of the step's global batch.
  const std::int64_t global_microbatch =
      static_cast<std::int64_t>(options_->data_rank) * schedule_->num_microbatches() + a.microbatch.value();
  Traits::load(st, *source_, step_, global_microbatch * b, b, input);
  if (Traits::takes_activation(st)) {
    if (sl.activation_in.empty()) fail("rank {}: {} has no input activation (its RECV_F did not run)", rank_, a);
    input_bytes = sl.activation_in.bytes();
    input.activation = std::move(sl.activation_in);
  }
  Tensor out = st.forward(sl.state, std::move(input));
  timing.held_bytes = st.activation_memory().live_bytes() - before + input_bytes - out.bytes();
  sl.held_bytes = timing.held_bytes;
  if (st.has_head()) {
    losses_[static_cast<std::size_t>(a.microbatch.value())] = sl.state.loss();
    return;
  }
  const Action send = *result_send(a);
  if (schedule_->peer_rank(send) == rank_) {
    hand_over(std::move(out), partner(send).stage, a.microbatch, false);
  } else {
    sl.activation_out = std::move(out);
  }
}

template <class StageT>
void BasicRankWorker<StageT>::backward_input(const Action& a, bool with_weight, ActionTiming& timing) {
  Slot& sl = slot(a.stage, a.microbatch);
  StageT& st = stage(a.stage);
  const std::int64_t before = st.activation_memory().live_bytes();
  std::int64_t input_bytes = 0;
  Tensor grad;
  if (st.has_head()) {
    // The mean loss over the global batch of m · d equal micro-batches (the
    // data-parallel all-reduce sums the d replicas' gradients), times fp16's
    // loss scale.
    const double loss_scale = loss_scale_ / (schedule_->num_microbatches() * options_->data_parallel);
    grad = with_weight ? st.backward_from_loss(sl.state, loss_scale)
                       : st.backward_input_from_loss(sl.state, loss_scale);
  } else {
    if (sl.gradient_in.empty() && Traits::receives_gradient(st)) {
      fail("rank {}: {} has no output gradient (its RECV_B did not run)", rank_, a);
    }
    input_bytes = sl.gradient_in.bytes();
    grad = with_weight ? st.backward(sl.state, std::move(sl.gradient_in))
                       : st.backward_input(sl.state, std::move(sl.gradient_in));
  }
  if (!with_weight) {
    timing.held_bytes = sl.held_bytes + st.activation_memory().live_bytes() - before + input_bytes - grad.bytes();
  }
  if (!Traits::sends_gradient(st)) return;
  const Action send = *result_send(a);
  if (schedule_->peer_rank(send) == rank_) {
    hand_over(std::move(grad), partner(send).stage, a.microbatch, true);
  } else {
    sl.gradient_out = std::move(grad);
  }
}

template <class StageT>
void BasicRankWorker<StageT>::hand_over(Tensor tensor, StageId to, MicrobatchId j, bool gradient) {
  tensor.charge_to(&stage(to).activation_memory());
  Slot& target = slot(to, j);
  (gradient ? target.gradient_in : target.activation_in) = std::move(tensor);
}

template <class StageT>
MessageKey BasicRankWorker<StageT>::message_of(const Action& a) const {
  const std::optional<RankId> peer = schedule_->peer_rank(a);
  if (!peer) {
    fail("rank {}: {} has no partner: stage {} is the pipeline's first or last; run pipeflow validate on the schedule",
         rank_, a, a.stage);
  }
  const bool forward = a.kind == ActionKind::kSendForward || a.kind == ActionKind::kRecvForward;
  const Direction direction = forward ? Direction::kActivation : Direction::kGradient;
  // A message is keyed by its sender: rank, then stage.
  if (is_send(a.kind)) return {rank_, *peer, a.stage, a.microbatch, direction};
  return {*peer, rank_, partner(a).stage, a.microbatch, direction};
}

template <class StageT>
WorkerOutcome BasicRankWorker<StageT>::send(std::size_t index, const Action& a) {
  if (a.kind == ActionKind::kSendBackward && !Traits::sends_gradient(stage(a.stage))) return Outcome::kDone;
  Slot& sl = slot(a.stage, a.microbatch);
  Tensor& payload = a.kind == ActionKind::kSendForward ? sl.activation_out : sl.gradient_out;
  if (payload.empty()) fail("rank {}: {} has nothing to send (its producer did not run)", rank_, a);
  const MessageKey key = message_of(a);
  payload.charge_to(nullptr);  // in flight: charged to nobody until the receiver takes it
  const WaitStatus status = transport_->send(key, std::move(payload), deadline());
  if (status == WaitStatus::kTimedOut) {
    fail_timeout(index, fmt::format("room in rank {}'s inbox to post the {}", key.destination, describe(key)));
  }
  return outcome_of(status);
}

template <class StageT>
WorkerOutcome BasicRankWorker<StageT>::receive(std::size_t index, const Action& a, bool block, ActionTiming& timing) {
  Slot& sl = slot(a.stage, a.microbatch);
  StageT& st = stage(a.stage);
  const bool gradient = a.kind == ActionKind::kRecvBackward;
  if (gradient && !Traits::receives_gradient(st)) return Outcome::kDone;
  Tensor& into = gradient ? sl.gradient_in : sl.activation_in;
  const MessageKey key = message_of(a);
  const Shape shape = Traits::message_shape(st, *options_, gradient);
  if (!block) {
    if (!transport_->try_receive(key, shape, st.allocator(), into)) {
      return transport_->aborted() ? Outcome::kAborted : Outcome::kNotReady;
    }
  } else {
    const Clock::time_point start = Clock::now();
    const WaitStatus status = transport_->receive(key, shape, st.allocator(), deadline(), into);
    timing.wait_s = std::chrono::duration<double>(Clock::now() - start).count();
    if (status == WaitStatus::kTimedOut) fail_timeout(index, describe(key));
    if (status == WaitStatus::kAborted) return Outcome::kAborted;
  }
  into.charge_to(&st.activation_memory());
  return Outcome::kDone;
}

template <class StageT>
std::string BasicRankWorker<StageT>::where_others_are() const {
  std::vector<std::string> where;
  for (int r = 0; r < schedule_->num_ranks(); ++r) {
    if (r == rank_.value()) continue;
    const auto& list = schedule_->actions(RankId(r));
    const std::size_t at = (*progress_)[static_cast<std::size_t>(r)].load(std::memory_order_relaxed);
    if (at == kInAnotherProcess) {
      where.push_back(fmt::format("rank {} runs in another process", r));
      continue;
    }
    where.push_back(at >= list.size() ? fmt::format("rank {} has finished its actions", r)
                                      : fmt::format("rank {} is at {} (position {})", r, list[at], at));
  }
  return where.empty() ? "it is the only rank" : fmt::format("{}", fmt::join(where, "; "));
}

template <class StageT>
void BasicRankWorker<StageT>::fail_timeout(std::size_t index, const std::string& waited_for) const {
  const Action& a = (*actions_)[index];
  fail("rank {} timed out after {} at {} (step {}, position {} of {}): waited for the {}; {}. "
       "If a stage is only slow, raise the timeout (pipeflow train --timeout SECONDS).\n{}",
       rank_, format_seconds(options_->timeout.count()), a, step_, index, actions_->size(), waited_for,
       where_others_are(), render_grid(*schedule_, {GridMark{rank_, index, 1}}));
}

template <class StageT>
void BasicRankWorker<StageT>::fail_flush_timeout(const char* phase, const std::string& waited_for) const {
  fail("rank {} timed out after {} in {} (step {}, after its last action): waited for {}; {}.\n{}", rank_,
       format_seconds(options_->timeout.count()), phase, step_, waited_for, where_others_are(),
       render_grid(*schedule_));
}

// --- The flush ---

template <class StageT>
StageId BasicRankWorker<StageT>::tied_partner(StageId s) const {
  return s == embedding_stage_ ? StageId(schedule_->num_stages() - 1) : embedding_stage_;
}

template <class StageT>
WorkerOutcome BasicRankWorker<StageT>::post_tied_gradients() {
  for (std::size_t i = 0; i < own_.size(); ++i) {
    StageT& st = stage(own_[i]);
    if (!st.needs_tied_reduction()) continue;
    const StageId partner = tied_partner(own_[i]);
    const RankId to = schedule_->rank_of(partner);
    if (to == rank_) continue;
    const auto gradient = st.tied_gradient();
    const bool with_small = sends_small_tied(own_[i]);
    const Shape tied = Traits::tied_shape(st);
    Tensor copy = Tensor::uninitialized({tied[0] * (with_small ? 2 : 1), tied[1]}, st.allocator());
    std::copy(gradient.begin(), gradient.end(), copy.data());
    if (with_small) std::copy(small_tied_[i].begin(), small_tied_[i].end(), copy.data() + gradient.size());
    const MessageKey key{rank_, to, own_[i], MicrobatchId(0), Direction::kTiedGradient};
    copy.charge_to(nullptr);
    const WaitStatus status = transport_->send(key, std::move(copy), deadline());
    if (status == WaitStatus::kTimedOut) {
      fail_flush_timeout("the tied-gradient reduction", fmt::format("room to post the {}", describe(key)));
    }
    if (status == WaitStatus::kAborted) return Outcome::kAborted;
  }
  return Outcome::kDone;
}

template <class StageT>
WorkerOutcome BasicRankWorker<StageT>::reduce_tied_gradients(bool block) {
  for (const StageId s : own_) {
    StageT& st = stage(s);
    if (!st.needs_tied_reduction()) continue;
    const StageId partner = tied_partner(s);
    const RankId from = schedule_->rank_of(partner);
    if (from == rank_) {
      // Both copies on this rank (V placement, one rank): sum once, from the embedding's side.
      if (!Traits::holds_embedding(st)) continue;
      StageT& head = stage(partner);
      const auto mine = st.tied_gradient();
      Tensor copy = Tensor::uninitialized(Traits::tied_shape(st), st.allocator());
      std::copy(mine.begin(), mine.end(), copy.data());
      st.add_tied_gradient(head.tied_gradient());
      head.add_tied_gradient(copy.span());
      if (measuring_noise_) add_small_tied(s, small_tied_[own_index(partner)]);
      continue;
    }
    const MessageKey key{from, rank_, partner, MicrobatchId(0), Direction::kTiedGradient};
    const Shape tied = Traits::tied_shape(st);
    const Shape shape{tied[0] * (sends_small_tied(partner) ? 2 : 1), tied[1]};
    Tensor other;
    if (!block) {
      if (!transport_->try_receive(key, shape, st.allocator(), other)) {
        return transport_->aborted() ? Outcome::kAborted : Outcome::kNotReady;
      }
    } else {
      const WaitStatus status = transport_->receive(key, shape, st.allocator(), deadline(), other);
      if (status == WaitStatus::kTimedOut) fail_flush_timeout("the tied-gradient reduction", "the " + describe(key));
      if (status == WaitStatus::kAborted) return Outcome::kAborted;
    }
    const std::span<const float> received = other.span();
    const std::size_t n = st.tied_gradient().size();
    if (sends_small_tied(partner)) add_small_tied(s, received.subspan(n));
    st.add_tied_gradient(received.first(n));
  }
  return Outcome::kDone;
}

template <class StageT>
std::size_t BasicRankWorker<StageT>::own_index(StageId s) const {
  return static_cast<std::size_t>(std::find(own_.begin(), own_.end(), s) - own_.begin());
}

// The head's side (any stage but the embedding's) sends its gradient of
// j* after its tied copy.
template <class StageT>
bool BasicRankWorker<StageT>::sends_small_tied(StageId s) const { return measuring_noise_ && s != embedding_stage_; }

template <class StageT>
void BasicRankWorker<StageT>::note_small_gradient(StageId s) {
  StageT& st = stage(s);
  small_square_sum_ += st.gradient_square_sum();  // |a|² on the embedding's stage, no wte on the head's
  if (!st.needs_tied_reduction()) return;
  const std::span<const float> tied = st.tied_gradient();
  small_tied_[own_index(s)].assign(tied.begin(), tied.end());
  if (!Traits::holds_embedding(st)) small_square_sum_ += dot(tied, tied);  // |b|²
}

// |a + b|² = |a|² + 2 a·b + |b|²: the embedding's rank adds the cross term.
template <class StageT>
void BasicRankWorker<StageT>::add_small_tied(StageId embedding, std::span<const float> head_small) {
  const std::vector<float>& mine = small_tied_[own_index(embedding)];
  if (mine.size() != head_small.size()) {
    fail("rank {}: the tied embedding's gradients of the noise micro-batch have {} and {} elements (a stage missed its "
         "weight gradient of micro-batch {})",
         rank_, mine.size(), head_small.size(), noise_microbatch_.value_or(-1));
  }
  small_square_sum_ += 2 * dot(mine, head_small);
}

template <class StageT>
double BasicRankWorker<StageT>::gradient_square_sum() const {
  double total = 0;
  for (const StageId s : own_) {
    const StageT& st = stage(s);
    const nn::OptimizerShard part =
        nn::OptimizerShard::of(st.layout().total(), options_->data_parallel, options_->data_rank);
    total += st.gradient_square_sum(part.begin, part.end);
  }
  return total;
}

template <class StageT>
WorkerOutcome BasicRankWorker<StageT>::all_reduce_sum(double& value) {
  const WaitStatus status = transport_->all_reduce_sum(rank_, value, deadline());
  if (status == WaitStatus::kTimedOut) fail_flush_timeout("the gradient-norm all-reduce", "every rank's square sum");
  return outcome_of(status);
}

template <class StageT>
void BasicRankWorker<StageT>::apply_update(double factor, double lr) {
  for (const StageId s : own_) {
    const Clock::time_point start = Clock::now();
    if (factor != 1) stage(s).scale_gradients(factor);
    optimizers_[static_cast<std::size_t>(s.value())]->step(lr);
    record_phase(FlushPhase::kOptimizer, s, start);
  }
}

template <class StageT>
void BasicRankWorker<StageT>::complete_sends() {
  if (transport_->complete_sends(rank_, deadline()) == WaitStatus::kTimedOut) {
    fail_flush_timeout("the end of the step", "its messages to be taken by their ranks");
  }
}

template <class StageT>
void BasicRankWorker<StageT>::record_phase(FlushPhase phase, Clock::time_point start) { record_phase(phase, own_.front(), start); }

template <class StageT>
void BasicRankWorker<StageT>::record_phase(FlushPhase phase, StageId s, Clock::time_point start) {
  record_.phases.push_back({phase, s, seconds_since_epoch(start), seconds_since_epoch(Clock::now())});
}

template class BasicRankWorker<nn::Stage>;
template class BasicRankWorker<nn::VlmStage>;

}  // namespace pipeflow::runtime
