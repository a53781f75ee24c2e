#include "pipeflow/runtime/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "pipeflow/core/error.h"
#include "train/emulated_step.h"
#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/measurement.h"
#include "pipeflow/runtime/noise_scale.h"
#include "pipeflow/runtime/progress.h"
#include "pipeflow/runtime/report.h"
#include "train/checkpointed_run.h"
#include "train/run_outputs.h"
#include "train/skipped_steps.h"
#include "train/run_kind.h"
#include "pipeflow/schedule/generators.h"

namespace pipeflow::runtime {
namespace {

// StepLog::ideal_fraction: one core would run every rank's compute (the
// part on its core) and optimizer one after the other; p cores at best
// p × (1 − bubble) as fast.
double ideal_fraction(const StepFigures& figures, double bubble_predicted) {
  double one_core_s = 0;
  for (const RankFigures& rank : figures.ranks) one_core_s += rank.compute_s - rank.off_core_s + rank.optimizer_s;
  const double ideal_speedup = static_cast<double>(figures.ranks.size()) * (1 - bubble_predicted);
  return one_core_s / (ideal_speedup * figures.wall_s);
}

// A training run of either kind of stage (RunKind says what differs).
template <class StageT>
class Run {
 public:
  Run(const TrainSettings& settings, ProgressPrinter& progress, RankGroup& group, const StopRequest* stop)
      : settings_(settings),
        progress_(progress),
        group_(group),
        kind_(settings),
        engine_(make_engine()),
        checkpoints_(settings, progress, stop, group, *engine_),
        first_costs_(engine_->num_stages()),
        costs_(engine_->num_stages()) {}

  TrainOutcome run();

 private:
  using Engine = BasicPipelineEngine<StageT>;
  // The kind's engine, initialised from settings.seed unless it resumes or
  // starts from --weights.
  std::unique_ptr<Engine> make_engine() const;
  void announce() const;
  StepLog train_step(std::int64_t step);
  void check_skipped(const std::vector<StepLog>& log);
  bool reporter() const { return engine_->is_reporter(); }
  std::string placement() const;
  std::string oversubscription() const;
  std::optional<double> validation_loss() const;
  void write_outputs(TrainOutcome& outcome, const StageT& model) const;
  // The costs the final prediction used, and which steps they were measured in.
  const CostProfile* record_costs() const { return costs_.steps() > 0 ? &costs_ : &first_costs_; }
  std::string cost_steps() const {
    const std::int64_t first = checkpoints_.first_step();
    return costs_.steps() > 0 ? fmt::format("steps {}-{}", first + 1, first + costs_.steps())
                              : fmt::format("step {}", first);
  }

