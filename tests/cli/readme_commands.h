#pragma once

// Running a Markdown page's shell commands as its reader would: from the
// repository root, with the pipeflow under test in place of the
// build/release/pipeflow the page names (another preset's build too). Shared
// by readme_test.cc (README.md's quick start) and cases_test.cc
// (examples/cases/*/README.md).

#include <cstddef>
#include <string>
#include <vector>

namespace pipeflow::testing {

// How the pages' commands name the executable.
inline const std::string kReadmeBinary = "build/release/pipeflow";

// The repository root, where every command runs.
std::string source_dir();

std::vector<std::string> split_lines(const std::string& text);
bool starts_with(const std::string& text, const std::string& prefix);

struct ShellResult {
  int exit_code = -1;
  std::string output;  // standard output, then standard error
  double seconds = 0;
};

// Runs `command` (any shell line: `;`, `&&`, `$?`, comments) by bash in the
// repository root, for at most 300 s, with the binary under test in place
// of every build/release/pipeflow; a line that runs mpirun runs without
// LeakSanitizer's leak check, as run_mpirun runs it (OpenMPI's own blocks
// at exit).
ShellResult run_as_written(const std::string& command);

}  // namespace pipeflow::testing
