// `pipeflow sweep`: simulates a layout over one or two varied settings and
// prints a table (or JSON), optionally with SVG plots.
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "pipeflow/config/run_config.h"
#include "pipeflow/plan/sweep.h"
#include "run_options.h"

namespace pipeflow::cli {
namespace {

struct SweepCommand {
  std::string config;
  std::vector<std::string> vary;
  std::string svg;
  bool json = false;
  RunFlags flags;
};

void run(const SweepCommand& command) {
  std::vector<SweepAxis> axes;
  for (const std::string& text : command.vary) axes.push_back(parse_sweep_axis(text));
  const ConfigSource source = [&](const RunOverrides& overrides) { return run_config_of(command.config, overrides); };
  const Sweep sweep = run_sweep(source, command.flags.overrides(), axes);
  if (!command.svg.empty()) write_output(sweep_svg(sweep), command.svg);
  write_output(command.json ? sweep_json(sweep) : sweep_text(sweep), "");
}

}  // namespace

void add_sweep_command(CLI::App& app) {
  auto c = std::make_shared<SweepCommand>();
  CLI::App* sub = app.add_subcommand(
      "sweep", "Simulate a layout over one or two varied settings: step time, bubble, peak memory, tokens/s");
  sub->add_option("--config", c->config, "Run configuration JSON (the keys of pipeflow train); flags override it");
  c->flags.add_to(sub);
  sub->add_option("--vary", c->vary,
                  "KEY=V1,V2,... (once or twice); KEY: microbatches (global batch fixed), micro-batch, global-batch, "
                  "stages, schedule, virtual, recompute, partition, comm, tensor-parallel, data-parallel, seq-length")
      ->required();
  sub->add_option("--svg", c->svg, "Write plots of the four figures against the first setting as SVG");
  sub->add_flag("--json", c->json, "Print one JSON object instead of the table");
  sub->callback([c] { run(*c); });
}

}  // namespace pipeflow::cli
