// `pipeflow schedule`: builds a schedule with a generator and prints it.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/grid.h"
#include "pipeflow/schedule/io.h"
#include "pipeflow/schedule/passes.h"
#include "pipeflow/schedule/validate.h"
#include "pipeflow/trace/event.h"
#include "pipeflow/trace/svg.h"

namespace pipeflow::cli {
namespace {

struct ScheduleOptions {
  std::string name;
  int stages = 0;
  int microbatches = 0;
  bool sized = false;  // both --stages and --microbatches were given
  int chunks_per_rank = 1;
  std::string format = "grid";
  std::string output;
  bool lowered = false;
  bool list = false;
};

std::string list_text() {
  std::string out;
  for (const ScheduleInfo& info : list_schedules()) {
    out += fmt::format("{:<17} {}\n", info.name, info.description);
    out += fmt::format("{:<17} constraints: {}{}\n", "", info.constraints,
                       info.takes_virtual ? " (takes --virtual)" : "");
    out += fmt::format("{:<17} placement: {}\n", "", to_string(info.placement));
    out += fmt::format("{:<17} source: {}\n", "", info.source);
  }
  return out;
}

std::string counted(int n, const char* one, const char* many) { return fmt::format("{} {}", n, n == 1 ? one : many); }

std::string svg_title(const Schedule& schedule) {
  std::string title = fmt::format("{}: {}, {}", schedule.name(), counted(schedule.num_ranks(), "rank", "ranks"),
                                  counted(schedule.num_microbatches(), "micro-batch", "micro-batches"));
  if (schedule.chunks_per_rank() > 1) title += fmt::format(", {} chunks per rank", schedule.chunks_per_rank());
  if (schedule.has_communication()) title += ", lowered (rendezvous)";
  return title + ", unit costs F=1 B=2 I=W=1";
}

std::string render(const Schedule& schedule, const std::string& format) {
  if (format == "csv") return write_csv(schedule);
  if (format == "json") return write_json(schedule);
  // Refused before the dry run, which alone takes minutes at Schedule's size limit.
  if (format == "svg") {
    check_svg_events(schedule.total_actions(),
                     "use fewer stages or micro-batches, or --format csv for the whole schedule");
  }
  if (format == "grid" && grid_cells(schedule) > kMaxGridCells) {
    fail("the grid of {} would have {} cells, more than the limit of {}: use fewer stages or micro-batches, or "
         "--format csv",
         schedule.name(), grid_cells(schedule), kMaxGridCells);
  }
  const ValidationReport report = validate(schedule);
  if (!report.ok()) fail("internal: generated schedule is invalid:\n{}", report.render(schedule));
  if (format == "svg") {
    Timeline timeline = timeline_from_execution(schedule, *report.dry_run, svg_title(schedule));
    timeline.time_unit = "unit";
    return render_svg(timeline);
  }
  return render_grid(schedule) + "\n" + report.summary(schedule);
}

void run(const ScheduleOptions& options) {
  std::string text;
  if (options.list) {
    text = list_text();
  } else {
    if (options.name.empty() || !options.sized) {
      fail("schedule needs --schedule NAME, --stages P and --microbatches M (or --list to see the schedules)");
    }
    Schedule schedule = make_schedule(options.name, options.stages, options.microbatches, options.chunks_per_rank);
    if (options.lowered) schedule = insert_send_recv(schedule);
    text = render(schedule, options.format);
  }
  write_output(text, options.output);
}

}  // namespace

void write_output(const std::string& text, const std::string& path) {
  if (!path.empty()) {
    write_file_atomic(path, text);
  } else if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size()) {
    fail("cannot write to standard output");
  }
}

void add_schedule_command(CLI::App& app) {
  auto options = std::make_shared<ScheduleOptions>();
  CLI::App* command = app.add_subcommand("schedule", "Generate a pipeline schedule and print it");
  command->add_option("--schedule", options->name, "Schedule name (see --list)");
  command->add_option("--stages", options->stages, "Pipeline ranks (devices), as DeepSpeed's num_stages");
  command->add_option("--microbatches", options->microbatches, "Micro-batches per step (gradient accumulation)");
  command->add_option("--virtual", options->chunks_per_rank,
                      "Model chunks per rank (interleaved-1f1b, looped-bfs; zbv and dualpipev always hold 2)")
      ->capture_default_str();
  command->add_option("--format", options->format, "Output format")
      ->check(CLI::IsMember({"grid", "csv", "json", "svg"}))
      ->capture_default_str();
  command->add_option("-o,--output", options->output, "Write to FILE (atomically) instead of standard output");
  command->add_flag("--lowered", options->lowered, "Add the SEND/RECV actions (insert_send_recv)");
  command->add_flag("--list", options->list, "List the schedules with their constraints");
  command->callback([options, command] {
    options->sized = command->count("--stages") > 0 && command->count("--microbatches") > 0;
    run(*options);
  });
}

}  // namespace pipeflow::cli
