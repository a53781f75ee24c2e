// Every output pipeflow writes goes through write_file_atomic or
// AtomicFileWriter (core/file.h). Here the path comes from the input's
// bytes, inside a scratch folder that holds what a user's folder may: a
// file, a read-only file, a folder, a FIFO nobody reads, a link to each, a
// dangling link and a link loop. Each write must end with the bytes in place
// or an Error; never a hang (a FIFO), a crash, a replaced device or link, a
// temporary left behind, or a write outside the folder. The folder is made
// under $TMPDIR, which tools/fuzz.sh points at a folder it removes after.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "fuzz_target.h"
#include "pipeflow/core/file.h"

namespace {

const std::filesystem::path& scratch() {
  static const std::filesystem::path folder = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "pipeflow-output-fuzz-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    const std::filesystem::path dir = pattern;
    pipeflow::write_file_atomic(dir / "file", "x");
    pipeflow::write_file_atomic(dir / "read_only", "x");
    ::chmod((dir / "read_only").c_str(), 0444);
    std::filesystem::create_directory(dir / "folder");
    ::mkfifo((dir / "fifo").c_str(), 0600);
    std::filesystem::create_symlink("file", dir / "to_file");
    std::filesystem::create_symlink("fifo", dir / "to_fifo");
    std::filesystem::create_symlink("folder", dir / "to_folder");
    std::filesystem::create_symlink("missing/deeper", dir / "dangling");
    std::filesystem::create_symlink("loop", dir / "loop");
    std::filesystem::create_symlink("/dev/null", dir / "to_null");
    return dir;
  }();
  return folder;
}

// A relative path from the bytes: names of the scratch folder's entries
// picked by control bytes, the rest as they come ("/" and ".." included;
// a name of ".." is dropped so that the path stays inside the folder).
std::filesystem::path path_from(std::string_view text) {
  static constexpr const char* kNames[] = {"file", "read_only", "folder", "fifo", "to_file", "to_fifo",
                                           "to_folder", "dangling", "loop", "to_null", "new"};
  std::filesystem::path path;
  std::string name;
  const auto flush = [&] {
    if (!name.empty() && name != "." && name != "..") path /= name;
    name.clear();
  };
  for (const char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 11) {
      flush();
      name = kNames[b];
      flush();
    } else if (c == '/') {
      flush();
    } else {
      name += c;
    }
  }
  flush();
  return path;
}

bool is_link_to(const std::filesystem::path& link, const char* target) {
  std::error_code error;
  return std::filesystem::is_symlink(link, error) && std::filesystem::read_symlink(link, error) == target;
}

// What no write may change: the links stay links to where they pointed, the
// FIFO a FIFO, /dev/null a device, and no temporary stays.
void check_invariants() {
  const std::filesystem::path& dir = scratch();
  struct stat info {};
  const bool fifo = ::stat((dir / "fifo").c_str(), &info) == 0 && S_ISFIFO(info.st_mode);
  const bool null = ::stat("/dev/null", &info) == 0 && S_ISCHR(info.st_mode);
  if (!fifo || !null || !is_link_to(dir / "to_file", "file") || !is_link_to(dir / "to_fifo", "fifo") ||
      !is_link_to(dir / "to_folder", "folder") || !is_link_to(dir / "dangling", "missing/deeper") ||
      !is_link_to(dir / "loop", "loop") || !is_link_to(dir / "to_null", "/dev/null")) {
    std::abort();
  }
  // This process's temporaries (NAME.pipeflow-tmp.PID); a name the input
  // chose may hold the marker without the PID.
  const std::string temporary = ".pipeflow-tmp." + std::to_string(::getpid());
  for (const std::filesystem::path folder : {dir, dir / "folder"}) {
    for (const auto& entry : std::filesystem::directory_iterator(folder)) {
      if (entry.path().filename().string().ends_with(temporary)) std::abort();
    }
  }
}

// Removes what the write made, so that the folder stays as it began.
void clean() {
  static const std::set<std::string> kept = {"file", "read_only", "folder", "fifo", "to_file", "to_fifo",
                                             "to_folder", "dangling", "loop", "to_null"};
  for (const std::filesystem::path folder : {scratch(), scratch() / "folder"}) {
    for (const auto& entry : std::filesystem::directory_iterator(folder)) {
      if (folder != scratch() || !kept.contains(entry.path().filename().string())) {
        std::filesystem::remove_all(entry.path());
      }
    }
  }
}

void write(std::string_view text) {
  // A name the input chose like a temporary (NAME.pipeflow-tmp.PID) would
  // look like one left behind: not what this target looks for.
  if (text.find(".pipeflow-tmp.") != std::string_view::npos) return;
  const std::filesystem::path target = scratch() / path_from(text.substr(0, 4096));
  const bool streamed = !text.empty() && text.back() % 2 == 1;
  try {
    if (streamed) {
      pipeflow::AtomicFileWriter writer(target);
      writer.write("streamed");
      writer.commit();
    } else {
      pipeflow::write_file_atomic(target, "whole");
    }
  } catch (const pipeflow::Error&) {
    // refused, naming why: as good as written
  }
  check_invariants();
  clean();
}

}  // namespace

PIPEFLOW_FUZZ_READER(write(text))
