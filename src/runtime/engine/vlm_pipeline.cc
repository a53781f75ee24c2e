#include "pipeflow/runtime/vlm_pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/gradient_clipping.h"
#include "pipeflow/runtime/in_process_transport.h"
#include "pipeflow/schedule/passes.h"

namespace pipeflow::runtime {

namespace {

constexpr std::chrono::seconds kTimeout{120};

}  // namespace

struct VlmPipeline::Slot {
  nn::VlmState state;
  Tensor activation_in, gradient_in, activation_out, gradient_out;
};

// One rank's part of a step: its actions in order.
class VlmPipeline::Rank {
 public:
  Rank(VlmPipeline& pipeline, Transport& transport, std::vector<std::vector<Slot>>& slots,
       const nn::ShapeCaptions& data, std::int64_t step, RankId rank, std::vector<double>& losses)
      : p_(pipeline), transport_(transport), slots_(slots), data_(data), step_(step), rank_(rank), losses_(losses) {}

  void run() {
    for (const Action& a : p_.schedule_.actions(rank_)) {
      if (transport_.aborted()) return;
      switch (a.kind) {
        case ActionKind::kForward:
          forward(a);
          break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput:
          backward_input(a, a.kind == ActionKind::kBackward);
          break;
        case ActionKind::kBackwardWeight:
          p_.stage(a.stage.value()).backward_weight(slot(a).state);
          break;
        case ActionKind::kSendForward:
        case ActionKind::kSendBackward:
          send(a);
          break;
        case ActionKind::kRecvForward:
        case ActionKind::kRecvBackward:
          receive(a);
          break;
      }
    }
  }

 private:
  Slot& slot(const Action& a) {
    return slots_[static_cast<std::size_t>(a.stage.value())][static_cast<std::size_t>(a.microbatch.value())];
  }

  // The activation stage s takes: [b, N, D] up to the projector, [b, N, C]
  // into the LM's embedding, [b, N + T_c, C] after it.
  Shape input_shape(int s) const {
    const nn::VlmConfig& c = p_.config_;
    const int layer = p_.stages_[static_cast<std::size_t>(s)]->layers().first;
    const int n = c.vision.tokens();
    if (layer <= c.projector_layer()) return {p_.micro_batch_, n, c.vision.width};
    if (layer == c.embedding_layer()) return {p_.micro_batch_, n, c.text.n_embd};
    return {p_.micro_batch_, n + nn::ShapeCaptions::kCaptionBytes, c.text.n_embd};
  }

  void forward(const Action& a) {
    Slot& sl = slot(a);
    nn::VlmStage& st = p_.stage(a.stage.value());
    const int b = p_.micro_batch_;
    auto batch = data_.batch(nn::Split::kTrain, step_, static_cast<std::int64_t>(a.microbatch.value()) * b, b,
                             st.allocator());
    nn::VlmInput input;
    if (st.has_images()) {
      input.images = std::move(batch.images);
    } else {
      if (sl.activation_in.empty()) fail("rank {}: {} has no input activation (its RECV_F did not run)", rank_, a);
      input.activation = std::move(sl.activation_in);
    }
    if (st.has_text_embedding()) input.tokens = std::move(batch.tokens);
    if (st.has_head()) input.targets = std::move(batch.targets);
    Tensor out = st.forward(sl.state, std::move(input));
    if (st.has_head()) {
      losses_[static_cast<std::size_t>(a.microbatch.value())] = sl.state.loss();
      return;
    }
    const Action send = *result_send(a);
    if (p_.schedule_.peer_rank(send) == rank_) {
      hand_over(std::move(out), partner(send), false);
    } else {
      sl.activation_out = std::move(out);
    }
  }

