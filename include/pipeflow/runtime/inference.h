#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "pipeflow/model/partition.h"
#include "pipeflow/nn/safetensors.h"
#include "pipeflow/nn/sampling.h"
#include "pipeflow/nn/stage.h"
#include "pipeflow/runtime/rank_group.h"

namespace pipeflow::runtime {

// One token as the last stage samples it.
struct GeneratedToken {
  int sequence = 0;               // index of its prompt
  int step = 0;                   // 0: the first new token (from the prefill)
  std::int32_t token = 0;
  std::span<const float> logits;  // [V] it was sampled from; valid during the call (empty under MPI: see below)
};

// generate's default prefill chunk (InferenceOptions::prefill_chunk): a
// 1,024-token prompt makes 8 chunks, whose prefill on P equal stages takes
// (8 + P − 1) / (8 · P) of one stage's (0.56 at P = 2), while every product
// keeps 128 rows, enough for sgemm to run near its rate.
inline constexpr int kDefaultPrefillChunk = 128;

struct InferenceOptions {
  // Groups of sequences circulating through the stages (DeepSpeed's
  // micro-batches of an InferenceSchedule); at most the number of prompts.
  int microbatches = 1;
  // new_tokens is the number generated for every prompt. Each sequence
  // draws from its own generator, seeded derive_seed(seed, sequence), so a
  // prompt's tokens do not depend on the stages, the micro-batches or the
  // other prompts.
  nn::SamplingOptions sampling;
  // Chunked, pipelined prefill: a group's prompts, one after another, are
  // cut into chunks of at most this many tokens that follow each other
  // through the stages (stage s forwards chunk k while stage s − 1 forwards
  // chunk k + 1), each attending to the cached positions of the chunks
  // before it; so the first token comes sooner with more stages. 0: the
  // group's prompts at once (one chunk per group). Must be >= 0. The
  // logits agree with an unchunked prefill's to float rounding (a row's
  // products run in other shapes), the greedy tokens of the tests exactly.
  int prefill_chunk = kDefaultPrefillChunk;
  // Memory is bounded whatever the number of prompts: they are generated in
  // passes, one after another, each of the next prompts whose bytes sum to
  // at most this (at least one prompt). A prompt's bytes: its kv cache (every
  // block's, for the whole context), a block's activations of its tokens
  // while its group's prefill runs (model/pipeline_layers.h's count for one
  // token, times its tokens) and its row of logits. A pass cuts its prompts
  // into min(microbatches, its prompts) groups. 1 GiB: GPT-2 124M (a kv
  // cache of 72 MiB at its context of 1024) takes 14 short prompts a pass.
  std::int64_t max_pass_bytes = std::int64_t{1} << 30;
  // Every wait for a message times out with an error after this long.
  std::chrono::duration<double> timeout = std::chrono::seconds(60);
  // Called on the last stage's thread for every token, in order for each
  // sequence (streaming); must not throw. Under MPI with more than one
  // process: on world rank 0 as the tokens reach the first stage, without
  // their logits (they stay on the last stage).
  std::function<void(const GeneratedToken&)> on_token = {};
};

struct StageInference {
  nn::LayerRange layers;
  double busy_s = 0;               // in its forwards and sampling
  double busy_share = 0;           // busy_s / the whole generation
  // Its thread's CPU time in the decode's forwards and sampling (after the
  // prefill): the work, which neither its waits nor other processes taking
  // its core add to.
  double decode_cpu_s = 0;
  std::int64_t kv_cache_bytes = 0; // allocated, as its memory account counts them
};

struct InferenceResult {
  std::vector<std::vector<std::int32_t>> tokens;  // the new tokens of each prompt
  double seconds = 0;                // the whole generation, prefill included
  // Until every prompt of the first pass has its first new token (its prefill).
  double time_to_first_token_s = 0;
  double prefill_s = 0;              // every pass's prefill, summed
  int passes = 1;                    // InferenceOptions::max_pass_bytes
  // Per stage: busy_s and decode_cpu_s summed over the passes, kv_cache_bytes the largest pass's.
  std::vector<StageInference> stages;

