// `pipeflow simulate`: predicts a layout's step (time, bubble, throughput,
// memory per rank) with the cost model and the simulator, and optionally
// writes its timeline as a Chrome trace and an SVG.
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "pipeflow/config/run_config.h"
#include "pipeflow/core/log.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/prediction.h"
#include "pipeflow/sim/report.h"
#include "pipeflow/sim/run_metadata.h"
#include "pipeflow/trace/chrome_trace.h"
#include "pipeflow/trace/svg.h"
#include "run_options.h"

namespace pipeflow::cli {
namespace {

struct SimulateCommand {
  std::string config;
  std::string profile;
  std::string trace;
  std::string svg;
  bool json = false;
  RunFlags flags;
};

void run(const SimulateCommand& command) {
  const RunOverrides overrides = command.flags.overrides();
  const RunConfig config = run_config_of(command.config, overrides);
  print_config_notes(config);
  const ResolvedRun resolved = resolve(config);
  const Layout layout = layout_of(resolved);
  std::optional<MeasuredProfile> profile;
  if (!command.profile.empty()) profile = load_profile(command.profile);
  const Prediction p = predict(layout, profile ? &*profile : nullptr);
  for (const std::string& warning : p.warnings) log_warning("{}", warning);

  if (!command.trace.empty() || !command.svg.empty()) {
    const std::string title =
        fmt::format("{} {}: {} ranks, {} micro-batches, simulated{}", layout.model.name, layout.schedule,
                    p.schedule.num_ranks(), p.microbatches, profile ? " from a measured profile" : "");
    Timeline timeline = simulation_timeline(p.schedule, p.result, title);
    timeline.run_metadata = run_metadata_json(
        resolved.config, profile ? *profile : profile_of_costs(p.costs.costs, "pipeflow simulate: the cost model"),
        profile.has_value(), "pipeflow simulate");
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
  sub->add_option("--config", c->config, "Run configuration JSON (the keys of pipeflow train); flags override it");
  c->flags.add_to(sub);
  sub->add_option("--profile", c->profile, "Measured per-stage costs (JSON, as pipeflow train writes them)");
  sub->add_option("--trace", c->trace, "Write the simulated timeline as Chrome-trace JSON (Perfetto)");
  sub->add_option("--svg", c->svg, "Write the simulated timeline as SVG");
  sub->add_flag("--json", c->json, "Print one JSON object instead of tables");
  sub->callback([c] { run(*c); });
}

}  // namespace pipeflow::cli
