#include "pipeflow/runtime/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <optional>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/gradient_clipping.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/parameter_layout.h"
#include "pipeflow/schedule/passes.h"
#include "pipeflow/runtime/rank_threads.h"
#include "pipeflow/runtime/report.h"
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

// A weights file or checkpoint holding a NaN or Inf would train on silently
// into NaN, and a negative second moment makes AdamW's square root NaN: such
// a file is refused before anything of it is loaded.
void check_values(const nn::SafetensorsFile& file) {
  for (const std::string& name : file.names()) {
    if (file.entry(name).dtype != nn::Dtype::kF32) continue;
    const Tensor values = file.floats(name);
    const bool second_moment = name.starts_with("exp_avg_sq.");
    for (std::int64_t i = 0; i < values.numel(); ++i) {
      const float v = values.data()[i];
      if (std::isfinite(v) && !(second_moment && v < 0)) continue;
      fail("{}: tensor {} holds {} at index {}: {}; start from another file or an earlier checkpoint", file.source(),
           name, v, i, second_moment ? "a second moment must be finite and >= 0" : "values must be finite");
    }
  }
}

// The first non-finite value of `values` within the tensors of `layout`: the tensor's name.
std::optional<std::string> non_finite_tensor(const nn::ParameterLayout& layout, std::span<const float> values) {
  for (const nn::ParameterInfo& info : layout.entries()) {
    const auto tensor = values.subspan(static_cast<std::size_t>(info.offset), static_cast<std::size_t>(info.numel()));
    if (!std::all_of(tensor.begin(), tensor.end(), [](float v) { return std::isfinite(v); })) return info.name;
  }
  return std::nullopt;
}

// A non-finite loss must skip the update on every rank, but only the rank of
// the last stage sees it: it joins the all-reduced square sum as 0 · loss,
// which is +0 for a finite loss (the sum keeps its bits) and NaN otherwise.
double loss_guard(const RankWorker& w, int microbatches) {
  if (!w.holds_last_stage()) return 0;
  double guard = 0;
  for (int j = 0; j < microbatches; ++j) guard += 0.0 * w.microbatch_loss(j);
  return guard;
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
  if (options_.seq_length < 1 || options_.seq_length > config_.context) {
    fail("seq_length {} must lie in [1, {}] (the model's context)", options_.seq_length, config_.context);
  }
  if (options_.timeout.count() <= 0) fail("timeout = {} s: must be > 0", options_.timeout.count());
  std::vector<nn::Stage*> stages;
  std::vector<nn::AdamW*> optimizers;
  for (int s = 0; s < schedule_.num_stages(); ++s) {
    const nn::LayerRange range{boundaries_[static_cast<std::size_t>(s)], boundaries_[static_cast<std::size_t>(s) + 1]};
    stages_.push_back(std::make_unique<nn::Stage>(
        config_, range, nn::StageOptions{options_.recompute_interval, fmt::format("stage {}", s)}));
    optimizers_.push_back(std::make_unique<nn::AdamW>(*stages_.back(), options_.optimizer));
    stages.push_back(stages_.back().get());
    optimizers.push_back(optimizers_.back().get());
  }
  // Spinning pays only when each rank has a core of its own (RankThreads pins them then).
  const auto spin = schedule_.num_ranks() <= usable_cores() ? kHandoffSpin : std::chrono::nanoseconds(0);
  transport_ = std::make_unique<InProcessTransport>(inbox_capacities(schedule_), spin);
  for (int r = 0; r < schedule_.num_ranks(); ++r) {
    workers_.push_back(std::make_unique<RankWorker>(schedule_, RankId(r), stages, optimizers, *transport_, options_,
                                                    progress_));
  }
}

PipelineEngine::~PipelineEngine() {
  threads_.reset();  // stops and joins the rank threads before what they used goes
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
  check_values(file);
  for (auto& stage : stages_) nn::load_parameters(*stage, file);
}

void PipelineEngine::write_checkpoint(const std::filesystem::path& path, std::int64_t steps_done) const {
  if (update_failed_) fail("cannot write checkpoint {}: an optimizer update failed and the weights are inconsistent",
                           path.string());
  if (const auto bad = first_non_finite(Values::kParameters)) {
    fail("not writing checkpoint {}: {} is not finite; the run diverged (lower optimizer.params.lr)", path.string(),
         *bad);
  }
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

std::optional<std::string> PipelineEngine::first_non_finite(Values values) const {
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    const nn::Stage& stage = *stages_[s];
    const bool parameters = values == Values::kParameters;
    if (const auto name =
            non_finite_tensor(stage.layout(), parameters ? stage.parameters() : stage.gradients())) {
      return fmt::format("stage {}'s {} {}", s, parameters ? "parameter" : "gradient of", *name);
    }
  }
  return std::nullopt;
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
  return global_batch() * options_.seq_length;
}

// The flush after the pipeline part, as the phases every rank runs in order.
enum class PipelineEngine::FlushStep { kPostTiedGradients, kReduceTiedGradients, kGradientNorm, kUpdate };
const PipelineEngine::FlushStep PipelineEngine::kFlushOrder[] = {
    FlushStep::kPostTiedGradients, FlushStep::kReduceTiedGradients, FlushStep::kGradientNorm, FlushStep::kUpdate};

