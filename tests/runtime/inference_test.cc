#include "pipeflow/runtime/inference.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_states.h"
#include "pipeflow/runtime/stage_partition.h"
#include "pipeflow/sim/inference.h"
#include "test_support.h"

namespace pipeflow::runtime {
namespace {

using nn::testing::error_of;
using pipeflow::testing::max_relative_error;

// 6 blocks, width 32, 2 heads, context 16 (test_support.h's kTiny): enough
// layers for 4 stages. The tests marked so run on its Llama too (kTinyLlama:
// 4 query heads on 2 key/value heads, rotary positions).
const nn::ModelConfig& kModel = testing::kTiny;
const nn::ModelConfig* const kModels[] = {&testing::kTiny, &testing::kTinyLlama};

std::unique_ptr<nn::Stage> whole_model(const nn::ModelConfig& config = kModel) {
  auto model = std::make_unique<nn::Stage>(config, nn::all_layers(config));
  model->init_parameters(21);
  return model;
}

// Three prompts of different lengths.
const std::vector<std::vector<std::int32_t>> kPrompts = {{104, 101, 108, 108, 111}, {10}, {97, 32, 98}};
constexpr int kNewTokens = 9;

// Every sampled token and the logits it came from, per sequence and step.
struct Recorded {
  std::vector<std::vector<std::vector<float>>> logits =
      std::vector<std::vector<std::vector<float>>>(kPrompts.size());
};

InferenceResult run(InferencePipeline& pipeline, int microbatches, const nn::SamplingOptions& sampling,
                    Recorded* recorded = nullptr, int prefill_chunk = kDefaultPrefillChunk) {
  InferenceOptions options{.microbatches = microbatches,
                           .sampling = sampling,
                           .prefill_chunk = prefill_chunk,
                           .timeout = std::chrono::seconds(20)};
  if (recorded != nullptr) {
    options.on_token = [recorded](const GeneratedToken& token) {
      auto& steps = recorded->logits[static_cast<std::size_t>(token.sequence)];
      EXPECT_EQ(static_cast<int>(steps.size()), token.step);
      steps.emplace_back(token.logits.begin(), token.logits.end());
    };
  }
  return pipeline.generate(kPrompts, options);
}

void expect_greedy_equals_recomputation(const nn::ModelConfig& config) {
  auto model = whole_model(config);
  const nn::SamplingOptions greedy{.new_tokens = kNewTokens};
  for (int stages = 1; stages <= 4; ++stages) {
    InferencePipeline pipeline(*model, stages);
    for (int microbatches = 1; microbatches <= 3; ++microbatches) {
      Recorded recorded;
      const InferenceResult result = run(pipeline, microbatches, greedy, &recorded);
      for (std::size_t s = 0; s < kPrompts.size(); ++s) {
        // The unpipelined generation without a cache: every token recomputes the whole prefix.
        EXPECT_EQ(result.tokens[s], nn::generate(*model, kPrompts[s], greedy))
            << "P = " << stages << ", M = " << microbatches << ", sequence " << s;
        std::vector<std::int32_t> prefix = kPrompts[s];
        for (int step = 0; step < kNewTokens; ++step) {
          IntTensor tokens{Shape{1, static_cast<std::int64_t>(prefix.size())}};
          std::copy(prefix.begin(), prefix.end(), tokens.data());
          const Tensor full = model->logits(tokens);
          const auto expected = full.span().subspan((prefix.size() - 1) * config.vocab_size, config.vocab_size);
          EXPECT_LT(max_relative_error(recorded.logits[s][static_cast<std::size_t>(step)], expected), 1e-5)
              << "P = " << stages << ", M = " << microbatches << ", sequence " << s << ", step " << step;
          prefix.push_back(result.tokens[s][static_cast<std::size_t>(step)]);
        }
      }
    }
  }
}

TEST(Inference, GreedyTokensAndLogitsEqualFullRecomputationForEveryLayout) {
  for (const nn::ModelConfig* config : kModels) {
    SCOPED_TRACE(nn::to_string(config->family));
    expect_greedy_equals_recomputation(*config);
  }
}

TEST(Inference, SampledTokensDependOnlyOnTheSeed) {
  auto model = whole_model();
  const nn::SamplingOptions sampling{.new_tokens = kNewTokens, .temperature = 0.9, .seed = 4, .top_k = 40,
                                     .top_p = 0.95};
  InferencePipeline unpipelined(*model, 1);
  const auto expected = run(unpipelined, 1, sampling).tokens;
  for (int stages = 2; stages <= 3; ++stages) {
    InferencePipeline pipeline(*model, stages);
    for (int microbatches = 1; microbatches <= 3; ++microbatches) {
      EXPECT_EQ(run(pipeline, microbatches, sampling).tokens, expected) << "P = " << stages << ", M = " << microbatches;
    }
  }
  InferencePipeline pipeline(*model, 2);
  auto reseeded = sampling;
  reseeded.seed = 5;
  EXPECT_NE(run(pipeline, 2, reseeded).tokens, expected);
}

void expect_kv_cache_is_the_formula(const nn::ModelConfig& m) {
  auto model = whole_model(m);
  InferencePipeline pipeline(*model, 3);
  const InferenceResult result = run(pipeline, 2, {.new_tokens = 2});
  ASSERT_EQ(result.stages.size(), 3U);
  std::int64_t total = 0;
  for (const StageInference& stage : result.stages) {
    const nn::LayerRange& l = stage.layers;
    const int blocks = std::min(l.last, m.n_layer + 1) - std::max(l.first, 1);
    EXPECT_EQ(stage.kv_cache_bytes, kv_cache_bytes(blocks, m.kv_heads(), m.head_size(), 4, m.context,
                                                   static_cast<std::int64_t>(kPrompts.size())));
    EXPECT_GT(stage.busy_s, 0);
    EXPECT_GT(stage.decode_cpu_s, 0);  // the second token's forward
    total += stage.kv_cache_bytes;
  }
  // With one new token there is no decode step: the prefill's CPU time is not counted in it.
  for (const StageInference& stage : run(pipeline, 2, {.new_tokens = 1}).stages) EXPECT_EQ(stage.decode_cpu_s, 0);
  // The cost model's cache per stage (simulate --inference) is what the stages allocate.
  InferenceSetup setup;
  setup.model = model_spec(m);
  setup.hardware = hardware_preset("cpu");
  setup.stages = 3;
  setup.sequences = static_cast<int>(kPrompts.size());
  setup.context = m.context;
  setup.bytes_per_value = 4;
  const InferencePrediction predicted = predict_inference(setup);
  for (std::size_t r = 0; r < result.stages.size(); ++r) {
    EXPECT_EQ(predicted.stages.at(r).first_layer, result.stages[r].layers.first);
    EXPECT_EQ(predicted.stages.at(r).end_layer, result.stages[r].layers.last);
    EXPECT_EQ(predicted.stages.at(r).kv_cache_bytes, static_cast<double>(result.stages[r].kv_cache_bytes));
  }
  // Cut across stages, the cache is the whole model's.
  EXPECT_EQ(total, kv_cache_bytes(m.n_layer, m.kv_heads(), m.head_size(), 4, m.context,
                                  static_cast<std::int64_t>(kPrompts.size())));
  EXPECT_EQ(result.new_tokens(), 2 * static_cast<std::int64_t>(kPrompts.size()));
}

TEST(Inference, KvCacheBytesPerStageAreTheFormula) {
  for (const nn::ModelConfig* config : kModels) {
    SCOPED_TRACE(nn::to_string(config->family));
    expect_kv_cache_is_the_formula(*config);
  }
}

// Prompts beyond InferenceOptions::max_pass_bytes are generated in passes,
// each with a kv cache of its own prompts only: the same tokens (greedy and
// sampled, each prompt its own seed) and the same token indices reported, at
// the memory of a pass.
TEST(Inference, PromptsPastTheMemoryBoundRunInPassesWithTheSameTokens) {
  auto model = whole_model();
  const std::int64_t per_prompt_cache =
      kv_cache_bytes(kModel.n_layer, kModel.kv_heads(), kModel.head_size(), 4, kModel.context, 1);
  for (const nn::SamplingOptions& sampling :
       {nn::SamplingOptions{.new_tokens = kNewTokens},
        nn::SamplingOptions{.new_tokens = kNewTokens, .temperature = 0.9, .seed = 4, .top_k = 40}}) {
    for (int stages = 1; stages <= 2; ++stages) {
      InferencePipeline pipeline(*model, stages);
      const InferenceResult whole = run(pipeline, 2, sampling);
      EXPECT_EQ(whole.passes, 1);
      // Less than any prompt needs: a pass for each (of one group, not 2).
      std::vector<int> reported;
      const InferenceOptions options{.microbatches = 2,
                                     .sampling = sampling,
                                     .max_pass_bytes = per_prompt_cache,
                                     .timeout = std::chrono::seconds(20),
                                     .on_token = [&](const GeneratedToken& token) {
                                       if (token.step == 0) reported.push_back(token.sequence);
                                     }};
      const InferenceResult passes = pipeline.generate(kPrompts, options);
      EXPECT_EQ(passes.tokens, whole.tokens) << "P = " << stages;
      EXPECT_EQ(passes.passes, 3);
      EXPECT_EQ(reported, (std::vector<int>{0, 1, 2}));
      std::int64_t cache = 0;
      for (const StageInference& stage : passes.stages) cache += stage.kv_cache_bytes;
      EXPECT_EQ(cache, per_prompt_cache);  // one prompt's, not all three's
      EXPECT_GE(passes.prefill_s, passes.time_to_first_token_s);
      EXPECT_LT(passes.prefill_s, passes.seconds);
    }
  }
}

// Chunked, pipelined prefill against the unchunked prefill (chunk 0): an
// 11-token prompt in chunks of 4 (4 + 4 + 3: not a multiple) and of 1, and
// the three prompts of kPrompts in one group, cut across their boundaries
// (chunks of 4 over 5 + 1 + 3 tokens) and in two groups. The logits of each
// prompt's last token (sampled from at step 0) agree to 1e-5 of the largest:
// a chunk's products run in other shapes than the whole prompt's, so their
// sums may round differently. Every greedy token is the same.
void expect_chunked_prefill_equals_unchunked(const nn::ModelConfig& config) {
  auto model = whole_model(config);
  const std::vector<std::vector<std::int32_t>> long_prompt = {
      {104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100}};
  struct Case {
    const std::vector<std::vector<std::int32_t>>* prompts;
    int microbatches;
    int chunk;
    int new_tokens;
  };
  const Case cases[] = {{&long_prompt, 1, 4, 6}, {&long_prompt, 1, 1, 6}, {&kPrompts, 1, 4, kNewTokens},
                        {&kPrompts, 2, 2, kNewTokens}};
  for (int stages = 1; stages <= 3; ++stages) {
    InferencePipeline pipeline(*model, stages);
    for (const Case& c : cases) {
      const auto generate = [&](int chunk, std::vector<std::vector<float>>& first_logits) {
        first_logits.assign(c.prompts->size(), {});
        InferenceOptions options{.microbatches = c.microbatches,
                                 .sampling = {.new_tokens = c.new_tokens},
                                 .prefill_chunk = chunk,
                                 .timeout = std::chrono::seconds(20)};
        options.on_token = [&first_logits](const GeneratedToken& token) {
          if (token.step == 0) first_logits[static_cast<std::size_t>(token.sequence)].assign(token.logits.begin(),
                                                                                           token.logits.end());
        };
        return pipeline.generate(*c.prompts, options);
      };
      std::vector<std::vector<float>> whole_logits;
      std::vector<std::vector<float>> chunked_logits;
      const InferenceResult whole = generate(0, whole_logits);
      const InferenceResult chunked = generate(c.chunk, chunked_logits);
      const std::string where = fmt::format("P = {}, M = {}, {} prompt(s), chunk {}", stages, c.microbatches,
                                            c.prompts->size(), c.chunk);
      EXPECT_EQ(chunked.tokens, whole.tokens) << where;
      for (std::size_t s = 0; s < c.prompts->size(); ++s) {
        ASSERT_EQ(chunked_logits[s].size(), static_cast<std::size_t>(config.vocab_size)) << where;
        EXPECT_LT(max_relative_error(chunked_logits[s], whole_logits[s]), 1e-5) << where << ", sequence " << s;
      }
    }
  }
}

TEST(Inference, ChunkedPrefillGivesTheUnchunkedTokensAndLogits) {
  for (const nn::ModelConfig* config : kModels) {
    SCOPED_TRACE(nn::to_string(config->family));
    expect_chunked_prefill_equals_unchunked(*config);
  }
}

// In bf16 or fp16 every stage multiplies by its weights rounded to the
// format and rounds each layer's output, as training does. The first token's
// logits are then fp32's up to that rounding: over 0 (the format is applied)
// and within kHalfBound units of the format's roundoff u (2^-9 bf16, 2^-12
// fp16) of the largest logit: 8 rounded layer outputs and the rounded weights
// of each, whose errors mostly cancel (measured: at most 2.6 u in bf16, 3.0 u
// in fp16, GPT-2 and Llama). A row's arithmetic does not depend on where the
// stages are cut, so every P gives the bits of one stage at the same M; other
// groupings (M) give the same tokens, and the logits within one unit
// roundoff of the format: the GEMM's summation order may change with the
// rows it multiplies (oneDNN picks kernels by shape), and a change of one
// fp32 ulp can flip a rounding to the format (measured: below 1e-5 with
// AVX-512; 3.4e-5 in fp16 with oneDNN held to AVX2, under u = 2.4e-4).
constexpr double kHalfBound = 8;

TEST(Inference, HalfPrecisionLogitsAreFp32sWithinTheFormatsRoundingOnEveryLayout) {
  const nn::SamplingOptions greedy{.new_tokens = kNewTokens};
  for (const nn::ModelConfig* config : kModels) {
    auto model = whole_model(*config);
    InferencePipeline fp32(*model, 1);
    Recorded exact;
    run(fp32, 1, greedy, &exact);
    for (const ComputeFormat format : {ComputeFormat::kBf16, ComputeFormat::kFp16}) {
      SCOPED_TRACE(fmt::format("{} in {}", nn::to_string(config->family), to_string(format)));
      InferencePipeline one_stage(*model, 1, InferencePipeline::kByParameters, 1, format);
      std::vector<Recorded> half(4);  // by M
      std::vector<InferenceResult> results;
      for (int microbatches = 1; microbatches <= 3; ++microbatches) {
        results.push_back(run(one_stage, microbatches, greedy, &half[static_cast<std::size_t>(microbatches)]));
      }
      const double u = format == ComputeFormat::kBf16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -12);
      for (std::size_t s = 0; s < kPrompts.size(); ++s) {
        const double error = max_relative_error(half[1].logits[s][0], exact.logits[s][0]);
        EXPECT_GT(error, 0) << "sequence " << s;
        EXPECT_LE(error, kHalfBound * u) << "sequence " << s;
        for (int microbatches = 2; microbatches <= 3; ++microbatches) {
          EXPECT_EQ(results[static_cast<std::size_t>(microbatches - 1)].tokens[s], results[0].tokens[s]);
          for (int step = 0; step < kNewTokens; ++step) {
            EXPECT_LT(max_relative_error(half[static_cast<std::size_t>(microbatches)].logits[s][step],
                                         half[1].logits[s][step]),
                      u)
                << "M = " << microbatches << ", sequence " << s << ", step " << step;
          }
        }
      }
      for (int stages = 2; stages <= 4; ++stages) {
        InferencePipeline pipeline(*model, stages, InferencePipeline::kByParameters, 1, format);
        for (int microbatches = 1; microbatches <= 3; ++microbatches) {
          Recorded recorded;
          EXPECT_EQ(run(pipeline, microbatches, greedy, &recorded).tokens, results[0].tokens)
              << "P = " << stages << ", M = " << microbatches;
          EXPECT_TRUE(recorded.logits == half[static_cast<std::size_t>(microbatches)].logits)
              << "P = " << stages << ", M = " << microbatches << ": not the bits of one stage";
        }
      }
    }
  }
}

// fp16 holds at most 65504: a model whose activations pass it gives inf and
// NaN logits, an error that says so, where fp32 and bf16 generate.
TEST(Inference, AnFp16OverflowIsAnErrorNamingTheFormat) {
  auto model = whole_model();
  for (float& value : model->parameter("h.0.mlp.c_fc.weight")) value *= 10000;
  for (float& value : model->parameter("h.0.mlp.c_proj.weight")) value *= 10000;
  const nn::SamplingOptions greedy{.new_tokens = 2};
  for (const ComputeFormat format : {ComputeFormat::kFp32, ComputeFormat::kBf16}) {
    InferencePipeline pipeline(*model, 2, InferencePipeline::kByParameters, 1, format);
    EXPECT_EQ(run(pipeline, 1, greedy).new_tokens(), 2 * static_cast<std::int64_t>(kPrompts.size()));
  }
  InferencePipeline fp16(*model, 2, InferencePipeline::kByParameters, 1, ComputeFormat::kFp16);
  const std::string error = error_of([&] { run(fp16, 1, greedy); });
  EXPECT_NE(error.find("prompt 0: the logits of new token 0 hold "), std::string::npos) << error;
  EXPECT_NE(error.find("a layer's output overflowed fp16 (largest value 65504): generate with --bf16 or in fp32"),
            std::string::npos)
      << error;
}

TEST(Inference, BadPromptsAndLayoutsAreErrors) {
  auto model = whole_model();
  InferencePipeline pipeline(*model, 2);
  auto error = [&](const std::vector<std::vector<std::int32_t>>& prompts, int microbatches, int new_tokens) {
    return error_of([&] {
      pipeline.generate(prompts, {.microbatches = microbatches, .sampling = {.new_tokens = new_tokens}});
    });
  };
  EXPECT_NE(error({std::vector<std::int32_t>(17, 1)}, 1, 1)
                .find("prompt 0 has 17 tokens, longer than the model's context of 16"),
            std::string::npos);
  EXPECT_NE(error({{1, 2}, std::vector<std::int32_t>(10, 1)}, 1, 8)
                .find("prompt 1 has 10 tokens: with --max-new-tokens 8 the sequence reaches 17 positions, over the "
                      "model's context of 16 (the kv cache holds that many): lower --max-new-tokens to 7"),
            std::string::npos);
  EXPECT_NE(error({{1, 300}}, 1, 1).find("prompt 0: token 300 at position 1 is outside the vocabulary [0, 256)"),
            std::string::npos);
  EXPECT_NE(error({{}}, 1, 1).find("prompt 0 is empty"), std::string::npos);
  EXPECT_NE(error({{1}, {2}}, 3, 1).find("--microbatches 3: must lie in [1, 2]"), std::string::npos);
  EXPECT_NE(error_of([&] { pipeline.generate({{1, 2}}, {.sampling = {.new_tokens = 1}, .prefill_chunk = -1}); })
                .find("--prefill-chunk -1: must be >= 0"),
            std::string::npos);
  // A full context is allowed: 10 + 7 − 1 = 16 positions.
  EXPECT_EQ(error({std::vector<std::int32_t>(10, 1)}, 1, 7), "(no error)");
}

}  // namespace
}  // namespace pipeflow::runtime

