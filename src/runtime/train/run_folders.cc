#include "train/run_folders.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <charconv>
#include <random>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"
#include "pipeflow/runtime/checkpoint_search.h"
#include "train/run_outputs.h"

namespace pipeflow::runtime {
namespace {

constexpr std::string_view kOwnerFile = "run_id.json";
constexpr std::size_t kMaxOwnerFileBytes = 64 << 10;

struct Owner {
  std::string run_id;
  long pid = 0;
};

// out_dir/run_id.json, as far as it reads: a damaged one names no run.
Owner read_owner(const std::filesystem::path& out_dir) {
  const std::filesystem::path path = out_dir / kOwnerFile;
  if (!std::filesystem::is_regular_file(path)) return {};
  try {
    const nlohmann::json json = parse_json(read_file(path, kMaxOwnerFileBytes, "run id file"), path.string());
    Owner owner;
    if (json.contains("run_id") && json["run_id"].is_string()) owner.run_id = json["run_id"].get<std::string>();
    if (json.contains("pid") && json["pid"].is_number_integer()) owner.pid = json["pid"].get<long>();
    return owner;
  } catch (const Error&) {
    return {};
  }
}

// "a, b, c, d and 4 more", relative to `folder`
std::string listed(const std::vector<std::filesystem::path>& paths, const std::filesystem::path& folder) {
  std::string text;
  const std::size_t shown = std::min<std::size_t>(paths.size(), 4);
  for (std::size_t i = 0; i < shown; ++i) {
    text += (i > 0 ? ", " : "") + paths[i].lexically_proximate(folder).string();
  }
  if (paths.size() > shown) text += fmt::format(" and {} more", paths.size() - shown);
  return text;
}

}  // namespace

RunFolders::RunFolders(const TrainSettings& settings) : settings_(settings) {
  std::vector<std::pair<std::string_view, std::filesystem::path>> folders{{"out_dir", settings.out_dir}};
  if (!is_within(settings.checkpoint_dir, settings.out_dir)) {
    folders.emplace_back("checkpoint.dir", settings.checkpoint_dir);
  }
  for (const auto& [key, folder] : folders) {
    require_writable_folder(folder, key);
    std::optional<FolderLock> lock = FolderLock::try_lock(folder);
    if (!lock) {
      const Owner owner = read_owner(settings.out_dir);
      fail("{} {}: another pipeflow train is writing into it now{}: wait for it to end, or give another {}", key,
           folder.string(),
           owner.pid > 0 ? fmt::format(" (process {}, run {}, per {})", owner.pid, owner.run_id,
                                       (settings.out_dir / kOwnerFile).string())
                         : "",
           key);
    }
    locks_.push_back(std::move(*lock));
  }
}

std::string RunFolders::owner() const { return read_owner(settings_.out_dir).run_id; }

std::vector<std::filesystem::path> RunFolders::others_files(const std::string& run_id,
                                                            const std::string& owner) const {
  std::vector<std::filesystem::path> files;
  const std::filesystem::path owner_file = settings_.out_dir / kOwnerFile;
  if (std::filesystem::exists(owner_file) && owner != run_id) files.push_back(owner_file);
  for (const std::string_view name : kRunOutputFiles) {
    if (std::filesystem::exists(settings_.out_dir / name)) files.push_back(settings_.out_dir / name);
  }
  for (const FoundCheckpoint& checkpoint : checkpoints_in(settings_.checkpoint_dir)) {
    if (checkpoint.steps_done && checkpoint.run_id != run_id) files.push_back(checkpoint.path);
  }
  return files;
}

std::vector<std::filesystem::path> RunFolders::claim(const std::string& run_id, bool resumed) const {
  const std::filesystem::path& out = settings_.out_dir;
  std::vector<std::filesystem::path> removed;
  const std::string owner = this->owner();
  if (!resumed || (!owner.empty() && owner != run_id)) {
    const std::vector<std::filesystem::path> others = others_files(run_id, owner);
    if (!others.empty() && !settings_.overwrite) {
      if (resumed) {
        fail("out_dir {} belongs to run {} ({}), the checkpoint resumed to run {}: resuming into it would mix the two "
             "runs' metrics and checkpoints: give another out_dir, or --overwrite to replace run {}'s files ({})",
             out.string(), owner, (out / kOwnerFile).string(), run_id, owner, listed(others, out));
      }
      fail("out_dir {} holds another run's files ({}): continue that run with --resume {}, replace its files with "
           "--overwrite, or give another out_dir",
           out.string(), listed(others, out), out.string());
    }
    for (const std::filesystem::path& file : others) {
      std::filesystem::remove_all(file);
      removed.push_back(file);
    }
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const nlohmann::ordered_json record = {{"run_id", run_id}, {"pid", static_cast<long>(::getpid())}, {"host", host}};
  write_file_atomic(out / kOwnerFile, json_text(record, 2) + "\n");
  return removed;
}

std::uint64_t new_run_id() {
  std::random_device device;
  const std::uint64_t bits = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  return (bits & ((std::uint64_t{1} << 52) - 1)) | 1;  // never 0: 0 is "none"
}

std::string run_id_text(std::uint64_t id) { return fmt::format("{:013x}", id); }

std::uint64_t run_id_number(const std::string& text) {
  std::uint64_t id = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), id, 16);
  if (text.size() != 13 || error != std::errc() || end != text.data() + text.size()) return 0;
  return id;
}

}  // namespace pipeflow::runtime
