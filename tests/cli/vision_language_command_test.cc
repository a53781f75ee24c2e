#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "pipeflow/core/file.h"
#include "pipeflow/nn/safetensors.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

const std::string kLlava = std::string(PIPEFLOW_SOURCE_DIR) + "/tests/data/hf/llava-1.5-7b/config.json";

// LLaVA-1.5-7B fine-tuned on 8 A100s, 4 stages × 2 replicas, sequences of
// 576 image and 1472 text tokens.
const std::string kSimulate = "simulate --model " + kLlava +
                              " --hardware a100-80g --devices 8 --pp 4 --dp 2 --micro-batch 1 --global-batch 32 "
                              "--seq 2048 --bf16 --partition balanced --json";

double peak(const nlohmann::json& json) {
  double most = 0;
  for (const auto& rank : json["ranks"]) most = std::max(most, rank["peak_memory_bytes"].get<double>());
  return most;
}

TEST(VisionLanguageCommand, SimulateReadsLlavaAndAFrozenTowerCostsLess) {
  const CommandResult trained = run_pipeflow(kSimulate);
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const CommandResult frozen = run_pipeflow(kSimulate + " --freeze '[\"vision.*\"]'");
  ASSERT_EQ(frozen.exit_code, 0) << frozen.err;
  const nlohmann::json a = nlohmann::json::parse(trained.out);
  const nlohmann::json b = nlohmann::json::parse(frozen.out);
  ASSERT_EQ(a["stages"].size(), 4u);
  // Balanced: stage 0 holds the whole tower (patch embedding, 23 blocks, projector) and the first LM layers.
  EXPECT_EQ(a["stages"][0]["first_layer"], 0) << a["stages"][0];
  EXPECT_GT(a["stages"][0]["end_layer"].get<int>(), 25) << a["stages"][0];
  EXPECT_LT(b["step_time_s"].get<double>(), a["step_time_s"].get<double>());
  EXPECT_LE(peak(b), peak(a));
  // The text report names the tower's layers in its partition.
  const CommandResult text = run_pipeflow("simulate --model " + kLlava +
                                          " --hardware a100-80g --devices 4 --pp 4 --micro-batch 1 --global-batch 8 --seq 2048 --bf16");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("vision.patch_embedding.."), std::string::npos) << text.out;
}

