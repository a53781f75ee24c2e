#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "pipeflow/nn/sampling.h"
#include "pipeflow/nn/stage.h"
#include "test_support.h"

namespace pipeflow::nn {
namespace {

using testing::error_of;
using testing::max_relative_error;
using testing::random_tokens;

const ModelConfig kModel{.vocab_size = 256, .context = 24, .n_layer = 3, .n_head = 4, .n_embd = 32};

std::unique_ptr<Stage> whole_model() {
  auto model = std::make_unique<Stage>(kModel, all_layers(kModel));
  model->init_parameters(5);
  return model;
}

// The logits of the last position of `prefix`, recomputed without a cache.
std::vector<float> full_logits(Stage& model, const std::vector<std::int32_t>& prefix) {
  IntTensor tokens{Shape{1, static_cast<std::int64_t>(prefix.size())}};
  std::copy(prefix.begin(), prefix.end(), tokens.data());
  const Tensor logits = model.logits(tokens);
  const auto last = logits.span().subspan((prefix.size() - 1) * kModel.vocab_size, kModel.vocab_size);
  return {last.begin(), last.end()};
}

IntTensor row_of(const std::vector<std::int32_t>& tokens) {
  IntTensor out{Shape{1, static_cast<std::int64_t>(tokens.size())}};
  std::copy(tokens.begin(), tokens.end(), out.data());
  return out;
}

TEST(KvCache, CachedDecodeMatchesFullRecomputationAtEveryStep) {
  auto model = whole_model();
  // Two sequences with prompts of 5 and 2 tokens in one batch, then one
  // token each per step, fed from a fixed stream.
  std::vector<std::vector<std::int32_t>> sequences = {{10, 20, 30, 40, 50}, {7, 8}};
  KvCache cache = model->make_kv_cache(2);
  Tensor logits = model->forward_cached(cache, {0, {5, 2}}, {.tokens = row_of({10, 20, 30, 40, 50, 7, 8})});
  ASSERT_EQ(logits.shape(), (Shape{2, kModel.vocab_size}));
  const IntTensor stream = random_tokens(1, 40, kModel.vocab_size, 9);
  for (int step = 0; step < 15; ++step) {
    for (int s = 0; s < 2; ++s) {
      const auto expected = full_logits(*model, sequences[static_cast<std::size_t>(s)]);
      const auto got = logits.span().subspan(static_cast<std::size_t>(s) * kModel.vocab_size, kModel.vocab_size);
      EXPECT_LT(max_relative_error(got, expected), 1e-5) << "sequence " << s << " step " << step;
      sequences[static_cast<std::size_t>(s)].push_back(stream[2 * step + s]);
    }
    EXPECT_EQ(cache.length(0), static_cast<int>(sequences[0].size()) - 1);
    logits = model->forward_cached(cache, {0, {1, 1}}, {.tokens = row_of({stream[2 * step], stream[2 * step + 1]})});
  }
}

TEST(KvCache, StagesChainedEqualTheWholeModel) {
  auto model = whole_model();
  Stage front(kModel, {0, 2});
  Stage back(kModel, {2, kModel.pipeline_layers()});
  front.copy_parameters_from(*model);
  back.copy_parameters_from(*model);
  KvCache whole_cache = model->make_kv_cache(1);
  KvCache front_cache = front.make_kv_cache(1);
  KvCache back_cache = back.make_kv_cache(1);
  const std::vector<std::int32_t> prompt = {1, 2, 3, 4};
  const Tensor expected = model->forward_cached(whole_cache, {0, {4}}, {.tokens = row_of(prompt)});
  Tensor x = front.forward_cached(front_cache, {0, {4}}, {.tokens = row_of(prompt)});
  const Tensor got = back.forward_cached(back_cache, {0, {4}}, {.activation = std::move(x)});
  EXPECT_LT(max_relative_error(got.span(), expected.span()), 1e-6);
  EXPECT_EQ(front_cache.length(0), 4);
  EXPECT_EQ(back_cache.length(0), 4);
}

// A stage packed for inference decodes what the stage with matrices decodes;
// width 45 (an odd number of columns) leaves every matrix a narrower last
// panel on every target. What needs the matrices is refused by name.
TEST(KvCache, AStagePackedForInferenceDecodesTheSameAndRefusesWhatNeedsTheMatrices) {
  for (const auto& [width, heads] : {std::pair{kModel.n_embd, kModel.n_head}, std::pair{45, 5}}) {
    ModelConfig config = kModel;
    config.n_embd = width;
    config.n_head = heads;
    Stage model(config, all_layers(config));
    model.init_parameters(5);
    Stage packed(config, all_layers(config));
    packed.copy_parameters_from(model);
    packed.pack_for_inference();
    EXPECT_TRUE(packed.packed_for_inference());
    KvCache cache = model.make_kv_cache(2);
    KvCache packed_cache = packed.make_kv_cache(2);
    const nn::SequenceRows prompts{0, {5, 2}};
    const IntTensor prompt_tokens = row_of({10, 20, 30, 40, 50, 7, 8});
    Tensor expected = model.forward_cached(cache, prompts, {.tokens = prompt_tokens.clone()});
    Tensor got = packed.forward_cached(packed_cache, prompts, {.tokens = prompt_tokens.clone()});
    for (int step = 0;; ++step) {
      EXPECT_LT(max_relative_error(got.span(), expected.span()), 1e-5) << "width " << width << " step " << step;
      if (step == 6) break;
      const IntTensor next = row_of({3 * step + 1, 5 * step + 2});
      expected = model.forward_cached(cache, {0, {1, 1}}, {.tokens = next.clone()});
      got = packed.forward_cached(packed_cache, {0, {1, 1}}, {.tokens = next.clone()});
    }
    for (const std::string& error :
         {error_of([&] { packed.logits(row_of({1, 2})); }), error_of([&] { (void)packed.parameter("wte.weight"); }),
          error_of([&] { (void)packed.parameters(); }), error_of([&] { packed.init_parameters(1); }),
          error_of([&] { packed.copy_parameters_from(model); }),
          error_of([&] { model.copy_parameters_from(packed); })}) {
      EXPECT_NE(error.find("pack_for_inference has rearranged them into panels"), std::string::npos) << error;
    }
    MicrobatchState state;
    EXPECT_NE(error_of([&] { packed.forward(state, {.tokens = row_of({1, 2}), .targets = row_of({2, 3})}); })
                  .find("forward needs the weight matrices"),
              std::string::npos);
  }
}

TEST(KvCache, ContextAndVocabularyAreChecked) {
  auto model = whole_model();
  KvCache cache = model->make_kv_cache(1);
  EXPECT_NE(error_of([&] { model->forward_cached(cache, {0, {2}}, {.tokens = row_of({1, 256})}); })
                .find("outside the vocabulary [0, 256)"),
            std::string::npos);
  model->forward_cached(cache, {0, {20}}, {.tokens = random_tokens(1, 20, 256, 1)});
  EXPECT_NE(error_of([&] { model->forward_cached(cache, {0, {5}}, {.tokens = random_tokens(1, 5, 256, 2)}); })
                .find("would hold 20 + 5 positions, over the model's context of 24"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model->forward_cached(cache, {0, {}}, {.tokens = row_of({3})}); })
                .find("an inference batch needs at least one sequence"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model->forward_cached(cache, {1, {1}}, {.tokens = row_of({3})}); })
                .find("outside the kv cache's 1"),
            std::string::npos);
}