  std::int64_t new_tokens() const;
  double tokens_per_s() const { return seconds > 0 ? static_cast<double>(new_tokens()) / seconds : 0; }
  // The decode alone: every token after each sequence's first, over the
  // time outside the prefills (0 with one new token per sequence).
  double decode_tokens_per_s() const;
};

// Autoregressive generation through a pipeline of stages on the ranks of a
// RankGroup (threads of this process, or one stage per process under
// mpirun; the code is the same): each stage holds a contiguous range of layers and a
// key/value cache for its blocks, preallocated for the model's context and
// every sequence of a pass (its bytes in the stage's memory account; a call
// runs its prompts in passes of bounded memory, InferenceOptions::
// max_pass_bytes, each as below).
//
// The schedule is forward only. Prefill is DeepSpeed's InferenceSchedule,
// the registry's `inference` schedule, whose rank lists every step follows:
// the prompts, cut into m groups and each group's tokens into chunks
// (InferenceOptions::prefill_chunk), pass the p stages in order, chunks + p
// − 1 steps (stage r forwards chunk k at step k + r). Then each group's new
// tokens go from the last stage back to the first and the group passes again
// one token per sequence, so stage r decodes one group while stage r + 1
// decodes another: with m >= p every stage is busy in steady state. The last
// stage samples (nn::sample_token); a token travels to the first stage as a
// float (exact: a vocabulary holds at most 2^24 ids; never narrowed to 16 bits).
//
// Messages go through the group's pipeline transport under the training
// runtime's keys: activations are kActivation messages, tokens
// kSampledTokens, micro-batch id step · m + group.
//
// In bf16 or fp16 (`format`) each stage multiplies by its weights rounded to
// the format and rounds every layer's output (nn::StageOptions::format, as
// training does); between processes the activations travel in 2 bytes a
// value. Norm statistics, softmax, the logits and sampling stay fp32.
//
// A process loads only the layers of the stages it runs. When the last stage
// runs in another process than the first (under mpirun), the last stage
// sends every step's tokens to the first, the last step's too, and world
// rank 0 collects them (without their logits): its result holds every
// sequence's tokens and every stage's figures (gathered); another process's
// holds the figures alone. A failure follows the group's policy (under
// mpirun it ends the job: a peer cannot be told to stop half way).
//
// Thread safety: one thread calls generate at a time.
class TensorCollectives;

class InferencePipeline {
 public:
  // DeepSpeed's `parameters`, pipeflow's default partition everywhere.
  static inline const PartitionMethod kByParameters{PartitionMethod::Kind::kParameters, {}, {}};

  // The stages cut from `model`'s layers by `partition` (weights copied),
  // each split over `tensor_parallel` ranks (threads of this process).
  InferencePipeline(const nn::Stage& model, int stages, const PartitionMethod& partition = kByParameters,
                    int tensor_parallel = 1, ComputeFormat format = ComputeFormat::kFp32);
  // The stages loaded from a weights file (model_file.h).
  InferencePipeline(const nn::SafetensorsFile& weights, int stages,
                    const PartitionMethod& partition = kByParameters);
  // The stages of `group`'s ranks that run here (it must outlive the
  // pipeline, and hold one replica: data_parallel 1; with tensor parallelism
  // each stage is split over its tensor-parallel ranks, each of which runs
  // the pipeline of its parts, and every one samples the same tokens from
  // the logits all-gathered).
  InferencePipeline(const nn::SafetensorsFile& weights, RankGroup& group,
                    const PartitionMethod& partition = kByParameters, ComputeFormat format = ComputeFormat::kFp32);
  ~InferencePipeline();
  InferencePipeline(const InferencePipeline&) = delete;
  InferencePipeline& operator=(const InferencePipeline&) = delete;

  const nn::ModelConfig& config() const { return config_; }
  ComputeFormat format() const { return format_; }
  int num_stages() const { return static_cast<int>(boundaries_.size()) - 1; }

  // Generates options.sampling.new_tokens tokens for every prompt. Errors
  // name the prompt: empty, a token outside the vocabulary, or more
  // positions than the context holds (prompt + new tokens − 1, since the
  // last token is never fed back).
  InferenceResult generate(const std::vector<std::vector<std::int32_t>>& prompts, const InferenceOptions& options);

 private:
  static std::unique_ptr<RankGroup> in_threads(int stages, int tensor_parallel);
  // Makes the stages this process runs.
  void start(const PartitionMethod& partition);
  // The first prompt of each pass (InferenceOptions::max_pass_bytes), then prompts.size().
  std::vector<int> pass_starts(const std::vector<std::vector<std::int32_t>>& prompts,
                               std::int64_t max_pass_bytes) const;
  // One pass over `prompts`, the first of which is prompt `first_sequence` of the call.
  InferenceResult generate_pass(std::span<const std::vector<std::int32_t>> prompts, int first_sequence,
                                const InferenceOptions& options);
  // Once the weights are in: every stage of this process rearranges its
  // weights for decoding (nn::BasicStage::pack_for_inference).
  void pack_stages();

  nn::ModelConfig config_;
  ComputeFormat format_ = ComputeFormat::kFp32;
  std::unique_ptr<RankGroup> own_group_;  // the threads of an in-process pipeline
  RankGroup* group_ = nullptr;
  std::vector<int> boundaries_;                     // stage i holds layers [boundaries_[i], boundaries_[i + 1])
  // By tensor-parallel rank, one per stage; null for another process's.
  std::vector<std::vector<std::unique_ptr<nn::Stage>>> stages_;
  // By world rank: the layers' collectives of a local rank split over t > 1.
  std::vector<std::unique_ptr<TensorCollectives>> collectives_;
};

}  // namespace pipeflow::runtime
