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
#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/in_process_transport.h"
#include "engine/rank_worker.h"
#include "pipeflow/schedule/passes.h"

namespace pipeflow::runtime {

namespace {

constexpr std::chrono::seconds kTimeout{120};

}  // namespace

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
  EngineOptions options;
  options.micro_batch = micro_batch_;
  options.seq_length = config_.vision.tokens() + nn::ShapeCaptions::kCaptionBytes;
  options.timeout = kTimeout;
  std::vector<nn::VlmStage*> stages;
  std::vector<nn::AdamW*> optimizers;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    stages.push_back(stages_[s].get());
    optimizers.push_back(optimizers_[s].get());
  }
  InProcessTransport transport(inbox_capacities(schedule_));
  Progress progress(static_cast<std::size_t>(schedule_.num_ranks()));
  std::vector<std::unique_ptr<VlmRankWorker>> workers;
  const Clock::time_point epoch = Clock::now();
  for (int r = 0; r < schedule_.num_ranks(); ++r) {
    workers.push_back(std::make_unique<VlmRankWorker>(schedule_, RankId(r), stages, optimizers, transport, options,
                                                      progress));
    workers.back()->begin_step(step, data, epoch);
  }
  // Each rank: its actions, then the flush (the tied wte's two gradients
  // summed, the global norm over the ranks, clipping and AdamW).
  StepResult result;
  std::mutex failure_mutex;
  std::exception_ptr failure;
  std::vector<std::thread> threads;
  for (auto& worker : workers) {
    threads.emplace_back([&, w = worker.get()] {
      try {
        for (std::size_t i = 0; i < w->size(); ++i) {
          if (w->run(i, true) == WorkerOutcome::kAborted) return;
        }
        if (w->post_tied_gradients() == WorkerOutcome::kAborted) return;
        if (w->reduce_tied_gradients(true) == WorkerOutcome::kAborted) return;
        double square_sum = w->gradient_square_sum();
        if (w->all_reduce_sum(square_sum) == WorkerOutcome::kAborted) return;
        const double norm = std::sqrt(square_sum);
        w->apply_update(nn::clip_coefficient(norm, max_norm), lr);
        w->complete_sends();
        if (w->rank() == RankId(0)) result.grad_norm = norm;
      } catch (...) {
        const std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        transport.abort();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& worker : workers) {
    if (!worker->holds_last_stage()) continue;
    for (int j = 0; j < m; ++j) result.loss += worker->microbatch_loss(j);
  }
  for (auto& worker : workers) worker->release();  // the states, before anything else touches the stages
  transport.reset();
  if (failure) std::rethrow_exception(failure);
  result.loss /= m;
  return result;
}

}  // namespace pipeflow::runtime
