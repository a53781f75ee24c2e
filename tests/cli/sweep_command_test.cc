// pipeflow sweep --train end to end: each point is a real training run whose
// losses are those of pipeflow train with the same settings, and whose
// prediction is pipeflow simulate's.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../trace/xml_check.h"
#include "pipeflow/core/file.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

// 2 blocks of width 32 on the fortunes corpus; 1F1B on 2 ranks, 8 sequences
// of 32 bytes a step in micro-batches of 2; 3 steps, validated after the last.
std::string tiny_config(const std::string& dir, double lr) {
  const std::string path = dir + "/run.json";
  write_file_atomic(path, fmt::format(R"({{
  "model": {{"n_layer": 2, "n_head": 2, "n_embd": 32, "n_ctx": 32, "vocab_size": 256}},
  "train_batch_size": 8,
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 4,
  "optimizer": {{"type": "AdamW", "params": {{"lr": {:.17g}}}}},
  "pipeline": {{"stages": 2, "schedule": "1f1b", "partition_method": "uniform"}},
  "steps": 3,
  "eval_interval": 0,
  "seed": 7,
  "out_dir": "{}/runs"
}})",
                                      lr, dir));
  return path;
}

std::vector<nlohmann::json> metrics_of(const std::string& run_dir) {
  std::istringstream lines(read_file(run_dir + "/metrics.jsonl"));
  std::vector<nlohmann::json> steps;
  for (std::string line; std::getline(lines, line);) steps.push_back(nlohmann::json::parse(line));
  return steps;
}

TEST(SweepCommand, TrainedPointsLossesAreThoseOfTrainAndTheirPredictionIsSimulates) {
  const std::string dir = make_temp_dir();
  const std::string config = tiny_config(dir, 3e-3);
  const CommandResult r = run_pipeflow("sweep --train --config " + config + " --vary global-batch=4,8 --json --svg " +
                                       dir + "/sweep.svg");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("pipeflow sweep: training global-batch=4 (3 steps) into " + dir + "/runs/global-batch=4"),
            std::string::npos)
      << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  ASSERT_EQ(json["points"].size(), 2u);
  // Global batch 4 from the configuration's 8 at 3e-3: the square-root rule.
  const double lr4 = 3e-3 * std::sqrt(0.5);
  EXPECT_EQ(json["points"][0]["lr"].get<double>(), lr4);
  EXPECT_EQ(json["points"][1]["lr"].get<double>(), 3e-3);
  for (const nlohmann::json& step : metrics_of(dir + "/runs/global-batch=4")) EXPECT_EQ(step["lr"].get<double>(), lr4);

  const std::string svg = read_file(dir + "/sweep.svg");
  EXPECT_EQ(XmlCheck(svg).run(), "");
  for (int i = 0; i < 2; ++i) {
    const nlohmann::json& point = json["points"][i];
    const std::string batch = point["global-batch"].get<std::string>();
    // pipeflow train with the point's settings (its learning rate written out) loses the same, bit for bit.
    const std::string direct_dir = dir + "/direct" + batch;
    std::filesystem::create_directory(direct_dir);
    const CommandResult direct = run_pipeflow("train --config " + tiny_config(direct_dir, point["lr"].get<double>()) +
                                              " --global-batch " + batch);
    ASSERT_EQ(direct.exit_code, 0) << direct.err;
    const std::vector<nlohmann::json> steps = metrics_of(direct_dir + "/runs");
    const nlohmann::json& measured = point["measured"];
    ASSERT_EQ(steps.size(), 3u);
    ASSERT_EQ(measured["loss"].size(), 3u);
    for (std::size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(measured["loss"][s].get<double>(), steps[s]["loss"].get<double>()) << batch << " step " << s;
      EXPECT_EQ(measured["tokens_seen"][s].get<double>(), (s + 1) * std::stod(batch) * 32);
    }
    EXPECT_EQ(measured["val_loss"].get<double>(), steps.back()["val_loss"].get<double>());
    // The predicted columns are pipeflow simulate's of the same settings.
    const CommandResult simulated = run_pipeflow("simulate --config " + config + " --global-batch " + batch + " --json");
    ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
    const nlohmann::json prediction = nlohmann::json::parse(simulated.out);
    for (const char* key : {"step_time_s", "bubble_ratio", "tokens_per_s"}) {
      EXPECT_EQ(point[key].get<double>(), prediction[key].get<double>()) << key;
    }
    // The plot's last loss circle of this point is the JSON's last loss.
    const std::size_t last = svg.rfind("data-setting=\"" + batch + "\" data-series=\"measured\" data-tokens=\"" +
                                       fmt::format("{}", 3 * std::stod(batch) * 32) + "\"");
    ASSERT_NE(last, std::string::npos) << batch;
    const std::size_t value = svg.find("data-value=\"", last) + 12;
    EXPECT_EQ(std::stod(svg.substr(value, svg.find('"', value) - value)), measured["loss"][2].get<double>());
  }
}

TEST(SweepCommand, AKeyPathIsSweptAndAnUnknownOneNamesTheValidKeys) {
  const std::string dir = make_temp_dir();
  const std::string config = tiny_config(dir, 3e-3);
  const CommandResult table = run_pipeflow("sweep --config " + config + " --vary model.n_layer=2,4");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_EQ(table.out.rfind("model.n_layer  step time  bubble  peak memory  tokens/s\n", 0), 0u) << table.out;
  const CommandResult bad = run_pipeflow("sweep --config " + config + " --vary pipeline.microbatches=2,4");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--vary \"pipeline.microbatches\": neither an option (microbatches, "),
            std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("gradient_accumulation_steps, "), std::string::npos) << bad.err;
  const CommandResult steps = run_pipeflow("sweep --config " + config + " --vary stages=2 --steps 3");
  EXPECT_EQ(steps.exit_code, 1);
  EXPECT_NE(steps.err.find("--steps is an option of the training runs: give it with --train"), std::string::npos)
      << steps.err;
}

// A sweep none of whose points ran prints its table of reasons and exits
// non-zero with the first; one point that runs is a result.
TEST(SweepCommand, ASweepWhosePointsAllFailExitsNonZero) {
  const std::string dir = make_temp_dir();
  const std::string config = tiny_config(dir, 3e-3);
  const CommandResult none = run_pipeflow("sweep --config " + config + " --vary stages=5,6");
  EXPECT_EQ(none.exit_code, 1) << none.out;
  EXPECT_NE(none.err.find("pipeflow: error: none of the 2 points ran; the first: "), std::string::npos) << none.err;
  const CommandResult one = run_pipeflow("sweep --config " + config + " --vary stages=2,5");
  EXPECT_EQ(one.exit_code, 0) << one.err;
}

}  // namespace
}  // namespace pipeflow::testing
