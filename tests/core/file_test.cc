#include "pipeflow/core/file.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

std::filesystem::path fresh_dir() {
  auto dir = std::filesystem::temp_directory_path() /
             ("pipeflow-file-test-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::size_t entries_in(const std::filesystem::path& dir) {
  return static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator(dir), {}));
}

TEST(File, AtomicWriteReplacesContentAndLeavesNoTemporary) {
  const auto dir = fresh_dir();
  write_file_atomic(dir / "a.txt", "first");
  write_file_atomic(dir / "a.txt", "second");
  EXPECT_EQ(read_file(dir / "a.txt"), "second");
  EXPECT_EQ(entries_in(dir), 1u);
}

TEST(File, UncommittedWriterLeavesTheOldFile) {
  const auto dir = fresh_dir();
  write_file_atomic(dir / "ckpt", "old");
  {
    AtomicFileWriter writer(dir / "ckpt");
    writer.write("half of the new");
  }
  EXPECT_EQ(read_file(dir / "ckpt"), "old");
  EXPECT_EQ(entries_in(dir), 1u);
}

TEST(File, WritingOverADirectorySaysWhyAndLeavesNoTemporary) {
  const auto dir = fresh_dir();
  std::filesystem::create_directories(dir / "taken");
  try {
    write_file_atomic(dir / "taken", "data");
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "cannot write " + (dir / "taken").string() + ": Is a directory");
  }
  EXPECT_EQ(entries_in(dir), 1u);
}

TEST(File, ReadingAMissingFileNamesIt) {
  try {
    read_file("/nonexistent/pipeflow.json");
    FAIL();
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "cannot read /nonexistent/pipeflow.json: No such file or directory");
  }
}

// A writer killed before commit() leaves NAME.tmp.PID; the next start removes
// it once no process PID runs, and leaves a live writer's and other files.
TEST(File, StaleTemporariesOfDeadWritersAreRemoved) {
  const auto dir = fresh_dir();
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // reaped: its PID runs no process now
  const auto dead = dir / ("step_3.safetensors.tmp." + std::to_string(child));
  const auto live = dir / ("step_4.safetensors.tmp." + std::to_string(::getpid()));
  for (const auto& path : {dead, live, dir / "notes.tmp.x", dir / "step_2.safetensors"}) write_file_atomic(path, "x");
  EXPECT_EQ(remove_stale_temporaries(dir), std::vector<std::filesystem::path>{dead});
  EXPECT_EQ(entries_in(dir), 3u);
  EXPECT_TRUE(remove_stale_temporaries(dir / "missing").empty());
}

}  // namespace
}  // namespace pipeflow
