#pragma once

#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace pipeflow::testing {

// The folders make_temp_dir made, removed with what they hold when the test
// program exits: after a failed assertion too (ctest runs each test in its own
// process), so a test run leaves nothing in the temporary folder. Only the
// process that made them removes them: a forked child that exits does not.
class TempDirs {
 public:
  std::string make() {
    std::string pattern = (std::filesystem::temp_directory_path() / "pipeflow-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    const std::lock_guard<std::mutex> lock(mutex_);
    made_.push_back(pattern);
    return pattern;
  }
  ~TempDirs() {
    if (::getpid() != owner_) return;
    for (const std::string& dir : made_) {
      std::error_code ignored;  // a folder the test removed itself
      std::filesystem::remove_all(dir, ignored);
    }
  }

 private:
  const pid_t owner_ = ::getpid();
  std::mutex mutex_;
  std::vector<std::string> made_;
};

// A fresh, empty folder under the system's temporary folder, removed when the
// test program exits.
inline std::string make_temp_dir() {
  static TempDirs dirs;
  return dirs.make();
}

}  // namespace pipeflow::testing