// Attention runs one sequence at a time: 46341 one-token prompts in one
// batch used to be refused as attention scores of 46341² elements, the
// training check of one sequence of that many tokens. Each still gets the
// logits of its own prompt; a sequence's own scores stay checked.
TEST(KvCache, ManySequencesInOneBatchAreCheckedOneSequenceAtATime) {
  const ModelConfig tiny{.vocab_size = 16, .context = 2, .n_layer = 1, .n_head = 1, .n_embd = 8};
  Stage model(tiny, all_layers(tiny));
  model.init_parameters(3);
  constexpr int kSequences = 46341;  // 46341² > 2^31
  KvCache cache = model.make_kv_cache(kSequences);
  const IntTensor tokens = random_tokens(1, kSequences, tiny.vocab_size, 4);
  const Tensor logits = model.forward_cached(cache, {0, std::vector<int>(kSequences, 1)}, {.tokens = tokens.clone()});
  ASSERT_EQ(logits.shape(), (Shape{kSequences, tiny.vocab_size}));
  for (const int s : {0, 12345, kSequences - 1}) {
    const Tensor alone = model.logits(row_of({tokens[s]}));
    EXPECT_LT(max_relative_error(logits.span().subspan(static_cast<std::size_t>(s) * 16, 16), alone.span()), 1e-5)
        << "sequence " << s;
  }
  const ModelConfig long_context{.vocab_size = 16, .context = 65536, .n_layer = 1, .n_head = 1, .n_embd = 8};
  Stage whole(long_context, all_layers(long_context), {.name = "model"});
  KvCache one = whole.make_kv_cache(1);
  EXPECT_EQ(error_of([&] { whole.forward_cached(one, {0, {65536}}, {.tokens = random_tokens(1, 65536, 16, 5)}); }),
            "model (embedding..head): an inference batch of 1 sequence, R = 65536 rows makes a sequence's attention "
            "scores [T, past + T] 4294967296 elements, over the 2^31 - 1 that the kernels and BLAS index: generate "
            "fewer prompts at once (more --microbatches) or shorter ones");
}

