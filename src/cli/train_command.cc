#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <signal.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <memory>
#include <chrono>
#include <optional>
#include <string>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/units.h"
#include "pipeflow/plan/review.h"
#include "pipeflow/runtime/checkpoint_search.h"
#include "pipeflow/runtime/mpi_world.h"
#include "pipeflow/runtime/rank_group.h"
#include "pipeflow/runtime/progress.h"
#include "pipeflow/runtime/report.h"
#include "pipeflow/runtime/run_settings.h"
#include "pipeflow/runtime/trainer.h"
#include "pipeflow/config/run_config.h"
#include "run_options.h"

namespace pipeflow::cli {
namespace {

struct TrainCommand {
  CLI::App* app = nullptr;
  std::string config;
  std::string weights;
  bool emulate = false;
  bool overwrite = false;
  double timeout_s = 60;
  RunFlags flags;

};

runtime::StopRequest stop_request{0};

// The first SIGINT or SIGTERM asks the training loop to stop after its step
// (it writes a checkpoint and its files); a second ends the process at once.
// Both are async-signal-safe: a lock-free exchange and _exit. Files being
// written then stay temporaries (NAME.pipeflow-tmp.PID) that the next run removes.
extern "C" void on_stop_signal(int signal) {
  if (stop_request.exchange(signal) != 0) ::_exit(128 + signal);
}

// Installs on_stop_signal for SIGINT and SIGTERM while training; restores the
// previous handlers after.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // the step's system calls go on; the loop checks the flag after it
    for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &action, &previous_[i]);
  }
  ~StopSignals() {
    for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &previous_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr std::array<int, 2> kSignals = {SIGINT, SIGTERM};
  std::array<struct sigaction, 2> previous_{};
};

// A vision-language run: its last step's time, the held-out captions and one of them.
void print_captions(const runtime::TrainOutcome& outcome, const runtime::TrainSettings& settings) {
  const runtime::StepLog& last = outcome.log.back();
  const nn::CaptionScore& captions = *outcome.captions;
  fmt::print("last step: {}, {:.0f} tokens/s\n", format_seconds(last.step_time_s), last.tokens_per_s);
  fmt::print("held-out captions: {} right of {} (chance {:g} of {}, 1 in {:g})\n", captions.right, captions.images,
             captions.images * nn::CaptionScore::kChance, captions.images, 1 / nn::CaptionScore::kChance);
  fmt::print("held-out image 0, \"{}\": captioned \"{}\"\n", runtime::printable(captions.expected),
             runtime::printable(captions.generated));
  std::string files;
  for (const auto& file : outcome.files) files += (files.empty() ? "" : ", ") + file.filename().string();
  fmt::print("wrote {}/{}\n", settings.out_dir.string(), files);
}

void print_summary(const runtime::TrainOutcome& outcome, const runtime::TrainSettings& settings) {
  const runtime::StepLog& first = outcome.log.front();
  const runtime::StepLog& last = outcome.log.back();
  const char* label = settings.emulate ? " (emulated)" : "";
  // A run stopped by a signal ends without its last validation.
  fmt::print("trained {}: loss {:.4f} -> {:.4f}{}\n", format_count(static_cast<std::int64_t>(outcome.log.size()), "step"), first.loss, last.loss,
             last.val_loss ? fmt::format(", validation loss {:.4f}", *last.val_loss) : "");
  if (outcome.captions) {
    print_captions(outcome, settings);
    return;
  }
  fmt::print("last step{}: {}, {:.0f} tokens/s; bubble {} (predicted {})\n", label, format_seconds(last.step_time_s),
             last.tokens_per_s, format_percent(last.bubble_measured), format_percent(last.bubble_predicted));
  fmt::print("sample:\n{}\n", runtime::printable(outcome.sample));
  fmt::print("wrote {}/report.md, metrics.jsonl, timeline.svg, trace.json, predicted.svg, profile.json, "
             "run_config.json, weights.safetensors\n",
             settings.out_dir.string());
}

// The review's errors and warnings (pipeflow review), one line each on
// standard error; the run goes on whatever they say. Nothing where the
// review cannot predict the run.
void print_review(const ResolvedRun& resolved) {
  try {
    for (const Finding& finding : review(resolved).findings) {
      if (finding.severity != Severity::kNote) fmt::print(stderr, "review: {}\n", finding_line(finding));
    }
  } catch (const Error&) {
    // A run the simulator cannot predict: train's own checks refuse it
    // (naming the key), or the report says the prediction is missing.
  }
}

