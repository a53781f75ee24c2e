#include "pipeflow/runtime/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/gradient_clipping.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/parameter_layout.h"
#include "pipeflow/schedule/passes.h"
#include "pipeflow/schedule/validate.h"

namespace pipeflow::runtime {
namespace {

// The schedule is checked as given before it is lowered: lowering an invalid
// one would bury its violations under the SEND/RECV it got wrong (a stage on
// two ranks read from a CSV) or fail as a deadlock without naming the cause.
Schedule lowered_and_valid(const Schedule& schedule) {
  const ValidationReport report = validate(schedule);
  if (!report.ok()) fail("schedule {} cannot run:\n{}", schedule.name(), report.render(schedule));
  if (schedule.has_communication()) return schedule;
  Schedule lowered = insert_send_recv(schedule);
  const ValidationReport lowered_report = validate(lowered);
  if (!lowered_report.ok()) {
    fail("schedule {} cannot run once lowered:\n{}", schedule.name(), lowered_report.render(lowered));
  }
  return lowered;
}

void check_boundaries(const nn::GptConfig& config, const Schedule& schedule, const std::vector<int>& b) {
  const int layers = config.pipeline_layers();
  const int stages = schedule.num_stages();
  if (static_cast<int>(b.size()) != stages + 1) {
    fail("partition has {} boundaries for {} stages: needs stages + 1 = {} (0 … {})", b.size(), stages, stages + 1,
         layers);
  }
  if (b.front() != 0 || b.back() != layers) {
    fail("partition boundaries [{}] must run from 0 to the model's {} pipeline layers", fmt::join(b, ", "), layers);
  }
  for (std::size_t i = 1; i < b.size(); ++i) {
    if (b[i] <= b[i - 1]) {
      fail("partition boundaries [{}] must increase: stage {} would hold no layer (a schedule of {} stages needs "
           "at least {} pipeline layers)",
           fmt::join(b, ", "), i - 1, stages, stages);
    }
  }
}

}  // namespace

std::vector<int> inbox_capacities(const Schedule& schedule) {
  std::vector<int> capacity(static_cast<std::size_t>(schedule.num_ranks()), 1);  // + the tied gradient
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    for (const Action& a : schedule.actions(RankId(r))) {
      if (is_recv(a.kind)) ++capacity[static_cast<std::size_t>(r)];
    }
  }
  return capacity;
}

PipelineEngine::PipelineEngine(const nn::GptConfig& config, const Schedule& schedule, std::vector<int> boundaries,
                               EngineOptions options)
    : config_(config),
      schedule_(lowered_and_valid(schedule)),
      boundaries_(std::move(boundaries)),
      options_(std::move(options)),
      progress_(static_cast<std::size_t>(schedule_.num_ranks())) {
  config_.validate();
  check_boundaries(config_, schedule_, boundaries_);
  if (options_.micro_batch < 1) fail("train_micro_batch_size_per_gpu = {}: must be >= 1", options_.micro_batch);
  if (options_.sequence_length < 0 || options_.sequence_length > config_.context) {
    fail("sequence length {} must lie in [1, {}] (the model's context), or 0 for the context", options_.sequence_length,
         config_.context);
  }
  if (options_.timeout.count() <= 0) fail("timeout = {} s: must be > 0", options_.timeout.count());
  std::vector<nn::Stage*> stages;
  std::vector<nn::AdamW*> optimizers;
  for (int s = 0; s < schedule_.num_stages(); ++s) {
    const nn::LayerRange range{boundaries_[static_cast<std::size_t>(s)], boundaries_[static_cast<std::size_t>(s) + 1]};
    stages_.push_back(std::make_unique<nn::Stage>(
        config_, range, nn::StageOptions{options_.checkpoint_interval, fmt::format("stage {}", s)}));
    optimizers_.push_back(std::make_unique<nn::AdamW>(*stages_.back(), options_.optimizer));
    stages.push_back(stages_.back().get());
    optimizers.push_back(optimizers_.back().get());
  }
  transport_ = std::make_unique<InProcessTransport>(inbox_capacities(schedule_));
  for (int r = 0; r < schedule_.num_ranks(); ++r) {
    workers_.push_back(std::make_unique<RankWorker>(schedule_, RankId(r), stages, optimizers, *transport_, options_,
                                                    progress_));
  }
}

PipelineEngine::~PipelineEngine() {
  for (auto& worker : workers_) worker->release();
  transport_->reset();
}