// What the ranks' flushes share within one step (each rank writes only its
// own entries).
struct PipelineEngine::Flush {
  explicit Flush(std::size_t ranks) : tied_start(ranks), square_sum(ranks, 0.0) {}

  // Threaded, every rank holds the all-reduced sum; serial, each its own,
  // added here in rank order as the all-reduce adds them (0 + v0 + v1 + …),
  // so both modes get the same bits.
  double grad_norm(std::size_t rank, RunMode run) const {
    if (run == RunMode::kThreaded) return std::sqrt(square_sum[rank]);
    double sum = 0;
    for (const double v : square_sum) sum += v;
    return std::sqrt(sum);
  }

  std::vector<Clock::time_point> tied_start;
  std::vector<double> square_sum;
  std::atomic<bool> updating{false};  // an optimizer update has begun on some rank
};

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
  Flush flush(workers_.size());
  if (run == RunMode::kThreaded) {
    run_threaded(mode, result.lr, flush);
  } else {
    run_serial(mode, result.lr, flush);
  }
  result.wall_s = std::chrono::duration<double>(Clock::now() - epoch).count();
  result.grad_norm = flush.grad_norm(0, run);
  result.skipped = mode == StepMode::kTrain && !std::isfinite(result.grad_norm);
  result.clip_coefficient = result.skipped ? 1 : clip_coefficient(mode, result.grad_norm);
  finish(result);
  return result;
}

double PipelineEngine::clip_coefficient(StepMode mode, double grad_norm) const {
  return mode == StepMode::kTrain ? nn::clip_coefficient(grad_norm, options_.gradient_clipping) : 1.0;
}

// One phase of rank w's flush, written once for both run modes. Threaded, a
// rank runs every phase on its own thread and waits for the other ranks'
// tied-gradient copy and the all-reduce; serial, every rank runs a phase
// before any runs the next, so nothing has to wait.
RankWorker::Outcome PipelineEngine::flush_step(FlushStep step, RankWorker& w, StepMode mode, RunMode run,
                                               double lr, Flush& flush) {
  const auto r = static_cast<std::size_t>(w.rank().value());
  switch (step) {
    case FlushStep::kPostTiedGradients:
      flush.tied_start[r] = Clock::now();
      return w.post_tied_gradients();
    case FlushStep::kReduceTiedGradients: {
      const RankWorker::Outcome outcome = w.reduce_tied_gradients(run == RunMode::kThreaded);
      if (outcome == RankWorker::Outcome::kNotReady) fail("serial run: rank {}'s tied-gradient copy was not posted", r);
      if (outcome == RankWorker::Outcome::kDone) w.record_phase(FlushPhase::kTiedGradients, flush.tied_start[r]);
      return outcome;
    }
    case FlushStep::kGradientNorm: {
      const Clock::time_point start = Clock::now();
      double sum = w.gradient_square_sum() + loss_guard(w, schedule_.num_microbatches());
      if (run == RunMode::kThreaded && w.all_reduce_sum(sum) == RankWorker::Outcome::kAborted) {
        return RankWorker::Outcome::kAborted;
      }
      w.record_phase(FlushPhase::kGradientNorm, start);
      flush.square_sum[r] = sum;
      return RankWorker::Outcome::kDone;
    }
    case FlushStep::kUpdate:
      // Every rank holds the same norm, so all skip a non-finite step together.
      if (mode == StepMode::kTrain && std::isfinite(flush.grad_norm(r, run))) {
        flush.updating.store(true);
        w.apply_update(clip_coefficient(mode, flush.grad_norm(r, run)), lr);
      }
      return RankWorker::Outcome::kDone;
  }
  return RankWorker::Outcome::kDone;
}

// Each rank on its own persistent thread (RankThreads, started at the first
// threaded step). A failing worker records its error and aborts the
// transport; the others return at their next action or wait; run() returns
// once every rank has, and the first error is rethrown.
void PipelineEngine::run_threaded(StepMode mode, double lr, Flush& flush) {
  if (!threads_) threads_ = std::make_unique<RankThreads>(schedule_.num_ranks());
  std::mutex error_mutex;
  std::exception_ptr first_error;
  threads_->run([&](int rank) {
    RankWorker& w = *workers_[static_cast<std::size_t>(rank)];
    try {
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (w.run(i, true) == RankWorker::Outcome::kAborted) return;
      }
      for (const FlushStep step : kFlushOrder) {
        if (flush_step(step, w, mode, RunMode::kThreaded, lr, flush) == RankWorker::Outcome::kAborted) return;
      }
    } catch (...) {
      {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      transport_->abort();
    }
  });
  if (first_error) {
    if (flush.updating.load()) update_failed_ = true;
    for (auto& worker : workers_) worker->release();
    std::rethrow_exception(first_error);
  }
}

// Every rank on this thread: passes over the ranks, each running as far as
// its messages allow, until all lists are done; then the flush phase by phase.
void PipelineEngine::run_serial(StepMode mode, double lr, Flush& flush) {
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
    for (const FlushStep step : kFlushOrder) {
      for (auto& worker : workers_) flush_step(step, *worker, mode, RunMode::kSerial, lr, flush);
    }
  } catch (...) {
    if (flush.updating.load()) update_failed_ = true;
    for (auto& worker : workers_) worker->release();
    throw;
  }
}

void PipelineEngine::finish(StepResult& result) {
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
  for (const auto& worker : workers_) result.ranks.push_back(worker->record());
}

}  // namespace pipeflow::runtime
