// `pipeflow validate FILE...`: checks schedule files (PyTorch CSV or JSON).
#include <CLI/CLI.hpp>
#include <fmt/ranges.h>

#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/units.h"
#include "pipeflow/schedule/io.h"
#include "pipeflow/schedule/validate.h"

namespace pipeflow::cli {
namespace {

// Prints the file's report and returns its number of violations (0: valid).
std::size_t check(const std::string& path, bool inference) {
  CsvReadNotes notes;
  Schedule schedule = load_schedule_file(path, &notes);
  if (inference) schedule.set_inference(true);
  const ValidationReport report = validate(schedule);
  const std::string how_read = describe_schedule_file(path, notes);
  write_output((report.ok() ? "OK " + report.summary(schedule) : report.render(schedule)) +
                   (how_read.empty() ? "" : how_read + "\n"),
               "");
  return report.violations.size();
}

// One file: its report, and an error naming it if it is not valid. Several:
// each report under the file's name (a file that cannot be read says why and
// the others are still checked), then one error listing those that failed.
void run(const std::vector<std::string>& paths, bool inference) {
  if (paths.size() == 1) {
    const std::size_t violations = check(paths.front(), inference);
    if (violations > 0) fail("{}: {} (listed above)", paths.front(), format_count(static_cast<std::int64_t>(violations), "violation"));
    return;
  }
  std::vector<std::string> failed;
  for (const std::string& path : paths) {
    write_output(fmt::format("== {}\n", path), "");
    try {
      const std::size_t violations = check(path, inference);
      if (violations > 0) failed.push_back(fmt::format("{} ({})", path, format_count(static_cast<std::int64_t>(violations), "violation")));
    } catch (const Error& error) {
      write_output(fmt::format("cannot check it: {}\n", error.what()), "");
      failed.push_back(fmt::format("{} (unreadable)", path));
    }
  }
  if (!failed.empty()) {
    fail("{} of {} files failed: {}", failed.size(), paths.size(), fmt::join(failed, ", "));
  }
}

}  // namespace

void add_validate_command(CLI::App& app) {
  auto paths = std::make_shared<std::vector<std::string>>();
  auto inference = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand(
      "validate", "Check schedule files (PyTorch pipelining CSV, or pipeflow JSON): every violation, with the grid");
  command->add_option("file", *paths, "Schedule files (.csv or .json), one or more")->required();
  command->add_flag("--inference", *inference,
                    "Check the files as forward-only inference schedules (no backward); a JSON file says it with "
                    "\"inference\": true");
  command->callback([paths, inference] { run(*paths, *inference); });
}

}  // namespace pipeflow::cli
