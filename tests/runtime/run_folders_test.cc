// A run's folders are its own: another run's files are refused or, with
// overwrite, replaced; two runs never write one folder at once;
// checkpoint.keep deletes only the run's own checkpoints, ranked by the
// steps they hold; a checkpoint's metrics are on disk before it is.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

#include <unistd.h>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/runtime/checkpoint_search.h"
#include "pipeflow/runtime/progress.h"
#include "pipeflow/runtime/trainer.h"
#include "test_support.h"
#include "../support/temp_dir.h"

namespace pipeflow::runtime {
namespace {

// (A test's folder, removed when the test program exits: after a failed
// assertion too.)
std::filesystem::path temp_dir() { return pipeflow::testing::make_temp_dir(); }

// testing::tiny_settings for `steps` steps of 2 micro-batches, without validation.
TrainSettings settings_in(const std::filesystem::path& dir, int steps) {
  TrainSettings s = testing::tiny_settings(dir);
  s.schedule = make_schedule("1f1b", 2, 2);
  s.steps = steps;
  s.eval_interval = 0;
  s.sample_tokens = 1;
  return s;
}

// The steps of metrics.jsonl's lines, in order.
std::vector<int> metric_steps(const std::filesystem::path& out_dir) {
  std::vector<int> steps;
  std::istringstream lines(read_file(out_dir / "metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) steps.push_back(nlohmann::json::parse(line)["step"].get<int>());
  return steps;
}

std::string run_id_of(const std::filesystem::path& checkpoint) {
  return nn::SafetensorsFile::read_metadata(checkpoint).metadata("run_id");
}

struct Quiet {
  std::FILE* log = std::tmpfile();
  ~Quiet() { std::fclose(log); }
  ProgressPrinter progress(int steps) const { return ProgressPrinter(log, false, steps, false); }
};

// A fresh run into another run's out_dir is refused, naming its files and
// the ways on, and changes nothing; with overwrite it replaces them, the
// earlier run's checkpoints included (a later resume would pick them up).
TEST(RunFolders, AFreshRunIntoAnotherRunsFolderIsRefusedUnlessOverwrite) {
  const auto dir = temp_dir();
  Quiet quiet;
  TrainSettings first = settings_in(dir, 4);
  first.save_interval = 2;
  ProgressPrinter progress = quiet.progress(4);
  train(first, progress);
  const std::string metrics = read_file(first.out_dir / "metrics.jsonl");
  const std::string first_id = run_id_of(first.checkpoint_dir / "step_4.safetensors");
  EXPECT_EQ(first_id.size(), 13u);
  EXPECT_EQ(nlohmann::json::parse(read_file(first.out_dir / "run_id.json"))["run_id"], first_id);

  TrainSettings second = settings_in(dir, 2);
  const std::string refused = testing::error_of([&] { train(second, progress); });
  EXPECT_NE(refused.find("out_dir " + first.out_dir.string() + " holds another run's files (run_id.json, "
                         "metrics.jsonl, timeline.svg, trace.json and 7 more): continue that run with --resume " +
                         first.out_dir.string() + ", replace its files with --overwrite, or give another out_dir"),
            std::string::npos)
      << refused;
  EXPECT_EQ(read_file(first.out_dir / "metrics.jsonl"), metrics);
  EXPECT_TRUE(std::filesystem::exists(first.checkpoint_dir / "step_4.safetensors"));

  second.overwrite = true;
  train(second, progress);
  EXPECT_EQ(metric_steps(second.out_dir), (std::vector<int>{0, 1}));
  EXPECT_FALSE(std::filesystem::exists(first.checkpoint_dir / "step_2.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(first.checkpoint_dir / "step_4.safetensors"));
  const std::string second_id = nlohmann::json::parse(read_file(second.out_dir / "run_id.json"))["run_id"];
  EXPECT_NE(second_id, first_id);
}

// A run resumed from one run's checkpoint into the out_dir of another is
// refused (their metrics and checkpoints would mix); resumed into its own
// out_dir it keeps its id.
TEST(RunFolders, AResumeIntoAnotherRunsFolderIsRefusedAndIntoItsOwnKeepsItsId) {
  const auto dir = temp_dir();
  Quiet quiet;
  ProgressPrinter progress = quiet.progress(4);
  TrainSettings a = settings_in(dir, 2);
  a.save_interval = 2;
  a.out_dir = dir / "a";
  a.checkpoint_dir = a.out_dir / "checkpoints";
  train(a, progress);
  TrainSettings b = a;
  b.out_dir = dir / "b";
  b.checkpoint_dir = b.out_dir / "checkpoints";
  train(b, progress);

  TrainSettings mixed = b;
  mixed.steps = 4;
  mixed.resume = a.out_dir;
  const std::string refused = testing::error_of([&] { train(mixed, progress); });
  EXPECT_NE(refused.find("out_dir " + b.out_dir.string() + " belongs to run " +
                         run_id_of(b.checkpoint_dir / "step_2.safetensors")),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("the checkpoint resumed to run " + run_id_of(a.checkpoint_dir / "step_2.safetensors") +
                         ": resuming into it would mix the two runs' metrics and checkpoints"),
            std::string::npos)
      << refused;

  TrainSettings own = a;
  own.steps = 4;
  own.resume = a.out_dir;
  train(own, progress);
  EXPECT_EQ(metric_steps(a.out_dir), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(run_id_of(a.checkpoint_dir / "step_4.safetensors"), run_id_of(a.checkpoint_dir / "step_2.safetensors"));
}

// While a run holds its out_dir, another is refused at once, naming the
// process (run_id.json) that holds it.
TEST(RunFolders, TwoRunsNeverWriteOneFolderAtOnce) {
  const auto dir = temp_dir();
  Quiet quiet;
  ProgressPrinter progress = quiet.progress(2);
  TrainSettings settings = settings_in(dir, 2);
  std::filesystem::create_directories(settings.out_dir);
  write_file_atomic(settings.out_dir / "run_id.json", R"({"run_id": "0000000000abc", "pid": 4242})");
  std::optional<FolderLock> held = FolderLock::try_lock(settings.out_dir);  // as a run training into it holds it
  ASSERT_TRUE(held);
  EXPECT_EQ(testing::error_of([&] { train(settings, progress); }),
            "out_dir " + settings.out_dir.string() +
                ": another pipeflow train is writing into it now (process 4242, run 0000000000abc, per " +
                (settings.out_dir / "run_id.json").string() + "): wait for it to end, or give another out_dir");
  held.reset();
  settings.overwrite = true;  // the run_id.json written above
  train(settings, progress);
  EXPECT_TRUE(FolderLock::try_lock(settings.out_dir));  // released when the run ended
}

// checkpoint.keep ranks checkpoints by the steps they hold and deletes
// only this run's: a user's step_0/ folder, another run's step_3 and its
// step_1 renamed step_0009, and a stray two-byte step_10.safetensors all
// stay (by name, the stray and step_0009 were the newest, and everything
// else went), and the run's newest `keep` stay with them.
TEST(RunFolders, KeepDeletesOnlyThisRunsOlderCheckpoints) {
  const auto dir = temp_dir();
  Quiet quiet;
  ProgressPrinter progress = quiet.progress(8);
  TrainSettings other = settings_in(dir, 3);
  other.save_interval = 1;
  other.out_dir = dir / "other";
  other.checkpoint_dir = other.out_dir / "checkpoints";
  train(other, progress);

  TrainSettings settings = settings_in(dir, 6);
  settings.save_interval = 1;
  settings.checkpoint_keep = 2;
  train(settings, progress);
  const std::filesystem::path& folder = settings.checkpoint_dir;
  std::filesystem::create_directories(folder / "step_0");
  write_file_atomic(folder / "step_0" / "notes.txt", "mine");
  write_file_atomic(folder / "step_10.safetensors", "{}");
  std::filesystem::copy_file(other.checkpoint_dir / "step_3.safetensors", folder / "step_3.safetensors");
  std::filesystem::copy_file(other.checkpoint_dir / "step_1.safetensors", folder / "step_0009.safetensors");

  TrainSettings more = settings;
  more.steps = 8;
  more.resume = settings.out_dir;
  train(more, progress);
  std::vector<std::string> names;
  for (const FoundCheckpoint& checkpoint : checkpoints_in(folder)) names.push_back(checkpoint.path.filename().string());
  // Newest first by the steps held: the stray (no header: its name's 10),
  // this run's 8 and 7, the other run's 3 and 1, the user's folder (0).
  EXPECT_EQ(names, (std::vector<std::string>{"step_10.safetensors", "step_8.safetensors", "step_7.safetensors",
                                             "step_3.safetensors", "step_0009.safetensors", "step_0"}));
  EXPECT_EQ(read_file(folder / "step_0" / "notes.txt"), "mine");
  EXPECT_EQ(read_file(folder / "step_10.safetensors"), "{}");
  // The stray was tried first and passed over for this run's step 6.
  EXPECT_EQ(metric_steps(settings.out_dir), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

// A resume ranks a folder's checkpoints by the steps they hold, not their
// names: step_0009 holding 1 step is older than step_3.
TEST(RunFolders, ResumeRanksCheckpointsByTheStepsTheyHold) {
  const auto dir = temp_dir();
  Quiet quiet;
  ProgressPrinter progress = quiet.progress(4);
  TrainSettings settings = settings_in(dir, 3);
  settings.save_interval = 1;
  train(settings, progress);
  std::filesystem::rename(settings.checkpoint_dir / "step_1.safetensors",
                          settings.checkpoint_dir / "step_0009.safetensors");
  EXPECT_EQ(checkpoints_to_resume(settings.out_dir).front(), settings.checkpoint_dir / "step_3.safetensors");
  TrainSettings more = settings;
  more.steps = 4;
  more.resume = settings.out_dir;
  train(more, progress);
  EXPECT_EQ(metric_steps(settings.out_dir), (std::vector<int>{0, 1, 2, 3}));
}

// The metrics of a checkpoint's steps reach the disk before the checkpoint
// does: a run whose metrics cannot be written at the checkpoint after step
// 4 (metrics.jsonl made a link to a path under a file during step 4) ends
// without that checkpoint, and the resume from step 2 keeps a line for every
// step. Written the other way round, step_4 existed and steps 2 and 3 had no
// line ([0, 1, 4, 5]).
TEST(RunFolders, ACheckpointsMetricsAreOnDiskBeforeItIs) {
  const auto dir = temp_dir();
  Quiet quiet;
  ProgressPrinter progress = quiet.progress(6);
  TrainSettings settings = settings_in(dir, 6);
  settings.save_interval = 2;
  const std::filesystem::path metrics = settings.out_dir / "metrics.jsonl";
  auto kept = std::make_shared<std::string>();
  TrainSettings failing = settings;
  failing.engine.before_action = [metrics, kept, forwards = std::make_shared<int>(0)](RankId rank,
                                                                                       const Action& action) {
    if (rank.value() != 0 || action != Action{StageId(0), ActionKind::kForward, MicrobatchId(0)}) return;
    if (++*forwards == 4) {  // the first action of step 4
      *kept = read_file(metrics);
      std::filesystem::remove(metrics);
      std::filesystem::create_symlink("run_id.json/metrics.jsonl", metrics);  // under a file: no folder can be made
    }
  };
  EXPECT_NE(testing::error_of([&] { train(failing, progress); }).find("metrics.jsonl"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(settings.checkpoint_dir / "step_4.safetensors"));
  ASSERT_TRUE(std::filesystem::exists(settings.checkpoint_dir / "step_2.safetensors"));
  std::filesystem::remove(metrics);
  write_file_atomic(metrics, *kept);
  EXPECT_EQ(metric_steps(settings.out_dir), (std::vector<int>{0, 1}));

  TrainSettings resumed = settings;
  resumed.resume = settings.out_dir;
  train(resumed, progress);
  EXPECT_EQ(metric_steps(settings.out_dir), (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

}  // namespace
}  // namespace pipeflow::runtime
