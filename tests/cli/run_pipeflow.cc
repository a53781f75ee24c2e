#include "run_pipeflow.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

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

std::vector<pid_t> ranks_of_job(const std::string& marker, int processes) {
  std::vector<pid_t> pids(static_cast<std::size_t>(processes), 0);
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (!std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream cmdline(entry.path() / "cmdline");
    std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    if (args.find(marker) == std::string::npos || args.rfind(PIPEFLOW_BINARY, 0) != 0) continue;
    std::ifstream environ(entry.path() / "environ");
    std::string env((std::istreambuf_iterator<char>(environ)), std::istreambuf_iterator<char>());
    const std::string key = std::string("OMPI_COMM_WORLD_RANK=");
    const std::size_t at = env.find(key);
    if (at == std::string::npos) continue;
    const int rank = std::stoi(env.substr(at + key.size()));
    if (rank >= 0 && rank < processes) pids[static_cast<std::size_t>(rank)] = std::stoi(name);
  }
  return pids;
}

bool alive(pid_t pid) {
  if (pid == 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const std::size_t state = text.rfind(") ");
  return state != std::string::npos && text.at(state + 2) != 'Z' && text.at(state + 2) != 'X';
}

bool ends_within_10_s(pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (alive(pid) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return !alive(pid);
}

}  // namespace pipeflow::testing
