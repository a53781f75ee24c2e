#include "run_pipeflow.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "pipeflow/core/file.h"

namespace pipeflow::testing {
namespace {

CommandResult run_command(const std::string& launcher, const std::string& arguments, const std::string& working_dir,
                          const std::string& setup) {
  const std::string dir = make_temp_dir();
  const std::string out_path = dir + "/stdout";
  const std::string err_path = dir + "/stderr";
  std::string command;
  if (!working_dir.empty()) command = "cd '" + working_dir + "' && ";
  if (!setup.empty()) command += setup + "; ";
  command += launcher + std::string(PIPEFLOW_BINARY) + " " + arguments + " >" + out_path + " 2>" + err_path;
  const int status = std::system(command.c_str());
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace

CommandResult run_pipeflow(const std::string& arguments, const std::string& working_dir, const std::string& setup) {
  return run_command("", arguments, working_dir, setup);
}

// Without leak detection: OpenMPI leaves blocks allocated by the modules it
// unloads in MPI_Finalize, which LeakSanitizer (the asan preset) reports
// from an unknown module, so no suppression can name them.
std::string mpirun_command(int processes) {
  return "env ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 mpirun --allow-run-as-root --oversubscribe "
         "--timeout 300 -np " +
         std::to_string(processes);
}

CommandResult run_mpirun(int processes, const std::string& arguments) {
  return run_command(mpirun_command(processes) + " ", arguments, "", "");
}

std::string read_file_if_exists(const std::string& path) {
  return std::filesystem::exists(path) ? read_file(path) : std::string();
}

std::string make_temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "pipeflow-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

}  // namespace pipeflow::testing
