#include "pipeflow/runtime/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/units.h"
#include "pipeflow/nn/byte_dataset.h"
#include "pipeflow/nn/sampling.h"
#include "pipeflow/runtime/checkpoint_search.h"
#include "train/emulated_step.h"
#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/measurement.h"
#include "train/metrics_log.h"
#include "pipeflow/runtime/noise_scale.h"
#include "pipeflow/runtime/progress.h"
#include "pipeflow/runtime/report.h"
#include "train/run_folders.h"
#include "train/run_outputs.h"
#include "train/skipped_steps.h"
#include "train/vision_language_run.h"
#include "pipeflow/runtime/stage_partition.h"
#include "pipeflow/schedule/generators.h"

namespace pipeflow::runtime {
namespace {

// StepLog::ideal_fraction: one core would run every rank's compute and
// optimizer one after the other; p cores at best p × (1 − bubble) as fast.
double ideal_fraction(const StepFigures& figures, double bubble_predicted) {
  double one_core_s = 0;
  for (const RankFigures& rank : figures.ranks) one_core_s += rank.compute_s + rank.optimizer_s;
  const double ideal_speedup = static_cast<double>(figures.ranks.size()) * (1 - bubble_predicted);
  return one_core_s / (ideal_speedup * figures.wall_s);
}

class Run {
 public:
  Run(const TrainSettings& settings, ProgressPrinter& progress, const StopRequest* stop, RankGroup& group)
      : settings_(settings),
        progress_(progress),
        stop_(stop),
        group_(group),
        dataset_(settings.data.empty() ? nn::ByteDataset::default_corpus() : settings.data,
                 {.seq_length = seq_length(), .seed = settings.seed,
                  .validation_fraction = settings.validation_fraction}),
        source_(dataset_, nn::Split::kTrain),
        engine_(make_engine()),
        first_costs_(engine_->num_stages()),
        costs_(engine_->num_stages()) {}

  TrainOutcome run();

 private:
  int seq_length() const { return settings_.engine.seq_length; }
  std::unique_ptr<PipelineEngine> make_engine() const;
  void announce() const;
  // " in bf16", " in fp16, dynamic loss scale from 2^16"; "" in fp32.
  std::string precision_text() const;
  void remove_stale_temporaries() const;
  // Loads the checkpoint to resume from (none: a fresh run) and sets
  // first_step_; returns the run id its header holds ("": none, or fresh).
  std::string resume();
  // The run's id, the same in every process: the resumed checkpoint's, else
  // the one out_dir/run_id.json names (a checkpoint from before run ids),
  // else a new one; world rank 0 claims the folders for it.
  void claim_folders(const std::string& resumed_id);
  StepLog train_step(std::int64_t step);
  void check_skipped(const std::vector<StepLog>& log);
  void write_metrics(const std::vector<StepLog>& log) const {
    write_file_atomic(settings_.out_dir / "metrics.jsonl", earlier_metrics_ + metrics_jsonl(log));
  }
  // The signal that stops the run, 0: none: the largest any process holds,
  // so that every process stops after the same step.
  int stop_signal() const;
  bool reporter() const { return engine_->is_reporter(); }
  std::string placement() const;
  std::string oversubscription() const;
  std::filesystem::path checkpoint_path(std::int64_t steps_done) const;
  void write_checkpoint(std::int64_t steps_done) const;
  std::optional<double> validation_loss() const;
  void write_outputs(TrainOutcome& outcome, const nn::Stage& model) const;
  // The costs the final prediction used, and which steps they were measured in.
  const CostProfile* record_costs() const { return costs_.steps() > 0 ? &costs_ : &first_costs_; }
  std::string cost_steps() const {
    return costs_.steps() > 0 ? fmt::format("steps {}-{}", first_step_ + 1, first_step_ + costs_.steps())
                              : fmt::format("step {}", first_step_);
  }

