#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>

#include <sched.h>

#include "pipeflow/core/config.h"
#include "pipeflow/core/file.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/parameter_layout.h"
#include "pipeflow/runtime/checkpoint_search.h"
#include "pipeflow/runtime/noise_scale.h"
#include "pipeflow/runtime/progress.h"
#include "pipeflow/runtime/report.h"
#include "pipeflow/runtime/trainer.h"
#include "pipeflow/sim/profile.h"
#include "test_support.h"
#include "train/skipped_steps.h"
#include "../support/temp_dir.h"

namespace pipeflow::runtime {
namespace {

// checkpoints_in's paths, newest first.
std::vector<std::filesystem::path> checkpoint_paths(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> paths;
  for (const FoundCheckpoint& checkpoint : checkpoints_in(dir)) paths.push_back(checkpoint.path);
  return paths;
}

// (A test's folder, removed when the test program exits: after a failed
// assertion too.)
std::filesystem::path temp_dir() { return pipeflow::testing::make_temp_dir(); }

// A few steps, validated and sampled only as much as a run must.
TrainSettings short_settings(const std::filesystem::path& dir, int steps) {
  TrainSettings s = testing::tiny_settings(dir);
  s.steps = steps;
  s.eval_interval = 0;
  s.sample_tokens = 1;
  return s;
}

TEST(Trainer, TrainsWritesMetricsReportTimelineAndWeights) {
  const auto dir = temp_dir();
  const TrainSettings settings = testing::tiny_settings(dir);
  std::FILE* log = std::tmpfile();
  ProgressPrinter progress(log, false, settings.steps, false);
  const TrainOutcome outcome = train(settings, progress);

  ASSERT_EQ(outcome.log.size(), 12u);
  EXPECT_LT(outcome.log.back().loss, outcome.log.front().loss - 0.5);
  EXPECT_TRUE(outcome.log[4].val_loss && outcome.log[9].val_loss && outcome.log[11].val_loss);
  EXPECT_FALSE(outcome.log[5].val_loss);
  EXPECT_EQ(outcome.sample.size(), 40u);

  std::istringstream lines(read_file(settings.out_dir / "metrics.jsonl"));
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    const auto json = nlohmann::json::parse(line);
    for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "bubble_measured", "bubble_predicted",
                            "peak_activation_bytes"}) {
      EXPECT_TRUE(json.contains(key)) << key << " in " << line;
    }
    EXPECT_EQ(json["step"], count);
    EXPECT_EQ(json["peak_activation_bytes"].size(), 2u);
    for (const char* key : {"busy_s", "busy_predicted_s", "idle_s", "idle_predicted_s", "comm_s", "off_core_s", "wake_s"}) {
      ASSERT_EQ(json[key].size(), 2u) << key;
    }
    for (int r = 0; r < 2; ++r) {  // a part of the rank's compute
      EXPECT_GE(json["off_core_s"][r].get<double>(), 0) << line;
      EXPECT_LE(json["off_core_s"][r].get<double>(), json["busy_s"][r].get<double>()) << line;
      EXPECT_GE(json["wake_s"][r].get<double>(), 0) << line;  // a part of the rank's idle time
      EXPECT_LE(json["wake_s"][r].get<double>(), json["idle_s"][r].get<double>()) << line;
    }
    // Measured and predicted split the same pipeline time, per rank.
    EXPECT_NEAR(json["busy_predicted_s"][0].get<double>() + json["idle_predicted_s"][0].get<double>(),
                json["busy_predicted_s"][1].get<double>() + json["idle_predicted_s"][1].get<double>(), 1e-12);
    EXPECT_EQ(json.contains("val_loss"), count == 4 || count == 9 || count == 11) << line;
    ++count;
  }
  EXPECT_EQ(count, 12);
  const std::string report = read_file(settings.out_dir / "report.md");
  for (const char* part : {"# Training report", "## Partition", "## Measured vs predicted", "| bubble |",
                           "Off core, the part of each rank's compute", "## Loss", "## Sample"}) {
    EXPECT_NE(report.find(part), std::string::npos) << part;
  }
  EXPECT_NE(read_file(settings.out_dir / "timeline.svg").find("<svg"), std::string::npos);
  EXPECT_NE(read_file(settings.out_dir / "trace.json").find("\"traceEvents\""), std::string::npos);
  const MeasuredProfile profile = load_profile(settings.out_dir / "profile.json");  // what simulate --profile reads
  ASSERT_EQ(profile.stages.size(), 2u);
  EXPECT_GT(profile.stages[1].costs.backward_s, 0);
  const auto weights = nn::SafetensorsFile::read(settings.out_dir / "weights.safetensors");
  EXPECT_EQ(nn::read_config(weights), testing::kTiny);
  std::fclose(log);
}