void run(const TrainCommand& c, const runtime::MpiWorld* mpi) {
  const RunConfig config = load_run_config(c.config, c.flags.overrides());
  for (std::string_view key : microbatch_shape_keys(config)) {
    fail("{}: {}: pipeflow train runs every micro-batch at one shape (seq_length); simulate prices micro-batches "
         "of their own shapes. Remove {} to train",
         config.source, key, key);
  }
  const bool reporter = mpi == nullptr || mpi->rank() == 0;  // before the group exists: notes on the configuration
  if (reporter) print_config_notes(config);
  // A weights file or checkpoint carries the model's shape: the configuration may leave model out.
  std::optional<ModelFromFile> model_file;
  // A vision-language model's checkpoint gives no shape: its configuration names the model (and
  // its run refuses --weights, naming it: the file is not read).
  const bool vision_language = config.model && config.model->vision;
  if (!c.weights.empty() && !vision_language) model_file = runtime::model_of_file(c.weights);
  if (!config.checkpoint.load.empty() && !vision_language) {
    model_file = runtime::model_of_file(runtime::checkpoint_to_resume(config.checkpoint.load));
  }
  // Under mpirun, data_parallel the file and flags leave out is the processes per pipeline.
  const std::optional<int> world = mpi != nullptr ? std::optional<int>(mpi->size()) : std::nullopt;
  const ResolvedRun resolved = resolve(config, model_file, world);
  runtime::TrainSettings settings = runtime::train_settings(resolved);
  settings.weights = c.weights;
  // The files of out_dir that name what a run reads: the run would replace them.
  refuse_overwriting({"out_dir's", settings.out_dir / "weights.safetensors"}, {{"--weights", c.weights}});
  refuse_overwriting({"out_dir's", settings.out_dir / "run_config.json"}, {{"--config", c.config}});
  settings.emulate = c.emulate;
  settings.overwrite = c.overwrite;
  if (!(c.timeout_s > 0)) fail("--timeout {}: must be > 0 seconds", c.timeout_s);
  settings.engine.timeout = std::chrono::duration<double>(c.timeout_s);
  if (mpi != nullptr && settings.emulate) fail("--emulate runs every rank in one process; run it without mpirun");
  if (reporter) print_review(resolved);
  const std::unique_ptr<runtime::RankGroup> group =
      runtime::RankGroup::make(mpi, {.pipeline = settings.schedule.num_ranks(),
                                     .data_parallel = resolved.config.data_parallel,
                                     .tensor = resolved.config.tensor_parallel,
                                     .order = resolved.config.rank_order});
  runtime::ProgressPrinter progress(reporter ? stderr : nullptr, isatty(fileno(stderr)) == 1, settings.steps,
                                    settings.emulate, settings.steps_per_print);
  runtime::TrainOutcome outcome;
  {
    const StopSignals stop_signals;
    outcome = runtime::train(settings, progress, &stop_request, *group);
  }
  if (reporter) print_summary(outcome, settings);
  if (reporter && settings.save_interval > 0) {
    fmt::print("checkpoints every {} steps in {}\n", settings.save_interval, settings.checkpoint_dir.string());
  }
  if (outcome.stop_signal != 0) {
    if (reporter) {
      fmt::print(stderr, "pipeflow: stopped by signal {}: resume with --resume {}\n", outcome.stop_signal,
                 settings.checkpoint_dir.string());
    }
    throw ExitStatus{128 + outcome.stop_signal};
  }
}

// Under mpirun, a process that fails ends the whole job (run_in_mpi_job).
void run(const TrainCommand& c) {
  run_here_or_in_mpi_job([&](const runtime::MpiWorld* mpi) { run(c, mpi); });
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto c = std::make_shared<TrainCommand>();
  CLI::App* sub = app.add_subcommand(
      "train", "Train a GPT-2, a Llama or the small vision-language model with a pipeline schedule on one worker thread per "
      "rank; report measured vs predicted");
  c->app = sub;
  sub->add_option("--config", c->config, "Run configuration JSON (DeepSpeed's keys and pipeflow's; see examples/)")
      ->required();
  sub->add_option("--weights", c->weights,
                  "Start from this weights file (pipeflow init) instead of the initialisation; it gives the model's shape");
  sub->add_flag("--emulate", c->emulate,
                "Run the actions one at a time and replay their measured durations with one core per rank "
                "(for more ranks than cores)");
  sub->add_flag("--overwrite", c->overwrite,
                "Replace the files of another run in out_dir and its checkpoint folder (without it such a folder is "
                "refused; --resume continues the run instead)");
  sub->add_option("--timeout", c->timeout_s, "Longest any wait for a peer may take, in seconds")->capture_default_str();
  c->flags.add_to(sub, {FlagScope::kAll, FlagScope::kTraining, FlagScope::kTrain});
  sub->callback([c] { run(*c); });
}

}  // namespace pipeflow::cli