namespace pipeflow::runtime {
namespace {

// Tensor parallelism: every stage split over 2 ranks (their logits
// all-gathered, each sampling the same tokens) generates one rank's greedy
// tokens, from the same logits to rounding, GPT-2 (panels) and Llama.
TEST(InferenceTensorParallel, SplitStagesGiveOneRanksGreedyTokensAndLogits) {
  for (const nn::ModelConfig* config : kModels) {
    auto model = whole_model(*config);
    const nn::SamplingOptions greedy{.new_tokens = kNewTokens};
    InferencePipeline whole(*model, 1);
    Recorded expected;
    const InferenceResult reference = run(whole, 1, greedy, &expected);
    for (const int stages : {1, 2}) {
      InferencePipeline split(*model, stages, InferencePipeline::kByParameters, 2);
      Recorded got;
      const InferenceResult result = run(split, stages, greedy, &got);
      EXPECT_EQ(result.tokens, reference.tokens) << nn::to_string(config->family) << " tp 2 pp " << stages;
      // The prefill in chunks of 2 (the prompts of 5, 1 and 3 tokens cut across their boundaries).
      EXPECT_EQ(run(split, stages, greedy, nullptr, 2).tokens, reference.tokens)
          << nn::to_string(config->family) << " tp 2 pp " << stages << ", chunks of 2";
      for (std::size_t s = 0; s < kPrompts.size(); ++s) {
        for (std::size_t step = 0; step < got.logits[s].size(); ++step) {
          EXPECT_LT(max_relative_error(got.logits[s][step], expected.logits[s][step]), 1e-4)
              << nn::to_string(config->family) << " sequence " << s << " step " << step;
        }
      }
    }
  }
}

}  // namespace
}  // namespace pipeflow::runtime