// Every other step measures the noise scale: metrics.jsonl has both squares
// (the big one the step's grad_norm²) and B_simple from their moving
// averages; the report says how it was measured.
TEST(Trainer, LogsTheGradientNoiseScaleOnTheStepsThatMeasureIt) {
  const auto dir = temp_dir();
  TrainSettings settings = short_settings(dir, 5);
  settings.engine.noise_scale_interval = 2;
  std::FILE* log = std::tmpfile();
  ProgressPrinter progress(log, false, settings.steps, false);
  train(settings, progress);
  std::istringstream lines(read_file(settings.out_dir / "metrics.jsonl"));
  NoiseScaleAverage average;
  int measured = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto json = nlohmann::json::parse(line);
    const bool measures = json["step"].get<int>() % 2 == 0;
    ASSERT_EQ(json.contains("grad_square_small"), measures) << line;
    ASSERT_EQ(json.contains("grad_square_big"), measures) << line;
    if (!measures) {
      EXPECT_FALSE(json.contains("noise_scale")) << line;
      continue;
    }
    ++measured;
    const double big = json["grad_square_big"];
    const double norm = json["grad_norm"];
    EXPECT_DOUBLE_EQ(big, norm * norm);
    // b = 2 sequences, B = 4 micro-batches of 2.
    const double small = json["grad_square_small"];
    average.add(noise_scale_sample(small, 2, big, 8));
    EXPECT_EQ(json.contains("noise_scale"), average.value().has_value()) << line;
    if (average.value()) {
      EXPECT_DOUBLE_EQ(json["noise_scale"].get<double>(), *average.value()) << line;
    }
  }
  EXPECT_EQ(measured, 3);
  const std::string report = read_file(settings.out_dir / "report.md");
  EXPECT_NE(report.find("## Gradient noise scale\n\nB_simple = tr(Σ)/|G|² (McCandlish et al. 2018, Appendix A), in "
                        "sequences, from |G_small|² of one micro-batch (b = 2 sequences: micro-batch 0 of "
                        "data-parallel replica 0"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("over 3 measured steps of this run"), std::string::npos) << report;
  std::fclose(log);
}

TEST(Trainer, EmulatedAndThreadedRunsTrainTheSameWeights) {
  const auto dir = temp_dir();
  TrainSettings settings = testing::tiny_settings(dir);
  settings.steps = 3;
  settings.sample_tokens = 1;
  settings.schedule = make_schedule("zbv", 2, 4);
  std::FILE* log = std::tmpfile();
  ProgressPrinter progress(log, false, settings.steps, false);
  const TrainOutcome threaded = train(settings, progress);
  const std::string threaded_weights = read_file(settings.out_dir / "weights.safetensors");
  settings.emulate = true;
  settings.overwrite = true;  // the threaded run's folder
  const TrainOutcome emulated = train(settings, progress);
  for (std::size_t i = 0; i < threaded.log.size(); ++i) EXPECT_EQ(threaded.log[i].loss, emulated.log[i].loss);
  EXPECT_EQ(read_file(settings.out_dir / "weights.safetensors"), threaded_weights);
  EXPECT_NE(read_file(settings.out_dir / "report.md").find("## Emulated vs predicted"), std::string::npos);
  EXPECT_NE(read_file(settings.out_dir / "timeline.svg").find("emulated (one core per rank)"), std::string::npos);
  std::fclose(log);
}

