#include "pipeflow/core/file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

std::string system_reason() { return std::strerror(errno); }

std::filesystem::path temporary_beside(const std::filesystem::path& path) {
  return path.string() + fmt::format(".tmp.{}", static_cast<long>(::getpid()));
}

}  // namespace

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}: {}", path.string(), system_reason());
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

std::string read_file(const std::filesystem::path& path, std::size_t max_bytes, std::string_view kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}: {}", path.string(), system_reason());
  std::string content;
  constexpr std::size_t kChunk = std::size_t{1} << 16;
  while (in && content.size() <= max_bytes) {
    const std::size_t size = content.size();
    content.resize(size + std::min(kChunk, max_bytes + 1 - size));
    in.read(content.data() + size, static_cast<std::streamsize>(content.size() - size));
    content.resize(size + static_cast<std::size_t>(in.gcount()));
  }
  if (content.size() > max_bytes) {
    fail("{}: more than {} bytes, the limit for a {}: is it the right file?", path.string(), max_bytes, kind);
  }
  if (in.bad()) fail("cannot read {}: {}", path.string(), system_reason());
  return content;
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  AtomicFileWriter writer(path);
  writer.write(content);
  writer.commit();
}

AtomicFileWriter::AtomicFileWriter(std::filesystem::path path)
    : path_(std::move(path)), temporary_(temporary_beside(path_)) {
  if (path_.has_parent_path()) {
    std::error_code ignored;
    std::filesystem::create_directories(path_.parent_path(), ignored);
  }
  file_ = std::fopen(temporary_.c_str(), "wb");
  if (file_ == nullptr) fail("cannot write {}: {}", path_.string(), system_reason());
}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_ == nullptr) return;
  std::fclose(file_);
  std::error_code ignored;
  std::filesystem::remove(temporary_, ignored);
}

void AtomicFileWriter::write(const void* data, std::size_t bytes) {
  if (file_ == nullptr) fail("internal: write to {} after commit", path_.string());
  if (bytes != 0 && std::fwrite(data, 1, bytes, file_) != bytes) {
    fail("cannot write {}: {}", path_.string(), system_reason());
  }
}

void AtomicFileWriter::commit() {
  if (file_ == nullptr) fail("internal: {} committed twice", path_.string());
  const bool flushed = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const std::string reason = flushed ? "" : system_reason();
  std::fclose(file_);
  file_ = nullptr;
  std::error_code error;
  if (flushed) std::filesystem::rename(temporary_, path_, error);
  if (!flushed || error) {
    std::error_code ignored;
    std::filesystem::remove(temporary_, ignored);
    fail("cannot write {}: {}", path_.string(), flushed ? error.message() : reason);
  }
}

}  // namespace pipeflow
