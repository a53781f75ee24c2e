// `pipeflow simulate`: predicts a layout's step (time, bubble, throughput,
// memory per rank) with the cost model and the simulator, and optionally
// writes its timeline as a Chrome trace and an SVG.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "pipeflow/core/file.h"
#include "pipeflow/config/megatron_args.h"
#include "pipeflow/config/run_config.h"
#include "pipeflow/core/json.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/log.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/inference.h"
#include "pipeflow/sim/prediction.h"
#include "pipeflow/sim/report.h"
#include "pipeflow/sim/run_metadata.h"
#include "pipeflow/trace/chrome_trace.h"
#include "pipeflow/trace/svg.h"
#include "inference_flags.h"
#include "run_options.h"

namespace pipeflow::cli {
namespace {

struct SimulateCommand {
  std::string config;
  std::string megatron_args;
  std::string profile;
  std::string profile_config;  // the run --profile measured, where it is not --config's
  std::string trace;
  std::string svg;
  bool json = false;
  RunFlags flags;
  // --inference: generation instead of a training step.
  bool inference = false;
  InferenceFlags inference_flags;
};

// The inference setup of the configuration (model, hardware, stages,
// partition; seq_length as the context unless --context) and the flags.
InferenceSetup inference_setup(const RunConfig& config, const InferenceFlags& flags) {
  if (!config.model) fail("--inference needs a model: give --model (a preset or a config.json)");
  if (config.tensor_parallel != 1 || config.data_parallel != 1) {
    fail("--inference prices pipeline stages only (got tensor_parallel {} and data_parallel {}): leave both at 1",
         config.tensor_parallel, config.data_parallel);
  }
  InferenceSetup setup;
  setup.model = *config.model;
  setup.hardware = config.hardware;
  setup.stages = config.pipeline.ranks;
  setup.partition = config.pipeline.partition_method;
  flags.apply(setup, config.seq_length);
  return setup;
}

void run_inference(const SimulateCommand& command) {
  if (!command.profile.empty() || !command.trace.empty() || !command.svg.empty()) {
    fail("--profile, --trace and --svg describe a training step: leave them out with --inference");
  }
  const RunConfig config = run_config_of(command.config, command.flags.overrides());
  print_config_notes(config);
  const InferencePrediction p = predict_inference(inference_setup(config, command.inference_flags));
  write_output(command.json ? json_text(inference_json(p), 2) + "\n" : inference_text(p), "");
}

// A Megatron-LM launch line (the arguments, or a file of them) as a run: its
// layout, batch and model under the flags (--hardware, --devices: Megatron
// takes its data-parallel size from the world it starts in, one replica
// without --devices). What it does not model is listed once.
RunConfig megatron_run(const std::string& text_or_file, const RunFlags& flags) {
  std::error_code not_a_path;  // a launch line longer than a file name may be
  const bool file = std::filesystem::is_regular_file(text_or_file, not_a_path);
  const std::string source = file ? text_or_file : "--megatron-args";
  MegatronArgs args =
      read_megatron_args(file ? read_file(text_or_file, kMaxConfigFileBytes, "Megatron-LM arguments") : text_or_file,
                         source);
  const RunOverrides given = flags.overrides();
  if (!given.has("devices") && !given.has("data_parallel")) {
    fmt::print(stderr, "{}: one replica ({} devices = tensor {} x pipeline {}); give --devices for Megatron's world "
                       "size\n",
               source, args.overrides.find("tensor_parallel")->get<int>() * args.overrides.find("pipeline.stages")->get<int>(),
               args.overrides.find("tensor_parallel")->get<int>(), args.overrides.find("pipeline.stages")->get<int>());
  }
  if (!args.not_modelled.empty()) {
    std::string list;
    for (const std::string& name : args.not_modelled) list += (list.empty() ? "" : ", ") + name;
    fmt::print(stderr, "{}: read, not modelled: {}\n", source, list);
  }
  return megatron_run_config(std::move(args), given, source);
}

void run(const SimulateCommand& command) {
  if (command.inference) return run_inference(command);
  if (command.inference_flags.any_given()) {
    fail("--context, --sequences, --prompt-tokens, --prefill-chunk and --microbatches shape a generation: add "
         "--inference, or leave them out");
  }
  for (const auto& [flag, output] : {std::pair{"--trace", &command.trace}, std::pair{"--svg", &command.svg}}) {
    refuse_overwriting({flag, *output}, {{"--config", command.config}, {"--profile", command.profile}});
  }
  const RunConfig config = command.megatron_args.empty() ? run_config_of(command.config, command.flags.overrides())
                                                         : megatron_run(command.megatron_args, command.flags);
  print_config_notes(config);
  const ResolvedRun resolved = resolve(config);
  const Layout layout = layout_of(resolved);
  if (!command.profile_config.empty() && command.profile.empty()) {
    fail("--profile-config {} is the configuration of the run --profile measured: give --profile too, or leave it out",
         quoted_excerpt(command.profile_config));
  }
  if (!command.profile.empty()) refuse_launch_overhead_with_profile(layout.block_launch_overhead_s);
  std::optional<MeasuredProfile> profile;
  if (!command.profile_config.empty()) {
    // Another run's measurement: this layout's costs calibrated by it, as plan and sweep predict.
    profile = Resimulator(measured_run_of(command.profile, command.profile_config, "--profile-config"))
                  .profile_for(layout);
  } else if (!command.profile.empty()) {
    profile = measured_run_from(command.profile, resolved.config).costs;
  }
  const Prediction p = predict(layout, profile ? &*profile : nullptr);
  for (const std::string& warning : p.warnings) log_warning("{}", warning);

  if (!command.trace.empty() || !command.svg.empty()) {
    // Refused before the timeline is built, which alone takes about 1.5 KB an
    // event: every action is one (two when it waits).
    const std::size_t actions = p.schedule.total_actions();
    const char* fewer = "lower the micro-batches (--global-batch, --micro-batch) or the stages (--pp)";
    if (!command.trace.empty()) check_chrome_trace_events(actions, fmt::format("{}, or leave out --trace", fewer));
    if (!command.svg.empty()) check_svg_events(actions, fmt::format("{}, or leave out --svg", fewer));
    const std::string title =
        fmt::format("{} {}: {} ranks, {} micro-batches, simulated{}", layout.model.name, layout.schedule,
                    p.schedule.num_ranks(), p.microbatches, profile ? " from a measured profile" : "");
    Timeline timeline = simulation_timeline(p.schedule, p.result, title);
    timeline.run_metadata = std::make_shared<const nlohmann::json>(run_metadata_json(
        resolved.config, profile ? *profile : profile_of_costs(p.costs.costs, "pipeflow simulate: the cost model"),
        profile.has_value(), "pipeflow simulate"));
    if (!command.trace.empty()) write_output(write_chrome_trace(timeline), command.trace);
    if (!command.svg.empty()) write_output(render_svg(timeline), command.svg);
  }
  write_output(command.json ? prediction_json(p) : prediction_text(p), "");
}

}  // namespace

void add_simulate_command(CLI::App& app) {
  auto c = std::make_shared<SimulateCommand>();
  CLI::App* sub = app.add_subcommand(
      "simulate", "Predict a layout's step: time, bubble, tokens/s, MFU and memory per rank, and its timeline");
  CLI::Option* config =
      sub->add_option("--config", c->config, "Run configuration JSON (the keys of pipeflow train); flags override it");
  sub->add_option("--megatron-args", c->megatron_args,
                  "Megatron-LM's arguments (in quotes, or a file of them) instead of --config: the model, layout and "
                  "batch of its launch line; flags override them")
      ->excludes(config);
  c->flags.add_to(sub, {FlagScope::kAll});
  sub->add_option("--profile", c->profile,
                  "Measured per-stage costs: a profile (JSON, as pipeflow train writes it), or a trace (pipeflow's, "
                  "PyTorch profiler traces) or a Megatron-LM or DeepSpeed log of this configuration's run");
  sub->add_option("--profile-config", c->profile_config,
                  "The pipeflow configuration of the run --profile measured, where it is another layout than "
                  "--config's: this layout's costs are then the cost model's calibrated by that run, as plan and "
                  "sweep predict them");
  sub->add_option("--trace", c->trace, "Write the simulated timeline as Chrome-trace JSON (Perfetto)");
  sub->add_option("--svg", c->svg, "Write the simulated timeline as SVG");
  sub->add_flag("--json", c->json, "Print one JSON object instead of tables");
  sub->add_flag("--inference", c->inference,
                "Predict generation instead: time to first token, per-token latency, tokens/s and memory per stage "
                "(docs/INFERENCE.md)");
  c->inference_flags.add_to(sub, true);
  sub->callback([c] { run(*c); });
}

}  // namespace pipeflow::cli
