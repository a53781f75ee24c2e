#pragma once

#include <string>

namespace pipeflow::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // standard output
  std::string err;  // standard error
};

// Runs the pipeflow executable with `arguments` (a shell-quoted string) in
// `working_dir` (empty: the current directory), after the shell commands
// `setup` (limits: "ulimit -f 100; trap '' XFSZ").
CommandResult run_pipeflow(const std::string& arguments, const std::string& working_dir = "",
                           const std::string& setup = "");

// Runs `processes` copies of the pipeflow executable under mpirun (as root
// and with more processes than cores allowed, as CI runs it), without
// LeakSanitizer's leak check (OpenMPI's own blocks at exit).
CommandResult run_pipeflow_under_mpirun(int processes, const std::string& arguments);

// A fresh, empty directory under the system's temporary directory.
std::string make_temp_dir();

}  // namespace pipeflow::testing
