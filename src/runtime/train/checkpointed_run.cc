#include "train/checkpointed_run.h"

#include <fmt/format.h>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/units.h"
#include "pipeflow/runtime/checkpoint_search.h"
#include "pipeflow/runtime/progress.h"
#include "pipeflow/runtime/rank_group.h"
#include "train/metrics_log.h"

namespace pipeflow::runtime {

template <class StageT>
CheckpointedRun<StageT>::CheckpointedRun(const TrainSettings& settings, ProgressPrinter& progress,
                                         const StopRequest* stop, RankGroup& group,
                                         BasicPipelineEngine<StageT>& engine)
    : settings_(settings), progress_(progress), stop_(stop), group_(group), engine_(engine) {
  if (settings_.steps < 1) fail("steps = {}: must be >= 1", settings_.steps);
  if (settings_.save_interval < 0) {
    fail("checkpoint.interval = {}: must be >= 0 (0: no checkpoints)", settings_.save_interval);
  }
  // Outputs that cannot be written fail now, not after the last step, and
  // folders another run writes into or owns are refused.
  if (reporter()) folders_.emplace(settings_);
  if (settings_.save_interval > 0) require_writable_folder(settings_.checkpoint_dir, "checkpoint folder");
}

template <class StageT>
void CheckpointedRun<StageT>::start() {
  remove_stale_temporaries();
  claim_folders(resume());
}

template <class StageT>
int CheckpointedRun<StageT>::stop_signal() const {
  const double mine = stop_ == nullptr ? 0 : stop_->load();
  return static_cast<int>(
      group_.max_over_processes(mine, deadline_after(settings_.engine.timeout), "every process's stop request"));
}

template <class StageT>
void CheckpointedRun<StageT>::remove_stale_temporaries() const {
  if (!reporter()) return;
  std::vector<std::filesystem::path> dirs{settings_.checkpoint_dir, settings_.out_dir};
  // Sharded checkpoints' folders hold their shards' temporaries: every
  // subfolder is searched (by name only; no checkpoint's header is read).
  std::error_code missing;
  for (const auto& entry : std::filesystem::directory_iterator(settings_.checkpoint_dir, missing)) {
    if (entry.is_directory()) dirs.push_back(entry.path());
  }
  for (const auto& dir : dirs) {
    for (const auto& removed : pipeflow::remove_stale_temporaries(dir)) {
      progress_.message(
          fmt::format("removed {}: a temporary file left by a writer that was stopped", removed.string()));
    }
  }
}

template <class StageT>
std::string CheckpointedRun<StageT>::resume() {
  if (settings_.resume.empty()) return "";
  const std::vector<std::filesystem::path> candidates = checkpoints_to_resume(settings_.resume);
  std::filesystem::path file;
  std::int64_t done = 0;
  std::string run_id;
  // A checkpoint cut short, corrupted or holding NaN falls back to the one before it.
  for (const std::filesystem::path& candidate : candidates) {
    try {
      const nn::SafetensorsFile checkpoint = read_checkpoint(candidate);
      done = engine_.load_checkpoint(checkpoint);
      if (const auto id = checkpoint.metadata().find("run_id"); id != checkpoint.metadata().end()) run_id = id->second;
      file = candidate;
      break;
    } catch (const Error& error) {
      if (candidate == candidates.back()) throw;
      progress_.message(fmt::format("warning: not resuming from {}: {}; trying the checkpoint before it",
                                    candidate.string(), error.what()));
    }
  }
  if (done >= settings_.steps) {
    fail("{}: {} steps done already, and steps = {} is the total: raise steps to train on", file.string(), done,
         settings_.steps);
  }
  progress_.message(fmt::format("resuming after {} from {}", format_count(done, "step"), file.string()));
  progress_.start(static_cast<int>(done));
  first_step_ = done;
  return run_id;
}

template <class StageT>
void CheckpointedRun<StageT>::claim_folders(const std::string& resumed_id) {
  std::uint64_t id = run_id_number(resumed_id);
  if (folders_ && id == 0 && !settings_.resume.empty()) id = run_id_number(folders_->owner());
  if (folders_ && id == 0) id = new_run_id();
  run_id_ = run_id_text(static_cast<std::uint64_t>(group_.max_over_processes(
      static_cast<double>(id), deadline_after(settings_.engine.timeout), "world rank 0's run id")));
  if (!folders_) return;
  for (const std::filesystem::path& removed : folders_->claim(run_id_, !settings_.resume.empty())) {
    progress_.message(fmt::format("removed {}: another run's (--overwrite)", removed.string()));
  }
  if (first_step_ > 0) earlier_metrics_ = runtime::earlier_metrics(settings_.out_dir / "metrics.jsonl", first_step_);
}

template <class StageT>
bool CheckpointedRun<StageT>::checkpoint_due(std::int64_t step, bool stopping) const {
  const bool last = step + 1 == settings_.steps;
  return stopping || (settings_.save_interval > 0 && (last || (step + 1) % settings_.save_interval == 0));
}

template <class StageT>
std::filesystem::path CheckpointedRun<StageT>::checkpoint_path(std::int64_t steps_done) const {
  return runtime::checkpoint_path(settings_.checkpoint_dir, steps_done, group_.spans_processes());
}

template <class StageT>
void CheckpointedRun<StageT>::write_checkpoint(std::int64_t steps_done) const {
  const std::filesystem::path dir = settings_.checkpoint_dir;
  if (reporter()) std::filesystem::create_directories(dir);
  engine_.write_checkpoint(checkpoint_path(steps_done), steps_done, run_id_);  // collective under MPI
  if (!reporter() || settings_.checkpoint_keep == 0) return;
  // This run's, newest first; one holding more steps (left by an attempt
  // that went further before it was resumed from an earlier checkpoint) is
  // replaced when the run gets there.
  std::vector<std::filesystem::path> mine;
  for (const FoundCheckpoint& checkpoint : checkpoints_in(dir)) {
    if (checkpoint.steps_done && checkpoint.run_id == run_id_ && *checkpoint.steps_done <= steps_done) {
      mine.push_back(checkpoint.path);
    }
  }
  for (std::size_t i = static_cast<std::size_t>(settings_.checkpoint_keep); i < mine.size(); ++i) {
    std::filesystem::remove_all(mine[i]);
  }
}

template <class StageT>
void CheckpointedRun<StageT>::write_metrics(const std::vector<StepLog>& log) const {
  write_file_atomic(settings_.out_dir / "metrics.jsonl", earlier_metrics_ + metrics_jsonl(log));
}

template class CheckpointedRun<nn::Stage>;
template class CheckpointedRun<nn::VlmStage>;

}  // namespace pipeflow::runtime
