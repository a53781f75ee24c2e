#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "pipeflow/core/error.h"
#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/gradient_clipping.h"
#include "pipeflow/nn/model_file.h"
#include "test_support.h"

namespace pipeflow::nn {
namespace {

using testing::error_of;

const ModelConfig kConfig{.vocab_size = 32, .context = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};

double train_step(Stage& stage, AdamW& optimizer, std::uint64_t seed) {
  stage.zero_gradients();
  MicrobatchState state;
  stage.forward(state,
                {.tokens = testing::random_tokens(2, 8, 32, seed), .targets = testing::random_tokens(2, 8, 32, seed + 1)});
  stage.backward_from_loss(state, 1.0);
  optimizer.step(optimizer.options().lr);
  return state.loss();
}

// Each run builds its own stage and optimizer; only the seed is shared. A
// different seed must change both, or the comparison could not fail.
TEST(AdamW, SameSeedGivesBitIdenticalLossesAndWeights) {
  auto run = [](std::uint64_t seed) {
    Stage stage(kConfig, all_layers(kConfig));
    stage.init_parameters(seed);
    AdamW optimizer(stage, {.lr = 1e-2});
    std::vector<double> losses;
    for (int step = 0; step < 4; ++step) losses.push_back(train_step(stage, optimizer, 100 + 2 * step));
    return std::pair(losses, std::vector<float>(stage.parameters().begin(), stage.parameters().end()));
  };
  const auto [losses, weights] = run(9);
  const auto [losses_again, weights_again] = run(9);
  EXPECT_EQ(losses, losses_again);
  EXPECT_EQ(weights, weights_again);
  const auto [other_losses, other_weights] = run(10);
  EXPECT_NE(losses, other_losses);
  EXPECT_NE(weights, other_weights);
}

TEST(AdamW, DecaysTwoDimensionalWeightsOnlyAndStepsBySignAtFirst) {
  Stage stage(kConfig, all_layers(kConfig));
  stage.init_parameters(1);
  const AdamWOptions options{.lr = 0.01, .weight_decay = 0.1};
  AdamW optimizer(stage, options);
  const float weight = stage.parameter("h.0.mlp.c_fc.weight")[3];
  stage.gradient("h.0.ln_1.bias")[2] = 0.5f;
  optimizer.step(options.lr);
  // Zero gradient: only the decoupled decay moves a weight, exactly ×(1 − lr·wd).
  EXPECT_EQ(stage.parameter("h.0.mlp.c_fc.weight")[3], weight * static_cast<float>(1 - 0.01 * 0.1));
  // A bias does not decay; its first step is lr · g/(|g| + ε) after bias correction.
  EXPECT_NEAR(stage.parameter("h.0.ln_1.bias")[2], -0.01, 1e-9);
  EXPECT_EQ(stage.parameter("h.0.ln_1.bias")[3], 0.0f);
  EXPECT_EQ(stage.parameter("h.0.ln_1.weight")[3], 1.0f);
  EXPECT_EQ(optimizer.steps(), 1);
}

TEST(AdamW, TrainingResumedFromSavedStateIsBitIdentical) {
  Stage straight(kConfig, all_layers(kConfig));
  straight.init_parameters(5);
  AdamW straight_optimizer(straight, {.lr = 3e-3});
  for (int step = 0; step < 2; ++step) train_step(straight, straight_optimizer, 10 + step);
  SafetensorsWriter writer;
  add_parameters(writer, straight);
  straight_optimizer.add_state(writer);
  const SafetensorsFile saved = SafetensorsFile::parse(writer.serialize(), "checkpoint");
  EXPECT_EQ(saved.metadata("adamw_step"), "2");

  Stage resumed(kConfig, all_layers(kConfig));
  load_parameters(resumed, saved);
  AdamW resumed_optimizer(resumed, {.lr = 3e-3});
  resumed_optimizer.load_state(saved);
  train_step(straight, straight_optimizer, 12);
  train_step(resumed, resumed_optimizer, 12);
  EXPECT_EQ(std::memcmp(straight.parameters().data(), resumed.parameters().data(), straight.parameters().size_bytes()),
            0);
  EXPECT_EQ(resumed_optimizer.steps(), 3);
}

// ZeRO stage 1 (docs/RUNTIME.md): three data-parallel replicas with the
// same gradients, each optimizer owning a third of the elements and updating
// only those; the shards put together (the all-gather) are the unsharded
// update bit for bit, each optimizer keeps 8 bytes of moments per element of
// its shard only, and a whole optimizer's saved moments load into a shard.
TEST(AdamW, ShardsOfThreeReplicasPutTogetherAreTheWholeUpdate) {
  constexpr int kReplicas = 3;
  Stage whole(kConfig, all_layers(kConfig));
  whole.init_parameters(8);
  AdamW whole_optimizer(whole, {.lr = 3e-3, .weight_decay = 0.1});
  const std::int64_t total = whole.layout().total();
  std::vector<std::unique_ptr<Stage>> replicas;
  std::vector<std::unique_ptr<AdamW>> optimizers;
  std::int64_t covered = 0;
  for (int k = 0; k < kReplicas; ++k) {
    replicas.push_back(std::make_unique<Stage>(kConfig, all_layers(kConfig)));
    replicas.back()->init_parameters(8);
    const OptimizerShard shard = OptimizerShard::of(total, kReplicas, k);
    EXPECT_EQ(shard.begin, covered);
    covered = shard.end;
    const std::int64_t before = replicas.back()->weight_memory().live_bytes();
    optimizers.push_back(std::make_unique<AdamW>(*replicas.back(), AdamWOptions{.lr = 3e-3, .weight_decay = 0.1},
                                                 shard));
    EXPECT_EQ(replicas.back()->weight_memory().live_bytes() - before, 8 * shard.size());
  }
  EXPECT_EQ(covered, total);
  for (int step = 0; step < 3; ++step) {
    train_step(whole, whole_optimizer, 40 + step);  // its gradients serve every replica
    std::vector<float> gathered(static_cast<std::size_t>(total));
    for (int k = 0; k < kReplicas; ++k) {
      Stage& replica = *replicas[static_cast<std::size_t>(k)];
      std::copy(whole.gradients().begin(), whole.gradients().end(), replica.gradients().begin());
      AdamW& optimizer = *optimizers[static_cast<std::size_t>(k)];
      optimizer.step(3e-3);
      const OptimizerShard shard = optimizer.shard();
      std::copy(replica.parameters().begin() + shard.begin, replica.parameters().begin() + shard.end,
                gathered.begin() + shard.begin);
    }
    EXPECT_EQ(std::memcmp(gathered.data(), whole.parameters().data(), whole.parameters().size_bytes()), 0)
        << "step " << step;
    for (auto& replica : replicas) std::copy(gathered.begin(), gathered.end(), replica->parameters().begin());
  }
  SafetensorsWriter writer;
  whole_optimizer.add_state(writer);
  const SafetensorsFile saved = SafetensorsFile::parse(writer.serialize(), "moments");
  AdamW loaded(*replicas[1], {.lr = 3e-3}, OptimizerShard::of(total, kReplicas, 1));
  loaded.load_state(saved);
  EXPECT_EQ(loaded.steps(), 3);
  EXPECT_TRUE(std::equal(loaded.exp_avg_sq().begin(), loaded.exp_avg_sq().end(),
                         optimizers[1]->exp_avg_sq().begin()));
  EXPECT_NE(error_of([&] { optimizers[1]->add_state(writer); }).find("gather the shards to save them"),
            std::string::npos);
}

// What the runtime does (docs/NN.md): two stages, two micro-batches with
// their weight passes deferred, the tied-gradient sum, global clipping and
// AdamW, against the whole model accumulating the same micro-batches.
TEST(AdamW, APipelinedStepMatchesTheWholeModelsStep) {
  Stage whole(kConfig, all_layers(kConfig));
  whole.init_parameters(21);
  Stage first(kConfig, {0, 2}, {.name = "stage 0"});
  Stage last(kConfig, {2, 4}, {.name = "stage 1"});
  first.copy_parameters_from(whole);
  last.copy_parameters_from(whole);
  const AdamWOptions options{.lr = 1e-2, .weight_decay = 0.1};
  AdamW whole_optimizer(whole, options), first_optimizer(first, options), last_optimizer(last, options);
  const double max_norm = 0.5;
  auto tokens = [](int mb) { return testing::random_tokens(2, 8, 32, 50 + mb); };
  auto targets = [](int mb) { return testing::random_tokens(2, 8, 32, 60 + mb); };

  for (int mb = 0; mb < 2; ++mb) {
    MicrobatchState state;
    whole.forward(state, {.tokens = tokens(mb), .targets = targets(mb)});
    whole.backward_from_loss(state, 0.5);
  }
  const double whole_coefficient = clip_coefficient(std::sqrt(whole.gradient_square_sum()), max_norm);
  ASSERT_LT(whole_coefficient, 1.0);
  whole.scale_gradients(whole_coefficient);
  whole_optimizer.step(options.lr);

  MicrobatchState s0[2], s1[2];
  for (int mb = 0; mb < 2; ++mb) {
    Tensor activation = first.forward(s0[mb], {.tokens = tokens(mb)});
    last.forward(s1[mb], {.activation = std::move(activation), .targets = targets(mb)});
  }
  for (int mb = 0; mb < 2; ++mb) first.backward_input(s0[mb], last.backward_input_from_loss(s1[mb], 0.5));
  for (int mb = 0; mb < 2; ++mb) {
    last.backward_weight(s1[mb]);
    first.backward_weight(s0[mb]);
  }
  const std::vector<float> a(first.tied_gradient().begin(), first.tied_gradient().end());
  const std::vector<float> b(last.tied_gradient().begin(), last.tied_gradient().end());
  first.add_tied_gradient(b);
  last.add_tied_gradient(a);
  const double squares = first.gradient_square_sum() + last.gradient_square_sum();
  const double coefficient = clip_coefficient(std::sqrt(squares), max_norm);
  EXPECT_NEAR(coefficient, whole_coefficient, 1e-6 * whole_coefficient);
  first.scale_gradients(coefficient);
  last.scale_gradients(coefficient);
  first_optimizer.step(options.lr);
  last_optimizer.step(options.lr);

  for (const Stage* stage : {&first, &last}) {
    for (const ParameterInfo& info : stage->layout().entries()) {
      const auto mine = stage->parameter(info.name);
      const auto expected = whole.parameter(info.name);
      for (std::size_t i = 0; i < mine.size(); ++i) {
        ASSERT_NEAR(mine[i], expected[i], 1e-6) << info.name << "[" << i << "]";
      }
    }
  }
  EXPECT_EQ(std::memcmp(first.parameter("wte.weight").data(), last.parameter("wte.weight").data(),
                        first.parameter("wte.weight").size_bytes()),
            0)
      << "the two copies of the tied wte stay identical";
}

// DeepSpeed's Adam with adam_w_mode false is torch.optim.Adam: the decay is
// an L2 term in the gradient, not a shrinking of the weight. With a zero
// gradient the first step is then lr · sign(w) (Adam's first step is
// lr · g/|g|), where AdamW would move w by exactly w · lr · wd.
TEST(AdamW, AdamWModeFalseIsAdamWithL2) {
  Stage stage(kConfig, all_layers(kConfig));
  stage.init_parameters(1);
  const AdamWOptions options{.decoupled_decay = false, .lr = 0.01, .weight_decay = 0.1};
  AdamW optimizer(stage, options);
  const float weight = stage.parameter("h.0.mlp.c_fc.weight")[3];
  ASSERT_NE(weight, 0.0f);
  optimizer.step(options.lr);
  EXPECT_NEAR(stage.parameter("h.0.mlp.c_fc.weight")[3], weight - 0.01f * (weight > 0 ? 1.0f : -1.0f), 1e-6);
  EXPECT_EQ(stage.parameter("h.0.ln_1.weight")[3], 1.0f);  // no decay, no gradient: unmoved
}

TEST(GradientClipping, ScalesToTheMaximumNormOnlyWhenAbove) {
  EXPECT_DOUBLE_EQ(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(100.0, 0.0), 1.0);
}

}  // namespace
}  // namespace pipeflow::nn
