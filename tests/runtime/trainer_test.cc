#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>

#include "pipeflow/core/file.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/runtime/progress.h"
#include "pipeflow/runtime/report.h"
#include "pipeflow/runtime/trainer.h"
#include "pipeflow/sim/profile.h"
#include "test_support.h"

namespace pipeflow::runtime {
namespace {

std::filesystem::path temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("pipeflow_runtime_" + name + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TrainSettings tiny_settings(const std::filesystem::path& dir) {
  write_file_atomic(dir / "corpus.txt", testing::corpus());
  TrainSettings s;
  s.model = testing::kTiny;
  s.schedule = "1f1b";
  s.stages = 2;
  s.microbatches = 4;
  s.partition = parse_partition_method("uniform");
  s.hardware = hardware_preset("cpu");
  s.engine = testing::tiny_options();
  s.engine.optimizer = {.lr = 3e-3};
  s.engine.lr_schedule = nn::LrSchedule::constant(3e-3);
  s.data = {dir / "corpus.txt"};
  s.steps = 12;
  s.eval_interval = 5;
  s.out_dir = dir / "out";
  s.sample_tokens = 40;
  return s;
}

TEST(Trainer, TrainsWritesMetricsReportTimelineAndWeights) {
  const auto dir = temp_dir("train");
  const TrainSettings settings = tiny_settings(dir);
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
    for (const char* key : {"busy_s", "busy_predicted_s", "idle_s", "idle_predicted_s", "comm_s"}) {
      ASSERT_EQ(json[key].size(), 2u) << key;
    }
    // Measured and predicted split the same pipeline time, per rank.
    EXPECT_NEAR(json["busy_predicted_s"][0].get<double>() + json["idle_predicted_s"][0].get<double>(),
                json["busy_predicted_s"][1].get<double>() + json["idle_predicted_s"][1].get<double>(), 1e-12);
    EXPECT_EQ(json.contains("val_loss"), count == 4 || count == 9 || count == 11) << line;
    ++count;
  }
  EXPECT_EQ(count, 12);
  const std::string report = read_file(settings.out_dir / "report.md");
  for (const char* part : {"# Training report", "## Partition", "## Measured vs predicted", "| bubble |", "## Loss",
                           "## Sample"}) {
    EXPECT_NE(report.find(part), std::string::npos) << part;
  }
  EXPECT_NE(read_file(settings.out_dir / "timeline.svg").find("<svg"), std::string::npos);
  EXPECT_NE(read_file(settings.out_dir / "trace.json").find("\"traceEvents\""), std::string::npos);
  const MeasuredProfile profile = load_profile(settings.out_dir / "profile.json");  // what simulate --profile reads
  ASSERT_EQ(profile.stages.size(), 2u);
  EXPECT_GT(profile.stages[1].backward_s, 0);
  const auto weights = nn::SafetensorsFile::read(settings.out_dir / "weights.safetensors");
  EXPECT_EQ(nn::read_config(weights), testing::kTiny);
  std::fclose(log);
  std::filesystem::remove_all(dir);
}

TEST(Trainer, EmulatedAndThreadedRunsTrainTheSameWeights) {
  const auto dir = temp_dir("emulate");
  TrainSettings settings = tiny_settings(dir);
  settings.steps = 3;
  settings.sample_tokens = 1;
  settings.schedule = "zbv";
  settings.microbatches = 4;
  std::FILE* log = std::tmpfile();
  ProgressPrinter progress(log, false, settings.steps, false);
  const TrainOutcome threaded = train(settings, progress);
  const std::string threaded_weights = read_file(settings.out_dir / "weights.safetensors");
  settings.emulate = true;
  const TrainOutcome emulated = train(settings, progress);
  for (std::size_t i = 0; i < threaded.log.size(); ++i) EXPECT_EQ(threaded.log[i].loss, emulated.log[i].loss);
  EXPECT_EQ(read_file(settings.out_dir / "weights.safetensors"), threaded_weights);
  EXPECT_NE(read_file(settings.out_dir / "report.md").find("## Emulated vs predicted"), std::string::npos);
  EXPECT_NE(read_file(settings.out_dir / "timeline.svg").find("emulated (one core per rank)"), std::string::npos);
  std::fclose(log);
  std::filesystem::remove_all(dir);
}

TEST(Progress, PlainLinesOnALogAndOneRedrawnLineOnATerminal) {
  StepLog log{.step = 35, .loss = 2.314, .lr = 1e-3, .grad_norm = 0.84, .step_time_s = 0.0521,
              .step_time_predicted_s = 0.05, .tokens_per_s = 12345, .tokens_per_s_predicted = 13000,
              .bubble_measured = 0.112, .bubble_predicted = 0.109, .busy_s = {}, .busy_predicted_s = {},
              .idle_s = {}, .idle_predicted_s = {}, .comm_s = {}, .peak_activation_bytes = {},
              .peak_activation_bytes_predicted = {}, .val_loss = {}};
  char buffer[1024] = {};
  std::FILE* out = fmemopen(buffer, sizeof buffer, "w");
  ProgressPrinter plain(out, false, 200, false);
  plain.step(log, 36 * 0.5);  // 36 done in 18 s: 164 to go at 0.5 s each
  log.step = 36;
  plain.step(log, 37 * 0.5);  // a line every 200 / 50 = 4 steps
  std::fflush(out);
  EXPECT_STREQ(buffer,
               "step 36/200 loss 2.3140 lr 0.001 grad_norm 0.84 12.3k tok/s step 52.1 ms bubble 11.2% (predicted "
               "10.9%) ETA 1m22s\n");
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
               "step 100: validation loss 2.5000\n\r\033[Kstep 100/200 [==========>         ] loss 2.3140  12.3k tok/s "
               "emulated  bubble 11.2% (pred 10.9%)  ETA 50s\n");
  std::fclose(out);
}

TEST(Report, SaysWhenRanksOutnumberCores) {
  EXPECT_EQ(oversubscription_note(2, 2, false), "");
  EXPECT_EQ(oversubscription_note(4, 2, false),
            "4 ranks share 2 cores: the workers are time-sliced, so the measured step time, tokens/s and bubble are "
            "not those of a pipeline with one device per rank; --emulate runs each action alone and replays the "
            "measured durations with one core per rank.");
  EXPECT_EQ(oversubscription_note(8, 2, true),
            "8 ranks, 2 cores: threads would time-slice, so this run is emulated: each action ran alone and the "
            "timeline replays the measured durations with one core per rank.");
  EXPECT_EQ(printable("ok\n\tfine\x01\xff"), "ok\n\tfine??");
}

TEST(Progress, EtaIsReadable) {
  EXPECT_EQ(format_eta(45.4), "45s");
  EXPECT_EQ(format_eta(72), "1m12s");
  EXPECT_EQ(format_eta(7380), "2h03m");
}

}  // namespace
}  // namespace pipeflow::runtime
