#include "pipeflow/nn/stage.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "pipeflow/core/error.h"
#include "test_support.h"

namespace pipeflow::nn {
namespace {

using testing::error_of;

using testing::random_activation;
using testing::random_tokens;

const ModelConfig kConfig{.vocab_size = 32, .context = 16, .n_layer = 3, .n_head = 2, .n_embd = 16};
// The same vocabulary and context as a Llama: 4 query heads on 2 key/value
// heads, rotary positions (the stage lends I's stashed operands at offsets
// into its saved tensors), an untied head.
const ModelConfig kLlama{.family = Family::kLlama,
                         .vocab_size = 32,
                         .context = 16,
                         .n_layer = 3,
                         .n_head = 4,
                         .n_embd = 16,
                         .n_kv_head = 2,
                         .intermediate = 24};
constexpr int kB = 2;
constexpr int kT = 12;

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

StageInput tokens_and_targets(std::uint64_t seed) {
  return {.tokens = random_tokens(kB, kT, kConfig.vocab_size, seed),
          .targets = random_tokens(kB, kT, kConfig.vocab_size, seed + 1)};
}

std::unique_ptr<Stage> whole_model(StageOptions options = {}, const ModelConfig& config = kConfig) {
  auto stage = std::make_unique<Stage>(config, all_layers(config), options);
  stage->init_parameters(42);
  return stage;
}

TEST(Stage, SameSeedGivesBitIdenticalWeightsWhateverTheCut) {
  const auto a = whole_model();
  const auto b = whole_model();
  EXPECT_TRUE(same_bits(a->parameters(), b->parameters()));
  Stage middle(kConfig, {2, 4});
  middle.init_parameters(42);
  for (const ParameterInfo& info : middle.layout().entries()) {
    EXPECT_TRUE(same_bits(middle.parameter(info.name), a->parameter(info.name))) << info.name;
  }
  Stage other_seed(kConfig, all_layers(kConfig));
  other_seed.init_parameters(43);
  EXPECT_FALSE(same_bits(other_seed.parameters(), a->parameters()));
}

TEST(Stage, InitialisationFollowsGpt2) {
  const ModelConfig config{.vocab_size = 256, .context = 64, .n_layer = 8, .n_head = 4, .n_embd = 64};
  Stage stage(config, all_layers(config));
  stage.init_parameters(1);
  auto std_of = [&](const char* name) {
    double sum = 0;
    double squares = 0;
    const auto values = stage.parameter(name);
    for (const float v : values) {
      sum += v;
      squares += static_cast<double>(v) * v;
    }
    const double n = static_cast<double>(values.size());
    return std::sqrt(squares / n - (sum / n) * (sum / n));
  };
  EXPECT_NEAR(std_of("wte.weight"), 0.02, 0.0005);
  EXPECT_NEAR(std_of("h.3.mlp.c_fc.weight"), 0.02, 0.0005);
  EXPECT_NEAR(std_of("h.3.mlp.c_proj.weight"), 0.02 / std::sqrt(16.0), 0.0002);
  EXPECT_EQ(stage.parameter("h.0.ln_2.weight")[5], 1.0f);
  EXPECT_EQ(stage.parameter("h.0.attn.c_attn.bias")[5], 0.0f);
}

void expect_input_then_weight_equals_full_backward(ComputeFormat format, const ModelConfig& config,
                                                   int recompute_interval = 0) {
  const StageOptions options{.recompute_interval = recompute_interval, .format = format};
  const auto split = whole_model(options, config);
  const auto full = whole_model(options, config);
  MicrobatchState first, second;
  split->forward(first, tokens_and_targets(1));
  split->forward(second, tokens_and_targets(3));
  split->backward_input_from_loss(first, 0.5);
  split->backward_input_from_loss(second, 0.5);
  EXPECT_EQ(first.phase(), MicrobatchState::Phase::kInputGrad);
  for (const float g : split->gradients()) ASSERT_EQ(g, 0.0f) << "I must not touch weight gradients";
  split->backward_weight(first);
  split->backward_weight(second);

  MicrobatchState state;
  full->forward(state, tokens_and_targets(1));
  full->backward_from_loss(state, 0.5);
  full->forward(state, tokens_and_targets(3));
  full->backward_from_loss(state, 0.5);
  EXPECT_TRUE(same_bits(split->gradients(), full->gradients()));
}

// The zero-bubble contract: I for two micro-batches, then W for both, gives
// exactly (bit for bit) what B does micro-batch after micro-batch; in bf16
// and fp16 too, where I stashes what W reads in 16 bits and B rounds it in
// place. GPT-2 and Llama (whose W reads lent operands at offsets into its
// saved tensors), with and without recompute (whose I reads the segment's
// tensors recomputed in floats, not stashed); the sequence-parallel stages
// are checked in tests/runtime/tensor_parallel_test.cc (they need a tensor
// group).
TEST(Stage, InputThenWeightPassesEqualTheFullBackwardBitForBit) {
  for (const ModelConfig* config : {&kConfig, &kLlama}) {
    for (const ComputeFormat format : {ComputeFormat::kFp32, ComputeFormat::kBf16, ComputeFormat::kFp16}) {
      for (const int recompute_interval : {0, 1, 2}) {
        SCOPED_TRACE(fmt::format("{} {}, recompute interval {}", to_string(config->family), to_string(format),
                                 recompute_interval));
        expect_input_then_weight_equals_full_backward(format, *config, recompute_interval);
      }
    }
  }
}

TEST(Stage, WeightPassesInAnotherOrderAgreeToRounding) {
  const auto a = whole_model();
  const auto b = whole_model();
  std::vector<MicrobatchState> states(3);
  for (auto* stage : {a.get(), b.get()}) {
    for (int i = 0; i < 3; ++i) {
      stage->forward(states[i], tokens_and_targets(10 + 2 * i));
      stage->backward_input_from_loss(states[i], 1.0 / 3);
    }
    if (stage == a.get()) {
      for (int i = 0; i < 3; ++i) stage->backward_weight(states[i]);
    } else {
      for (int i = 2; i >= 0; --i) stage->backward_weight(states[i]);
    }
  }
  const auto ga = a->gradients();
  const auto gb = b->gradients();
  for (std::size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-6 + 1e-5 * std::abs(ga[i])) << i;
}

TEST(Stage, SplitPipelineComputesWhatTheWholeModelComputes) {
  const auto full = whole_model();
  Stage front(kConfig, {0, 2}, {.name = "stage 0"});
  Stage back(kConfig, {2, 5}, {.name = "stage 1"});
  front.copy_parameters_from(*full);
  back.copy_parameters_from(*full);

  MicrobatchState whole, s0, s1;
  full->forward(whole, tokens_and_targets(5));
  full->backward_from_loss(whole, 1.0);
  StageInput input = tokens_and_targets(5);
  Tensor activation = front.forward(s0, {.tokens = std::move(input.tokens)});
  EXPECT_EQ(front.activation_memory().live_bytes() > 0, true);
  back.forward(s1, {.activation = std::move(activation), .targets = std::move(input.targets)});
  EXPECT_EQ(s1.loss(), whole.loss());
  Tensor grad = back.backward_from_loss(s1, 1.0);
  EXPECT_TRUE(front.backward(s0, std::move(grad)).empty());

  for (const Stage* stage : {&front, &back}) {
    for (const ParameterInfo& info : stage->layout().entries()) {
      if (info.name == "wte.weight") continue;
      EXPECT_TRUE(same_bits(stage->gradient(info.name), full->gradient(info.name))) << info.name;
    }
  }
  // Tied wte: each side holds a part; their sum is the whole model's gradient.
  ASSERT_TRUE(front.needs_tied_reduction() && back.needs_tied_reduction() && !full->needs_tied_reduction());
  const std::vector<float> front_copy(front.tied_gradient().begin(), front.tied_gradient().end());
  front.add_tied_gradient(back.tied_gradient());
  back.add_tied_gradient(front_copy);
  EXPECT_TRUE(same_bits(front.tied_gradient(), back.tied_gradient()));
  const auto expected = full->tied_gradient();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(front.tied_gradient()[i], expected[i], 1e-7 + 1e-5 * std::abs(expected[i])) << i;
  }
  // The norm counts wte once: on the embedding's side.
  EXPECT_NEAR(front.gradient_square_sum() + back.gradient_square_sum(), full->gradient_square_sum(),
              1e-5 * full->gradient_square_sum());
}

TEST(Stage, RecomputeGivesBitIdenticalGradientsAndHoldsLess) {
  for (const int interval : {1, 2, 4}) {
    const auto plain = whole_model();
    const auto recompute = whole_model({.recompute_interval = interval});
    MicrobatchState a, b;
    plain->forward(a, tokens_and_targets(7));
    recompute->forward(b, tokens_and_targets(7));
    EXPECT_LT(recompute->activation_memory().live_bytes(), plain->activation_memory().live_bytes()) << interval;
    EXPECT_EQ(a.loss(), b.loss());
    plain->backward_from_loss(a, 1.0);
    recompute->backward_from_loss(b, 1.0);
    EXPECT_TRUE(same_bits(plain->gradients(), recompute->gradients())) << "interval " << interval;
    EXPECT_EQ(recompute->activation_memory().live_bytes(), 0);
  }
}

// Bytes a block keeps per micro-batch, from the list in transformer_block.h.
std::int64_t block_forward_bytes(std::int64_t n, std::int64_t c, std::int64_t nh, std::int64_t t) {
  return 4 * (16 * n * c + 4 * n + (n / t) * nh * t * t);
}

TEST(Stage, ForwardHoldsExactlyTheSavedActivationsAndBackwardFreesThem) {
  Stage block(kConfig, {1, 2});
  block.init_parameters(1);
  const std::int64_t n = kB * kT, c = kConfig.n_embd;
  MicrobatchState state;
  Tensor out = block.forward(state, {.activation = random_activation(kB, kT, kConfig.n_embd, 2)});
  EXPECT_EQ(block.activation_memory().live_bytes(), block_forward_bytes(n, c, kConfig.n_head, kT) + 4 * n * c);
  out.reset();
  Tensor dx = block.backward_input(state, random_activation(kB, kT, kConfig.n_embd, 3));
  EXPECT_EQ(block.activation_memory().live_bytes(), 4 * (20 * n * c + 4 * n) + 4 * n * c);
  block.backward_weight(state);
  EXPECT_EQ(block.activation_memory().live_bytes(), 4 * n * c);
  dx.reset();
  EXPECT_EQ(block.activation_memory().live_bytes(), 0);

  Stage head(kConfig, {4, 5});
  StageInput input = tokens_and_targets(4);
  head.forward(state, {.activation = random_activation(kB, kT, kConfig.n_embd, 4), .targets = std::move(input.targets)});
  // targets (int32), x, ln_f, mean, rstd, probs [B, T, V].
  EXPECT_EQ(head.activation_memory().live_bytes(), 4 * (n + 2 * n * c + 2 * n + n * kConfig.vocab_size));
  Tensor head_dx = head.backward_input_from_loss(state, 1.0);
  // W needs x, ln_f, mean, rstd, ∂L/∂logits (in probs' place) and d_ln_f;
  // dx is returned.
  EXPECT_EQ(head.activation_memory().live_bytes(), 4 * (3 * n * c + 2 * n + n * kConfig.vocab_size) + 4 * n * c);
  head.backward_weight(state);
  head_dx.reset();
  EXPECT_EQ(head.activation_memory().live_bytes(), 0);
}

TEST(Stage, CheckpointedStageHoldsOnlyTheSegmentInputs) {
  Stage blocks(kConfig, {1, 4}, {.recompute_interval = 2});
  blocks.init_parameters(1);
  MicrobatchState state;
  const Tensor out = blocks.forward(state, {.activation = random_activation(kB, kT, kConfig.n_embd, 2)});
  // Segments {block.0, block.1} and {block.2}: two inputs, plus the output.
  EXPECT_EQ(blocks.activation_memory().live_bytes(), 3 * 4 * kB * kT * kConfig.n_embd);
}

TEST(Stage, ASteadyStateStepAllocatesNothing) {
  const auto stage = whole_model();
  auto step = [&] {
    MicrobatchState state;
    stage->forward(state, tokens_and_targets(9));
    stage->backward_from_loss(state, 1.0);
  };
  step();
  const std::int64_t after_first = stage->buffer_pool().system_allocations();
  step();
  step();
  EXPECT_EQ(stage->buffer_pool().system_allocations(), after_first);
  EXPECT_GT(stage->activation_memory().peak_bytes(), 0);
}

TEST(Stage, LogitsMatchTheLossOfTheTrainingPath) {
  const auto stage = whole_model();
  StageInput input = tokens_and_targets(11);
  const IntTensor tokens = input.tokens.clone();
  const IntTensor targets = input.targets.clone();
  MicrobatchState state;
  stage->forward(state, std::move(input));
  const Tensor logits = stage->logits(tokens);
  ASSERT_EQ(logits.shape(), Shape({kB, kT, kConfig.vocab_size}));
  double total = 0;
  for (int row = 0; row < kB * kT; ++row) {
    const float* l = logits.data() + row * kConfig.vocab_size;
    double top = l[0];
    for (int j = 1; j < kConfig.vocab_size; ++j) top = std::max(top, static_cast<double>(l[j]));
    double sum = 0;
    for (int j = 0; j < kConfig.vocab_size; ++j) sum += std::exp(l[j] - top);
    total += std::log(sum) + top - l[targets[row]];
  }
  EXPECT_NEAR(state.loss(), total / (kB * kT), 1e-6);
}

// Pipeline workers: different stages on different threads at once must each
// compute exactly what they compute alone.
TEST(Stage, StagesOnTwoThreadsComputeExactlyWhatTheyComputeAlone) {
  auto run = [](Stage& stage, std::uint64_t seed) {
    for (int i = 0; i < 4; ++i) {
      MicrobatchState state;
      stage.forward(state, tokens_and_targets(seed + i));
      stage.backward_from_loss(state, 0.25);
    }
  };
  const auto alone_a = whole_model();
  const auto alone_b = whole_model();
  run(*alone_a, 100);
  run(*alone_b, 200);
  const auto together_a = whole_model();
  const auto together_b = whole_model();
  std::thread first([&] { run(*together_a, 100); });
  std::thread second([&] { run(*together_b, 200); });
  first.join();
  second.join();
  EXPECT_TRUE(same_bits(together_a->gradients(), alone_a->gradients()));
  EXPECT_TRUE(same_bits(together_b->gradients(), alone_b->gradients()));
}

TEST(Stage, WrongInputsAndOrderAreErrorsThatSayWhatToDo) {
  Stage first(kConfig, {0, 2}, {.name = "stage 0"});
  Stage last(kConfig, {2, 5}, {.name = "stage 1"});
  MicrobatchState state;
  IntTensor bad = random_tokens(kB, kT, kConfig.vocab_size, 1);
  bad[13] = 32;
  EXPECT_EQ(error_of([&] { first.forward(state, {.tokens = std::move(bad)}); }),
            "stage 0 (embedding..block.0): tokens [1, 1] = 32 is outside the vocabulary [0, 32)");
  EXPECT_EQ(error_of([&] { first.forward(state, {.tokens = random_tokens(1, 17, 32, 1)}); }),
            "stage 0 (embedding..block.0): sequence length 17 exceeds the model's context of 16");
  const ModelConfig long_context{.vocab_size = 32, .context = 65536, .n_layer = 1, .n_head = 4, .n_embd = 16};
  Stage whole(long_context, all_layers(long_context), {.name = "model"});
  EXPECT_EQ(error_of([&] { whole.forward(state, {.tokens = random_tokens(1, 65536, 32, 1)}); }),
            "model (embedding..head): a micro-batch of 1 x 65536 tokens makes the attention scores [B, NH, T, T] "
            "17179869184 elements, over the 2^31 - 1 that the kernels and BLAS index: lower "
            "train_micro_batch_size_per_gpu or the sequence length");
  EXPECT_EQ(error_of([&] { last.forward(state, {.activation = random_activation(kB, kT, 8, 1)}); }),
            "stage 1 (block.1..head): needs an activation [B, T, 16] from the previous stage, got [2, 12, 8]");
  EXPECT_EQ(error_of([&] { last.backward_input_from_loss(state, 1.0); }),
            "stage 1 (block.1..head): backward_input_from_loss needs a completed forward for this micro-batch");
  first.forward(state, {.tokens = random_tokens(kB, kT, kConfig.vocab_size, 1)});
  EXPECT_EQ(error_of([&] { first.forward(state, {.tokens = random_tokens(kB, kT, kConfig.vocab_size, 1)}); }),
            "stage 0 (embedding..block.0): forward needs a fresh (or fully backpropagated) state for this "
            "micro-batch");
  EXPECT_EQ(error_of([&] { first.backward_weight(state); }),
            "stage 0 (embedding..block.0): backward_weight needs a completed backward_input for this micro-batch");
  EXPECT_EQ(error_of([&] { first.backward_input_from_loss(state, 1.0); }),
            "stage 0 (embedding..block.0): does not hold the head: its backward takes the next stage's gradient");
}

TEST(ModelConfig, ShapesOutsideTheirRangeNameTheFieldAndTheBound) {
  auto error = [](ModelConfig config) { return error_of([&] { config.validate(); }); };
  EXPECT_EQ(error({.n_layer = 0}), "model n_layer = 0: must be positive");
  EXPECT_EQ(error({.n_embd = 2000000000}), "model n_embd = 2000000000: must be at most 65536");
  EXPECT_EQ(error({.n_layer = 100000}), "model n_layer = 100000: must be at most 4096");
  EXPECT_EQ(error({.n_head = 8, .n_embd = 36}),
            "model n_embd = 36 is not a multiple of n_head = 8: every head needs n_embd / n_head features");
  // The largest accepted shape counts its parameters without overflow.
  const ModelConfig largest{.vocab_size = ModelConfig::kMaxVocab, .context = ModelConfig::kMaxContext,
                          .n_layer = ModelConfig::kMaxLayers, .n_head = 1, .n_embd = ModelConfig::kMaxWidth};
  EXPECT_EQ(error(largest), "(no error)");
  EXPECT_EQ(largest.parameter_count(), 212277953429504);  // V·C + T·C + L·(12C² + 13C) + 2C
}

}  // namespace
}  // namespace pipeflow::nn