void PipelineEngine::init_gpt2(std::uint64_t seed) {
  for (auto& stage : stages_) stage->init_gpt2(seed);
}

void PipelineEngine::load_parameters(const nn::SafetensorsFile& file) {
  const nn::GptConfig stored = nn::read_config(file);
  if (!(stored == config_)) {
    fail("{}: holds a model with {} layers, {} heads, width {}, context {}, vocab {}; the run's model has {}, {}, {}, "
         "{}, {}",
         file.source(), stored.n_layer, stored.n_head, stored.n_embd, stored.context, stored.vocab_size,
         config_.n_layer, config_.n_head, config_.n_embd, config_.context, config_.vocab_size);
  }
  for (auto& stage : stages_) nn::load_parameters(*stage, file);
}

void PipelineEngine::write_checkpoint(const std::filesystem::path& path, std::int64_t steps_done) const {
  if (update_failed_) fail("cannot write checkpoint {}: an optimizer update failed and the weights are inconsistent",
                           path.string());
  nn::SafetensorsWriter writer;
  nn::write_config(writer, config_);
  const nn::ParameterLayout whole_model(config_, nn::all_layers(config_));
  for (const nn::ParameterInfo& info : whole_model.entries()) {
    writer.add(info.name, parameter(info.name), info.shape);  // the tied wte from the embedding's stage
  }
  for (const auto& optimizer : optimizers_) optimizer->add_state(writer);
  writer.set_metadata("steps_done", std::to_string(steps_done));
  writer.write(path);
}

std::int64_t PipelineEngine::load_checkpoint(const nn::SafetensorsFile& file) {
  const std::int64_t steps_done = file.metadata_count("steps_done");
  load_parameters(file);
  for (auto& optimizer : optimizers_) optimizer->load_state(file);
  return steps_done;
}

const nn::Stage& PipelineEngine::holder(std::string_view name) const {
  for (const auto& stage : stages_) {
    if (stage->layout().find(name) != nullptr) return *stage;
  }
  fail("the model has no tensor named {}", name);
}

std::span<const float> PipelineEngine::parameter(std::string_view name) const { return holder(name).parameter(name); }
std::span<const float> PipelineEngine::gradient(std::string_view name) const { return holder(name).gradient(name); }

std::unique_ptr<nn::Stage> PipelineEngine::assemble_model(bool with_gradients) const {
  auto model = std::make_unique<nn::Stage>(config_, nn::all_layers(config_), nn::StageOptions{0, "model"});
  for (const nn::ParameterInfo& info : model->layout().entries()) {
    const nn::Stage& from = holder(info.name);
    std::copy(from.parameter(info.name).begin(), from.parameter(info.name).end(),
              model->parameter(info.name).begin());
    if (with_gradients) {
      std::copy(from.gradient(info.name).begin(), from.gradient(info.name).end(), model->gradient(info.name).begin());
    }
  }
  return model;
}

std::int64_t PipelineEngine::global_batch() const {
  return static_cast<std::int64_t>(schedule_.num_microbatches()) * options_.micro_batch;
}

std::int64_t PipelineEngine::tokens_per_step() const {
  return global_batch() * (options_.sequence_length > 0 ? options_.sequence_length : config_.context);
}

StepResult PipelineEngine::step(std::int64_t step, const BatchSource& source, StepMode mode, RunMode run) {
  if (update_failed_) {
    fail("the pipeline failed during an optimizer update in step {}: its weights are no longer consistent; start "
         "the run again",
         current_step_);
  }
  current_step_ = step;
  transport_->reset();
  const Clock::time_point epoch = Clock::now();
  for (auto& worker : workers_) worker->begin_step(step, source, epoch);
  StepResult result;
  result.step = step;
  result.mode = run;
  result.tokens = tokens_per_step();
  result.lr = options_.lr_schedule.lr(step);
  if (run == RunMode::kThreaded) {
    run_threaded(mode, result);
  } else {
    run_serial(mode, result);
  }
  result.wall_s = std::chrono::duration<double>(Clock::now() - epoch).count();
  finish(mode, result);
  return result;
}