  void backward_input(const Action& a, bool with_weight) {
    Slot& sl = slot(a);
    nn::VlmStage& st = p_.stage(a.stage.value());
    Tensor grad;
    if (st.has_head()) {
      const double scale = 1.0 / p_.schedule_.num_microbatches();
      grad = with_weight ? st.backward_from_loss(sl.state, scale) : st.backward_input_from_loss(sl.state, scale);
    } else {
      if (sl.gradient_in.empty() && p_.carries_gradient(a.stage.value())) {
        fail("rank {}: {} has no output gradient (its RECV_B did not run)", rank_, a);
      }
      grad = with_weight ? st.backward(sl.state, std::move(sl.gradient_in))
                         : st.backward_input(sl.state, std::move(sl.gradient_in));
    }
    if (st.has_images() || !p_.carries_gradient(a.stage.value() - 1)) return;
    const Action send = *result_send(a);
    if (p_.schedule_.peer_rank(send) == rank_) {
      hand_over(std::move(grad), partner(send), true);
    } else {
      sl.gradient_out = std::move(grad);
    }
  }

  void hand_over(Tensor tensor, const Action& to, bool gradient) {
    tensor.charge_to(&p_.stage(to.stage.value()).activation_memory());
    Slot& target = slot(to);
    (gradient ? target.gradient_in : target.activation_in) = std::move(tensor);
  }

  MessageKey message_of(const Action& a) const {
    const RankId peer = *p_.schedule_.peer_rank(a);
    const bool forward = a.kind == ActionKind::kSendForward || a.kind == ActionKind::kRecvForward;
    const Direction direction = forward ? Direction::kActivation : Direction::kGradient;
    if (is_send(a.kind)) return {rank_, peer, a.stage, a.microbatch, direction};
    return {peer, rank_, partner(a).stage, a.microbatch, direction};
  }

  void send(const Action& a) {
    if (a.kind == ActionKind::kSendBackward && !p_.carries_gradient(a.stage.value() - 1)) return;
    Slot& sl = slot(a);
    Tensor& payload = a.kind == ActionKind::kSendForward ? sl.activation_out : sl.gradient_out;
    if (payload.empty()) fail("rank {}: {} has nothing to send (its producer did not run)", rank_, a);
    payload.charge_to(nullptr);
    if (transport_.send(message_of(a), std::move(payload), deadline_after(kTimeout)) == WaitStatus::kTimedOut) {
      fail("rank {}: {} timed out", rank_, a);
    }
  }

  void receive(const Action& a) {
    if (a.kind == ActionKind::kRecvBackward && !p_.carries_gradient(a.stage.value())) return;
    Slot& sl = slot(a);
    nn::VlmStage& st = p_.stage(a.stage.value());
    const bool forward = a.kind == ActionKind::kRecvForward;
    Tensor& into = forward ? sl.activation_in : sl.gradient_in;
    // A gradient comes into stage s from s + 1: of stage s + 1's input's shape.
    const Shape shape = input_shape(forward ? a.stage.value() : a.stage.value() + 1);
    const WaitStatus status = transport_.receive(message_of(a), shape, st.allocator(), deadline_after(kTimeout), into);
    if (status == WaitStatus::kTimedOut) fail("rank {}: {} timed out waiting for {}", rank_, a, describe(message_of(a)));
    if (status == WaitStatus::kOk) into.charge_to(&st.activation_memory());
  }

  VlmPipeline& p_;
  Transport& transport_;
  std::vector<std::vector<Slot>>& slots_;
  const nn::ShapeCaptions& data_;
  std::int64_t step_;
  RankId rank_;
  std::vector<double>& losses_;
};

VlmPipeline::VlmPipeline(const nn::VlmConfig& config, const std::vector<nn::LayerRange>& stages,
                         const Schedule& schedule, int micro_batch, nn::VlmStageOptions options,
                         nn::AdamWOptions adam)
    : config_(config),
      schedule_(schedule.has_communication() ? schedule : insert_send_recv(schedule)),
      micro_batch_(micro_batch) {
  if (static_cast<int>(stages.size()) != schedule.num_stages()) {
    fail("vlm pipeline: {} layer ranges for a schedule of {} stages: give one range per stage", stages.size(),
         schedule.num_stages());
  }
  int next = 0;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    if (stages[s].first != next) {
      fail("vlm pipeline: stage {} starts at layer {}, expected {}: the ranges must cover the model in order", s,
           stages[s].first, next);
    }
    next = stages[s].last;
    nn::VlmStageOptions stage_options = options;
    stage_options.name = fmt::format("stage {}", s);
    stages_.push_back(std::make_unique<nn::VlmStage>(config_, stages[s], stage_options));
    optimizers_.push_back(std::make_unique<nn::AdamW>(*stages_.back(), adam));
  }
  if (next != config_.pipeline_layers()) {
    fail("vlm pipeline: the ranges end at layer {}, the model has {}: the last stage must hold the head", next,
         config_.pipeline_layers());
  }
}

