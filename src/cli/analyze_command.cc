// `pipeflow analyze`: reads a trace (a train run's directory, or another
// program's traces, one per rank) back, says where the step went and what
// each change would gain, re-simulated.
#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/plan/analyze.h"

namespace pipeflow::cli {
namespace {

struct AnalyzeCommand {
  std::vector<std::string> inputs;
  std::optional<int> step;
  std::string config;
  std::string html;
  bool json = false;
  bool compare = false;
};

void run(const AnalyzeCommand& command) {
  std::vector<std::filesystem::path> paths;
  for (const std::string& input : command.inputs) {
    refuse_overwriting({"--html", command.html},
                       {{"the trace", input}, {"the trace", std::filesystem::path(input) / "trace.json"}});
    paths.emplace_back(input);
  }
  TraceOptions options{command.step, std::nullopt};
  if (!command.config.empty()) options.config = command.config;
  if (command.compare) {
    if (paths.size() != 2) {
      fail("--compare takes two runs, A (before) and B (after): {} given", paths.size());
    }
    if (!command.html.empty()) fail("--html draws one run's timeline: leave it out with --compare");
    const Analysis before = analyze(load_trace_input({paths[0]}, options));
    const Analysis after = analyze(load_trace_input({paths[1]}, options));
    write_output(command.json ? comparison_json(before, after) : comparison_text(before, after), "");
    return;
  }
  const TraceInput input = load_trace_input(paths, options);
  // The files found in a folder are inputs too.
  for (const std::string& file : input.reading.files) refuse_overwriting({"--html", command.html}, {{"the trace", file}});
  const Analysis analysis = analyze(input);
  if (!command.html.empty()) write_output(analysis_html(analysis, input.timeline), command.html);
  write_output(command.json ? analysis_json(analysis) : analysis_text(analysis), "");
}

}  // namespace

void add_analyze_command(CLI::App& app) {
  auto c = std::make_shared<AnalyzeCommand>();
  CLI::App* sub = app.add_subcommand(
      "analyze", "Explain a step's trace (busy, idle, bubble, imbalance, critical path) and rank re-simulated fixes");
  sub->add_option("inputs", c->inputs,
                  "A run directory of pipeflow train, a Chrome-trace JSON file, PyTorch profiler traces (one per "
                  "rank: files, .json.gz, or folders of them), or a Megatron-LM or DeepSpeed log")
      ->required();
  sub->add_option("--step", c->step, "The ProfilerStep#N of PyTorch traces to analyse (default: the last in every rank's)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--config", c->config,
                  "The run behind a trace or log without pipeflow's run metadata (a PyTorch, DeepSpeed or "
                  "Megatron job's), as a pipeflow or DeepSpeed configuration: the advice re-simulates it with the "
                  "measured durations");
  sub->add_option("--html", c->html, "Also write a self-contained HTML report (timeline, tables, advice)");
  sub->add_flag("--json", c->json, "Print one JSON object instead of the summary");
  sub->add_flag("--compare", c->compare,
                "Compare two runs (two inputs: A before a change, B after): their figures side by side");
  sub->callback([c] { run(*c); });
}

}  // namespace pipeflow::cli