// A run stopped after 3 of 6 steps and resumed from its checkpoint makes the
// uninterrupted run's steps 3-5 bit for bit (same data, learning rate, AdamW
// moments and step count); resumed under another layout, the same numbers
// up to the rounding of another accumulation order.
TEST(Trainer, ARunResumedFromItsCheckpointContinuesTheUninterruptedRun) {
  const auto dir = temp_dir();
  TrainSettings settings = short_settings(dir, 6);
  settings.engine.lr_schedule = nn::LrSchedule::warmup_decay(0, 3e-3, {.steps = 3}, 6);
  std::FILE* log = std::tmpfile();
  ProgressPrinter progress(log, false, settings.steps, false);
  const TrainOutcome straight = train(settings, progress);
  const std::string straight_weights = read_file(settings.out_dir / "weights.safetensors");

  TrainSettings first_half = settings;
  first_half.steps = 3;
  first_half.save_interval = 2;
  first_half.out_dir = dir / "first";
  first_half.checkpoint_dir = first_half.out_dir / "checkpoints";
  train(first_half, progress);
  const auto checkpoints = first_half.out_dir / "checkpoints";
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "step_2.safetensors"));
  const auto saved = nn::SafetensorsFile::read(checkpoints / "step_3.safetensors");  // the last step writes one
  EXPECT_EQ(saved.metadata("steps_done"), "3");
  EXPECT_EQ(saved.metadata("adamw_step"), "3");
  EXPECT_EQ(nn::read_config(saved), testing::kTiny);  // usable as --weights too
  // Every weight and its two moments, the tied wte once.
  EXPECT_EQ(saved.names().size(),
            3 * nn::ParameterLayout(testing::kTiny, nn::all_layers(testing::kTiny)).entries().size());

  // Files that are no checkpoints do not confuse the choice of the latest.
  for (const char* other : {"a", "notes.md", "step_x.safetensors", "step_9.safetensors.tmp", "step_.safetensors"}) {
    write_file_atomic(checkpoints / other, "not a checkpoint");
  }
  TrainSettings second_half = settings;
  second_half.resume = checkpoints;  // the directory: its latest checkpoint
  second_half.out_dir = first_half.out_dir;  // continuing the same run: its metrics lines are kept
  const TrainOutcome resumed = train(second_half, progress);
  ASSERT_EQ(resumed.log.size(), 3u);
  std::istringstream metrics(read_file(second_half.out_dir / "metrics.jsonl"));
  std::int64_t expected_step = 0;
  for (std::string line; std::getline(metrics, line); ++expected_step) {
    EXPECT_EQ(nlohmann::json::parse(line)["step"], expected_step);
  }
  EXPECT_EQ(expected_step, 6);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed.log[i].step, straight.log[i + 3].step);
    EXPECT_EQ(resumed.log[i].lr, straight.log[i + 3].lr);
    EXPECT_EQ(resumed.log[i].loss, straight.log[i + 3].loss);
  }
  EXPECT_EQ(read_file(second_half.out_dir / "weights.safetensors"), straight_weights);

  TrainSettings other_layout = second_half;
  other_layout.resume = checkpoints / "step_3.safetensors";
  other_layout.schedule = make_schedule("zbv", 2, 4);
  other_layout.out_dir = dir / "other";
  other_layout.checkpoint_dir = other_layout.out_dir / "checkpoints";
  const TrainOutcome moved = train(other_layout, progress);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(moved.log[i].loss, straight.log[i + 3].loss, 1e-5);

  other_layout.steps = 3;
  EXPECT_NE(testing::error_of([&] { train(other_layout, progress); }).find("3 steps done already, and steps = 3 is the total"), std::string::npos);
  other_layout.steps = 6;
  other_layout.weights = checkpoints / "step_3.safetensors";
  EXPECT_NE(testing::error_of([&] { train(other_layout, progress); }).find("a checkpoint holds the weights; give one of the two"), std::string::npos);
  other_layout.weights.clear();
  other_layout.resume = dir / "corpus.txt.missing";
  EXPECT_NE(testing::error_of([&] { train(other_layout, progress); }).find("no such file or directory"), std::string::npos);
  std::filesystem::create_directories(dir / "empty");
  other_layout.resume = dir / "empty";
  EXPECT_NE(testing::error_of([&] { train(other_layout, progress); }).find("neither the directory nor its checkpoints/ holds a step_N.safetensors"),
            std::string::npos);
  std::fclose(log);
}

// What a test's ProgressPrinter wrote to its temporary file.
std::string printed(std::FILE* log) {
  std::fflush(log);
  std::rewind(log);
  std::string text;
  for (int c = std::fgetc(log); c != EOF; c = std::fgetc(log)) text.push_back(static_cast<char>(c));
  return text;
}

