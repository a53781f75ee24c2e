// pipeflow train in bf16 and fp16, end to end: a bf16 run ends near the fp32
// run of the same seed; an fp16 run whose loss scale overflows on purpose
// skips those steps, lowers the scale, recovers and trains; its checkpoint
// says the precision and carries the scale, and a resumed run continues it;
// a bf16 run's checkpoint holds fp32 master weights and resumes as fp32, and
// an fp32 run's resumes as bf16.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "pipeflow/core/file.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/tensor/gemm.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

// 2 blocks of width 32 on 2 pipeline ranks (1F1B), 4 micro-batches of 2 x 32.
std::string config(const std::string& out_dir, int steps, const std::string& extra) {
  return R"({
  "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_ctx": 32, "vocab_size": 256},
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 4,
  "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
  "pipeline": {"stages": 2, "schedule": "1f1b", "partition_method": "uniform"},
  "steps": )" + std::to_string(steps) + R"(,
  "eval_interval": 0,
  "seed": 7,)" + extra + R"(
  "out_dir": ")" + out_dir + R"("
})";
}

std::vector<nlohmann::json> metrics(const std::string& out_dir) {
  std::istringstream lines(read_file(out_dir + "/metrics.jsonl"));
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

double final_validation_loss(const CommandResult& result) {
  const std::string key = "validation loss ";
  const std::size_t at = result.out.rfind(key);
  EXPECT_NE(at, std::string::npos) << result.out;
  return std::stod(result.out.substr(at + key.size()));
}

CommandResult train(const std::string& dir, const std::string& name, int steps, const std::string& extra,
                    const std::string& flags = "") {
  const std::string path = dir + "/" + name + ".json";
  write_file_atomic(path, config(dir + "/" + name, steps, extra));
  CommandResult result = run_pipeflow("train --config " + path + " " + flags);
  EXPECT_EQ(result.exit_code, 0) << name << "\n" << result.err;
  return result;
}

// The bound: 2% of the final validation loss, the issue's, on both ways a
// bf16 run multiplies (PIPEFLOW_BF16_GEMM): measured 0.05% through the bf16
// matmul (3.6154 against 3.6171), 0.76% in fp32 GEMMs (3.5896).
TEST(TrainPrecision, Bf16EndsWithinTwoPercentOfFp32) {
  const std::string dir = make_temp_dir();
  const double fp32 = final_validation_loss(train(dir, "fp32", 60, ""));
  const CommandResult bf16 = train(dir, "bf16", 60, R"("bf16": {"enabled": true},)");
  EXPECT_NE(bf16.err.find("in bf16"), std::string::npos) << bf16.err;
  EXPECT_NEAR(final_validation_loss(bf16), fp32, 0.02 * fp32);
  for (const std::string path : {"fp32", "bf16"}) {
    if (path == "bf16" && !bf16_matmul_available()) continue;  // AVX2 alone: refused, tested in tensor
    const std::string name = "bf16-gemm-" + path;
    write_file_atomic(dir + "/" + name + ".json", config(dir + "/" + name, 60, R"("bf16": {"enabled": true},)"));
    const CommandResult forced =
        run_pipeflow("train --config " + dir + "/" + name + ".json", "", "export PIPEFLOW_BF16_GEMM=" + path);
    ASSERT_EQ(forced.exit_code, 0) << forced.err;
    EXPECT_NEAR(final_validation_loss(forced), fp32, 0.02 * fp32) << path;
  }
  const nn::SafetensorsFile weights = nn::SafetensorsFile::read_metadata(dir + "/bf16/weights.safetensors");
  EXPECT_EQ(weights.metadata("precision"), "bf16");
}

// A scale of 2^40 overflows fp16 at once. With hysteresis 1 each overflow
// halves it, until the scaled gradients fit; then the run trains, and the
// scale grows again after each clean window.
TEST(TrainPrecision, AnFp16RunThatOverflowsSkipsLowersTheScaleAndRecovers) {
  const std::string dir = make_temp_dir();
  const std::string fp16 = R"("fp16": {"enabled": true, "initial_scale_power": 40, "hysteresis": 1,
    "loss_scale_window": 5}, "checkpoint": {"interval": 30},)";
  const CommandResult result = train(dir, "fp16", 40, fp16);
  EXPECT_NE(result.err.find("skipped: fp16 gradients overflowed at loss scale 1099511627776; the scale is lowered to "
                            "549755813888"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("loss_scale "), std::string::npos) << result.err;
  const std::vector<nlohmann::json> rows = metrics(dir + "/fp16");
  ASSERT_EQ(rows.size(), 40u);
  int overflows = 0;
  while (rows[static_cast<std::size_t>(overflows)].value("overflow", false)) {
    const nlohmann::json& row = rows[static_cast<std::size_t>(overflows)];
    EXPECT_TRUE(row.value("skipped", false));
    EXPECT_EQ(row.at("loss_scale").get<double>(), std::ldexp(1.0, 40 - overflows));
    ++overflows;
  }
  ASSERT_GT(overflows, 5);
  ASSERT_LT(overflows, 30);
  // Recovered: no skip after the last overflow's halving found a scale that fits...
  const double fitting = std::ldexp(1.0, 40 - overflows);
  EXPECT_EQ(rows[static_cast<std::size_t>(overflows)].at("loss_scale").get<double>(), fitting);
  EXPECT_FALSE(rows[static_cast<std::size_t>(overflows)].value("skipped", false));
  // ... the loss falls, and each clean window of 5 steps tries a doubled scale.
  EXPECT_LT(rows.back().at("loss").get<double>(), rows[static_cast<std::size_t>(overflows)].at("loss").get<double>());
  bool doubled = false;
  for (std::size_t i = static_cast<std::size_t>(overflows) + 1; i < rows.size(); ++i) {
    doubled = doubled || rows[i].at("loss_scale").get<double>() > fitting;
  }
  EXPECT_TRUE(doubled);

  // The checkpoint after step 30 carries the precision and the scaler; a
  // resumed run starts from its scale, as the uninterrupted run went on.
  const nn::SafetensorsFile checkpoint = nn::SafetensorsFile::read_metadata(dir + "/fp16/checkpoints/step_30.safetensors");
  EXPECT_EQ(checkpoint.metadata("precision"), "fp16");
  EXPECT_EQ(std::stod(checkpoint.metadata("loss_scale.scale")), rows[30].at("loss_scale").get<double>());
  train(dir, "fp16", 40, fp16, "--resume " + dir + "/fp16/checkpoints/step_30.safetensors --out-dir " + dir + "/resumed");
  const std::vector<nlohmann::json> resumed = metrics(dir + "/resumed");
  ASSERT_FALSE(resumed.empty());
  EXPECT_EQ(resumed.front().at("step").get<int>(), 30);
  EXPECT_EQ(resumed.front().at("loss_scale").get<double>(), rows[30].at("loss_scale").get<double>());
  EXPECT_NEAR(resumed.back().at("loss").get<double>(), rows.back().at("loss").get<double>(), 1e-5);
  // A static scale given on resume is the scale: the checkpoint's dynamic one does not replace it.
  train(dir, "static", 32, R"("fp16": {"enabled": true, "loss_scale": 128},)",
        "--resume " + dir + "/fp16/checkpoints/step_30.safetensors");
  EXPECT_EQ(metrics(dir + "/static").front().at("loss_scale").get<double>(), 128);
}

