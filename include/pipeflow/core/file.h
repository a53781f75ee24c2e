#pragma once

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pipeflow {

// The readers and writers here (require_regular_file, read_file,
// write_file_atomic, AtomicFileWriter, require_writable_folder) refuse a
// path longer than the system's PATH_MAX (no file has one; a message would
// otherwise quote it whole) with an Error quoting an excerpt of it.

// Throws Error unless `path` is a regular file (links followed): a device
// such as /dev/zero would be read without end, a FIFO would block until a
// writer came. A path that is not there passes (opening it names why).
void require_regular_file(const std::filesystem::path& path);

// Reads a whole file (a regular one: require_regular_file); throws Error
// naming the path and the system's reason.
std::string read_file(const std::filesystem::path& path);

// Reads a file meant to be small (a configuration, a schedule, a profile),
// `kind` naming it in messages ("configuration file"): throws Error naming
// the path, the limit and the kind when it holds more than `max_bytes`. It
// reads at most max_bytes + 1 bytes, so /dev/zero or a pipe that never ends
// fails at once instead of exhausting memory.
std::string read_file(const std::filesystem::path& path, std::size_t max_bytes, std::string_view kind);

// read_file(path, max_bytes, kind), and a gzip file (one that starts with
// gzip's magic bytes 1f 8b, whatever its name) inflated: `max_bytes` bounds
// the inflated bytes too, so a small file that inflates without end fails
// at the limit. Throws Error naming the path for a damaged or truncated
// gzip stream.
std::string read_file_inflated(const std::filesystem::path& path, std::size_t max_bytes, std::string_view kind);

// The size limits of the files read with the bounded read_file, large enough
// for any real file of the kind (the largest example configuration is 2 KB, a
// Hugging Face config.json a few KB, a schedule of the largest size Schedule
// accepts in JSON about 60 MB).
inline constexpr std::size_t kMaxConfigFileBytes = std::size_t{16} << 20;
// metrics.jsonl: about 1 KB a step, so a million steps fit.
inline constexpr std::size_t kMaxMetricsFileBytes = std::size_t{1} << 30;

// Writes a file so that readers see either the old content or the whole new
// content, never a part: the bytes go to a temporary file beside the target,
// are flushed to disk, the temporary is renamed over the target
// (NAME.pipeflow-tmp.PID, PID: the writer's process) and the folder is
// synced, so that the rename survives a crash. A symbolic link is followed:
// its target is replaced, the link stays. A target that is not a regular
// file (a device such as /dev/null, a FIFO, a socket) is written through,
// never replaced; a FIFO that nobody reads is an Error, not a wait.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

// Removes the temporaries (NAME.pipeflow-tmp.PID) in `folder` whose writer no longer
// runs: what a writer killed before its commit() left behind. A live
// writer's temporary stays. Returns the paths removed; a missing folder
// holds none.
std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& folder);

// A path a command reads or writes, with the flag that named it.
struct NamedPath {
  std::string_view flag;  // "--html", "--config"
  std::filesystem::path path;
};

// Throws Error when `output` names the same file as one of `inputs` (links
// and relative paths resolved; an output that does not exist yet names
// none), naming both and the fix: writing it would replace the input.
void refuse_overwriting(const NamedPath& output, std::initializer_list<NamedPath> inputs);

// Whether `path` lies in `folder` or below it, both resolved as opening them
// would (relative to the working directory, "..", "." and symbolic links
// followed); false when either cannot be resolved.
bool is_within(const std::filesystem::path& path, const std::filesystem::path& folder);

// Creates `folder` if needed and proves a file can be made in it (a probe,
// made and removed), so that a run finds a read-only or missing output
// folder before its work, not after. Throws Error naming `what` ("out_dir"),
// the folder and the system's reason.
void require_writable_folder(const std::filesystem::path& folder, std::string_view what);

// An exclusive lock on a folder (flock(2) on the folder itself): held while
// the object lives, released when its process ends however it ends (a
// kill -9 leaves no stale lock). Advisory: it keeps out the programs that
// ask for it, here every pipeflow train into the same folder.
class FolderLock {
 public:
  // The lock on `folder` (which exists), or none when another process (or
  // another FolderLock in this one) holds it. Throws Error when the folder
  // cannot be opened.
  static std::optional<FolderLock> try_lock(const std::filesystem::path& folder);
  ~FolderLock();
  FolderLock(FolderLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FolderLock& operator=(FolderLock&&) = delete;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  explicit FolderLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// The streaming form of write_file_atomic, for files too large to build in
// memory (checkpoints). Nothing appears at `path` until commit(); a writer
// destroyed without commit() removes its temporary file.
//
// Thread safety: one writer per thread.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, std::size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  void commit();

 private:
  std::filesystem::path shown_;      // as given, for messages
  std::filesystem::path path_;       // the file written: a link's target
  std::filesystem::path temporary_;  // empty: written through (not a regular file)
  std::FILE* file_ = nullptr;
};

}  // namespace pipeflow