VlmPipeline::~VlmPipeline() = default;

bool VlmPipeline::carries_gradient(int s) const {
  const int next = stages_[static_cast<std::size_t>(s) + 1]->layers().first;
  return !(stages_.front()->options().freeze_vision && next <= config_.projector_layer());
}

void VlmPipeline::init_parameters(std::uint64_t seed) {
  for (auto& st : stages_) st->init_parameters(seed);
}

std::unique_ptr<nn::VlmStage> VlmPipeline::assemble_model() const {
  nn::VlmStageOptions options = stages_.front()->options();
  options.name = "the whole model";
  auto whole = std::make_unique<nn::VlmStage>(config_, nn::LayerRange{0, config_.pipeline_layers()}, options);
  for (const auto& st : stages_) {
    for (const nn::ParameterLayout* layout : {&st->layout(), &st->frozen_layout()}) {
      for (const nn::ParameterInfo& info : layout->entries()) {
        const auto from = std::as_const(*st).parameter(info.name);
        std::copy(from.begin(), from.end(), whole->parameter(info.name).begin());
      }
    }
  }
  return whole;
}

VlmPipeline::StepResult VlmPipeline::step(const nn::ShapeCaptions& data, std::int64_t step, double lr,
                                          double max_norm) {
  const int m = schedule_.num_microbatches();
  for (auto& st : stages_) st->zero_gradients();
  std::vector<std::vector<Slot>> slots(stages_.size());
  for (auto& row : slots) row.resize(static_cast<std::size_t>(m));
  std::vector<double> losses(static_cast<std::size_t>(m));
  InProcessTransport transport(std::vector<int>(static_cast<std::size_t>(schedule_.num_ranks()), 2 * m * num_stages()));
  std::mutex failure_mutex;
  std::exception_ptr failure;
  std::vector<std::thread> threads;
  for (int r = 0; r < schedule_.num_ranks(); ++r) {
    threads.emplace_back([&, r] {
      try {
        Rank(*this, transport, slots, data, step, RankId(r), losses).run();
      } catch (...) {
        const std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        transport.abort();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  slots.clear();  // the states, before anything else touches the stages
  if (failure) std::rethrow_exception(failure);
  nn::VlmStage& last = *stages_.back();
  for (auto& st : stages_) {  // the LM's embedding and head on different stages: both wte gradients become the sum
    if (!st->has_text_embedding() || !st->needs_tied_reduction()) continue;
    std::vector<float> mine(st->tied_gradient().begin(), st->tied_gradient().end());
    std::vector<float> theirs(last.tied_gradient().begin(), last.tied_gradient().end());
    st->add_tied_gradient(theirs);
    last.add_tied_gradient(mine);
  }
  double square_sum = 0;
  for (const auto& st : stages_) square_sum += st->gradient_square_sum();
  StepResult result{.loss = 0, .grad_norm = std::sqrt(square_sum)};
  if (const double coefficient = nn::clip_coefficient(result.grad_norm, max_norm); coefficient != 1) {
    const auto factor = static_cast<float>(coefficient);  // as nn::Stage::scale_gradients
    for (auto& st : stages_) {
      for (float& g : st->gradients()) g *= factor;
    }
  }
  for (auto& optimizer : optimizers_) optimizer->step(lr);
  for (const double loss : losses) result.loss += loss;
  result.loss /= m;
  return result;
}

}  // namespace pipeflow::runtime
