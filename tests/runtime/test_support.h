#pragma once

// A tiny model, a small corpus and the unpipelined reference for the runtime tests.

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>

#include "pipeflow/core/error.h"
#include "pipeflow/model/partition.h"
#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/byte_dataset.h"
#include "pipeflow/nn/gradient_clipping.h"
#include "pipeflow/nn/stage.h"
#include "pipeflow/core/file.h"
#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/trainer.h"
#include "../nn/test_support.h"
#include "../sanitized.h"

namespace pipeflow::runtime::testing {

using pipeflow::testing::kSanitized;

// 6 blocks (8 pipeline layers: enough for 4 ranks × 2 chunks), width 32, 2
// heads, context 16; micro-batches of 2.
inline const nn::ModelConfig kTiny{.vocab_size = 256, .context = 16, .n_layer = 6, .n_head = 2, .n_embd = 32};
inline constexpr int kMicroBatch = 2;

// The same depth and width as a Llama: 4 query heads on 2 key/value heads,
// an MLP of 48, rotary positions, the LM head tied to the embedding (so the
// tied-gradient reduction runs across stages as for GPT-2).
inline const nn::ModelConfig kTinyLlama{.family = nn::Family::kLlama,
                                        .vocab_size = 256,
                                        .context = 16,
                                        .n_layer = 6,
                                        .n_head = 4,
                                        .n_embd = 32,
                                        .n_kv_head = 2,
                                        .intermediate = 48,
                                        .tied_embeddings = true};

// A few kilobytes of varied text, the same on every run.
inline std::string corpus() {
  std::string text;
  for (int i = 0; i < 120; ++i) {
    text += "line " + std::to_string(i * 7919 % 1000) + ": the quick brown fox jumps over the lazy dog";
    text += i % 3 == 0 ? "; pack my box with five dozen liquor jugs.\n" : ".\n";
  }
  return text;
}

inline const nn::ByteDataset& tiny_dataset() {
  static const nn::ByteDataset dataset(corpus(), "test corpus", {.seq_length = kTiny.context, .seed = 3});
  return dataset;
}

inline EngineOptions tiny_options(int recompute_interval = 0) {
  EngineOptions options;
  options.micro_batch = kMicroBatch;
  options.seq_length = kTiny.context;
  options.recompute_interval = recompute_interval;
  options.timeout = std::chrono::seconds(20);
  // eps = 1e-4, not AdamW's usual 1e-8: AdamW divides each gradient element
  // by its own magnitude (+ eps), so an element whose exact gradient is zero
  // (the attention key bias, which softmax ignores) or nearly so takes a
  // full-size step driven by its rounding noise -- and that noise depends on
  // the order a schedule accumulates micro-batches in (looped BFS runs them
  // in reverse). With eps above that noise the weights inherit the
  // gradients' agreement. Measured on the sweep: gradients within 6e-7 of
  // the unpipelined run, weights after 3 steps within 9e-7; with eps = 1e-8
  // zero-initialised biases differ by up to 1.3e-4 of their norm.
  options.optimizer = {.lr = 1e-2, .eps = 1e-4, .weight_decay = 0.1};
  options.lr_schedule = nn::LrSchedule::constant(1e-2);
  options.gradient_clipping = 0.5;  // small enough to clip, so clipping is exercised
  return options;
}

// The engine of a layout, its stages cut uniformly, initialised with `seed`.
inline std::unique_ptr<PipelineEngine> tiny_engine(const Schedule& schedule, int recompute_interval = 0,
                                                   std::uint64_t seed = 11, const nn::ModelConfig& model = kTiny) {
  auto engine = std::make_unique<PipelineEngine>(
      model, schedule, partition_uniform(model.pipeline_layers(), schedule.num_stages()),
      tiny_options(recompute_interval));
  engine->init_parameters(seed);
  return engine;
}

// A training run of kTiny on 2 ranks (1F1B, 4 micro-batches) over corpus(),
// written into `dir` (corpus.txt, out/): 12 steps, validated every 5.
inline TrainSettings tiny_settings(const std::filesystem::path& dir) {
  write_file_atomic(dir / "corpus.txt", corpus());
  TrainSettings s;
  s.model = kTiny;
  s.schedule = make_schedule("1f1b", 2, 4);
  s.partition = parse_partition_method("uniform");
  s.hardware = hardware_preset("cpu");
  s.engine = tiny_options();
  s.engine.optimizer = {.lr = 3e-3};
  s.engine.lr_schedule = nn::LrSchedule::constant(3e-3);
  s.data = {dir / "corpus.txt"};
  s.steps = 12;
  s.eval_interval = 5;
  s.out_dir = dir / "out";
  s.checkpoint_dir = s.out_dir / "checkpoints";
  s.sample_tokens = 40;
  return s;
}

// The unpipelined run: the whole model as one stage; each step one forward
// and backward of the whole global batch, then the same clipping and AdamW.
class Reference {
 public:
  explicit Reference(int global_batch, std::uint64_t seed = 11, const nn::ModelConfig& model = kTiny)
      : model_(model, nn::all_layers(model)), optimizer_(model_, tiny_options().optimizer), batch_(global_batch) {
    model_.init_parameters(seed);
  }

  // One step's loss; gradients stay readable until the next step.
  double step(std::int64_t step, bool update) {
    model_.zero_gradients();
    nn::Batch batch = tiny_dataset().batch(nn::Split::kTrain, step, 0, batch_);
    nn::MicrobatchState state;
    model_.forward(state, {.tokens = std::move(batch.inputs), .targets = std::move(batch.targets)});
    const double loss = state.loss();
    model_.backward_from_loss(state, 1.0);
    if (update) {
      const EngineOptions options = tiny_options();
      const double clip = nn::clip_coefficient(std::sqrt(model_.gradient_square_sum()), options.gradient_clipping);
      if (clip < 1) model_.scale_gradients(clip);
      optimizer_.step(options.lr_schedule.lr(step));
    }
    return loss;
  }
  nn::Stage& model() { return model_; }

 private:
  nn::Stage model_;
  nn::AdamW optimizer_;
  int batch_;
};

using nn::testing::relative_error;
using nn::testing::error_of;

}  // namespace pipeflow::runtime::testing
