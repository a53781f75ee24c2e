#include "pipeflow/core/file.h"

#include <zlib.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <stdexcept>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

std::string system_reason() { return std::strerror(errno); }

// NAME.pipeflow-tmp.PID: a name no user's file has by chance, so that only
// this writer's leftovers are ever removed.
constexpr std::string_view kTemporaryMarker = ".pipeflow-tmp.";

std::filesystem::path temporary_beside(const std::filesystem::path& path) {
  return path.string() + fmt::format("{}{}", kTemporaryMarker, static_cast<long>(::getpid()));
}

// The system's calls end a path at its first NUL byte (a JSON string may
// hold one: "a\u0000b"): such a path would read or write another file than
// the one named.
void refuse_nul(const std::filesystem::path& path) {
  const std::string& text = path.native();
  const std::size_t nul = text.find('\0');
  if (nul == std::string::npos) return;
  fail("the path {}: holds a NUL byte at byte {}, which no file name can: give the path without it",
       quoted_excerpt(text.substr(0, nul)), nul);
}

// No path the system opens is longer than PATH_MAX bytes: a longer one (a
// value meant for something else, or hostile) is refused before a message
// quotes it whole.
constexpr std::size_t kMaxPathBytes = PATH_MAX;

// `what` names the path's flag or key ("out_dir"), if anything does here.
void refuse_overlong(const std::filesystem::path& path, std::string_view what = "") {
  const std::string& text = path.native();
  if (text.size() <= kMaxPathBytes) return;
  fail("{}{}: a path of {} bytes, more than the system's limit of {}: give a shorter path",
       what.empty() ? "" : fmt::format("{} ", what), quoted_excerpt(text), text.size(), kMaxPathBytes);
}

// The file a write to `path` lands in: a symbolic link's target (followed
// to the end, relative links from their folder), else the path itself.
std::filesystem::path followed(const std::filesystem::path& path) {
  refuse_overlong(path);
  refuse_nul(path);
  std::filesystem::path at = path;
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code error;
    if (!std::filesystem::is_symlink(at, error)) return at;
    const std::filesystem::path target = std::filesystem::read_symlink(at, error);
    if (error) return at;
    at = target.is_absolute() ? target : at.parent_path() / target;
  }
  fail("cannot write {}: more than 40 symbolic links to follow", path.string());
}

// Whether `path` exists and is not a regular file (a device, a FIFO, a
// socket): such a target is written through, never replaced.
// 0 when it is not there (a link followed).
mode_t file_type(const std::filesystem::path& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 ? (info.st_mode & S_IFMT) : 0;
}

bool is_special(const std::filesystem::path& path) {
  const mode_t type = file_type(path);
  return type != 0 && !S_ISREG(type) && !S_ISDIR(type);
}

// Refuses a FIFO or socket (a FIFO's open would block until a writer came)
// and, unless `devices`, a device.
void refuse_non_file(const std::filesystem::path& path, bool devices) {
  refuse_overlong(path);
  refuse_nul(path);
  const mode_t type = file_type(path);
  if (type == 0 || S_ISREG(type) || S_ISDIR(type) || (devices && !S_ISFIFO(type) && !S_ISSOCK(type))) return;
  const char* kind = S_ISFIFO(type) ? "a FIFO" : S_ISSOCK(type) ? "a socket" : "a device";
  fail("{}: {}, not a file: pipeflow reads files (a device may never end, a FIFO may never be written); give the "
       "file itself",
       path.string(), kind);
}

// Opens a non-regular target for writing: a FIFO without a reader is
// refused at once instead of blocking.
std::FILE* open_through(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENXIO) fail("cannot write {}: a FIFO that nobody reads", path.string());
    fail("cannot write {}: {}", path.string(), system_reason());
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  std::FILE* file = ::fdopen(fd, "wb");
  if (file == nullptr) {
    ::close(fd);
    fail("cannot write {}: {}", path.string(), system_reason());
  }
  return file;
}

// The rename is durable only once the folder's entry is on disk too.
bool sync_folder(const std::filesystem::path& folder) {
  const int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return false;
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  return synced;
}

// The writer's PID when `name` is a temporary of AtomicFileWriter (NAME.tmp.PID), else 0.
long writer_of_temporary(const std::string& name) {
  const std::size_t marker = name.rfind(kTemporaryMarker);
  if (marker == std::string::npos) return 0;
  const std::string_view digits = std::string_view(name).substr(marker + kTemporaryMarker.size());
  long pid = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  return error == std::errc() && end == digits.data() + digits.size() && pid > 0 ? pid : 0;
}