TEST(Sampling, TopKAndTopPKeepOnlyTheMostLikely) {
  const std::vector<float> logits = {0.5f, 3.0f, 2.9f, -1.0f, 2.8f};
  Rng rng(1);
  // top_k 1 and a tiny top_p are greedy at any temperature.
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(sample_token(logits, {.temperature = 5.0, .top_k = 1}, rng), 1);
    EXPECT_EQ(sample_token(logits, {.temperature = 5.0, .top_p = 1e-6}, rng), 1);
  }
  // top_k 2 draws only tokens 1 and 2, and both.
  std::vector<int> seen(logits.size());
  for (int i = 0; i < 400; ++i) ++seen[static_cast<std::size_t>(sample_token(logits, {.temperature = 1.0, .top_k = 2}, rng))];
  EXPECT_EQ(seen[0] + seen[3] + seen[4], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
  // Probabilities at temperature 1: 0.354, 0.320, 0.290 for tokens 1, 2, 4,
  // the rest 0.036: top_p 0.6 keeps tokens 1 and 2 (0.674 >= 0.6).
  std::fill(seen.begin(), seen.end(), 0);
  for (int i = 0; i < 400; ++i) ++seen[static_cast<std::size_t>(sample_token(logits, {.temperature = 1.0, .top_p = 0.6}, rng))];
  EXPECT_EQ(seen[0] + seen[3] + seen[4], 0);
  EXPECT_GT(seen[2], 0);
  // At the boundary: four equal tokens, top_p 0.5 reaches exactly half with
  // tokens 0 and 1 (the nucleus is the smallest set whose mass is >= top_p),
  // so tokens 2 and 3 never come.
  const std::vector<float> equal = {0.0f, 0.0f, 0.0f, 0.0f};
  std::vector<int> drawn(equal.size());
  for (int i = 0; i < 400; ++i) ++drawn[static_cast<std::size_t>(sample_token(equal, {.temperature = 1.0, .top_p = 0.5}, rng))];
  EXPECT_EQ(drawn[2] + drawn[3], 0);
  EXPECT_GT(drawn[0], 0);
  EXPECT_GT(drawn[1], 0);
  EXPECT_NE(error_of([] { SamplingOptions{.top_p = 0}.validate(); }).find("--top-p 0: must lie in (0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of([] { SamplingOptions{.temperature = -1}.validate(); }).find("--temperature -1"),
            std::string::npos);
}

}  // namespace
}  // namespace pipeflow::nn
