// The tiny vision-language model through the pipeline engine: 2 and 4
// stages (threads) with the existing schedules give the same losses as the
// unpipelined run.

#include "pipeflow/runtime/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../support/error_of.h"
#include "pipeflow/core/error.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/schedule/generators.h"
#include "../support/temp_dir.h"

namespace pipeflow::runtime {
namespace {

// 16 × 16 images in 8 × 8 patches (4 image tokens of width 16, 2 ViT
// blocks), a projector to the LM's 16, a GPT-2 of 2 blocks: 8 pipeline
// layers (vision.patch_embedding, vision.block.0, vision.block.1, projector, embedding, block.0,
// block.1, head), 4 + 18 positions.
nn::VlmConfig small_vlm() {
  return {.vision = {.geometry = {.image_size = nn::ShapeCaptions::kImageSize, .patch_size = 8, .channels = 3},
                     .width = 16,
                     .heads = 2,
                     .layers = 2},
          .text = {.vocab_size = 256, .context = 24, .n_layer = 2, .n_head = 2, .n_embd = 16}};
}

VlmTraining small_training(const nn::VlmStageOptions& options = {}) {
  return {.model = small_vlm(), .freeze_vision = options.freeze_vision, .lora = options.lora};
}

EngineOptions small_options(int data_parallel = 1) {
  EngineOptions options;
  options.micro_batch = 2;
  options.seq_length = small_vlm().vision.tokens() + nn::ShapeCaptions::kCaptionBytes;
  options.optimizer = {.lr = 1e-2, .weight_decay = 0.01};
  options.lr_schedule = nn::LrSchedule::constant(1e-2);
  options.data_parallel = data_parallel;
  return options;
}

std::vector<double> train(const std::vector<int>& boundaries, const Schedule& schedule, int steps,
                          const nn::VlmStageOptions& options = {}) {
  VlmPipelineEngine engine(small_training(options), schedule, boundaries, small_options());
  engine.init_parameters(11);
  const nn::ShapeCaptions data(4);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) losses.push_back(engine.step(step, data).loss);
  return losses;
}

void expect_losses_equal(const std::vector<double>& expected, const std::vector<double>& actual) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-5 * expected[i]) << i;
}

constexpr int kSteps = 4, kMicrobatches = 4;

// Cut inside the encoder, at the projector and inside the LM: every kind of
// message (vision width, LM width with and without the text) crosses a boundary.
TEST(VlmEngine, TwoAndFourStagesGiveTheUnpipelinedLosses) {
  const int layers = small_vlm().pipeline_layers();
  const auto whole = train({0, layers}, make_gpipe(1, kMicrobatches), kSteps);
  EXPECT_LT(whole.back(), whole.front());
  const std::vector<int> two = {0, 4, layers};  // the text joins on stage 1
  const std::vector<int> four = {0, 2, 4, 6, layers};
  for (const char* name : {"gpipe", "1f1b", "zb-h1"}) {
    SCOPED_TRACE(name);
    expect_losses_equal(whole, train(two, make_schedule(name, 2, kMicrobatches), kSteps));
    expect_losses_equal(whole, train(four, make_schedule(name, 4, kMicrobatches), kSteps));
  }
}

// A frozen encoder (no gradient crosses into stages 0 and 1) and LoRA on
// the LM, through 4 stages, against their unpipelined runs.
TEST(VlmEngine, FrozenEncoderAndLoraGiveTheUnpipelinedLosses) {
  const int layers = small_vlm().pipeline_layers();
  const std::vector<int> four = {0, 2, 4, 6, layers};
  for (const nn::VlmStageOptions& options :
       {nn::VlmStageOptions{.freeze_vision = true}, nn::VlmStageOptions{.lora = nn::LoraOptions{.r = 2, .alpha = 4}}}) {
    SCOPED_TRACE(options.lora ? "lora" : "frozen encoder");
    const auto whole = train({0, layers}, make_gpipe(1, kMicrobatches), kSteps, options);
    EXPECT_LT(whole.back(), whole.front());
    expect_losses_equal(whole, train(four, make_1f1b(4, kMicrobatches), kSteps, options));
    expect_losses_equal(whole, train(four, make_schedule("zb-h1", 4, kMicrobatches), kSteps, options));
  }
}

// Every tensor of the whole model, trained and frozen, by name, in model order.
std::vector<std::vector<float>> all_tensors(const VlmPipelineEngine& engine) {
  const std::unique_ptr<nn::VlmStage> model = engine.assemble_model();
  std::vector<std::vector<float>> tensors;
  for (const nn::ParameterLayout* layout : {&model->layout(), &model->frozen_layout()}) {
    for (const nn::ParameterInfo& info : layout->entries()) {
      const auto values = std::as_const(*model).parameter(info.name);
      tensors.emplace_back(values.begin(), values.end());
    }
  }
  return tensors;
}