  const TrainSettings& settings_;
  ProgressPrinter& progress_;
  const StopRequest* stop_;
  RankGroup& group_;
  nn::ByteDataset dataset_;
  DatasetSource source_;
  std::unique_ptr<PipelineEngine> engine_;
  std::optional<RunFolders> folders_;  // world rank 0's: locked for the run's life
  std::string run_id_;
  std::int64_t first_step_ = 0;  // steps done before this run (a resumed checkpoint's)
  std::string earlier_metrics_;   // metrics.jsonl lines of those steps, when resumed into the same out_dir
  CostProfile first_costs_;  // this run's first step (warm-up), until later steps are measured
  CostProfile costs_;        // the cost_steps steps after it
  SimulationResult prediction_;
  std::vector<StepFigures> figures_;
  std::optional<StepResult> last_;
  SkippedInARow skipped_in_a_row_;
  int overflows_ = 0;  // fp16 steps skipped for an overflow that lowered the loss scale
  NoiseScaleAverage noise_scale_;  // over this run's measured steps (a resumed run starts afresh)
};

std::unique_ptr<PipelineEngine> Run::make_engine() const {
  dataset_.check_vocabulary(settings_.model.vocab_size);
  const Schedule& schedule = settings_.schedule;
  EngineOptions options = settings_.engine;
  options.seq_length = seq_length();
  std::vector<int> boundaries;
  try {
    boundaries = partition_model(settings_.model, schedule.num_stages(), settings_.partition, options.micro_batch,
                                 seq_length(), settings_.hardware);
  } catch (const Error& error) {
    fail("{}: pipeline.stages = {} with {} ({} stages): {}", settings_.config_source, schedule.num_ranks(),
         schedule.name(), schedule.num_stages(), error.what());
  }
  auto engine = std::make_unique<PipelineEngine>(settings_.model, schedule, boundaries, options, group_);
  if (!settings_.resume.empty()) {
    if (!settings_.weights.empty()) {
      fail("--weights {} and checkpoint.load {}: a checkpoint holds the weights; give one of the two",
           settings_.weights.string(), settings_.resume.string());
    }
    return engine;  // resume() loads it
  }
  if (settings_.weights.empty()) {
    engine->init_parameters(settings_.seed);
  } else {
    engine->load_parameters(read_checkpoint(settings_.weights));  // a file, or a sharded folder or its index
  }
  return engine;
}

int Run::stop_signal() const {
  const double mine = stop_ == nullptr ? 0 : stop_->load();
  return static_cast<int>(
      group_.max_over_processes(mine, deadline_after(settings_.engine.timeout), "every process's stop request"));
}

std::string Run::placement() const {
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

std::string Run::oversubscription() const { return group_.oversubscription(settings_.emulate); }

void Run::remove_stale_temporaries() const {
  if (!reporter()) return;
  std::vector<std::filesystem::path> dirs{settings_.checkpoint_dir, settings_.out_dir};
  // Sharded checkpoints' folders hold their shards' temporaries: every
  // subfolder is searched (by name only; no checkpoint's header is read).
  std::error_code missing;
  for (const auto& entry : std::filesystem::directory_iterator(settings_.checkpoint_dir, missing)) {
    if (entry.is_directory()) dirs.push_back(entry.path());
  }
  for (const auto& dir : dirs) {
    for (const auto& removed : pipeflow::remove_stale_temporaries(dir)) {
      progress_.message(fmt::format("removed {}: a temporary file left by a writer that was stopped", removed.string()));
    }
  }
}

std::string Run::resume() {
  if (settings_.resume.empty()) return "";
  const std::vector<std::filesystem::path> candidates = checkpoints_to_resume(settings_.resume);
  std::filesystem::path file;
  std::int64_t done = 0;
  std::string run_id;
  // A checkpoint cut short, corrupted or holding NaN falls back to the one before it.
  for (const std::filesystem::path& candidate : candidates) {
    try {
      const nn::SafetensorsFile checkpoint = read_checkpoint(candidate);
      done = engine_->load_checkpoint(checkpoint);
      if (const auto id = checkpoint.metadata().find("run_id"); id != checkpoint.metadata().end()) run_id = id->second;
      file = candidate;
      break;
    } catch (const Error& error) {
      if (candidate == candidates.back()) throw;
      progress_.message(fmt::format("warning: not resuming from {}: {}; trying the checkpoint before it",
                                    candidate.string(), error.what()));
    }
  }
  if (done >= settings_.steps) {
    fail("{}: {} steps done already, and steps = {} is the total: raise steps to train on", file.string(), done,
         settings_.steps);
  }
  progress_.message(fmt::format("resuming after {} from {}", format_count(done, "step"), file.string()));
  progress_.start(static_cast<int>(done));
  first_step_ = done;
  return run_id;
}

void Run::claim_folders(const std::string& resumed_id) {
  std::uint64_t id = run_id_number(resumed_id);
  if (folders_ && id == 0 && !settings_.resume.empty()) id = run_id_number(folders_->owner());
  if (folders_ && id == 0) id = new_run_id();
  run_id_ = run_id_text(static_cast<std::uint64_t>(group_.max_over_processes(
      static_cast<double>(id), deadline_after(settings_.engine.timeout), "world rank 0's run id")));
  if (!folders_) return;
  for (const std::filesystem::path& removed : folders_->claim(run_id_, !settings_.resume.empty())) {
    progress_.message(fmt::format("removed {}: another run's (--overwrite)", removed.string()));
  }
  if (first_step_ > 0) earlier_metrics_ = earlier_metrics(settings_.out_dir / "metrics.jsonl", first_step_);
}

std::filesystem::path Run::checkpoint_path(std::int64_t steps_done) const {
  return runtime::checkpoint_path(settings_.checkpoint_dir, steps_done, group_.spans_processes());
}

void Run::write_checkpoint(std::int64_t steps_done) const {
  const std::filesystem::path dir = settings_.checkpoint_dir;
  if (reporter()) std::filesystem::create_directories(dir);
  engine_->write_checkpoint(checkpoint_path(steps_done), steps_done, run_id_);  // collective under MPI
  if (!reporter() || settings_.checkpoint_keep == 0) return;
  // This run's, newest first; one holding more steps (left by an attempt
  // that went further before it was resumed from an earlier checkpoint) is
  // replaced when the run gets there.
  std::vector<std::filesystem::path> mine;
  for (const FoundCheckpoint& checkpoint : checkpoints_in(dir)) {
    if (checkpoint.steps_done && checkpoint.run_id == run_id_ && *checkpoint.steps_done <= steps_done) {
      mine.push_back(checkpoint.path);
    }
  }
  for (std::size_t i = static_cast<std::size_t>(settings_.checkpoint_keep); i < mine.size(); ++i) {
    std::filesystem::remove_all(mine[i]);
  }
}

std::string Run::precision_text() const {
  const EngineOptions& e = settings_.engine;
  if (e.format == ComputeFormat::kFp32) return "";
  if (!e.loss_scale) return fmt::format(" in {}", to_string(e.format));
  const LossScaleConfig& scale = *e.loss_scale;
  return scale.loss_scale > 0 ? fmt::format(" in fp16, static loss scale {:g}", scale.loss_scale)
                              : fmt::format(" in fp16, dynamic loss scale from 2^{}", scale.initial_scale_power);
}

void Run::announce() const {
  const Schedule& s = engine_->schedule();
  progress_.message(fmt::format(
      "pipeflow train: {} ({} parameters){}; {} on {} ({}), {} of {} x {} tokens; {}{}",
      nn::describe(settings_.model), settings_.model.parameter_count(), precision_text(), s.name(), format_count(s.num_ranks(), "rank"),
      format_count(s.num_stages(), "stage"), format_count(s.num_microbatches(), "micro-batch", "micro-batches"),
      settings_.engine.micro_batch, seq_length(), format_count(settings_.steps, "step"),
      settings_.emulate ? ", emulated" : ""));
  if (group_.layout().data_parallel > 1 || group_.layout().tensor > 1 || group_.spans_processes()) {
    progress_.message(placement() + "; ranks (Megatron-LM's order):\n" + group_.layout().describe());
  }
  const std::string note = oversubscription();
  if (!note.empty()) progress_.message(note);
}

StepLog Run::train_step(std::int64_t step) {
  const RunMode mode = settings_.emulate ? RunMode::kSerial : RunMode::kThreaded;
  StepResult result = engine_->step(step, source_, StepMode::kTrain, mode);
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
  if (step == first_step_) {
    first_costs_.add(result);
    prediction_ = predict_step(*engine_, first_costs_);
  } else if (step - first_step_ <= settings_.cost_steps) {
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
void Run::check_skipped(const std::vector<StepLog>& logs) {
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
  if (reporter()) write_metrics(logs);
  std::optional<std::string> first = engine_->first_non_finite(PipelineEngine::Values::kParameters);
  if (!first) first = engine_->first_non_finite(PipelineEngine::Values::kGradients);
  fail("step {}: {} steps in a row had a non-finite loss or gradient norm (numerics.max_skipped_steps = {}); the "
       "first non-finite tensor: {}; the run diverged: lower optimizer.params.lr or set gradient_clipping",
       log.step + 1, in_a_row, settings_.max_skipped_steps,
       first.value_or("none (the loss alone)"));
}

// The mean loss over one global batch of the validation split (the same
// samples at every evaluation, so the losses are comparable).
std::optional<double> Run::validation_loss() const {
  const auto model = engine_->assemble_model();  // collective under MPI: nullptr but on world rank 0
  if (!model) return std::nullopt;
  const int b = settings_.engine.micro_batch;
  const int microbatches = settings_.schedule.num_microbatches() * settings_.engine.data_parallel;  // of every replica
  double total = 0;
  for (int j = 0; j < microbatches; ++j) {
    nn::Batch batch = dataset_.batch(nn::Split::kValidation, 0, static_cast<std::int64_t>(j) * b, b,
                                     model->allocator());
    nn::MicrobatchState state;
    model->forward(state, {.tokens = std::move(batch.inputs), .targets = std::move(batch.targets)});
    total += state.loss();
  }
  return total / microbatches;
}

TrainOutcome Run::run() {
  if (settings_.steps < 1) fail("steps = {}: must be >= 1", settings_.steps);
  if (settings_.save_interval < 0) {
    fail("checkpoint.interval = {}: must be >= 0 (0: no checkpoints)", settings_.save_interval);
  }
  // Before any work: outputs that cannot be written fail now, not after the
  // last step, and folders another run writes into or owns are refused.
  if (reporter()) folders_.emplace(settings_);
  if (settings_.save_interval > 0) require_writable_folder(settings_.checkpoint_dir, "checkpoint folder");
  announce();
  remove_stale_temporaries();
  claim_folders(resume());
  TrainOutcome outcome;
  const Clock::time_point start = Clock::now();
  for (std::int64_t step = first_step_; step < settings_.steps && outcome.stop_signal == 0; ++step) {
    StepLog log = train_step(step);
    outcome.stop_signal = stop_signal();
    const bool last = step + 1 == settings_.steps;
    const bool stopping = outcome.stop_signal != 0 && !last;
    if (!stopping && (last || (settings_.eval_interval > 0 && (step + 1) % settings_.eval_interval == 0))) {
      log.val_loss = validation_loss();
    }
    outcome.log.push_back(std::move(log));
    progress_.step(outcome.log.back(), std::chrono::duration<double>(Clock::now() - start).count());
    check_skipped(outcome.log);
    const bool checkpoint =
        stopping || (settings_.save_interval > 0 && (last || (step + 1) % settings_.save_interval == 0));
    // The metrics of a checkpoint's steps are on disk before it is, so that
    // a run resumed from it after any failure keeps a line for every step.
    if ((checkpoint || outcome.log.back().val_loss) && reporter()) write_metrics(outcome.log);
    if (checkpoint) write_checkpoint(step + 1);
  }
  const std::int64_t steps_done = first_step_ + static_cast<std::int64_t>(outcome.log.size());
  if (steps_done < settings_.steps) {
    progress_.message(fmt::format("stopped by signal {} after step {}: checkpoint {}", outcome.stop_signal,
                                  steps_done, checkpoint_path(steps_done).string()));
  }
  progress_.finish();
  const auto model = engine_->assemble_model();  // collective under MPI: nullptr but on world rank 0
  if (!model) return outcome;
  outcome.sample = nn::sample_text(*model, "", {.new_tokens = settings_.sample_tokens, .temperature = 0.8,
                                                .seed = settings_.seed});
  write_outputs(outcome, *model);
  return outcome;
}

void Run::write_outputs(TrainOutcome& outcome, const nn::Stage& model) const {
  const RunRecord record{
      .settings = &settings_,
      .schedule = &engine_->schedule(),
      .boundaries = engine_->boundaries(),
      .data = fmt::format("{} ({} training bytes)", dataset_.source(), dataset_.bytes(nn::Split::kTrain)),
      .placement = placement(),
      .oversubscription = oversubscription(),
      .log = outcome.log,
      .figures = figures_,
      .costs = record_costs(),
      .cost_steps = cost_steps(),
      .prediction = &prediction_,
      .sample = outcome.sample};
  outcome.files = write_run_outputs(record, *engine_, model, *last_, earlier_metrics_);
}

}  // namespace

TrainOutcome train(const TrainSettings& settings, ProgressPrinter& progress, const StopRequest* stop,
                   RankGroup& group) {
  if (settings.emulate && (settings.engine.data_parallel > 1 || settings.engine.tensor_parallel > 1)) {
    fail("--emulate replays one pipeline with one rank a stage: it cannot emulate data_parallel {} x "
         "tensor_parallel {}; drop --emulate (or run pipeline stages alone)",
         settings.engine.data_parallel, settings.engine.tensor_parallel);
  }
  if (settings.vision_language) {
    // Its rank worker finds the stage holding the LM's embedding among the
    // stages of its process: every rank must be in this one.
    if (group.spans_processes()) {
      fail("{}: a vision-language model trains in one process (its pipeline ranks on threads): run pipeflow train "
           "without mpirun",
           settings.config_source);
    }
    return train_vision_language(settings, progress, stop, group);
  }
  Run run(settings, progress, stop, group);
  return run.run();
}

TrainOutcome train(const TrainSettings& settings, ProgressPrinter& progress, const StopRequest* stop) {
  const std::unique_ptr<RankGroup> group =
      RankGroup::in_threads({.pipeline = settings.schedule.num_ranks(),
                             .data_parallel = settings.engine.data_parallel,
                             .tensor = settings.engine.tensor_parallel});
  return train(settings, progress, stop, *group);
}

}  // namespace pipeflow::runtime
