#include "pipeflow/core/file.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pipeflow/core/error.h"
#include "../support/temp_dir.h"

namespace pipeflow {
namespace {

std::string error_of_writable(const std::filesystem::path& folder) {
  try {
    require_writable_folder(folder, "out_dir");
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

// The message of the Error `call` throws ("(no error)" when none).
template <class Call>
std::string error_of(Call call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

std::size_t entries_in(const std::filesystem::path& dir) {
  return static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator(dir), {}));
}

TEST(File, AtomicWriteReplacesContentAndLeavesNoTemporary) {
  const std::filesystem::path dir = testing::make_temp_dir();
  write_file_atomic(dir / "a.txt", "first");
  write_file_atomic(dir / "a.txt", "second");
  EXPECT_EQ(read_file(dir / "a.txt"), "second");
  EXPECT_EQ(entries_in(dir), 1u);
}

// read_file reads a file's length and a byte more at once: every byte comes
// back, NULs included, at sizes around the readers' 64 KiB chunk; the bounded
// reader, 64 KiB at a time, gives the same bytes (the loop that also reads
// on a file whose length the system gives as 0, /proc's, read whole here).
TEST(File, ReadFileReturnsEveryByteAtAnySize) {
  const std::filesystem::path dir = testing::make_temp_dir();
  for (const std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{65535}, std::size_t{65536},
                                 std::size_t{65537}, (std::size_t{1} << 20) + 3}) {
    std::string bytes(size, '\0');
    std::uint32_t state = 12345;
    for (char& byte : bytes) {
      state = state * 1664525u + 1013904223u;
      byte = static_cast<char>(state >> 24);
    }
    write_file_atomic(dir / "bytes", bytes);
    EXPECT_EQ(read_file(dir / "bytes"), bytes) << size << " bytes";
    EXPECT_EQ(read_file(dir / "bytes", size, "test file"), bytes) << size << " bytes, bounded";
    if (size > 0) {
      EXPECT_NE(error_of([&] { read_file(dir / "bytes", size - 1, "test file"); })
                    .find("more than " + std::to_string(size - 1) + " bytes, the limit for a test file"),
                std::string::npos)
          << size << " bytes, one past the limit";
    }
  }
  ASSERT_EQ(std::filesystem::file_size("/proc/self/status"), 0u);
  const std::string status = read_file("/proc/self/status");
  EXPECT_TRUE(status.starts_with("Name:")) << status.substr(0, 40);
  EXPECT_NE(status.find("\nVmRSS:"), std::string::npos);
}

TEST(File, UncommittedWriterLeavesTheOldFile) {
  const std::filesystem::path dir = testing::make_temp_dir();
  write_file_atomic(dir / "ckpt", "old");
  {
    AtomicFileWriter writer(dir / "ckpt");
    writer.write("half of the new");
  }
  EXPECT_EQ(read_file(dir / "ckpt"), "old");
  EXPECT_EQ(entries_in(dir), 1u);
}

TEST(File, WritingOverADirectorySaysWhyAndLeavesNoTemporary) {
  const std::filesystem::path dir = testing::make_temp_dir();
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

// A writer killed before commit() leaves NAME.pipeflow-tmp.PID; the next
// start removes it once no process PID runs (a zombie, ended but not yet
// reaped, runs none), and leaves a live writer's and other files, a user's
// NAME.tmp.PID among them.
TEST(File, StaleTemporariesOfDeadWritersAreRemoved) {
  const std::filesystem::path dir = testing::make_temp_dir();
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // reaped: its PID runs no process now
  const pid_t zombie = ::fork();
  if (zombie == 0) ::_exit(0);
  siginfo_t ended{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(zombie), &ended, WEXITED | WNOWAIT), 0);  // ended, not reaped
  const auto dead = dir / ("step_3.safetensors.pipeflow-tmp." + std::to_string(child));
  const auto unreaped = dir / ("step_5.safetensors.pipeflow-tmp." + std::to_string(zombie));
  const auto live = dir / ("step_4.safetensors.pipeflow-tmp." + std::to_string(::getpid()));
  const auto users = dir / ("notes.tmp." + std::to_string(child));
  for (const auto& path : {dead, unreaped, live, users, dir / "notes.tmp.x", dir / "step_2.safetensors"}) {
    write_file_atomic(path, "x");
  }
  std::vector<std::filesystem::path> removed = remove_stale_temporaries(dir);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::filesystem::path>{dead, unreaped}));
  EXPECT_EQ(entries_in(dir), 4u);
  ASSERT_EQ(::waitpid(zombie, nullptr, 0), zombie);
  EXPECT_TRUE(remove_stale_temporaries(dir / "missing").empty());
}