// `file` rewritten with `change` applied to one of its float tensors (the
// checksums recomputed: a file whose values, not bytes, are wrong).
void rewrite_tensor(const std::filesystem::path& from, const std::filesystem::path& to, const std::string& changed,
                    float value) {
  const auto file = nn::SafetensorsFile::read(from);
  nn::SafetensorsWriter writer;
  for (const std::string& name : file.names()) {
    Tensor values = file.floats(name);
    if (name == changed) values.data()[1] = value;
    writer.add(name, values.span(), values.shape());
  }
  for (const auto& [key, text] : file.metadata()) {
    if (!key.starts_with("crc32.")) writer.set_metadata(key, text);
  }
  writer.write(to);
}

// SIGINT or SIGTERM during a run (the CLI's handler stores it): the run ends
// after the step it is in with a checkpoint, metrics.jsonl and the other
// files, and a run resumed from its out_dir makes the uninterrupted run's
// steps bit for bit.
TEST(Trainer, AStopRequestEndsTheRunAfterItsStepAndTheResumedRunContinuesItBitForBit) {
  const auto dir = temp_dir();
  TrainSettings settings = short_settings(dir, 4);
  std::FILE* log = std::tmpfile();
  ProgressPrinter progress(log, false, settings.steps, false);
  const TrainOutcome straight = train(settings, progress);

  TrainSettings stopped = settings;
  stopped.out_dir = dir / "stopped";
  stopped.checkpoint_dir = stopped.out_dir / "checkpoints";
  const StopRequest stop{SIGTERM};  // arrived during the first step
  const TrainOutcome first = train(stopped, progress, &stop);
  EXPECT_EQ(first.stop_signal, SIGTERM);
  ASSERT_EQ(first.log.size(), 1u);
  EXPECT_EQ(nn::SafetensorsFile::read(stopped.out_dir / "checkpoints/step_1.safetensors").metadata("steps_done"), "1");
  EXPECT_EQ(read_file(stopped.out_dir / "metrics.jsonl").find("\"step\":0,"), 1u);
  EXPECT_TRUE(std::filesystem::exists(stopped.out_dir / "report.md"));
  EXPECT_NE(printed(log).find("stopped by signal 15 after step 1: checkpoint "), std::string::npos);

  TrainSettings resumed = settings;
  resumed.out_dir = stopped.out_dir;
  resumed.checkpoint_dir = resumed.out_dir / "checkpoints";
  resumed.resume = stopped.out_dir;  // the run's out_dir: its checkpoints/
  const TrainOutcome rest = train(resumed, progress);
  ASSERT_EQ(rest.log.size(), 3u);
  EXPECT_EQ(rest.stop_signal, 0);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(rest.log[i].loss, straight.log[i + 1].loss);
  EXPECT_EQ(read_file(resumed.out_dir / "weights.safetensors"), read_file(settings.out_dir / "weights.safetensors"));
  std::fclose(log);
}