// One thread per rank. A failing worker records its error and aborts the
// transport; the others return at their next action or wait; all are joined
// before the first error is rethrown.
void PipelineEngine::run_threaded(StepMode mode, StepResult& result) {
  std::mutex error_mutex;
  std::exception_ptr first_error;
  std::atomic<bool> updating{false};
  double square_sum = 0;
  auto body = [&](RankWorker& w) {
    try {
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (w.run(i, true) == RankWorker::Outcome::kAborted) return;
      }
      Clock::time_point start = Clock::now();
      if (w.post_tied_gradients() == RankWorker::Outcome::kAborted) return;
      if (w.reduce_tied_gradients(true) == RankWorker::Outcome::kAborted) return;
      w.record_phase(FlushPhase::kTiedGradients, start);
      start = Clock::now();
      double sum = w.gradient_square_sum();
      if (w.all_reduce_sum(sum) == RankWorker::Outcome::kAborted) return;
      w.record_phase(FlushPhase::kGradientNorm, start);
      if (w.rank().value() == 0) square_sum = sum;
      if (mode == StepMode::kTrain) {
        updating.store(true);
        w.apply_update(nn::clip_coefficient(std::sqrt(sum), options_.gradient_clipping), result.lr);
      }
    } catch (...) {
      {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      transport_->abort();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers_.size());
  try {
    for (auto& worker : workers_) threads.emplace_back(body, std::ref(*worker));
  } catch (...) {
    transport_->abort();
    for (auto& thread : threads) thread.join();
    throw;
  }
  for (auto& thread : threads) thread.join();
  if (first_error) {
    if (updating.load()) update_failed_ = true;
    for (auto& worker : workers_) worker->release();
    std::rethrow_exception(first_error);
  }
  result.grad_norm = std::sqrt(square_sum);
}

// Every rank on this thread: passes over the ranks, each running as far as
// its messages allow, until all lists are done; then the flush phase by
// phase, summing the square sums in rank order as the all-reduce does.
void PipelineEngine::run_serial(StepMode mode, StepResult& result) {
  try {
    std::vector<std::size_t> next(workers_.size(), 0);
    for (bool done = false; !done;) {
      done = true;
      bool moved = false;
      for (std::size_t r = 0; r < workers_.size(); ++r) {
        RankWorker& w = *workers_[r];
        while (next[r] < w.size() && w.run(next[r], false) == RankWorker::Outcome::kDone) {
          ++next[r];
          moved = true;
        }
        done = done && next[r] == w.size();
      }
      if (!done && !moved) fail("serial run of {} is stuck although the schedule validated", schedule_.name());
    }
    std::vector<Clock::time_point> start(workers_.size());
    for (std::size_t r = 0; r < workers_.size(); ++r) {
      start[r] = Clock::now();
      workers_[r]->post_tied_gradients();
    }
    double square_sum = 0;
    for (std::size_t r = 0; r < workers_.size(); ++r) {
      if (workers_[r]->reduce_tied_gradients(false) != RankWorker::Outcome::kDone) {
        fail("serial run: rank {}'s tied-gradient copy was not posted", r);
      }
      workers_[r]->record_phase(FlushPhase::kTiedGradients, start[r]);
    }
    for (auto& worker : workers_) {
      const Clock::time_point begin = Clock::now();
      square_sum += worker->gradient_square_sum();
      worker->record_phase(FlushPhase::kGradientNorm, begin);
    }
    result.grad_norm = std::sqrt(square_sum);
    if (mode == StepMode::kTrain) {
      const double clip = nn::clip_coefficient(result.grad_norm, options_.gradient_clipping);
      for (auto& worker : workers_) {
        update_failed_ = true;  // until every rank's update has finished
        worker->apply_update(clip, result.lr);
      }
      update_failed_ = false;
    }
  } catch (...) {
    for (auto& worker : workers_) worker->release();
    throw;
  }
}

void PipelineEngine::finish(StepMode mode, StepResult& result) {
  const int m = schedule_.num_microbatches();
  for (const auto& worker : workers_) {
    if (!worker->holds_last_stage()) continue;
    double sum = 0;
    for (int j = 0; j < m; ++j) {
      result.microbatch_losses.push_back(worker->microbatch_loss(j));
      sum += worker->microbatch_loss(j);
    }
    result.loss = sum / m;
  }
  result.clip_coefficient =
      mode == StepMode::kTrain ? nn::clip_coefficient(result.grad_norm, options_.gradient_clipping) : 1.0;
  for (const auto& worker : workers_) result.ranks.push_back(worker->record());
}

}  // namespace pipeflow::runtime