// Whether process `pid` can still write: it exists and is not a zombie. A
// killed writer whose parent has not reaped it (a container's init that
// reaps nothing, a launcher killed with it) stays a zombie, which kill(pid,
// 0) still finds.
bool writer_runs(long pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const std::size_t state = text.rfind(") ");  // the command name in parentheses may hold anything
  return state == std::string::npos || state + 2 >= text.size() || (text[state + 2] != 'Z' && text[state + 2] != 'X');
}

}  // namespace

void require_regular_file(const std::filesystem::path& path) { refuse_non_file(path, false); }

namespace {

constexpr std::size_t kReadChunk = std::size_t{1} << 16;

// `in` to its end, or to one byte past `limit` (the caller names a file
// longer than its limit by that byte): `first` bytes in one read, then 64 KiB
// at a time.
std::string read_to_end(std::istream& in, std::size_t first, std::size_t limit, const std::filesystem::path& path) {
  std::string content;
  std::size_t size = 0;
  std::size_t chunk = first;
  const auto too_large = [&] {
    fail("cannot read {}: a string of {} bytes for it does not fit in this process's memory", path.string(),
         size + chunk);
  };
  while (in && size <= limit) {
    if (limit - size < chunk) chunk = limit - size + 1;  // (never 0: a 0-byte read would leave `in` good)
    try {
      content.resize(size + chunk);
    } catch (const std::bad_alloc&) {
      too_large();
    } catch (const std::length_error&) {
      too_large();
    }
    in.read(content.data() + size, static_cast<std::streamsize>(chunk));
    size += static_cast<std::size_t>(in.gcount());
    chunk = kReadChunk;
  }
  if (in.bad()) fail("cannot read {}: {}", path.string(), system_reason());
  content.resize(size);
  return content;
}

}  // namespace

std::string read_file(const std::filesystem::path& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}: {}", path.string(), system_reason());
  // The file's size and one byte more in one read (the extra byte meets the
  // end, so the loop stops there): a checkpoint is read straight into its
  // string. A file that tells no size (/proc's say 0) or grew meanwhile is
  // read on in chunks. (resize still zeroes the string before the read.)
  constexpr std::size_t kNoLimit = std::numeric_limits<std::size_t>::max() - 1;
  std::error_code unknown;
  const std::uintmax_t expected = std::filesystem::file_size(path, unknown);
  const std::size_t first = unknown || expected >= kNoLimit ? kReadChunk : static_cast<std::size_t>(expected) + 1;
  return read_to_end(in, first, kNoLimit, path);
}

std::string read_file(const std::filesystem::path& path, std::size_t max_bytes, std::string_view kind) {
  refuse_non_file(path, true);  // a device is read up to the limit
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}: {}", path.string(), system_reason());
  std::string content = read_to_end(in, kReadChunk, max_bytes, path);
  if (content.size() > max_bytes) {
    fail("{}: more than {} bytes, the limit for a {}: is it the right file?", path.string(), max_bytes, kind);
  }
  return content;
}

std::string read_file_inflated(const std::filesystem::path& path, std::size_t max_bytes, std::string_view kind) {
  std::string packed = read_file(path, max_bytes, kind);
  if (packed.size() < 2 || static_cast<unsigned char>(packed[0]) != 0x1f || static_cast<unsigned char>(packed[1]) != 0x8b) {
    return packed;
  }
  z_stream stream{};
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK) fail("{}: cannot start gzip's inflater", path.string());
  std::string content;
  stream.next_in = reinterpret_cast<Bytef*>(packed.data());
  stream.avail_in = static_cast<uInt>(packed.size());
  int status = Z_OK;
  while (status != Z_STREAM_END && content.size() <= max_bytes) {
    const std::size_t size = content.size();
    content.resize(size + kReadChunk);
    stream.next_out = reinterpret_cast<Bytef*>(content.data() + size);
    stream.avail_out = static_cast<uInt>(kReadChunk);
    status = inflate(&stream, Z_NO_FLUSH);
    content.resize(size + kReadChunk - stream.avail_out);
    if (status == Z_STREAM_END && stream.avail_in > 0) {  // gzip members one after another
      status = inflateReset(&stream);
      continue;
    }
    if (status != Z_OK && status != Z_STREAM_END) {
      const std::string reason = stream.msg != nullptr ? stream.msg : (status == Z_BUF_ERROR ? "the stream ends early" : "damaged data");
      inflateEnd(&stream);
      fail("{}: not a whole gzip file ({}): is it truncated?", path.string(), reason);
    }
  }
  inflateEnd(&stream);
  if (content.size() > max_bytes) {
    fail("{}: inflates to more than {} bytes, the limit for a {}: is it the right file?", path.string(), max_bytes,
         kind);
  }
  return content;
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  AtomicFileWriter writer(path);
  writer.write(content);
  writer.commit();
}