// A device or a FIFO is written through, never replaced by a regular file;
// a FIFO nobody reads is refused at once; a symbolic link's target is
// replaced and the link stays.
TEST(File, DevicesAndFifosAreWrittenThroughAndLinksFollowed) {
  const std::filesystem::path dir = testing::make_temp_dir();
  write_file_atomic("/dev/null", "discarded");
  struct stat null_info {};
  ASSERT_EQ(::stat("/dev/null", &null_info), 0);
  EXPECT_TRUE(S_ISCHR(null_info.st_mode));  // still the device

  const auto fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    write_file_atomic(fifo, "nobody listens");
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "cannot write " + fifo.string() + ": a FIFO that nobody reads");
  }
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  write_file_atomic(fifo, "heard");
  char buffer[16] = {};
  EXPECT_EQ(::read(reader, buffer, sizeof buffer), 5);
  EXPECT_STREQ(buffer, "heard");
  ::close(reader);
  struct stat fifo_info {};
  ASSERT_EQ(::stat(fifo.c_str(), &fifo_info), 0);
  EXPECT_TRUE(S_ISFIFO(fifo_info.st_mode));

  std::filesystem::create_directories(dir / "real");
  write_file_atomic(dir / "real" / "out.txt", "old");
  std::filesystem::create_symlink("real/out.txt", dir / "link.txt");
  write_file_atomic(dir / "link.txt", "new");
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.txt"));
  EXPECT_EQ(read_file(dir / "real" / "out.txt"), "new");
  EXPECT_EQ(entries_in(dir / "real"), 1u);
}

// A folder that cannot hold files is found before any work: /proc/self
// (even for root) and a read-only bind are refused with the reason; a new
// folder is made, and the probe leaves nothing behind.
TEST(File, AFolderThatCannotBeWrittenIsFoundBeforeTheWork) {
  const std::filesystem::path dir = testing::make_temp_dir();
  require_writable_folder(dir / "new" / "deep", "out_dir");
  EXPECT_EQ(entries_in(dir / "new" / "deep"), 0u);
  const std::string proc = error_of_writable("/proc/self");
  EXPECT_EQ(proc.rfind("out_dir /proc/self: cannot write in it: ", 0), 0u) << proc;
  write_file_atomic(dir / "file", "x");
  EXPECT_EQ(error_of_writable(dir / "file"),
            "out_dir " + (dir / "file").string() + ": cannot create it: Not a directory: choose a folder you can write");
}

// A FIFO used to block every reader forever, and /dev/zero grew the
// unbounded reader without end: both are refused at once; the bounded
// reader still reads a device up to its limit.
TEST(File, ReadersRefuseFifosAndTheUnboundedOneDevices) {
  const std::filesystem::path dir = testing::make_temp_dir();
  const auto fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string refused = ": a FIFO, not a file: pipeflow reads files (a device may never end, a FIFO may never "
                              "be written); give the file itself";
  try {
    read_file(fifo);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), fifo.string() + refused);
  }
  try {
    read_file(fifo, 100, "configuration");
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), fifo.string() + refused);
  }
  try {
    read_file("/dev/zero");
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()).rfind("/dev/zero: a device, not a file", 0), 0u) << error.what();
  }
  EXPECT_EQ(read_file("/dev/null", 10, "configuration"), "");
}

}  // namespace
}  // namespace pipeflow

