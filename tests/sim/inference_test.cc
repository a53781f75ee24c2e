#include "pipeflow/sim/inference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "../support/error_of.h"
#include "pipeflow/core/units.h"
#include "pipeflow/model/hardware.h"

namespace pipeflow {
namespace {

using testing::error_of;

// HBM at 1 TB/s and all of it achieved, compute and links so fast that
// decode is purely the bytes it reads and no transfer takes time.
HardwareProfile bandwidth_only() {
  HardwareProfile hw;
  hw.name = "hand";
  hw.peak_flop_per_s = 1e21;
  hw.peak_fp32_flop_per_s = 1e21;
  hw.memory_bytes = 1e12;
  hw.memory_bandwidth_bytes_per_s = 1e12;
  hw.devices_per_node = 8;
  hw.intra_node_bandwidth_bytes_per_s = hw.inter_node_bandwidth_bytes_per_s = 1e30;
  hw.intra_node_latency_s = hw.inter_node_latency_s = 1e-30;
  hw.efficiency = 1;
  return hw;
}

// GPT, L = 2, h = 64, 4 heads (head_dim 16), V = 100, 32 positions, tied
// embeddings. Per block 12h² + 13h = 49984 parameters; the head reads its
// final norm (2h = 128) and the tied table (V·h = 6400).
InferenceSetup tiny(int stages, int sequences, int microbatches) {
  return InferenceSetup{.model = gpt_model("tiny", 2, 64, 4, 100, 32),
                        .hardware = bandwidth_only(),
                        .stages = stages,
                        .microbatches = microbatches,
                        .sequences = sequences,
                        .context = 32,
                        .prompt_tokens = 8,
                        .bytes_per_value = 2,
                        .partition = stages == 2 ? PartitionMethod{PartitionMethod::Kind::kCounts, {}, {2, 2}}
                                                 : PartitionMethod{PartitionMethod::Kind::kParameters, {}, {}}};
}

constexpr double kRelative = 1e-12;

// KV cache = 2 · layers · kv_heads · head_dim · bytes · context · batch.
TEST(InferenceCost, KvCacheIsTheFormulaByHand) {
  InferenceSetup llama;
  llama.model = model_preset("llama3-70b");
  llama.hardware = hardware_preset("h100");
  llama.context = 32768;
  // 2 · 80 · 8 · 128 · 2 B = 320 KiB per token; 32K tokens: 10 GiB.
  EXPECT_EQ(predict_inference(llama).stages.at(0).kv_cache_bytes, 10.0 * kGiB);
  llama.stages = 4;
  llama.sequences = 3;
  double total = 0;
  for (const InferenceStage& stage : predict_inference(llama).stages) total += stage.kv_cache_bytes;
  EXPECT_EQ(total, 30.0 * kGiB);
  // Llama 3 405B: 2 · 126 · 8 · 128 · 2 B = 504 KiB per token; 128K tokens: 63 GiB.
  InferenceSetup big = llama;
  big.model = model_preset("llama3-405b");
  big.stages = 1;
  big.sequences = 1;
  big.context = 131072;
  EXPECT_EQ(predict_inference(big).stages.at(0).kv_cache_bytes, 63.0 * kGiB);
}

// One stage, one sequence: a token reads every weight once (e = 2 B), one
// embedding row and the whole cache, at the HBM bandwidth.
TEST(InferenceCost, DecodeOnOneStageIsTheBytesReadOverBandwidth) {
  const InferencePrediction p = predict_inference(tiny(1, 1, 1));
  const double blocks = 2 * 2 * 49984.0;
  const double head = 2 * (128 + 6400.0);
  const double embedding_row = 2 * 64.0;
  const double kv = 2 * 2 * 4 * 16 * 2 * 32.0;  // 16384
  const double bytes = blocks + head + embedding_row + kv;  // 229504
  EXPECT_NEAR(p.per_token_s, bytes / 1e12, kRelative * bytes / 1e12);
  EXPECT_NEAR(p.tokens_per_s, 1e12 / bytes, kRelative * 1e12 / bytes);
  EXPECT_EQ(p.stages.at(0).kv_cache_bytes, kv);
  EXPECT_EQ(p.stages.at(0).weight_bytes, 2 * (2 * 49984.0 + 128 + 100 * 64 + 32 * 64));  // wte, wpe, blocks, norm
  // Two sequences in one group: the weights once, the cache and the row twice.
  const InferencePrediction two = predict_inference(tiny(1, 2, 1));
  const double bytes2 = blocks + head + 2 * embedding_row + 2 * kv;
  EXPECT_NEAR(two.per_token_s, bytes2 / 1e12, kRelative * bytes2 / 1e12);
  EXPECT_NEAR(two.tokens_per_s, 2e12 / bytes2, kRelative * 2e12 / bytes2);
}

// Stage 0 = embedding + block.0, stage 1 = block.1 + head. With M ≥ P
// groups the busiest stage sets the round: M · its decode; with one group
// a round is the trip through both stages.
TEST(InferenceCost, PipelinedDecodeWithAtLeastAsManyGroupsAsStages) {
  const double d0 = (2 * 64.0 + 2 * 49984.0 + 8192) / 1e12;      // row, block.0, its cache
  const double d1 = (2 * 49984.0 + 8192 + 2 * 6528.0) / 1e12;     // block.1, its cache, head
  const InferencePrediction two_groups = predict_inference(tiny(2, 2, 2));
  EXPECT_NEAR(two_groups.stages.at(0).decode_s, d0, kRelative * d0);
  EXPECT_NEAR(two_groups.stages.at(1).decode_s, d1, kRelative * d1);
  EXPECT_NEAR(two_groups.per_token_s, 2 * d1, kRelative * d1);
  EXPECT_NEAR(two_groups.tokens_per_s, 2 / (2 * d1), kRelative / d1);
  const InferencePrediction four_groups = predict_inference(tiny(2, 4, 4));
  EXPECT_NEAR(four_groups.per_token_s, 4 * d1, kRelative * d1);
  // One group of two: the round is d0(2) + d1(2).
  const double e0 = d0 + (2 * 64.0 + 8192) / 1e12;
  const double e1 = d1 + 8192 / 1e12;
  const InferencePrediction one_group = predict_inference(tiny(2, 2, 1));
  EXPECT_NEAR(one_group.per_token_s, e0 + e1, kRelative * (e0 + e1));
  EXPECT_EQ(one_group.group_sizes, (std::vector<int>{2}));
  EXPECT_EQ(predict_inference(tiny(2, 5, 0)).group_sizes, (std::vector<int>{2, 3}));  // M = min(P, S)
}

// Prefill follows the inference schedule: with two equal groups on two
// stages, rank 0 forwards them back to back and rank 1 starts each when
// both it and its input are ready.
TEST(InferenceCost, TimeToFirstTokenIsThePrefillScheduleSimulated) {
  const InferencePrediction one = predict_inference(tiny(1, 1, 1));
  EXPECT_EQ(one.time_to_first_token_s, one.stages.at(0).prefill_s);
  EXPECT_EQ(one.prefill_bubble, 0);
  const InferencePrediction p = predict_inference(tiny(2, 2, 2));
  const double t0 = p.stages.at(0).prefill_s;
  const double t1 = p.stages.at(1).prefill_s;
  const double makespan = std::max(2 * t0, t0 + t1) + t1;
  EXPECT_NEAR(p.time_to_first_token_s, makespan, kRelative * makespan);
  EXPECT_NEAR(p.prefill_bubble, 1 - 2 * (t0 + t1) / (2 * makespan), 1e-12);
}

// Chunked prefill on a device whose memory and links are infinitely fast,
// GEMMs at the peak whatever their shape (matmul_half_size 0): a chunk
// costs its FLOPs, the embedding nothing. GPT, 6 blocks of width 512, 8
// heads, a vocabulary of 64 (the head's one row per finished prompt is
// 2 · 64 · 512 FLOPs, 3e-5 of a stage's chunk), 1024 positions; 2 stages of
// 3 blocks each, 3 stages of 2.
InferenceSetup compute_only(int stages, int sequences, std::int64_t prompt_tokens, std::int64_t chunk) {
  HardwareProfile hw = bandwidth_only();
  hw.peak_flop_per_s = hw.peak_fp32_flop_per_s = 1e12;
  hw.memory_bandwidth_bytes_per_s = 1e30;
  const std::vector<int> counts = stages == 1 ? std::vector<int>{8} : stages == 2 ? std::vector<int>{4, 4}
                                                                                  : std::vector<int>{3, 2, 3};
  return InferenceSetup{.model = gpt_model("wide", 6, 512, 8, 64, 1024),
                        .hardware = hw,
                        .stages = stages,
                        .microbatches = 1,
                        .sequences = sequences,
                        .context = 1024,
                        .prompt_tokens = prompt_tokens,
                        .bytes_per_value = 2,
                        .prefill_chunk = chunk,
                        .partition = PartitionMethod{PartitionMethod::Kind::kCounts, {}, counts}};
}

// Uniform chunks: 8 prompts of 128 tokens in one group, chunks of 128, so
// every chunk is one whole prompt and costs the same, t on each of p equal
// stages (p · t on one). The pipeline fills in p − 1 chunk-steps and then
// finishes a chunk every step: (n + p − 1) · t, against n · p · t on one
// stage, a ratio of (n + p − 1) / (n · p): 9/16 at p = 2, 10/24 at p = 3.
TEST(InferenceCost, UniformPrefillChunksGiveTheFillAndDrainClosedForm) {
  const int n = 8;
  const InferencePrediction one = predict_inference(compute_only(1, n, 128, 128));
  ASSERT_EQ(one.prefill_chunks, n);
  const double chunk = one.stages.at(0).prefill_chunk_s.at(0);
  for (const double t : one.stages.at(0).prefill_chunk_s) EXPECT_NEAR(t, chunk, kRelative * chunk);
  EXPECT_NEAR(one.time_to_first_token_s, n * chunk, kRelative * n * chunk);
  for (const int p : {2, 3}) {
    const InferencePrediction piped = predict_inference(compute_only(p, n, 128, 128));
    const double ratio = piped.time_to_first_token_s / one.time_to_first_token_s;
    EXPECT_NEAR(ratio, (n + p - 1.0) / (n * p), 1e-4) << "p = " << p;
    // Exactly, with the stages' own chunk times a_r (the head's row makes the
    // last a little slower): the slowest stage every step after the fill.
    double sum = 0;
    double slowest = 0;
    for (const InferenceStage& stage : piped.stages) {
      sum += stage.prefill_chunk_s.at(0);
      slowest = std::max(slowest, stage.prefill_chunk_s.at(0));
    }
    EXPECT_NEAR(piped.time_to_first_token_s, sum + (n - 1) * slowest, kRelative * piped.time_to_first_token_s);
  }
}

// One 1000-token prompt in chunks of 128 (7 of 128 and one of 104). Chunk k
// attends to the 128 · k positions cached before it as well as its own: its
// attention core (q·kᵀ and probs·v) costs 4 · rows · (cached + rows) · h
// FLOPs a block, so each full chunk costs 4 · 128 · 128 · h · L more than
// the one before. On p equal stages, with a_k = t_k / p a stage's time of
// chunk k, the largest chunk sets the drain: the makespan is
// Σ a_k + (p − 1) · max a_k (a flow shop whose jobs take the same time on
// every machine), so the ratio to one stage is (Σ t_k + (p − 1) t_max) /
// (p Σ t_k) — above the uniform (n + p − 1) / (n p). Unchunked (chunk 0), a
// single prompt gains nothing from the stages (its attention is priced
// T × T: generate's unchunked prefill computes every score and masks).
TEST(InferenceCost, PrefillChunksAttendToTheCachedPrefix) {
  const InferencePrediction one = predict_inference(compute_only(1, 1, 1000, 128));
  const std::vector<double>& t = one.stages.at(0).prefill_chunk_s;
  ASSERT_EQ(t.size(), 8U);
  const double growth = 4.0 * 128 * 128 * 512 * 6 / 1e12;
  for (std::size_t k = 1; k + 1 < t.size(); ++k) EXPECT_NEAR(t[k] - t[k - 1], growth, 1e-9 * t[k]) << k;
  double sum = 0;
  for (const double chunk : t) sum += chunk;
  EXPECT_NEAR(one.time_to_first_token_s, sum, kRelative * sum);
  const double largest = *std::max_element(t.begin(), t.end());
  const InferencePrediction whole_one = predict_inference(compute_only(1, 1, 1000, 0));
  for (const int p : {2, 3}) {
    const InferencePrediction piped = predict_inference(compute_only(p, 1, 1000, 128));
    const double ratio = piped.time_to_first_token_s / one.time_to_first_token_s;
    EXPECT_NEAR(ratio, (sum + (p - 1) * largest) / (p * sum), 1e-4) << "p = " << p;
    EXPECT_GT(ratio, (8 + p - 1.0) / (8 * p)) << "p = " << p;
    const InferencePrediction whole = predict_inference(compute_only(p, 1, 1000, 0));
    EXPECT_EQ(whole.prefill_chunks, 1);
    EXPECT_NEAR(whole.time_to_first_token_s, whole_one.time_to_first_token_s,
                kRelative * whole_one.time_to_first_token_s);
  }
}

TEST(InferenceCost, SetupErrorsNameTheFieldAndTheFix) {
  EXPECT_EQ(error_of([] { predict_inference(tiny(5, 1, 1)); }),
            "stages = 5: tiny has 4 pipeline layers (embedding, 2 blocks, head) and every stage needs one; use 4 "
            "stages or fewer");
  EXPECT_EQ(error_of([] { predict_inference(tiny(2, 2, 3)); }),
            "microbatches = 3: must lie in [1, sequences = 2] (a group holds at least one sequence)");
  InferenceSetup long_prompt = tiny(1, 1, 1);
  long_prompt.prompt_tokens = 33;
  EXPECT_EQ(error_of([&] { predict_inference(long_prompt); }), "prompt tokens = 33: must lie in [1, context = 32]");
  InferenceSetup long_context = tiny(1, 1, 1);
  long_context.context = 64;
  EXPECT_EQ(error_of([&] { predict_inference(long_context); }),
            "context = 64: tiny has a position table of 32 positions; use --context 32 or less");
  InferenceSetup negative_chunk = tiny(1, 1, 1);
  negative_chunk.prefill_chunk = -1;
  EXPECT_EQ(error_of([&] { predict_inference(negative_chunk); }),
            "prefill chunk = -1: must be >= 0 (tokens per prefill chunk; 0: a group's prompts in one piece)");
  InferenceSetup tiny_chunks = tiny(4, 1, 1);
  tiny_chunks.model = gpt_model("tiny", 2, 64, 4, 100, 1 << 21);
  tiny_chunks.context = tiny_chunks.prompt_tokens = 1 << 21;
  tiny_chunks.prefill_chunk = 1;
  EXPECT_EQ(error_of([&] { predict_inference(tiny_chunks); }),
            "prefill chunk = 1: the prompts make 2097152 chunks, and 4 stages × 2097152 chunks pass the inference "
            "schedule's limit of 4194304 (stage, chunk) pairs: use a larger prefill chunk (0: a group's prompts in "
            "one piece)");
}

}  // namespace
}  // namespace pipeflow