AtomicFileWriter::AtomicFileWriter(std::filesystem::path path) : shown_(std::move(path)), path_(followed(shown_)) {
  if (is_special(path_)) {
    file_ = open_through(path_);
    return;
  }
  temporary_ = temporary_beside(path_);
  if (path_.has_parent_path()) {
    std::error_code ignored;
    std::filesystem::create_directories(path_.parent_path(), ignored);
  }
  file_ = std::fopen(temporary_.c_str(), "wb");
  if (file_ == nullptr) fail("cannot write {}: {}", shown_.string(), system_reason());
}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_ == nullptr) return;
  std::fclose(file_);
  if (temporary_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove(temporary_, ignored);
}

void AtomicFileWriter::write(const void* data, std::size_t bytes) {
  if (file_ == nullptr) fail("internal: write to {} after commit", shown_.string());
  if (bytes != 0 && std::fwrite(data, 1, bytes, file_) != bytes) {
    fail("cannot write {}: {}", shown_.string(), system_reason());
  }
}

void AtomicFileWriter::commit() {
  if (file_ == nullptr) fail("internal: {} committed twice", shown_.string());
  if (temporary_.empty()) {  // written through to a device or FIFO: nothing to rename
    const bool flushed = std::fflush(file_) == 0;
    const std::string reason = flushed ? "" : system_reason();
    std::fclose(file_);
    file_ = nullptr;
    if (!flushed) fail("cannot write {}: {}", shown_.string(), reason);
    return;
  }
  const bool flushed = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const std::string reason = flushed ? "" : system_reason();
  std::fclose(file_);
  file_ = nullptr;
  std::error_code error;
  if (flushed) std::filesystem::rename(temporary_, path_, error);
  if (!flushed || error) {
    std::error_code ignored;
    std::filesystem::remove(temporary_, ignored);
    fail("cannot write {}: {}", shown_.string(), flushed ? error.message() : reason);
  }
  if (!sync_folder(path_.parent_path())) {
    fail("cannot write {}: syncing its folder failed: {}", shown_.string(), system_reason());
  }
}

void refuse_overwriting(const NamedPath& output, std::initializer_list<NamedPath> inputs) {
  if (output.path.empty()) return;
  for (const NamedPath& input : inputs) {
    std::error_code not_there;
    if (input.path.empty() || !std::filesystem::equivalent(output.path, input.path, not_there)) continue;
    fail("{} {} is the file of {} {}: writing it would replace what is read; choose another {}", output.flag,
         output.path.string(), input.flag, input.path.string(), output.flag);
  }
}

bool is_within(const std::filesystem::path& path, const std::filesystem::path& folder) {
  const auto resolved = [](const std::filesystem::path& p) -> std::optional<std::filesystem::path> {
    std::error_code error;
    std::filesystem::path at = std::filesystem::absolute(p, error);
    if (!error) at = std::filesystem::weakly_canonical(at, error);
    if (error) return std::nullopt;
    return at;
  };
  const auto inner = resolved(path), outer = resolved(folder);
  if (!inner || !outer) return false;
  const std::filesystem::path relative = inner->lexically_relative(*outer);
  return !relative.empty() && *relative.begin() != "..";
}

void require_writable_folder(const std::filesystem::path& folder, std::string_view what) {
  refuse_overlong(folder, what);
  refuse_nul(folder);
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error) fail("{} {}: cannot create it: {}: choose a folder you can write", what, folder.string(), error.message());
  const std::filesystem::path probe = folder / fmt::format(".pipeflow-probe.{}", static_cast<long>(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    fail("{} {}: cannot write in it: {}: choose a folder you can write", what, folder.string(), system_reason());
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

std::optional<FolderLock> FolderLock::try_lock(const std::filesystem::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open folder {} to lock it: {}", folder.string(), system_reason());
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return FolderLock(fd);
  const int reason = errno;
  ::close(fd);
  if (reason == EWOULDBLOCK) return std::nullopt;
  errno = reason;
  fail("cannot lock folder {}: {}", folder.string(), system_reason());
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& folder) {
  std::vector<std::filesystem::path> removed;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(folder, error)) {
    const long pid = writer_of_temporary(entry.path().filename().string());
    if (pid == 0 || writer_runs(pid)) continue;
    std::error_code ignored;
    if (std::filesystem::remove(entry.path(), ignored)) removed.push_back(entry.path());
  }
  return removed;
}

}  // namespace pipeflow