// A worker that throws in the middle of a step (rank 1, at its backward of
// micro-batch 2 in the fourth step, while rank 0 waits on it): the run ends
// with that error, leaves no half-written file, and the last checkpoint
// before it (step 2) resumes into the uninterrupted run's losses bit for bit.
TEST(Trainer, AWorkerThrowingMidStepEndsTheRunAndTheLastGoodCheckpointResumesIt) {
  const auto dir = temp_dir();
  TrainSettings settings = short_settings(dir, 4);
  settings.save_interval = 2;
  std::FILE* log = std::tmpfile();
  ProgressPrinter progress(log, false, settings.steps, false);
  const TrainOutcome straight = train(settings, progress);

  TrainSettings failing = settings;
  failing.out_dir = dir / "failing";
  failing.checkpoint_dir = failing.out_dir / "checkpoints";
  auto times_reached = std::make_shared<std::atomic<int>>(0);
  failing.engine.before_action = [times_reached](RankId rank, const Action& action) {
    if (rank.value() == 1 && action == Action{StageId(1), ActionKind::kBackward, MicrobatchId(2)} &&
        ++*times_reached == 4) {
      throw Error("injected failure at 1B2");
    }
  };
  EXPECT_EQ(testing::error_of([&] { train(failing, progress); }), "injected failure at 1B2");
  const auto checkpoints = failing.out_dir / "checkpoints";
  EXPECT_EQ(checkpoint_paths(checkpoints), std::vector<std::filesystem::path>{checkpoints / "step_2.safetensors"});
  EXPECT_EQ(read_file(failing.out_dir / "metrics.jsonl").find("\"step\":2,"), std::string::npos);  // steps 0 and 1 only
  EXPECT_NE(read_file(failing.out_dir / "metrics.jsonl").find("\"step\":1,"), std::string::npos);
  for (const auto& entry : std::filesystem::recursive_directory_iterator(failing.out_dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
  }

  TrainSettings resumed = settings;
  resumed.out_dir = failing.out_dir;
  resumed.checkpoint_dir = resumed.out_dir / "checkpoints";
  resumed.resume = failing.out_dir;
  const TrainOutcome rest = train(resumed, progress);
  ASSERT_EQ(rest.log.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) EXPECT_EQ(rest.log[i].loss, straight.log[i + 2].loss);
  EXPECT_EQ(read_file(resumed.out_dir / "weights.safetensors"), read_file(settings.out_dir / "weights.safetensors"));
  std::istringstream metrics(read_file(resumed.out_dir / "metrics.jsonl"));  // a line for every step
  std::int64_t expected_step = 0;
  for (std::string line; std::getline(metrics, line); ++expected_step) {
    EXPECT_EQ(nlohmann::json::parse(line)["step"], expected_step);
  }
  EXPECT_EQ(expected_step, 4);
  std::fclose(log);
}

// numerics.max_skipped_steps counts non-finite steps in a row: a finite step
// ends the streak, an fp16 overflow the scaler absorbs leaves it as it was.
TEST(Trainer, AFiniteStepEndsAStreakOfSkippedStepsAndAnAbsorbedOverflowDoesNot) {
  SkippedInARow streak;
  const auto step = [](bool skipped, bool overflow) {
    StepLog log;
    log.skipped = skipped;
    log.overflow = overflow;
    return log;
  };
  EXPECT_EQ(streak.after(step(true, false)), 1);
  EXPECT_EQ(streak.after(step(true, false)), 2);
  EXPECT_EQ(streak.after(step(false, false)), 0);
  EXPECT_EQ(streak.after(step(true, false)), 1);
  EXPECT_EQ(streak.after(step(true, true)), 1);
  EXPECT_EQ(streak.after(step(true, false)), 2);
}

// lr 1e30: the first update throws the weights to ~1e30 and every later loss
// is NaN. Those steps change nothing (the checkpoints after them hold the
// same tensors), are marked in metrics.jsonl, and the third in a row stops
// the run naming the step and the tensor.
TEST(Trainer, NonFiniteStepsAreSkippedAndTooManyInARowStopTheRun) {
  const auto dir = temp_dir();
  TrainSettings settings = testing::tiny_settings(dir);
  settings.engine.optimizer = {.lr = 1e30};
  settings.engine.lr_schedule = nn::LrSchedule::constant(1e30);
  settings.save_interval = 1;
  settings.eval_interval = 0;
  std::FILE* log = std::tmpfile();
  ProgressPrinter progress(log, false, settings.steps, false);
  const std::string error = testing::error_of([&] { train(settings, progress); });
  EXPECT_NE(error.find("step 4: 3 steps in a row had a non-finite loss or gradient norm "
                       "(numerics.max_skipped_steps = 3); the first non-finite tensor: stage "),
            std::string::npos)
      << error;
  EXPECT_NE(printed(log).find("warning: step 2 skipped: loss -nan, gradient norm -nan: not finite, so no update (1 "
                              "of numerics.max_skipped_steps = 3 in a row)"),
            std::string::npos)
      << printed(log);
  std::istringstream lines(read_file(settings.out_dir / "metrics.jsonl"));
  std::vector<bool> skipped;
  for (std::string line; std::getline(lines, line);) skipped.push_back(nlohmann::json::parse(line).contains("skipped"));
  EXPECT_EQ(skipped, (std::vector<bool>{false, true, true, true}));
  const auto after_1 = nn::SafetensorsFile::read(settings.out_dir / "checkpoints/step_1.safetensors");
  const auto after_3 = nn::SafetensorsFile::read(settings.out_dir / "checkpoints/step_3.safetensors");
  EXPECT_EQ(after_3.metadata("adamw_step"), "1");
  for (const std::string& name : after_1.names()) {
    EXPECT_EQ(after_3.metadata("crc32." + name), after_1.metadata("crc32." + name)) << name;
  }
  std::fclose(log);
}

// A checkpoint cut short, with a flipped bit or holding NaN or a negative
// second moment is refused naming the file and the tensor; --resume DIR
// falls back to the newest good one and says so; checkpoint.keep leaves the
// newest K.
TEST(Trainer, BadCheckpointsAreRefusedAndResumeFallsBackToTheNewestGoodOne) {
  const auto dir = temp_dir();
  TrainSettings settings = short_settings(dir, 4);
  settings.save_interval = 1;
  settings.checkpoint_keep = 3;
  std::FILE* log = std::tmpfile();
  ProgressPrinter progress(log, false, settings.steps, false);
  const TrainOutcome straight = train(settings, progress);
  const auto checkpoints = settings.out_dir / "checkpoints";
  EXPECT_EQ(checkpoint_paths(checkpoints),
            (std::vector<std::filesystem::path>{checkpoints / "step_4.safetensors", checkpoints / "step_3.safetensors",
                                                checkpoints / "step_2.safetensors"}));

  std::string bytes = read_file(checkpoints / "step_4.safetensors");
  bytes[bytes.size() - 3] ^= 0x10;  // in the last tensor's data
  write_file_atomic(checkpoints / "step_4.safetensors", bytes);
  const std::string flipped = testing::error_of([&] { nn::SafetensorsFile::read(checkpoints / "step_4.safetensors"); });
  EXPECT_NE(flipped.find("step_4.safetensors: tensor exp_avg_sq."), std::string::npos) << flipped;
  EXPECT_NE(flipped.find("does not match the"), std::string::npos) << flipped;
  write_file_atomic(checkpoints / "step_3.safetensors", bytes.substr(0, bytes.size() / 2));  // cut short

  TrainSettings resumed = settings;
  resumed.steps = 4;
  resumed.out_dir = dir / "resumed";
  resumed.checkpoint_dir = resumed.out_dir / "checkpoints";
  resumed.resume = checkpoints;
  const TrainOutcome rest = train(resumed, progress);
  ASSERT_EQ(rest.log.size(), 2u);
  EXPECT_EQ(rest.log[1].loss, straight.log[3].loss);
  const std::string said = printed(log);
  EXPECT_NE(said.find("warning: not resuming from " + (checkpoints / "step_4.safetensors").string()),
            std::string::npos);
  EXPECT_NE(said.find("warning: not resuming from " + (checkpoints / "step_3.safetensors").string() +
                      ": " + (checkpoints / "step_3.safetensors").string() + ": tensor "),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("resuming after 2 steps from " + (checkpoints / "step_2.safetensors").string()),
            std::string::npos);

  resumed.resume = dir / "negative.safetensors";
  rewrite_tensor(checkpoints / "step_2.safetensors", resumed.resume, "exp_avg_sq.wpe.weight", -1);
  EXPECT_NE(testing::error_of([&] { train(resumed, progress); })
                .find("negative.safetensors: tensor exp_avg_sq.wpe.weight holds -1 at index 1: a second moment must be "
                      "finite and >= 0"),
            std::string::npos);
  resumed.resume.clear();
  resumed.weights = dir / "nan.safetensors";  // --weights is checked as grad checks it
  rewrite_tensor(checkpoints / "step_2.safetensors", resumed.weights, "wte.weight", std::nanf(""));
  EXPECT_NE(testing::error_of([&] { train(resumed, progress); })
                .find("nan.safetensors: tensor wte.weight holds nan at index 1: values must be finite"),
            std::string::npos);
  std::fclose(log);
}

TEST(Progress, PlainLinesOnALogAndOneRedrawnLineOnATerminal) {
  StepLog log{.step = 35, .loss = 2.314, .lr = 1e-3, .grad_norm = 0.84, .step_time_s = 0.0521,
              .step_time_predicted_s = 0.05, .tokens_per_s = 12345, .tokens_per_s_predicted = 13000,
              .bubble_measured = 0.112, .bubble_predicted = 0.109, .ideal_fraction = 0.931, .busy_s = {}, .busy_predicted_s = {},
              .idle_s = {}, .idle_predicted_s = {}, .comm_s = {}, .off_core_s = {}, .wake_s = {}, .data_parallel_s = {},
              .data_parallel_early_s = {}, .tensor_parallel_s = {}, .tensor_parallel_predicted_s = {}, .peak_activation_bytes = {},
              .peak_activation_bytes_predicted = {}, .val_loss = {}};
  char buffer[1024] = {};
  std::FILE* out = fmemopen(buffer, sizeof buffer, "w");
  ProgressPrinter plain(out, false, 200, false, 4);
  plain.step(log, 36 * 0.5);  // 36 done in 18 s: 164 to go at 0.5 s each
  log.step = 36;
  plain.step(log, 37 * 0.5);  // a line every 4 steps
  std::fflush(out);
  EXPECT_STREQ(buffer,
               "step 36/200 loss 2.3140 lr 0.001 grad_norm 0.84 12.3k tok/s step 52.1 ms bubble 11.2% (predicted "
               "10.9%) ETA 1m22s\n");
  std::fclose(out);

  char resumed[1024] = {};
  out = fmemopen(resumed, sizeof resumed, "w");
  ProgressPrinter after_checkpoint(out, false, 200, false);
  after_checkpoint.start(30);
  log.step = 35;
  after_checkpoint.step(log, 6 * 0.5);  // 6 steps made in 3 s: the same ETA
  std::fflush(out);
  EXPECT_NE(std::string(resumed).find("step 36/200 ") , std::string::npos) << resumed;
  EXPECT_NE(std::string(resumed).find("ETA 1m22s\n"), std::string::npos) << resumed;
  std::fclose(out);

  char screen[1024] = {};
  out = fmemopen(screen, sizeof screen, "w");
  ProgressPrinter bar(out, true, 200, true);
  log.step = 99;
  log.val_loss = 2.5;
  bar.step(log, 50);
  bar.finish();
  std::fflush(out);
  EXPECT_STREQ(screen,
               "after 100 steps: validation loss 2.5000\n\r\033[Kstep 100/200 [==========>         ] loss 2.3140  12.3k tok/s "
               "emulated  bubble 11.2% (pred 10.9%)  ETA 50s\n");
  std::fclose(out);

  // A pipeline of two ranks also shows its speedup against the ideal.
  char pipelined[1024] = {};
  out = fmemopen(pipelined, sizeof pipelined, "w");
  ProgressPrinter two_ranks(out, false, 200, false);
  log.busy_s = {0.02, 0.02};
  two_ranks.step(log, 50);
  std::fflush(out);
  EXPECT_NE(std::string(pipelined).find("bubble 11.2% (predicted 10.9%) 93.1% of ideal ETA"), std::string::npos)
      << pipelined;
  std::fclose(out);
}

TEST(Report, SaysWhenRanksOutnumberCores) {
  EXPECT_EQ(oversubscription_note(2, 2, false, true), "");
  EXPECT_EQ(oversubscription_note(4, 2, false, true),
            "4 ranks share 2 cores: the workers are time-sliced, so the measured step time, tokens/s and bubble are "
            "not those of a pipeline with one device per rank; --emulate runs each action alone and replays the "
            "measured durations with one core per rank.");
  // With data or tensor parallelism there is nothing to emulate: no pointer to --emulate.
  EXPECT_EQ(oversubscription_note(4, 2, false, false),
            "4 ranks share 2 cores: the workers are time-sliced, so the measured step time, tokens/s and bubble are "
            "not those of a pipeline with one device per rank.");
  EXPECT_EQ(oversubscription_note(8, 2, true, true),
            "8 ranks, 2 cores: threads would time-slice, so this run is emulated: each action ran alone and the "
            "timeline replays the measured durations with one core per rank.");
  EXPECT_EQ(printable("ok\n\tfine\x01\xff"), "ok\n\tfine??");
}

// A process pinned to one core (taskset -c 0) has one core, however many
// the machine has.
TEST(Report, CountsTheCoresTheAffinityAllows) {
  int pinned = 0;
  std::thread thread([&] {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int first = 0;
    while (!CPU_ISSET(first, &allowed)) ++first;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    pinned = usable_cores();
  });
  thread.join();
  EXPECT_EQ(pinned, 1);
  EXPECT_GE(usable_cores(), 1);
}

TEST(Progress, EtaIsReadable) {
  EXPECT_EQ(format_eta(45.4), "45s");
  EXPECT_EQ(format_eta(72), "1m12s");
  EXPECT_EQ(format_eta(7380), "2h03m");
}

}  // namespace
}  // namespace pipeflow::runtime
