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

// "mpirun ... -np N": as root, oversubscribed (as CI runs it), the job ended
// after 300 s, without LeakSanitizer's leak check (OpenMPI's own blocks at exit).
std::string mpirun_command(int processes);
// Runs `mpirun_command(processes) pipeflow arguments`, as run_pipeflow.
CommandResult run_mpirun(int processes, const std::string& arguments);

// The file's bytes, or "" when it does not exist (yet).
std::string read_file_if_exists(const std::string& path);

// A fresh, empty directory under the system's temporary directory.
std::string make_temp_dir();

}  // namespace pipeflow::testing
