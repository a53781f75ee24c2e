#include "readme_commands.h"

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "pipeflow/core/file.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {

std::string source_dir() { return PIPEFLOW_SOURCE_DIR; }

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) result.push_back(line);
  return result;
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

namespace {

std::string with_binary_under_test(std::string command) {
  const std::string binary = PIPEFLOW_BINARY;
  for (std::size_t at = command.find(kReadmeBinary); at != std::string::npos;
       at = command.find(kReadmeBinary, at + binary.size())) {
    command.replace(at, kReadmeBinary.size(), binary);
  }
  return command;
}

}  // namespace

ShellResult run_as_written(const std::string& command) {
  const std::string dir = make_temp_dir();
  // A script, so that the command's own `;`, `$?` and trailing comments stay
  // its own and the redirections below take all of its output.
  std::string script = "cd '" + source_dir() + "' || exit 1\n";
  if (command.find("mpirun ") != std::string::npos) {
    script += "export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\n";
  }
  script += with_binary_under_test(command) + "\n";
  write_file_atomic(dir + "/command.sh", script);
  const std::string shell =
      "timeout -k 10 300 bash " + dir + "/command.sh >" + dir + "/stdout 2>" + dir + "/stderr";
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(shell.c_str());
  ShellResult result;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.output = read_file_if_exists(dir + "/stdout") + read_file_if_exists(dir + "/stderr");
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace pipeflow::testing
