// `pipeflow validate FILE`: checks a schedule file (PyTorch CSV or JSON).
#include <memory>
#include <string>

#include "commands.h"
#include "pipeflow/core/error.h"
#include "pipeflow/schedule/io.h"
#include "pipeflow/schedule/validate.h"

namespace pipeflow::cli {
namespace {

void run(const std::string& path) {
  int ignored = 0;
  const Schedule schedule = load_schedule_file(path, &ignored);
  const ValidationReport report = validate(schedule);
  std::string note;
  if (ignored > 0) {
    note = fmt::format("(ignored {} UNSHARD/RESHARD/REDUCE_GRAD action{}: they are no pipeline actions)\n", ignored,
                       ignored == 1 ? "" : "s");
  }
  if (report.ok()) {
    write_output("OK " + report.summary(schedule) + note, "");
    return;
  }
  write_output(report.render(schedule) + note, "");
  fail("{}: {} violation{} (listed above)", path, report.violations.size(), report.violations.size() == 1 ? "" : "s");
}

}  // namespace

void add_validate_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand(
      "validate", "Check a schedule file (PyTorch pipelining CSV, or pipeflow JSON): every violation, with the grid");
  command->add_option("file", *path, "Schedule file (.csv or .json)")->required();
  command->callback([path] { run(*path); });
}

}  // namespace pipeflow::cli
