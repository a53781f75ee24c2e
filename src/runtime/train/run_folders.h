#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "pipeflow/core/file.h"
#include "pipeflow/runtime/trainer.h"

namespace pipeflow::runtime {

// A run's folders are its own. While it trains, a run holds an exclusive
// lock on out_dir and on its checkpoint folder when that lies outside
// out_dir (FolderLock: a second run into them is refused at once; a killed
// run leaves no lock). out_dir/run_id.json names the run that wrote the
// folder, and each of its checkpoints carries the same id (__metadata__
// run_id): checkpoint.keep deletes only the run's own checkpoints, and a
// fresh run does not mix its files with another's.
class RunFolders {
 public:
  // Locks the folders (creating them). Throws Error naming the folder and,
  // as far as out_dir/run_id.json tells, the process training into it.
  explicit RunFolders(const TrainSettings& settings);

  // The run id in out_dir/run_id.json; "" when there is none.
  std::string owner() const;

  // Makes the folders run `run_id`'s, then writes run_id.json. A fresh run
  // (`resumed` false) into folders holding another run's files (run_id.json,
  // write_run_outputs's files, a checkpoint whose header reads), or a resumed
  // run into an out_dir that another run owns, is an Error naming the files
  // and the ways on (--resume, --overwrite, another out_dir); with
  // settings.overwrite those files are removed instead, and returned.
  std::vector<std::filesystem::path> claim(const std::string& run_id, bool resumed) const;

 private:
  // The files of another run than `run_id` in the folders; `owner`: the
  // run run_id.json names ("": none).
  std::vector<std::filesystem::path> others_files(const std::string& run_id, const std::string& owner) const;

  const TrainSettings& settings_;
  std::vector<FolderLock> locks_;
};

// Run ids are 13 hexadecimal digits: 52 bits, exact in a double, so that
// RankGroup::max_over_processes hands world rank 0's to every process.
std::uint64_t new_run_id();
std::string run_id_text(std::uint64_t id);
// The number of an id's text; 0 for "" or a text that is no run id.
std::uint64_t run_id_number(const std::string& text);

}  // namespace pipeflow::runtime
