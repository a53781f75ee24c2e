// `pipeflow sweep`: simulates a layout over one or two varied settings and
// prints a table (or JSON), optionally with SVG plots; with --train it also
// trains every point (pipeflow train in this process) and sets the measured
// figures and the loss curves beside the predicted ones.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "pipeflow/config/run_config.h"
#include "pipeflow/core/error.h"
#include "pipeflow/plan/advise_batch.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/plan/sweep.h"
#include "pipeflow/runtime/progress.h"
#include "pipeflow/runtime/run_settings.h"
#include "pipeflow/runtime/trainer.h"
#include "run_options.h"

namespace pipeflow::cli {
namespace {

struct SweepCommand {
  CLI::App* app = nullptr;
  std::string config;
  std::vector<std::string> vary;
  std::string svg;
  bool json = false;
  std::string lr_rule = "sqrt";
  bool train = false;
  bool emulate = false;
  bool overwrite = false;
  double timeout_s = 60;
  std::optional<double> noise_scale;
  std::string profile;
  std::string metrics;
  RunFlags flags;
};

// One point as `pipeflow train` runs it, into out_dir/NAME (and its
// checkpoints, if any, into checkpoint.dir/NAME): progress on standard error.
MeasuredPoint train_point(const SweepCommand& c, const ResolvedRun& run, const std::string& name) {
  runtime::TrainSettings settings = runtime::train_settings(run);
  if (!settings.resume.empty()) {
    fail("{}: checkpoint.load = \"{}\": a trained sweep starts every point afresh; remove checkpoint.load",
         run.config.source, settings.resume.string());
  }
  settings.out_dir /= name;
  settings.checkpoint_dir /= name;
  settings.emulate = c.emulate;
  settings.overwrite = c.overwrite;
  settings.engine.timeout = std::chrono::duration<double>(c.timeout_s);
  fmt::print(stderr, "pipeflow sweep: training {} ({} steps) into {}\n", name, settings.steps,
             settings.out_dir.string());
  runtime::ProgressPrinter progress(stderr, isatty(fileno(stderr)) == 1, settings.steps, settings.emulate,
                                    settings.steps_per_print);
  const runtime::TrainOutcome outcome = runtime::train(settings, progress);
  const runtime::StepLog& last = outcome.log.back();
  MeasuredPoint m;
  m.step_time_s = last.step_time_s;
  m.bubble_ratio = last.bubble_measured;
  for (std::int64_t bytes : last.peak_activation_bytes) {
    m.peak_activation_bytes = std::max(m.peak_activation_bytes, static_cast<double>(bytes));
  }
  m.tokens_per_s = last.tokens_per_s;
  const double tokens_per_step = static_cast<double>(run.batch.global) * run.seq_length;
  for (const runtime::StepLog& step : outcome.log) {
    m.tokens_seen.push_back(static_cast<double>(step.step + 1) * tokens_per_step);
    m.loss.push_back(step.loss);
  }
  m.val_loss = last.val_loss;
  m.out_dir = settings.out_dir.string();
  return m;
}

void run(const SweepCommand& c) {
  if (!c.train) {
    for (const char* flag : {"--steps", "--out-dir", "--emulate", "--timeout"}) {
      if (c.app->count(flag) > 0) fail("{} is an option of the training runs: give it with --train", flag);
    }
  }
  if (!(c.timeout_s > 0)) fail("--timeout {}: must be > 0 seconds", c.timeout_s);
  SweepRequest request{c.flags.overrides(), {}, parse_lr_rule(c.lr_rule), {}, c.noise_scale, {}};
  if (!c.metrics.empty()) {
    if (c.noise_scale) fail("--noise-scale and --metrics {}: give the noise scale one way", c.metrics);
    request.noise_scale = noise_scale_of_metrics(c.metrics);
  }
  for (const std::string& text : c.vary) request.axes.push_back(parse_sweep_axis(text));
  if (c.train) request.train = [&](const ResolvedRun& run, const std::string& name) { return train_point(c, run, name); };
  const ConfigSource source = [&](const RunOverrides& overrides) { return run_config_of(c.config, overrides); };
  if (!c.profile.empty()) request.measured = measured_run_from(c.profile, source(request.base));
  const Sweep sweep = run_sweep(source, request);
  if (!c.svg.empty()) write_output(sweep_svg(sweep), c.svg);
  write_output(c.json ? sweep_json(sweep) : sweep_text(sweep), "");
  // A sweep none of whose points ran found nothing: say why, and fail.
  const bool none_ran = std::all_of(sweep.points.begin(), sweep.points.end(),
                                    [](const SweepPoint& point) { return !point.error.empty(); });
  if (none_ran) {
    fail("none of the {} points ran; the first: {}", sweep.points.size(), sweep.points.front().error);
  }
}

}  // namespace

void add_sweep_command(CLI::App& app) {
  auto c = std::make_shared<SweepCommand>();
  CLI::App* sub = app.add_subcommand(
      "sweep", "Simulate (or --train) a layout over one or two varied settings: step time, bubble, memory, tokens/s, "
               "loss");
  c->app = sub;
  sub->add_option("--config", c->config, "Run configuration JSON (the keys of pipeflow train); flags override it");
  c->flags.add_to(sub, {FlagScope::kAll, FlagScope::kTraining});
  sub->add_option("--vary", c->vary,
                  fmt::format("KEY=V1,V2,... (once or twice); KEY: {} (microbatches keeps the global batch; a "
                              "global-batch scales the learning rate by --lr-rule), or a key path of the "
                              "configuration (optimizer.params.lr, model.n_layer, ...)",
                              sweep_option_names()))
      ->required();
  sub->add_option("--lr-rule", c->lr_rule,
                  "How a varied global batch scales the learning rate: sqrt (Adam, AdamW), linear (SGD) or none")
      ->capture_default_str();
  sub->add_flag("--train", c->train,
                "Also train every point as pipeflow train does (its steps, into out_dir/KEY=VALUE) and show the "
                "measured figures and loss beside the predicted");
  sub->add_flag("--emulate", c->emulate, "With --train: run the actions one at a time and replay their durations");
  sub->add_flag("--overwrite", c->overwrite,
                "With --train: replace an earlier sweep's runs in the points' folders (as pipeflow train --overwrite)");
  sub->add_option("--timeout", c->timeout_s, "With --train: longest any wait for a peer may take, in seconds")
      ->capture_default_str();
  sub->add_option("--profile", c->profile,
                  "The run measured: a profile (as train writes it), a trace (pipeflow's, PyTorch profiler traces) or "
                  "a Megatron-LM or DeepSpeed log, of the configuration given; every point is re-simulated from it");
  sub->add_option("--noise-scale", c->noise_scale,
                  "Gradient noise scale B_simple in sequences: each point's samples and steps over their minimum");
  sub->add_option("--metrics", c->metrics, "A pipeflow train metrics.jsonl: its last noise_scale is the noise scale");
  sub->add_option("--svg", c->svg, "Write plots of the figures against the first setting as SVG");
  sub->add_flag("--json", c->json, "Print one JSON object instead of the table");
  sub->callback([c] { run(*c); });
}

}  // namespace pipeflow::cli