// 2 stages x 2 replicas of 2 micro-batches against 1 stage x 1 replica of 4
// micro-batches: the same global batch of 8 samples (replica d's
// micro-batch j is the step's micro-batch 2d + j), the same loss scale 1/4.
// The gradients differ only in the order they are summed (two replicas'
// sums of two, added by the reduce-scatter, against one sum of four): a few
// float roundoffs (~1e-7) of each gradient, which AdamW's normalised step
// (lr 1e-2) turns into weight differences of ~1e-9 a step. Expected: the
// losses within 1e-5 relative of each other over 4 steps, as the
// pipelined runs. ZeRO-1 on the same layout gives the bits of ZeRO-1 off.
TEST(VlmEngine, TwoStagesTimesTwoReplicasGiveTheLossesOfOneStageOneReplica) {
  const int layers = small_vlm().pipeline_layers();
  const auto whole = train({0, layers}, make_gpipe(1, 2 * 2), kSteps);
  for (const bool zero : {false, true}) {
    SCOPED_TRACE(zero ? "ZeRO-1" : "replicated optimizer");
    EngineOptions options = small_options(2);
    options.shard_optimizer = zero;
    VlmPipelineEngine engine(small_training(), make_1f1b(2, 2), {0, 4, layers}, options);
    engine.init_parameters(11);
    EXPECT_EQ(engine.global_batch(), 8);
    const nn::ShapeCaptions data(4);
    std::vector<double> losses;
    for (int step = 0; step < kSteps; ++step) losses.push_back(engine.step(step, data).loss);
    expect_losses_equal(whole, losses);
  }
}

// A frozen-encoder run stopped after 2 steps, checkpointed and resumed by a
// new engine (initialised from another seed, so that every tensor, the
// frozen ones too, and the AdamW moments and step count must come from the
// file) ends with the uninterrupted run's bits, every tensor, trained and frozen.
TEST(VlmEngine, ACheckpointedRunResumesBitIdentical) {
  const int layers = small_vlm().pipeline_layers();
  const VlmTraining training = small_training({.freeze_vision = true});
  const nn::ShapeCaptions data(4);
  VlmPipelineEngine uninterrupted(training, make_1f1b(2, kMicrobatches), {0, 4, layers}, small_options());
  uninterrupted.init_parameters(11);
  for (int step = 0; step < kSteps; ++step) uninterrupted.step(step, data);

  const std::filesystem::path file = std::filesystem::path(pipeflow::testing::make_temp_dir()) / "checkpoint.safetensors";
  {
    VlmPipelineEngine first(training, make_1f1b(2, kMicrobatches), {0, 4, layers}, small_options());
    first.init_parameters(11);
    for (int step = 0; step < 2; ++step) first.step(step, data);
    first.write_checkpoint(file, 2);
  }
  // A run training another part of the model (the encoder too) has other
  // optimizer state: refused naming the header's key and both parts.
  VlmPipelineEngine other(small_training(), make_1f1b(2, kMicrobatches), {0, 4, layers}, small_options());
  EXPECT_NE(testing::error_of([&] { other.load_checkpoint(nn::SafetensorsFile::read(file)); })
                .find("__metadata__ trained = \"freeze [\"vision.*\"], lora none\": the checkpoint holds the "
                      "optimizer state of what its run trained, and this run trains another part of the model "
                      "(freeze [], lora none); resume with the checkpoint's freeze and lora"),
            std::string::npos);
  VlmPipelineEngine resumed(training, make_1f1b(2, kMicrobatches), {0, 4, layers}, small_options());
  resumed.init_parameters(12);
  ASSERT_EQ(resumed.load_checkpoint(nn::SafetensorsFile::read(file)), 2);
  for (int step = 2; step < kSteps; ++step) resumed.step(step, data);
  EXPECT_EQ(all_tensors(resumed), all_tensors(uninterrupted));
}

// The stage holding the LM's embedding (layer 4 of the 8: vision.layers + 2)
// comes from the cut alone, so that a process holding only the head's stage
// knows its tied partner: by hand, the stage whose range holds layer 4.
TEST(VlmEngine, TheEmbeddingsStageIsTheOneWhoseLayersHoldTheLmEmbedding) {
  using Traits = StageTraits<nn::VlmStage>;
  const VlmTraining training = small_training();
  ASSERT_EQ(training.model.embedding_layer(), 4);
  EXPECT_EQ(Traits::embedding_stage(training, std::vector<int>{0, 8}), StageId(0));
  EXPECT_EQ(Traits::embedding_stage(training, std::vector<int>{0, 5, 8}), StageId(0));
  EXPECT_EQ(Traits::embedding_stage(training, std::vector<int>{0, 4, 8}), StageId(1));
  EXPECT_EQ(Traits::embedding_stage(training, std::vector<int>{0, 2, 3, 5, 8}), StageId(2));
  EXPECT_EQ(StageTraits<nn::Stage>::embedding_stage(nn::ModelConfig{}, std::vector<int>{0, 3, 6}), StageId(0));
}

// A weights file whose header does not say model_type "llava" (a GPT's
// checkpoint, or a hand-made one) is refused naming the file, the key and
// the fix, before any tensor is read.
TEST(VlmEngine, AFileWithoutTheVlmModelTypeIsRefusedNamingTheKey) {
  VlmPipelineEngine engine(small_training(), make_schedule("1f1b", 2, 2), {0, 4, 8}, small_options());
  nn::SafetensorsWriter writer;
  writer.set_metadata("model_type", "gpt2");
  const nn::SafetensorsFile file = nn::SafetensorsFile::parse(writer.serialize(), "gpt.safetensors");
  try {
    engine.load_parameters(file);
    FAIL() << "loaded a file without model_type \"llava\"";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what())
                  .find("gpt.safetensors: __metadata__ model_type = \"gpt2\": not a vision-language model's weights "
                        "(model_type \"llava\")"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace pipeflow::runtime