namespace pipeflow {
namespace {

void write_gzip(const std::filesystem::path& path, const std::string& content) {
  gzFile out = gzopen(path.c_str(), "wb");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(gzwrite(out, content.data(), static_cast<unsigned>(content.size())), static_cast<int>(content.size()));
  ASSERT_EQ(gzclose(out), Z_OK);
}

std::string error_of_inflating(const std::filesystem::path& path, std::size_t limit) {
  try {
    read_file_inflated(path, limit, "trace");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// A path with a NUL byte (a JSON string may hold one) would name another
// file to the system: readers and writers refuse it, and nothing is made.
TEST(File, APathWithANulByteIsRefusedByReadersAndWriters) {
  const std::filesystem::path dir = testing::make_temp_dir();
  const std::filesystem::path path = dir / std::string("a\0b", 3);
  const std::string written = error_of([&] { write_file_atomic(path, "x"); });
  EXPECT_NE(written.find("holds a NUL byte at byte "), std::string::npos) << written;
  EXPECT_FALSE(std::filesystem::exists(dir / "a"));
  EXPECT_NE(error_of([&] { read_file(path, 100, "test file"); }).find("holds a NUL byte"), std::string::npos);
  EXPECT_NE(error_of([&] { read_file(path); }).find("holds a NUL byte"), std::string::npos);
}

// A folder lock is exclusive between holders, in one process or several,
// and released with its holder.
TEST(File, AFolderLockIsExclusiveAndReleasedWithItsHolder) {
  const std::filesystem::path dir = testing::make_temp_dir();
  std::optional<FolderLock> first = FolderLock::try_lock(dir);
  ASSERT_TRUE(first);
  EXPECT_FALSE(FolderLock::try_lock(dir));
  const pid_t child = ::fork();
  if (child == 0) ::_exit(FolderLock::try_lock(dir) ? 1 : 0);  // another process is refused too
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  first.reset();
  EXPECT_TRUE(FolderLock::try_lock(dir));
  EXPECT_NE(error_of([&] { FolderLock::try_lock(dir / "missing"); }).find("cannot open folder"), std::string::npos);
}

TEST(File, AGzipFileIsInflatedAndAPlainOneReadAsItIs) {
  const std::filesystem::path dir = testing::make_temp_dir();
  const std::string text = R"({"traceEvents": []})";
  write_gzip(dir / "t.json.gz", text);
  EXPECT_EQ(read_file_inflated(dir / "t.json.gz", 1 << 20, "trace"), text);
  write_file_atomic(dir / "plain.json", text);
  EXPECT_EQ(read_file_inflated(dir / "plain.json", 1 << 20, "trace"), text);
}

TEST(File, AGzipFileThatInflatesPastTheLimitOrIsCutShortIsAnError) {
  const std::filesystem::path dir = testing::make_temp_dir();
  write_gzip(dir / "bomb.gz", std::string(std::size_t{8} << 20, 'x'));  // 8 MiB of one byte: a few KiB packed
  EXPECT_LT(std::filesystem::file_size(dir / "bomb.gz"), std::uintmax_t{64} << 10);
  EXPECT_NE(error_of_inflating(dir / "bomb.gz", 1 << 20).find("inflates to more than 1048576 bytes, the limit for a trace"),
            std::string::npos);
  write_gzip(dir / "cut.gz", std::string(100000, 'y') + "the end");
  std::string packed = read_file(dir / "cut.gz");
  write_file_atomic(dir / "cut.gz", packed.substr(0, packed.size() / 2));
  EXPECT_NE(error_of_inflating(dir / "cut.gz", 1 << 20).find("not a whole gzip file"), std::string::npos)
      << error_of_inflating(dir / "cut.gz", 1 << 20);
}

}  // namespace
}  // namespace pipeflow