// Resumed at step 5 in the other precision, each run goes on from the
// checkpoint's state: its first step's loss is the uninterrupted runs' at
// step 5 (4.868 in both precisions; a run that started afresh would read
// 5.54), in the precision the resumed run's configuration gives. The
// checkpoint holds fp32 master weights and moments and says the precision
// of the run that wrote it.
TEST(TrainPrecision, ABf16CheckpointResumesAsFp32AndTheReverse) {
  const std::string dir = make_temp_dir();
  const std::string every_5 = R"("checkpoint": {"interval": 5},)";
  const std::string bf16 = every_5 + R"("bf16": {"enabled": true},)";
  train(dir, "bf16", 10, bf16);
  train(dir, "fp32", 10, every_5);
  const nn::SafetensorsFile checkpoint = nn::SafetensorsFile::read(dir + "/bf16/checkpoints/step_5.safetensors");
  EXPECT_EQ(checkpoint.metadata("precision"), "bf16");
  for (const std::string& name : checkpoint.names()) {
    EXPECT_EQ(checkpoint.entry(name).dtype, nn::Dtype::kF32) << name << ": master weights and moments in fp32";
  }
  train(dir, "as-fp32", 10, every_5, "--resume " + dir + "/bf16/checkpoints/step_5.safetensors");
  train(dir, "as-bf16", 10, bf16, "--resume " + dir + "/fp32/checkpoints/step_5.safetensors");
  const double at_5 = metrics(dir + "/fp32")[5].at("loss").get<double>();
  for (const std::string name : {"as-fp32", "as-bf16"}) {
    const std::vector<nlohmann::json> rows = metrics(dir + "/" + name);
    ASSERT_EQ(rows.size(), 5u) << name;
    EXPECT_EQ(rows.front().at("step").get<int>(), 5) << name;
    EXPECT_NEAR(rows.front().at("loss").get<double>(), at_5, 2e-3) << name;
    EXPECT_LT(rows.back().at("loss").get<double>(), rows.front().at("loss").get<double>()) << name;
  }
  EXPECT_EQ(nlohmann::json::parse(read_file(dir + "/as-fp32/run_config.json"))["bf16"]["enabled"], false);
  EXPECT_EQ(nlohmann::json::parse(read_file(dir + "/as-bf16/run_config.json"))["bf16"]["enabled"], true);
}

}  // namespace
}  // namespace pipeflow::testing
