#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/trainer.h"
#include "train/run_folders.h"

namespace pipeflow::runtime {

// What a training run (trainer.cc's Run<StageT>) does around its steps, the
// same for either kind of stage: its folders and run id (RunFolders), the
// checkpoint it resumes from (settings.resume: the newest that loads, with
// a warning for each newer one that does not), the checkpoints it writes
// (every save_interval steps, after the last and when stopped; all but the
// newest checkpoint_keep of its own deleted after each), metrics.jsonl
// rewritten atomically with the lines of the steps it continues, and the
// stop request every process agrees on. See TrainSettings and train() in
// trainer.h.
template <class StageT>
class CheckpointedRun {
 public:
  // Before any work: checks the settings, locks world rank 0's folders and
  // checks that the checkpoint folder can be written.
  CheckpointedRun(const TrainSettings& settings, ProgressPrinter& progress, const StopRequest* stop,
                  RankGroup& group, BasicPipelineEngine<StageT>& engine);

  // After the run's announcement: removes killed writers' temporaries,
  // loads the checkpoint to resume (none: the engine's weights stay as they
  // are) and claims the folders for the run's id.
  void start();

  std::int64_t first_step() const { return first_step_; }  // steps done before this run
  const std::string& earlier_metrics() const { return earlier_metrics_; }
  // After step `step` (0-based), and `stopping` when the run stops early.
  bool checkpoint_due(std::int64_t step, bool stopping) const;
  std::filesystem::path checkpoint_path(std::int64_t steps_done) const;
  // Collective under MPI.
  void write_checkpoint(std::int64_t steps_done) const;
  // World rank 0 alone.
  void write_metrics(const std::vector<StepLog>& log) const;
  // The signal that stops the run, 0: none: the largest any process holds,
  // so that every process stops after the same step.
  int stop_signal() const;
  bool reporter() const { return engine_.is_reporter(); }

 private:
  // Loads the checkpoint to resume from and sets first_step_; returns the
  // run id its header holds ("": none, or a fresh run).
  std::string resume();
  // The run's id, the same in every process: the resumed checkpoint's, else
  // the one out_dir/run_id.json names (a checkpoint from before run ids),
  // else a new one; world rank 0 claims the folders for it.
  void claim_folders(const std::string& resumed_id);
  void remove_stale_temporaries() const;

  const TrainSettings& settings_;
  ProgressPrinter& progress_;
  const StopRequest* stop_;
  RankGroup& group_;
  BasicPipelineEngine<StageT>& engine_;
  std::optional<RunFolders> folders_;  // world rank 0's: locked for the run's life
  std::string run_id_;
  std::int64_t first_step_ = 0;
  std::string earlier_metrics_;  // metrics.jsonl lines of those steps, when resumed into the same out_dir
};

extern template class CheckpointedRun<nn::Stage>;
extern template class CheckpointedRun<nn::VlmStage>;

}  // namespace pipeflow::runtime
