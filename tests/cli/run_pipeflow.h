#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "../support/temp_dir.h"

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

// The pids of an MPI job's pipeflow processes, by world rank (from their
// environment: mpirun sets OMPI_COMM_WORLD_RANK): those whose command line
// holds `marker`; 0 for a rank not (yet) running.
std::vector<pid_t> ranks_of_job(const std::string& marker, int processes);

// Running, not a zombie (an ended process whose new parent has not reaped it yet).
bool alive(pid_t pid);

// A process may still be tearing down (MPI_Finalize, the sanitizers' exit
// work) for a moment after mpirun returned: "no process outlives the job"
// means each one is gone within 10 s of it.
bool ends_within_10_s(pid_t pid);

}  // namespace pipeflow::testing
