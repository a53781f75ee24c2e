#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_spec.h"
#include "pipeflow/model/partition.h"

namespace pipeflow {

// The default prefill chunk (InferenceSetup::prefill_chunk), as vLLM's and
// TensorRT-LLM's chunked prefill cut prompts on a GPU: 8192 tokens keep
// every GEMM large enough for its peak rate, and a stage holds one chunk's
// activations, not the whole prompt's. `pipeflow generate` on a CPU takes
// 128 (runtime/inference.h).
inline constexpr std::int64_t kPrefillChunkTokens = 8192;

// What `simulate --inference` prices: `sequences` concurrent sequences of a
// model cut into `stages` pipeline stages, one device each (no tensor or
// data parallelism), the sequences in `microbatches` groups as `pipeflow
// generate` cuts them (group g holds ⌊S·g/M⌋ … ⌊S·(g+1)/M⌋ − 1).
struct InferenceSetup {
  ModelSpec model;
  HardwareProfile hardware;
  int stages = 1;
  int microbatches = 0;           // M; 0: min(stages, sequences), the fewest that keep every stage busy
  int sequences = 1;              // S
  std::int64_t context = 0;       // positions of each sequence the KV cache holds (0: the model's)
  std::int64_t prompt_tokens = 0;  // tokens of each prompt; 0: the context (the longest prefill)
  int bytes_per_value = 2;        // bf16 weights, activations and cache
  // Chunked, pipelined prefill: a group's prompts, one after another, cut
  // into chunks of at most this many tokens that follow each other through
  // the stages (0: one chunk per group, the whole group's prompts).
  std::int64_t prefill_chunk = kPrefillChunkTokens;
  PartitionMethod partition = PartitionMethod{PartitionMethod::Kind::kParameters, {}, {}};
};


struct InferenceStage {
  int first_layer = 0;  // pipeline layers [first_layer, end_layer)
  int end_layer = 0;
  std::string layers;   // "embedding .. block.19"
  int blocks = 0;
  std::int64_t parameters = 0;  // a tied copy held here included
  double weight_bytes = 0;      // parameters · bytes_per_value
  // 2 · blocks · kv_heads · head_dim · bytes · context · sequences.
  double kv_cache_bytes = 0;
  // Prefill: one chunk of the largest group, e · tokens · (2h + qkv + up) on
  // a stage with a block (its input and output, the QKV projection, the
  // MLP's up projection), e · tokens · 2h otherwise.
  double activation_bytes = 0;
  double prefill_s = 0;  // the largest group's prompts (the sum of its chunks)
  std::vector<double> prefill_chunk_s;  // the largest group's chunks, in order
  double decode_s = 0;   // one token of the largest group, the cache full
  double peak_bytes() const { return weight_bytes + kv_cache_bytes + activation_bytes; }
};

struct InferencePrediction {
  InferenceSetup setup;  // microbatches, context and prompt_tokens resolved
  std::vector<InferenceStage> stages;
  std::vector<int> group_sizes;  // sequences per group
  // Prefill: the inference schedule over the chunks of every group (chunks
  // + p − 1 steps: stage r forwards chunk k at step k + r) simulated with
  // each stage's prefill of each chunk and the activations' transfers;
  // every prompt has its first token at its end. For n equal chunks of time
  // t on each of p equal stages (one stage: p · t a chunk) that is
  // (n + p − 1) · t, (n + p − 1) / (n · p) of one stage's.
  double time_to_first_token_s = 0;
  int prefill_chunks = 0;     // of every group
  double prefill_bubble = 0;  // idle share of the prefill
  // Decode: every group passes the stages once per token and its tokens go
  // back from the last stage to the first. With d(r, g) the decode of group
  // g on stage r and c(r, g) its transfer onward (the last stage's: the
  // token ids back to the first; none on one stage), one round gives every
  // sequence a token and lasts
  //   max( max_r Σ_g d(r, g),  max_g Σ_r (d(r, g) + c(r, g)) ):
  // the busiest stage, or one group's trip around the ring. With M ≥ P
  // equal groups and stages the first term wins: no stage waits.
  double per_token_s = 0;
  double tokens_per_s = 0;  // sequences / per_token_s
  double peak_bytes() const;  // the largest stage's
};

// The setup with its defaults filled in (microbatches, context, prompt
// tokens). Throws Error naming the field and the fix for a setup that cannot
// run at any stage count: stages, sequences or microbatches < 1, more groups
// than sequences, a prompt longer than the context, a GPT context above its
// position table, a prefill chunk < 0.
InferenceSetup resolve_inference_setup(const InferenceSetup& setup);

// Throws Error as resolve_inference_setup, and for more stages than pipeline
// layers or an inference schedule (stages x microbatches) over the
// generators' limit.
InferencePrediction predict_inference(const InferenceSetup& setup);

// What `simulate --inference` prints: the setup, the latencies and
// throughput, and a table of the stages; or the same as one JSON object.
std::string inference_text(const InferencePrediction& prediction);
nlohmann::ordered_json inference_json(const InferencePrediction& prediction);

}  // namespace pipeflow
