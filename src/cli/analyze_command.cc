// `pipeflow analyze`: reads a trace (or a train run's directory) back, says
// where the step went and what each change would gain, re-simulated.
#include <memory>
#include <string>

#include "commands.h"
#include "pipeflow/core/file.h"
#include "pipeflow/plan/analyze.h"

namespace pipeflow::cli {
namespace {

struct AnalyzeCommand {
  std::string input;
  std::string html;
  bool json = false;
};

void run(const AnalyzeCommand& command) {
  refuse_overwriting({"--html", command.html},
                     {{"the trace", command.input}, {"the trace", std::filesystem::path(command.input) / "trace.json"}});
  const TraceInput input = load_trace_input(command.input);
  const Analysis analysis = analyze(input);
  if (!command.html.empty()) write_output(analysis_html(analysis, input.timeline), command.html);
  write_output(command.json ? analysis_json(analysis) : analysis_text(analysis), "");
}

}  // namespace

void add_analyze_command(CLI::App& app) {
  auto c = std::make_shared<AnalyzeCommand>();
  CLI::App* sub = app.add_subcommand(
      "analyze", "Explain a step's trace (busy, idle, bubble, imbalance, critical path) and rank re-simulated fixes");
  sub->add_option("input", c->input, "A run directory of pipeflow train, or a Chrome-trace JSON file")->required();
  sub->add_option("--html", c->html, "Also write a self-contained HTML report (timeline, tables, advice)");
  sub->add_flag("--json", c->json, "Print one JSON object instead of the summary");
  sub->callback([c] { run(*c); });
}

}  // namespace pipeflow::cli