TEST(VisionLanguageCommand, PlanFindsALayoutForLlavaWithItsTowerFrozen) {
  const CommandResult r = run_pipeflow("plan --model " + kLlava +
                                       " --hardware a100-80g --devices 8 --global-batch 32 --seq 2048 --top 1 "
                                       "--freeze '[\"vision.*\"]' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);
  ASSERT_FALSE(json["candidates"].empty()) << r.out;
  EXPECT_GT(json["candidates"][0]["tokens_per_s"].get<double>(), 0);
}

// plan prices one shape: simulate's --variable-images (the same flag, from
// the run configuration's key) is refused with the fix, not by CLI11.
TEST(VisionLanguageCommand, PlanRefusesVariableImagesWithTheFix) {
  const CommandResult r = run_pipeflow("plan --model " + kLlava +
                                       " --hardware a100-80g --devices 8 --global-batch 32 --seq 2048 "
                                       "--variable-images '[1, 2]'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("pipeflow: error: --variable-images: plan prices every micro-batch of a layout at one shape"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("give --variable-images to pipeflow simulate --config with it"), std::string::npos) << r.err;
  const CommandResult bad = run_pipeflow("plan --model " + kLlava +
                                         " --hardware a100-80g --devices 8 --global-batch 32 --seq 2048 "
                                         "--variable-images '[0]'");
  EXPECT_NE(bad.err.find("variable_images = [0]: every count must be >= 1"), std::string::npos) << bad.err;
}

TEST(VisionLanguageCommand, ModelShowsTheTowerAndTrainRefusesLlavasLlama) {
  const CommandResult model = run_pipeflow("model --model " + kLlava + " --seq 2048");
  ASSERT_EQ(model.exit_code, 0) << model.err;
  EXPECT_NE(model.out.find("vision tower: 23 layers run, hidden 1024, heads 16, ffn 4096, 336 px in 14 px patches, "
                           "576 tokens per image into the language model (1 per sequence of 2048)"),
            std::string::npos)
      << model.out;
  EXPECT_NE(model.out.find("parameters: 7050828800"), std::string::npos) << model.out;
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/llava.json", R"({"model": ")" + kLlava + R"(", "steps": 1, "seq_length": 600})");
  write_file_atomic(dir + "/frozen.json", R"({"model": "gpt-tiny", "steps": 1, "freeze": ["head"]})");
  const CommandResult train = run_pipeflow("train --config llava.json --out-dir out", dir);
  EXPECT_NE(train.exit_code, 0);
  EXPECT_NE(train.err.find(": text_config model_type = \"llama\" (transformers' default where text_config or its "
                           "model_type is absent): the language model behind the tower is GPT-2's; give a "
                           "text_config with model_type \"gpt2\""),
            std::string::npos)
      << train.err;
  const CommandResult frozen = run_pipeflow("train --config frozen.json --out-dir out", dir);
  EXPECT_NE(frozen.exit_code, 0);
  EXPECT_NE(frozen.err.find("freeze / lora: pipeflow train trains every weight of a language model"), std::string::npos)
      << frozen.err;
}

const std::string kVlmExample = std::string(PIPEFLOW_SOURCE_DIR) + "/examples/train_vlm_2stage.json";

// metrics.jsonl's lines.
std::vector<nlohmann::json> metrics(const std::string& out_dir) {
  std::vector<nlohmann::json> lines;
  std::istringstream text(read_file_if_exists(out_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(text, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// The losses of `whole`'s steps and the same steps of `other`: 1e-5 relative.
void expect_losses_near(const std::vector<nlohmann::json>& whole, const std::vector<nlohmann::json>& other) {
  for (std::size_t i = 0; i < whole.size(); ++i) {
    const double expected = whole[i]["loss"].get<double>();
    EXPECT_NEAR(other[i]["loss"].get<double>(), expected, 1e-5 * expected) << "step " << i;
  }
}

// The example (300 steps) for 80 steps through its 2 stages (1F1B), and
// 20 through one: the same losses to 1e-5 (float sums in another order,
// not bit for bit; measured 1.2e-6), and held-out captions right more often
// than chance, 4 of 64 (measured 10: the colours are learned first).
TEST(VisionLanguageCommand, TrainsTheExampleThroughTwoStagesToTheUnpipelinedLossesAndCaptionsAboveChance) {
  const std::string dir = make_temp_dir();
  const CommandResult two = run_pipeflow("train --config " + kVlmExample + " --out-dir two --steps 80", dir);
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const CommandResult one = run_pipeflow("train --config " + kVlmExample + " --out-dir one --steps 20 --stages 1", dir);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_NE(two.err.find("1f1b on 2 ranks (2 stages: stage 0: vision.patch_embedding.."), std::string::npos)
      << two.err;
  const std::vector<nlohmann::json> pipelined = metrics(dir + "/two");
  const std::vector<nlohmann::json> whole = metrics(dir + "/one");
  ASSERT_EQ(pipelined.size(), 80u);
  ASSERT_EQ(whole.size(), 20u);
  expect_losses_near(whole, pipelined);
  // Bytes start near uniform, ln 256 = 5.55.
  EXPECT_NEAR(whole.front()["loss"].get<double>(), 5.55, 0.2);
  EXPECT_LT(pipelined.back()["loss"].get<double>(), 0.5);
  // The validation loss after the last step.
  EXPECT_TRUE(pipelined.back().contains("val_loss"));
  EXPECT_FALSE(pipelined[40].contains("val_loss"));
  int right = -1, images = 0;
  const std::size_t at = two.out.find("held-out captions: ");
  ASSERT_NE(at, std::string::npos) << two.out;
  ASSERT_EQ(std::sscanf(two.out.c_str() + at, "held-out captions: %d right of %d", &right, &images), 2) << two.out;
  EXPECT_EQ(images, 64);
  EXPECT_GT(right, 4) << two.out;
  EXPECT_NE(two.out.find("(chance 4 of 64, 1 in 16)"), std::string::npos) << two.out;
  EXPECT_NE(two.out.find("held-out image 0, \""), std::string::npos) << two.out;
  const nn::SafetensorsFile weights = nn::SafetensorsFile::read(dir + "/two/weights.safetensors");
  EXPECT_TRUE(weights.contains("vision.embeddings.patch_embedding.weight"));
  EXPECT_TRUE(weights.contains("vision.embeddings.class_embedding"));
  EXPECT_TRUE(weights.contains("vision.pre_layrnorm.bias"));
  EXPECT_TRUE(weights.contains("projector.fc2.bias"));
  EXPECT_TRUE(weights.contains("h.1.mlp.c_proj.weight"));
}

// The tiny LLaVA config.json (CLIP's tower of 2 layers read up to
// vision_feature_layer -2, a GPT-2 text_config) is the example's inline
// model: the same layers and initial weights, so 3 steps give the same
// losses bit for bit.
TEST(VisionLanguageCommand, TrainsTheTinyLlavaConfigAsTheInlineModel) {
  const std::string dir = make_temp_dir();
  const std::string config = std::string(PIPEFLOW_SOURCE_DIR) + "/examples/models/tiny-llava/config.json";
  const CommandResult llava =
      run_pipeflow("train --config " + kVlmExample + " --model " + config + " --out-dir llava --steps 3", dir);
  ASSERT_EQ(llava.exit_code, 0) << llava.err;
  const CommandResult inline_model = run_pipeflow("train --config " + kVlmExample + " --out-dir inline --steps 3", dir);
  ASSERT_EQ(inline_model.exit_code, 0) << inline_model.err;
  EXPECT_NE(llava.err.find("vision-language model (ViT 1 x 32, 16 image tokens; GPT-2 2 x 32)"), std::string::npos)
      << llava.err;
  const std::vector<nlohmann::json> a = metrics(dir + "/llava"), b = metrics(dir + "/inline");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << "step " << i;
  EXPECT_LT(a.back()["loss"].get<double>(), a.front()["loss"].get<double>());
  // The language model's context must hold the 16 image tokens and text: the key named.
  std::string short_config = read_file_if_exists(config);
  const std::string positions = "\"n_positions\": 34";
  ASSERT_NE(short_config.find(positions), std::string::npos);
  short_config.replace(short_config.find(positions), positions.size(), "\"n_positions\": 16");
  write_file_atomic(dir + "/short.json", short_config);
  const CommandResult short_context =
      run_pipeflow("train --config " + kVlmExample + " --model short.json --out-dir short --steps 1", dir);
  EXPECT_NE(short_context.exit_code, 0);
  EXPECT_NE(short_context.err.find("max_positions = 16 (the language model's context: n_ctx, or a config.json's "
                                   "n_positions or max_position_embeddings): must exceed the 16 image tokens"),
            std::string::npos)
      << short_context.err;
  // A context above the image tokens but short of the caption: the fix
  // names the context to raise (34 passes: the run above), not a
  // seq_length the context cannot hold.
  short_config.replace(short_config.find("\"n_positions\": 16"), 17, "\"n_positions\": 17");
  write_file_atomic(dir + "/short17.json", short_config);
  const CommandResult short17 =
      run_pipeflow("train --config " + kVlmExample + " --model short17.json --out-dir short --steps 1", dir);
  EXPECT_NE(short17.exit_code, 0);
  EXPECT_NE(short17.err.find("seq_length = 17: pipeflow runs a vision-language model over its 16 image tokens and a "
                             "caption of 18 bytes; raise the language model's context (n_ctx, or a config.json's "
                             "n_positions) from 17 to 34 and set seq_length to 34 or leave it out"),
            std::string::npos)
      << short17.err;
  // The same for the inline model's n_ctx.
  std::string inline_config = read_file_if_exists(kVlmExample);
  ASSERT_NE(inline_config.find("\"n_ctx\": 34"), std::string::npos);
  inline_config.replace(inline_config.find("\"n_ctx\": 34"), 11, "\"n_ctx\": 16");
  write_file_atomic(dir + "/short_inline.json", inline_config);
  const CommandResult short_inline = run_pipeflow("train --config short_inline.json --out-dir short --steps 1", dir);
  EXPECT_NE(short_inline.exit_code, 0);
  EXPECT_NE(short_inline.err.find("max_positions = 16 (the language model's context: n_ctx, or"), std::string::npos)
      << short_inline.err;
}

// The example's 2 stages x 2 replicas (--dp 2, a global batch of 32 = 8 x 2
// micro-batches x 2 replicas) against 1 stage, 1 replica of its 4
// micro-batches: the same 32 samples a step, the gradients summed in
// another order (a few float roundoffs), so the losses within 1e-5
// relative over 5 steps (measured 1e-7).
TEST(VisionLanguageCommand, TrainsDataParallelReplicasToTheOneReplicaLosses) {
  const std::string dir = make_temp_dir();
  const CommandResult replicas = run_pipeflow(
      "train --config " + kVlmExample + " --out-dir dp --steps 5 --data-parallel 2 --global-batch 32", dir);
  ASSERT_EQ(replicas.exit_code, 0) << replicas.err;
  // The header places the 2 x 2 ranks as a GPT-2 run's does.
  EXPECT_NE(replicas.err.find("4 worker threads (pipeline 2 x data parallel 2)"), std::string::npos) << replicas.err;
  EXPECT_NE(replicas.err.find("data-parallel group (pipeline rank 1): world ranks 2 3"), std::string::npos)
      << replicas.err;
  const CommandResult one = run_pipeflow("train --config " + kVlmExample + " --out-dir one --steps 5 --stages 1", dir);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::vector<nlohmann::json> parallel = metrics(dir + "/dp");
  const std::vector<nlohmann::json> whole = metrics(dir + "/one");
  ASSERT_EQ(parallel.size(), 5u);
  ASSERT_EQ(whole.size(), 5u);
  expect_losses_near(whole, parallel);
}

// A VLM run writes what a GPT's does: metrics.jsonl with each step's
// measured and predicted figures (2 ranks), report.md, timeline.svg,
// trace.json (a Chrome trace of the last step, every F and B of its 4
// micro-batches on each of the 2 ranks), predicted.svg and profile.json,
// which simulate reads as a GPT's.
TEST(VisionLanguageCommand, ARunWritesTheReportTraceAndPredictionOfAGptRun) {
  const std::string dir = make_temp_dir();
  const CommandResult run = run_pipeflow("train --config " + kVlmExample + " --out-dir out --steps 5", dir);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("wrote out/metrics.jsonl, timeline.svg, trace.json, predicted.svg, profile.json, "
                         "run_config.json, weights.safetensors, report.md"),
            std::string::npos)
      << run.out;
  const std::vector<nlohmann::json> lines = metrics(dir + "/out");
  ASSERT_EQ(lines.size(), 5u);
  for (const nlohmann::json& line : lines) {
    EXPECT_GT(line["step_time_predicted_s"].get<double>(), 0) << line;
    // 1F1B, p = 2, m = 4: (p - 1) / (m + p - 1) = 0.2 were the stages' costs equal.
    EXPECT_GT(line["bubble_predicted"].get<double>(), 0) << line;
    EXPECT_LT(line["bubble_predicted"].get<double>(), 1) << line;
    EXPECT_EQ(line["busy_s"].size(), 2u) << line;
    EXPECT_EQ(line["busy_predicted_s"].size(), 2u) << line;
  }
  const std::string report = read_file_if_exists(dir + "/out/report.md");
  EXPECT_NE(report.find("- model: vision-language model (ViT 1 x 32, 16 image tokens; GPT-2 2 x 32): "),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("| 0 | 0 | vision.patch_embedding .. "), std::string::npos) << report;  // the VLM's layers
  EXPECT_NE(report.find("## Measured vs predicted"), std::string::npos) << report;
  EXPECT_NE(report.find("| step time | "), std::string::npos) << report;
  EXPECT_NE(report.find("Held-out image 0 (\""), std::string::npos) << report;
  const nlohmann::json trace = nlohmann::json::parse(read_file_if_exists(dir + "/out/trace.json"));
  int forwards = 0, backwards = 0;
  for (const nlohmann::json& event : trace["traceEvents"]) {
    if (!event.contains("cat")) continue;
    const std::string category = event["cat"].get<std::string>();
    forwards += category == "forward" ? 1 : 0;
    backwards += category == "backward" ? 1 : 0;
  }
  EXPECT_EQ(forwards, 8);  // 4 micro-batches x 2 stages
  EXPECT_EQ(backwards, 8);
  const CommandResult simulated =
      run_pipeflow("simulate --config " + kVlmExample + " --profile out/profile.json --json", dir);
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  EXPECT_GT(nlohmann::json::parse(simulated.out)["step_time_s"].get<double>(), 0);
}

// The example checkpointed every 2 steps, stopped after 4 of 6 and resumed
// from its out_dir (--resume: the newest checkpoint, step_4) ends where a
// run of 6 steps ends, bit for bit: every step's loss and gradient norm
// (metrics.jsonl keeps the first run's 4 lines) and every final weight,
// the frozen encoder's too. keep 1 leaves the newest checkpoint alone.
TEST(VisionLanguageCommand, ACheckpointedRunResumesToTheUninterruptedRunsBits) {
  const std::string dir = make_temp_dir();
  std::string config = read_file_if_exists(kVlmExample);
  const std::string steps = "\"steps\": 300,";
  ASSERT_NE(config.find(steps), std::string::npos);
  config.replace(config.find(steps), steps.size(), "\"steps\": 6, \"checkpoint\": {\"interval\": 2, \"keep\": 1},");
  write_file_atomic(dir + "/vlm.json", config);
  const std::string frozen = " --freeze '[\"vision.*\"]'";
  const CommandResult first = run_pipeflow("train --config vlm.json --out-dir resumed --steps 4" + frozen, dir);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.out.find("checkpoints every 2 steps in resumed/checkpoints"), std::string::npos) << first.out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/resumed/checkpoints/step_2.safetensors"));
  ASSERT_TRUE(std::filesystem::exists(dir + "/resumed/checkpoints/step_4.safetensors"));
  const CommandResult resumed =
      run_pipeflow("train --config vlm.json --resume resumed --out-dir resumed" + frozen, dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resuming after 4 steps from resumed/checkpoints/step_4.safetensors"), std::string::npos)
      << resumed.err;
  const CommandResult straight = run_pipeflow("train --config vlm.json --out-dir straight" + frozen, dir);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const std::vector<nlohmann::json> a = metrics(dir + "/resumed"), b = metrics(dir + "/straight");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(fmt::format("{:.9g}", a[i]["loss"].get<double>()), fmt::format("{:.9g}", b[i]["loss"].get<double>()))
        << "step " << i;
    EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << "step " << i;
    EXPECT_EQ(a[i]["grad_norm"], b[i]["grad_norm"]) << "step " << i;
  }
  EXPECT_EQ(read_file_if_exists(dir + "/resumed/weights.safetensors"),
            read_file_if_exists(dir + "/straight/weights.safetensors"));
  const nn::SafetensorsFile checkpoint = nn::SafetensorsFile::read(dir + "/resumed/checkpoints/step_6.safetensors");
  EXPECT_EQ(checkpoint.metadata().at("model_type"), "llava");
  EXPECT_TRUE(checkpoint.contains("vision.h.0.attn.c_attn.weight"));  // frozen: kept as it is
  EXPECT_FALSE(std::filesystem::exists(dir + "/resumed/checkpoints/step_4.safetensors"));

  // A language model's checkpoint into the vision-language run, and the reverse: refused by key, with the fix.
  write_file_atomic(dir + "/gpt.json",
                    R"({"model": "gpt-tiny", "steps": 1, "eval_interval": 0, "checkpoint": {"interval": 1}})");
  const CommandResult gpt = run_pipeflow("train --config gpt.json --out-dir gpt", dir);
  ASSERT_EQ(gpt.exit_code, 0) << gpt.err;
  const auto expect_refused = [&](const std::string& command, const std::string& message) {
    const CommandResult refused = run_pipeflow(command, dir);
    EXPECT_NE(refused.exit_code, 0);
    EXPECT_NE(refused.err.find(message), std::string::npos) << refused.err;
  };
  expect_refused("train --config vlm.json --out-dir wrong --resume gpt",
                 "gpt/checkpoints/step_1.safetensors: __metadata__ model_type = absent: not a vision-language model's "
                 "weights (model_type \"llava\"), so the run's model cannot load them; give checkpoint.load (--resume) "
                 "a checkpoint a vision-language run wrote");
  expect_refused("train --config gpt.json --out-dir wrong --resume resumed",
                 "resumed/checkpoints/step_6.safetensors: a vision-language model's checkpoint (__metadata__ "
                 "model_type = \"llava\") resumes only the run of its model: give the configuration with that model");
}

// freeze ["vision.*"]: the encoder's weights stay as initialised (1 step
// and 2 give the same bits) while the projector trains; LoRA adapts c_attn
// (lora_B leaves zero), its base stays.
TEST(VisionLanguageCommand, TrainHonoursAFrozenEncoderAndLora) {
  const std::string dir = make_temp_dir();
  const auto run = [&](const std::string& out, const std::string& flags) {
    const CommandResult r = run_pipeflow("train --config " + kVlmExample + " --out-dir " + out + " " + flags, dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nn::SafetensorsFile::read(dir + "/" + out + "/weights.safetensors");
  };
  const auto same = [](const nn::SafetensorsFile& a, const nn::SafetensorsFile& b, const char* name) {
    const Tensor x = a.floats(name), y = b.floats(name);
    return std::equal(x.span().begin(), x.span().end(), y.span().begin());
  };
  const std::string frozen = "--freeze '[\"vision.*\"]'";
  const nn::SafetensorsFile f2 = run("f2", frozen + " --steps 1"), f4 = run("f4", frozen + " --steps 2");
  EXPECT_TRUE(same(f2, f4, "vision.embeddings.class_embedding"));
  EXPECT_TRUE(same(f2, f4, "vision.h.0.attn.c_attn.weight"));
  EXPECT_FALSE(same(f2, f4, "projector.fc1.weight"));
  EXPECT_FALSE(same(f2, f4, "h.0.attn.c_attn.weight"));
  const std::string lora = R"(--lora '{"r": 2, "alpha": 4, "target": ["c_attn"], "train": ["projector"]}')";
  const nn::SafetensorsFile l2 = run("l2", lora + " --steps 1"), l4 = run("l4", lora + " --steps 2");
  EXPECT_TRUE(same(l2, l4, "vision.embeddings.patch_embedding.weight"));
  EXPECT_TRUE(same(l2, l4, "h.0.attn.c_attn.weight"));
  EXPECT_TRUE(same(l2, l4, "wte.weight"));
  EXPECT_FALSE(same(l2, l4, "h.0.attn.c_attn.lora_B"));
  EXPECT_FALSE(same(l2, l4, "projector.fc2.weight"));
  // What the model cannot freeze is refused by key, naming the layer.
  const CommandResult half = run_pipeflow(
      "train --config " + kVlmExample + " --out-dir half --steps 1 --freeze '[\"vision.patch_embedding\"]'", dir);
  EXPECT_NE(half.exit_code, 0);
  EXPECT_NE(half.err.find("freeze [vision.patch_embedding]: layer vision.block.0 would be trained"), std::string::npos)
      << half.err;
  const CommandResult split = run_pipeflow("train --config " + kVlmExample + " --out-dir split --tensor-parallel 2", dir);
  EXPECT_NE(split.exit_code, 0);
  EXPECT_NE(split.err.find("tensor_parallel = 2: pipeflow runs a vision-language model with its stages whole"),
            std::string::npos)
      << split.err;
}

}  // namespace
}  // namespace pipeflow::testing
