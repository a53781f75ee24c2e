#include "pipeflow/sim/report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "../support/error_of.h"

namespace pipeflow {
namespace {

Layout llama_layout(const std::string& training_keys) {
  return layout_of(resolve(parse_run_config(Config::parse(
      R"({"model": "llama2-7b", "hardware": "a100-80g", "devices": 2, "pipeline": {"stages": 2},
          "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "seq_length": 128, "bf16": {"enabled": true})" +
          training_keys + "}",
      "run.json"))));
}

// Llama 2 7B, LoRA r 8 on q_proj and v_proj (2 · 8 · (4096 + 4096) = 131,072 a block), block.0 frozen whole:
// 31 adapted blocks train 4,063,232 parameters beside the model's 6,738,415,616; embedding, block.0 and head
// train nothing, and the first two run no backward.
TEST(SimulateReport, NamesWhatIsFrozenAndLorasSettingsBesideTheRunsOtherSettings) {
  const Prediction p = predict(llama_layout(
      R"(, "freeze": ["block.0"], "lora": {"r": 8, "target": ["q_proj", "v_proj"]})"));
  const std::string text = prediction_text(p);
  EXPECT_NE(text.find("\ntraining: freeze [\"block.0\"]; lora r 8, alpha 16 on q_proj, v_proj; 4.1M of 6.74B "
                      "parameters trainable; 3 of 34 layers frozen, 31 with frozen base weights beside their "
                      "adapters, the first 2 (embedding..block.0) without a backward\n"),
            std::string::npos)
      << text;
  const nlohmann::json json = nlohmann::json::parse(prediction_json(p));
  EXPECT_EQ(json["layout"]["freeze"], nlohmann::json::array({"block.0"}));
  EXPECT_EQ(json["layout"]["lora"]["r"], 8);
  EXPECT_EQ(json["layout"]["lora"]["alpha"], 16.0);
  EXPECT_EQ(json["layout"]["lora"]["target"], nlohmann::json::array({"q_proj", "v_proj"}));
  EXPECT_EQ(json["training"]["parameters"], 6738415616 + 4063232);
  EXPECT_EQ(json["training"]["trainable_parameters"], 4063232);
  EXPECT_EQ(json["training"]["frozen_layers"], nlohmann::json::array({"embedding", "block.0", "head"}));
  EXPECT_EQ(json["training"]["adapted_layers"], 31);
  EXPECT_EQ(json["training"]["layers_without_backward"], 2);
}

TEST(SimulateReport, ARunThatTrainsEverythingHasNoTrainingLine) {
  const Prediction p = predict(llama_layout(""));
  EXPECT_EQ(prediction_text(p).find("training:"), std::string::npos);
  const nlohmann::json json = nlohmann::json::parse(prediction_json(p));
  EXPECT_TRUE(json["layout"]["lora"].is_null());
  EXPECT_EQ(json["layout"]["freeze"], nlohmann::json::array());
  EXPECT_EQ(json["training"]["trainable_parameters"], 6738415616);
  EXPECT_EQ(json["training"]["parameters"], 6738415616);
  EXPECT_EQ(json["training"]["layers_without_backward"], 0);
}

// block_launch_overhead_s is named in the layout line and the JSON's layout
// when set, and absent from the line at its default 0.
TEST(SimulateReport, NamesSynchronousLaunchesAndTheirHostTime) {
  const Prediction p = predict(llama_layout(R"(, "block_launch_overhead_s": 0.004)"));
  const std::string text = prediction_text(p);
  EXPECT_NE(text.find(", host overhead (4.00 ms a block pass)\n"), std::string::npos) << text;
  EXPECT_EQ(nlohmann::json::parse(prediction_json(p))["layout"]["block_launch_overhead_s"], 0.004);
  const Prediction plain = predict(llama_layout(""));
  EXPECT_EQ(prediction_text(plain).find("host overhead"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(prediction_json(plain))["layout"]["block_launch_overhead_s"], 0.0);
}

// Micro-batches of 64 and 128 tokens: a step carries 64 + 128 = 192 tokens; at equal lengths the step is
// the uniform case's exactly.
TEST(SimulateReport, VariableSequenceLengthsAgainstTheUniformCase) {
  const Prediction p = predict(llama_layout(R"(, "variable_seq_lengths": [64, 128])"));
  EXPECT_DOUBLE_EQ(p.costs.tokens_per_step, 192);
  ASSERT_TRUE(p.variable_lengths.has_value());
  EXPECT_EQ(p.variable_lengths->lengths, (std::vector<int>{64, 128}));
  EXPECT_EQ(p.variable_lengths->uniform_length, 96);
  EXPECT_GT(p.variable_lengths->microbatch_imbalance, 1.2);
  EXPECT_NE(prediction_text(p).find("\nvariable sequence lengths: 2 micro-batches of 64 .. 128 tokens: step "),
            std::string::npos);
  const Prediction same = predict(llama_layout(R"(, "variable_seq_lengths": [128])"));
  EXPECT_DOUBLE_EQ(same.result.step_time_s, same.variable_lengths->uniform_step_time_s);
  EXPECT_DOUBLE_EQ(same.result.step_time_s, predict(llama_layout("")).result.step_time_s);
  EXPECT_DOUBLE_EQ(same.variable_lengths->microbatch_imbalance, 1);
}


Layout llava_layout(const std::string& keys) {
  return layout_of(resolve(parse_run_config(Config::parse(
      R"({"model": ")" + std::string(PIPEFLOW_SOURCE_DIR) +
          R"(/examples/cases/2-multimodal/llava-1.5-7b.json", "hardware": "a100-80g", "devices": 2,
          "pipeline": {"stages": 2}, "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
          "seq_length": 2048, "bf16": {"enabled": true})" +
          keys + "}",
      "run.json"))));
}

// LLaVA-1.5-7B, micro-batches of 2048 tokens with 1 and 2 images (576 image tokens each): each priced as
// a uniform run of its own shape would be, the tower's work doubling with the second image; the uniform
// case holds the mean images rounded down (1.5 → 1: a whole number that leaves text).
TEST(SimulateReport, VariableImagesPriceEachMicrobatchsVisionTowerOnItsOwn) {
  const Layout layout = llava_layout(R"(, "variable_images": [1, 2])");
  const Prediction p = predict(layout);
  ASSERT_EQ(p.costs.costs.microbatch_stages.size(), 2u);
  for (int images : {1, 2}) {
    const Layout own = with_microbatch_shape(layout, {2048, images});
    const LayoutCosts uniform = layout_costs(own, layout_schedule(own), p.costs.partition);
    const std::vector<StageCosts>& priced = p.costs.costs.microbatch_stages[static_cast<std::size_t>(images - 1)];
    for (std::size_t s = 0; s < priced.size(); ++s) {
      EXPECT_DOUBLE_EQ(priced[s].forward_s, uniform.costs.stages[s].forward_s) << images << " image(s), stage " << s;
      EXPECT_DOUBLE_EQ(priced[s].backward_s, uniform.costs.stages[s].backward_s) << images << " image(s), stage " << s;
    }
  }
  // Stage 0 holds the tower.
  EXPECT_LT(p.costs.costs.microbatch_stages[0][0].forward_s, p.costs.costs.microbatch_stages[1][0].forward_s);
  ASSERT_TRUE(p.variable_lengths.has_value());
  EXPECT_EQ(p.variable_lengths->images, (std::vector<int>{1, 2}));
  EXPECT_EQ(p.variable_lengths->uniform_images, 1);
  EXPECT_EQ(p.variable_lengths->uniform_length, 2048);
  EXPECT_NE(prediction_text(p).find("\nvariable sequence lengths: 2 micro-batches of 2048 .. 2048 tokens, 1 .. 2 "
                                    "images: step "),
            std::string::npos)
      << prediction_text(p);
  EXPECT_NE(prediction_text(p).find(" with every micro-batch at 2048 tokens and 1 image ("), std::string::npos);
  // Lengths of 600 and 1200 with 1 and 2 images: each leaves text, and so does the uniform case (900
  // tokens, 1 image); rounding the 1.5 images up would leave none (1152 > 900).
  const Prediction paired = predict(llava_layout(R"(, "variable_seq_lengths": [600, 1200], "variable_images": [1, 2])"));
  EXPECT_EQ(paired.variable_lengths->uniform_length, 900);
  EXPECT_EQ(paired.variable_lengths->uniform_images, 1);
}

// Checked once, as the configuration is resolved, naming its file.
TEST(SimulateReport, VariableImagesNeedAVisionTowerAndRoomForText) {
  EXPECT_EQ(testing::error_of([] { predict(llava_layout(R"(, "variable_images": [1, 4])")); }),
            "run.json: seq_length = 2048 with 4 image(s) of 576 tokens: they leave no text (a length counts its image tokens); "
            "raise seq_length above 2304, or fewer variable_images");
  EXPECT_EQ(testing::error_of([] { predict(llava_layout(R"(, "variable_seq_lengths": [100, 2048])")); }),
            "run.json: variable_seq_lengths holds 100 with 1 image(s) of 576 tokens: they leave no text (a length counts its "
            "image tokens); give variable_seq_lengths lengths above 576");
  EXPECT_EQ(testing::error_of([] {
              llava_layout(R"(, "variable_seq_lengths": {"distribution": "uniform", "min": 100, "max": 2048},
                               "variable_images": [1, 2])");
            }),
            "run.json: variable_seq_lengths.min = 100: a sequence holds up to 2 image(s) of 576 tokens and its "
            "text, so a drawn length must exceed 1152: use min >= 1153");
  EXPECT_EQ(testing::error_of([] { predict(llama_layout(R"(, "variable_images": [1, 2])")); }),
            "run.json: variable_images = [1, 2]: llama2-7b has no vision tower: drop variable_images, or give a "
            "vision-language model");
}

}  // namespace
}  // namespace pipeflow