  const TrainSettings& settings_;
  ProgressPrinter& progress_;
  RankGroup& group_;
  RunKind<StageT> kind_;
  std::unique_ptr<Engine> engine_;
  CheckpointedRun<StageT> checkpoints_;
  CostProfile first_costs_;  // this run's first step (warm-up), until later steps are measured
  CostProfile costs_;        // the cost_steps steps after it
  SimulationResult prediction_;
  std::vector<StepFigures> figures_;
  std::optional<StepResult> last_;
  SkippedInARow skipped_in_a_row_;
  int overflows_ = 0;  // fp16 steps skipped for an overflow that lowered the loss scale
  NoiseScaleAverage noise_scale_;  // over this run's measured steps (a resumed run starts afresh)
};

template <class StageT>
std::unique_ptr<BasicPipelineEngine<StageT>> Run<StageT>::make_engine() const {
  std::unique_ptr<Engine> engine = kind_.make_engine(group_);
  if (settings_.resume.empty() && settings_.weights.empty()) engine->init_parameters(settings_.seed);
  return engine;  // else the checkpoint (CheckpointedRun::start) or the weights file gave the weights
}

template <class StageT>
std::string Run<StageT>::placement() const {
  std::string text = group_.placement();
  const RankLayout& layout = group_.layout();
  if (settings_.engine.shard_optimizer && layout.data_parallel > 1) {
    // pipeflow's fp32 AdamW: 8 bytes of moments per parameter, 1/d of them kept
    const std::int64_t psi = engine_->local_parameter_count();
    const std::int64_t kept = engine_->optimizer_state_bytes();
    const double formula = 8.0 * static_cast<double>(psi) * (1 - 1.0 / layout.data_parallel);
    text += fmt::format("; ZeRO-1: {} keeps {} of {} bytes of AdamW moments, saving {} (8Ψ(1 - 1/d) = {:.0f} "
                        "for its Ψ = {} parameters, d = {})",
                        group_.spans_processes() ? "this process" : "the first pipeline of this process", kept, 8 * psi,
                        8 * psi - kept, formula, psi, layout.data_parallel);
  }
  return text;
}

template <class StageT>
std::string Run<StageT>::oversubscription() const {
  return group_.oversubscription(settings_.emulate, RunKind<StageT>::kEmulates);
}

template <class StageT>
void Run<StageT>::announce() const {
  progress_.message(kind_.announcement(*engine_));
  if (group_.layout().data_parallel > 1 || group_.layout().tensor > 1 || group_.spans_processes()) {
    progress_.message(placement() + "; ranks (Megatron-LM's order):\n" + group_.layout().describe());
  }
  const std::string note = oversubscription();
  if (!note.empty()) progress_.message(note);
}

template <class StageT>
StepLog Run<StageT>::train_step(std::int64_t step) {
  const RunMode mode = settings_.emulate ? RunMode::kSerial : RunMode::kThreaded;
  StepResult result = engine_->step(step, kind_.source(), StepMode::kTrain, mode);
  if (!reporter()) {  // under MPI, world rank 0 alone measures and reports
    StepLog log;
    log.step = step;
    log.loss = result.loss;
    log.lr = result.lr;
    log.grad_norm = result.grad_norm;
    log.skipped = result.skipped;
    if (settings_.engine.loss_scale) log.loss_scale = result.loss_scale;
    log.next_loss_scale = result.next_loss_scale;
    log.overflow = result.overflow;
    return log;
  }
  const Schedule& schedule = engine_->schedule();
  StepFigures figures = step_figures(result, schedule.num_ranks());
  if (settings_.emulate) figures = emulated_figures(schedule, result, figures);
  const std::int64_t first_step = checkpoints_.first_step();
  if (step == first_step) {
    first_costs_.add(result);
    prediction_ = predict_step(*engine_, first_costs_);
  } else if (step - first_step <= settings_.cost_steps) {
    costs_.add(result);
    prediction_ = predict_step(*engine_, costs_);
  }
  StepLog log{.step = step,
              .loss = result.loss,
              .lr = result.lr,
              .grad_norm = result.grad_norm,
              .step_time_s = figures.wall_s,
              .step_time_predicted_s = prediction_.step_time_s,
              .tokens_per_s = figures.tokens_per_s,
              .tokens_per_s_predicted = static_cast<double>(result.tokens) / prediction_.step_time_s,
              .bubble_measured = figures.bubble,
              .bubble_predicted = prediction_.pipeline_bubble_ratio,
              .ideal_fraction = ideal_fraction(figures, prediction_.pipeline_bubble_ratio),
              .busy_s = {},
              .busy_predicted_s = {},
              .idle_s = {},
              .idle_predicted_s = {},
              .comm_s = {},
              .off_core_s = {},
              .wake_s = {},
              .data_parallel_s = {},
              .data_parallel_early_s = {},
              .tensor_parallel_s = {},
              .tensor_parallel_predicted_s = {},
              .peak_activation_bytes = {},
              .peak_activation_bytes_predicted = {},
              .val_loss = std::nullopt,
              .skipped = result.skipped};
  if (settings_.engine.loss_scale) log.loss_scale = result.loss_scale;
  log.next_loss_scale = result.next_loss_scale;
  log.overflow = result.overflow;
  for (const RankFigures& rank : figures.ranks) {
    log.busy_s.push_back(rank.compute_s);
    log.idle_s.push_back(figures.pipeline_s - rank.compute_s);
    log.comm_s.push_back(rank.comm_s);
    log.off_core_s.push_back(rank.off_core_s);
    log.wake_s.push_back(rank.wake_s);
    if (settings_.engine.data_parallel > 1) {
      log.data_parallel_s.push_back(rank.data_parallel_s);
      log.data_parallel_early_s.push_back(rank.data_parallel_early_s);
    }
    if (settings_.engine.tensor_parallel > 1) {
      log.tensor_parallel_s.push_back(rank.tensor_parallel_s);
      log.tensor_parallel_predicted_s.push_back(
          predicted_tensor_parallel_s(rank, settings_.engine.tensor_parallel, settings_.hardware));
    }
    log.peak_activation_bytes.push_back(rank.peak_activation_bytes);
  }
  for (const RankResult& rank : prediction_.ranks) {
    log.busy_predicted_s.push_back(rank.busy_s);
    log.idle_predicted_s.push_back(prediction_.pipeline_time_s - rank.busy_s);
    log.peak_activation_bytes_predicted.push_back(static_cast<std::int64_t>(rank.activation_bytes));
  }
  if (result.grad_square_small && !result.skipped) {
    log.grad_square_small = result.grad_square_small;
    log.grad_square_big = result.grad_norm * result.grad_norm;
    noise_scale_.add(noise_scale_sample(*log.grad_square_small, settings_.engine.micro_batch, *log.grad_square_big,
                                        engine_->global_batch()));
    log.noise_scale = noise_scale_.value();
  }
  figures_.push_back(std::move(figures));
  last_ = std::move(result);
  return log;
}

// A skipped step is reported; max_skipped_steps of them in a row mean the
// run diverged, and it stops naming where the first NaN or Inf is.
template <class StageT>
void Run<StageT>::check_skipped(const std::vector<StepLog>& logs) {
  const StepLog& log = logs.back();
  const int in_a_row = skipped_in_a_row_.after(log);
  if (log.overflow) {  // fp16: the scaler lowered the scale; the next step tries again
    ++overflows_;
    progress_.message(fmt::format(
        "step {} skipped: fp16 gradients overflowed at loss scale {}; {} ({} overflow{} so far)", log.step + 1,
        *log.loss_scale,
        log.next_loss_scale < *log.loss_scale ? fmt::format("the scale is lowered to {}", log.next_loss_scale)
                                              : std::string("the scale is kept (fp16.hysteresis)"),
        overflows_, overflows_ == 1 ? "" : "s"));
    return;
  }
  if (!log.skipped) return;
  progress_.message(fmt::format("warning: step {} skipped: loss {}, gradient norm {}: not finite, so no update "
                                "({} of numerics.max_skipped_steps = {} in a row)",
                                log.step + 1, log.loss, log.grad_norm, in_a_row, settings_.max_skipped_steps));
  if (in_a_row < settings_.max_skipped_steps) return;
  if (reporter()) checkpoints_.write_metrics(logs);
  std::optional<std::string> first = engine_->first_non_finite(Engine::Values::kParameters);
  if (!first) first = engine_->first_non_finite(Engine::Values::kGradients);
  fail("step {}: {} steps in a row had a non-finite loss or gradient norm (numerics.max_skipped_steps = {}); the "
       "first non-finite tensor: {}; the run diverged: lower optimizer.params.lr or set gradient_clipping",
       log.step + 1, in_a_row, settings_.max_skipped_steps,
       first.value_or("none (the loss alone)"));
}

template <class StageT>
std::optional<double> Run<StageT>::validation_loss() const {
  const auto model = engine_->assemble_model();  // collective under MPI: nullptr but on world rank 0
  if (!model) return std::nullopt;
  return kind_.validation_loss(*model);
}

template <class StageT>
TrainOutcome Run<StageT>::run() {
  announce();
  checkpoints_.start();
  TrainOutcome outcome;
  const Clock::time_point start = Clock::now();
  for (std::int64_t step = checkpoints_.first_step(); step < settings_.steps && outcome.stop_signal == 0; ++step) {
    StepLog log = train_step(step);
    outcome.stop_signal = checkpoints_.stop_signal();
    const bool last = step + 1 == settings_.steps;
    const bool stopping = outcome.stop_signal != 0 && !last;
    if (!stopping && (last || (settings_.eval_interval > 0 && (step + 1) % settings_.eval_interval == 0))) {
      log.val_loss = validation_loss();
    }
    outcome.log.push_back(std::move(log));
    progress_.step(outcome.log.back(), std::chrono::duration<double>(Clock::now() - start).count());
    check_skipped(outcome.log);
    const bool checkpoint = checkpoints_.checkpoint_due(step, stopping);
    // The metrics of a checkpoint's steps are on disk before it is, so that
    // a run resumed from it after any failure keeps a line for every step.
    if ((checkpoint || outcome.log.back().val_loss) && reporter()) checkpoints_.write_metrics(outcome.log);
    if (checkpoint) checkpoints_.write_checkpoint(step + 1);
  }
  const std::int64_t steps_done = checkpoints_.first_step() + static_cast<std::int64_t>(outcome.log.size());
  if (steps_done < settings_.steps) {
    progress_.message(fmt::format("stopped by signal {} after step {}: checkpoint {}", outcome.stop_signal,
                                  steps_done, checkpoints_.checkpoint_path(steps_done).string()));
  }
  progress_.finish();
  const auto model = engine_->assemble_model();  // collective under MPI: nullptr but on world rank 0
  if (!model) return outcome;
  kind_.finish(outcome, *model);
  write_outputs(outcome, *model);
  return outcome;
}

template <class StageT>
void Run<StageT>::write_outputs(TrainOutcome& outcome, const StageT& model) const {
  const RunRecord record{
      .settings = &settings_,
      .schedule = &engine_->schedule(),
      .boundaries = engine_->boundaries(),
      .layer_name = [this](int layer) { return kind_.layer_name(layer); },
      .data = kind_.data(),
      .placement = placement(),
      .oversubscription = oversubscription(),
      .log = outcome.log,
      .figures = figures_,
      .costs = record_costs(),
      .cost_steps = cost_steps(),
      .prediction = &prediction_,
      .model = kind_.model(model),
      .sample_note = kind_.sample_note(outcome),
      .weights_note = kind_.weights_note(),
      .sample = outcome.sample};
  const MeasuredProfile profile = measured_profile(
      *record_costs(), *engine_,
      fmt::format("pipeflow train {}, median action costs of {}", settings_.config_source, cost_steps()));
  outcome.files =
      write_run_outputs(record, profile, *last_, checkpoints_.earlier_metrics(),
                        [&](const std::filesystem::path& path) { kind_.write_weights(path, model); });
}

}  // namespace

TrainOutcome train(const TrainSettings& settings, ProgressPrinter& progress, const StopRequest* stop,
                   RankGroup& group) {
  if (settings.emulate && (settings.engine.data_parallel > 1 || settings.engine.tensor_parallel > 1)) {
    fail("--emulate replays one pipeline with one rank a stage: it cannot emulate data_parallel {} x "
         "tensor_parallel {}; drop --emulate (or run pipeline stages alone)",
         settings.engine.data_parallel, settings.engine.tensor_parallel);
  }
  if (settings.vision_language) return Run<nn::VlmStage>(settings, progress, group, stop).run();
  return Run<nn::Stage>(settings, progress, group, stop).run();
}

TrainOutcome train(const TrainSettings& settings, ProgressPrinter& progress, const StopRequest* stop) {
  const std::unique_ptr<RankGroup> group =
      RankGroup::in_threads({.pipeline = settings.schedule.num_ranks(),
                             .data_parallel = settings.engine.data_parallel,
                             .tensor = settings.engine.tensor_parallel});
  return train(settings, progress, stop, *group);
}

}  // namespace pipeflow::runtime
