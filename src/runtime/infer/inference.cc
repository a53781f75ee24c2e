#include "pipeflow/runtime/inference.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>

#include "pipeflow/core/cpu_time.h"
#include "pipeflow/core/error.h"
#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_states.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/runtime/stage_partition.h"
#include "pipeflow/schedule/generators.h"
#include "engine/tensor_collectives.h"

namespace pipeflow::runtime {
namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void check_prompts(const std::vector<std::vector<std::int32_t>>& prompts, const nn::ModelConfig& config,
                   int new_tokens) {
  if (prompts.empty()) fail("generation needs at least one prompt");
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto& prompt = prompts[i];
    const auto length = static_cast<std::int64_t>(prompt.size());
    if (prompt.empty()) fail("prompt {} is empty: give at least one token (an empty text prompt is a newline)", i);
    for (std::size_t j = 0; j < prompt.size(); ++j) {
      if (prompt[j] < 0 || prompt[j] >= config.vocab_size) {
        fail("prompt {}: token {} at position {} is outside the vocabulary [0, {}) of the model", i, prompt[j], j,
             config.vocab_size);
      }
    }
    if (length > config.context) {
      fail("prompt {} has {} tokens, longer than the model's context of {}: shorten it", i, length, config.context);
    }
    if (length + new_tokens - 1 > config.context) {
      fail("prompt {} has {} tokens: with --max-new-tokens {} the sequence reaches {} positions, over the model's "
           "context of {} (the kv cache holds that many): lower --max-new-tokens to {} or shorten the prompt",
           i, length, new_tokens, length + new_tokens - 1, config.context, config.context - length + 1);
    }
  }
}

// One generate call: the caches, the transport and what the ranks record.
// Rank r runs run_rank(r) on its own thread; each touches only its own
// stage, cache and busy time, the last rank alone the tokens.
class Decode {
 public:
  // The pipeline of tensor-parallel rank `tensor_rank` (its parts of every
  // stage), for a pass over `prompts`, the first of which is sequence
  // `first_sequence` of the call (its seed and the index on_token reports);
  // activations travel in `wire` (the stages' format).
  Decode(const std::vector<std::unique_ptr<nn::Stage>>& stages, RankGroup& group, int tensor_rank,
         std::span<const std::vector<std::int32_t>> prompts, int first_sequence, const InferenceOptions& options,
         ComputeFormat wire)
      : stages_(stages),
        prompts_(prompts),
        first_sequence_(first_sequence),
        options_(options),
        p_(static_cast<int>(stages.size())),
        m_(options.microbatches),
        reports_(tensor_rank == 0),
        collects_(p_ > 1 && !group.shares_process(group.layout().world_rank(0, 0, tensor_rank),
                                                  group.layout().world_rank(p_ - 1, 0, tensor_rank))),
        first_(group_firsts(static_cast<int>(prompts.size()), m_)),
        chunks_(prefill_chunks(prompts, first_, options.prefill_chunk)),
        units_(static_cast<int>(chunks_.size())),
        prefill_(make_schedule("inference", p_, units_)),
        round_(make_schedule("inference", p_, m_)),
        timeout_(std::chrono::duration_cast<Clock::duration>(options.timeout)),
        busy_(stages.size(), 0.0),
        decode_cpu_(stages.size(), 0.0) {
    const int sequences = static_cast<int>(prompts.size());
    last_chunk_.resize(static_cast<std::size_t>(m_));
    for (int u = 0; u < units_; ++u) last_chunk_[static_cast<std::size_t>(chunks_[static_cast<std::size_t>(u)].group)] = u;
    for (const auto& stage : stages) {
      // A cache does not move (its tensor is charged to its own account): new
      // constructs it in place from make_kv_cache's result.
      caches_.emplace_back(stage ? new nn::KvCache(stage->make_kv_cache(sequences)) : nullptr);
    }
    // Message ids: the prefill's chunks 0 … units − 1, then units + (step −
    // 1) · m + group for the decode steps (key). An inbox holds a
    // step's m messages, the last step's tokens and a few chunks ahead.
    transport_ = group.pipeline_transport(
        0, tensor_rank, {.inbox_capacity = std::vector<int>(stages.size(), m_ + 1 + std::min(units_, 8)),
            .stages = p_,
            .microbatches = units_ + m_ * (options.sampling.new_tokens - 1),
            .wire = wire});
    result_.tokens.resize(prompts.size());
    for (int s = 0; s < sequences; ++s) {
      rngs_.emplace_back(nn::derive_seed(options.sampling.seed, first_sequence + s));
    }
  }

  // Prefill (step 0: the chunks of every group, rank r's list of the
  // registry's inference schedule over them), then one token per step, each
  // step rank r's list over the groups.
  void run_rank(int r, Clock::time_point start) {
    for (const Action& action : prefill_.actions(RankId(r))) {
      const PrefillChunk& chunk = chunks_[static_cast<std::size_t>(action.microbatch.value())];
      if (!forward(r, 0, action.microbatch.value(), chunk.group, chunk.rows, start)) return;
    }
    for (int step = 1; step < options_.sampling.new_tokens; ++step) {
      for (const Action& action : round_.actions(RankId(r))) {
        const int g = action.microbatch.value();
        nn::SequenceRows rows{first_[static_cast<std::size_t>(g)], {}};
        rows.counts.assign(static_cast<std::size_t>(first_[static_cast<std::size_t>(g) + 1] - rows.first), 1);
        if (!forward(r, step, g, g, rows, start)) return;
      }
    }
    if (r == 0 && collects_) {  // the last step's tokens, which no stage forwards
      for (int g = 0; g < m_; ++g) {
        Tensor tokens;
        if (!receive_tokens(options_.sampling.new_tokens - 1, g, tokens)) return;
      }
    }
    if (transport_->complete_sends(RankId(r), deadline()) == WaitStatus::kTimedOut) {
      fail("rank {} waited {} s for its last messages to leave and gave up: another stage stalled", r,
           options_.timeout.count());
    }
  }

  // Rank r's forward of `rows` at `step` (message index: the chunk at step
  // 0, else the group g); the last rank samples the sequences whose prompt
  // or token is done and sends the group's tokens to the first once it has
  // them all. False when another rank failed.
  bool forward(int r, int step, int index, int g, const nn::SequenceRows& rows, Clock::time_point start) {
    nn::StageInput input;
    if (!receive_input(r, step, index, g, rows, input)) return false;
    const auto i = static_cast<std::size_t>(r);
    const Clock::time_point busy_from = Clock::now();
    const double cpu_from = step > 0 ? thread_cpu_seconds() : 0;
    Tensor out = stages_[i]->forward_cached(*caches_[i], rows, std::move(input));
    if (r + 1 < p_) {
      if (step > 0) decode_cpu_[i] += thread_cpu_seconds() - cpu_from;
      busy_[i] += seconds_since(busy_from);
      const MessageKey to = key(r, r + 1, step, index);
      return wait(r, transport_->send(to, std::move(out), deadline()), to);
    }
    const bool group_done = step > 0 || index == last_chunk_[static_cast<std::size_t>(g)];
    sample(step, g, rows, out);
    if (step > 0) decode_cpu_[i] += thread_cpu_seconds() - cpu_from;
    busy_[i] += seconds_since(busy_from);
    if (!group_done) return true;
    Tensor tokens = std::move(group_tokens_);
    group_tokens_.reset();
    if (step == 0 && g == m_ - 1) result_.time_to_first_token_s = seconds_since(start);
    if (p_ == 1 || (step + 1 == options_.sampling.new_tokens && !collects_)) return true;
    const MessageKey to = key(r, 0, step, index);
    return wait(r, transport_->send(to, std::move(tokens), deadline()), to);
  }

  void abort() { transport_->abort(); }

  // Group g holds sequences ⌊S·g/m⌋ … ⌊S·(g+1)/m⌋ − 1: its first, then S.
  static std::vector<int> group_firsts(int sequences, int groups) {
    std::vector<int> firsts;
    for (int g = 0; g <= groups; ++g) {
      firsts.push_back(static_cast<int>(std::int64_t{sequences} * g / groups));
    }
    return firsts;
  }

  // How generate cuts the prefill: group g's prompts, one after another, in
  // pieces of at most `chunk` rows (0: the whole group at once), in order.
  struct PrefillChunk {
    int group = 0;
    nn::SequenceRows rows;  // each sequence's next rows, from its cached length on
  };
  static std::vector<PrefillChunk> prefill_chunks(std::span<const std::vector<std::int32_t>> prompts,
                                                  const std::vector<int>& firsts, int chunk) {
    std::vector<PrefillChunk> chunks;
    for (int g = 0; g + 1 < static_cast<int>(firsts.size()); ++g) {
      PrefillChunk piece{g, {}};
      int room = chunk > 0 ? chunk : std::numeric_limits<int>::max();
      for (int s = firsts[static_cast<std::size_t>(g)]; s < firsts[static_cast<std::size_t>(g) + 1]; ++s) {
        for (int left = static_cast<int>(prompts[static_cast<std::size_t>(s)].size()); left > 0;) {
          if (piece.rows.counts.empty()) piece.rows.first = s;
          const int take = std::min(left, room);
          piece.rows.counts.push_back(take);
          left -= take;
          room -= take;
          if (room == 0) {
            chunks.push_back(std::move(piece));
            piece = {g, {}};
            room = chunk;
          }
        }
      }
      if (!piece.rows.counts.empty()) chunks.push_back(std::move(piece));
    }
    return chunks;
  }

  // Rank r's figures, to gather over the pipeline: its busy time, its
  // cache's bytes, the time to the first tokens (the last rank's), its
  // seconds and its decode's CPU time.
  static constexpr std::size_t kFigures = 5;
  std::array<double, kFigures> figures(int r, double seconds) const {
    const auto i = static_cast<std::size_t>(r);
    const double kv_bytes = caches_[i] ? static_cast<double>(caches_[i]->memory().live_bytes()) : 0.0;
    return {busy_[i], kv_bytes, r == p_ - 1 ? result_.time_to_first_token_s : 0.0, seconds, decode_cpu_[i]};
  }

  // From every rank's figures, rank by rank.
  InferenceResult result(const std::vector<int>& boundaries, const std::vector<double>& all) {
    const auto p = static_cast<std::size_t>(p_);
    const auto at = [&](std::size_t rank, std::size_t figure) { return all[kFigures * rank + figure]; };
    for (std::size_t i = 0; i < p; ++i) result_.seconds = std::max(result_.seconds, at(i, 3));
    result_.time_to_first_token_s = at(p - 1, 2);  // the last stage samples the first tokens
    result_.prefill_s = result_.time_to_first_token_s;
    for (std::size_t i = 0; i < p; ++i) {
      result_.stages.push_back({.layers = {boundaries[i], boundaries[i + 1]},
                                .busy_s = at(i, 0),
                                .busy_share = result_.seconds > 0 ? at(i, 0) / result_.seconds : 0,
                                .decode_cpu_s = at(i, 4),
                                .kv_cache_bytes = static_cast<std::int64_t>(at(i, 1))});
    }
    return std::move(result_);
  }

 private:
  // The message from rank `from` to rank `to` of group g at `step`: an
  // activation to the next stage, or the sampled tokens back to the first.
  // `index` is the chunk at step 0 (the group's last chunk for its tokens),
  // else the group.
  MessageKey key(int from, int to, int step, int index) const {
    return {RankId(from), RankId(to), StageId(from),
            MicrobatchId(step == 0 ? index : units_ + (step - 1) * m_ + index),
            to > from ? Direction::kActivation : Direction::kSampledTokens};
  }
  Deadline deadline() const { return Clock::now() + timeout_; }

  // False when another rank failed (the transport was aborted).
  bool wait(int r, WaitStatus status, const MessageKey& key) const {
    if (status == WaitStatus::kTimedOut) {
      fail("rank {} waited {} s for the {} and gave up: another stage stalled", r, options_.timeout.count(),
           describe(key));
    }
    return status == WaitStatus::kOk;
  }

  // The first stage's tokens: the chunk's rows of the prompts at step 0
  // (each from its cached length on), then the tokens the last stage sampled
  // at the step before; every other stage's activation.
  bool receive_input(int r, int step, int index, int g, const nn::SequenceRows& rows, nn::StageInput& input) {
    nn::Stage& stage = *stages_[static_cast<std::size_t>(r)];
    const int begin = rows.first;
    const int count = static_cast<int>(rows.counts.size());
    if (r > 0) {
      const MessageKey from = key(r - 1, r, step, index);
      return wait(r, transport_->receive(from, Shape{1, rows.total(), stage.config().n_embd}, stage.allocator(),
                                         deadline(), input.activation),
                  from);
    }
    input.tokens = IntTensor(Shape{1, rows.total()});
    if (step == 0) {
      std::int32_t* out = input.tokens.data();
      for (int i = 0; i < count; ++i) {
        const auto& prompt = prompts_[static_cast<std::size_t>(begin + i)];
        const auto from = prompt.begin() + caches_.front()->length(begin + i);
        out = std::copy(from, from + rows.counts[static_cast<std::size_t>(i)], out);
      }
    } else if (p_ == 1) {
      for (int i = 0; i < count; ++i) input.tokens[i] = result_.tokens[static_cast<std::size_t>(begin + i)].back();
    } else {
      Tensor tokens;
      if (!receive_tokens(step - 1, g, tokens)) return false;
      for (int i = 0; i < count; ++i) input.tokens[i] = static_cast<std::int32_t>(tokens[i]);
    }
    return true;
  }

  // On the first stage: the tokens the last stage sampled for group g at
  // `step`; recorded and reported here when this process collects them.
  bool receive_tokens(int step, int g, Tensor& tokens) {
    const int begin = first_[static_cast<std::size_t>(g)];
    const int count = first_[static_cast<std::size_t>(g) + 1] - begin;
    const MessageKey from = key(p_ - 1, 0, step, step == 0 ? last_chunk_[static_cast<std::size_t>(g)] : g);
    if (!wait(0, transport_->receive(from, Shape{1, count}, stages_.front()->allocator(), deadline(), tokens), from)) {
      return false;
    }
    if (collects_) {
      for (int i = 0; i < count; ++i) record(begin + i, step, static_cast<std::int32_t>(tokens[i]), {});
    }
    return true;
  }

  void record(int sequence, int step, std::int32_t token, std::span<const float> logits) {
    result_.tokens[static_cast<std::size_t>(sequence)].push_back(token);
    if (options_.on_token && reports_) options_.on_token({first_sequence_ + sequence, step, token, logits});
  }

  // A layer's output past the format's range (fp16's 65504) reaches the
  // logits as inf or NaN: no token can be sampled from them.
  void check_finite(int sequence, int step, std::span<const float> row, ComputeFormat format) const {
    const auto bad = std::find_if(row.begin(), row.end(), [](float v) { return !std::isfinite(v); });
    if (bad == row.end()) return;
    fail("prompt {}: the logits of new token {} hold {} (token id {}): a layer's output overflowed {}{}",
         first_sequence_ + sequence, step, *bad, bad - row.begin(), to_string(format),
         format == ComputeFormat::kFp16 ? " (largest value 65504): generate with --bf16 or in fp32"
                                        : ": the weights drive the activations past the format's range");
  }

  // On the last stage: a token for each sequence of `rows` whose prompt is
  // done (at step 0 a chunk may end inside one: its logits row is not the
  // prompt's last), from its logits row, recorded and reported; kept as a
  // float in group g's tokens for the first stage.
  void sample(int step, int g, const nn::SequenceRows& rows, const Tensor& logits) {
    nn::Stage& stage = *stages_.back();
    const nn::KvCache& cache = *caches_.back();
    const auto vocab = static_cast<std::size_t>(stage.config().vocab_size);
    const int group_first = first_[static_cast<std::size_t>(g)];
    if (group_tokens_.empty()) {
      group_tokens_ = Tensor(Shape{1, first_[static_cast<std::size_t>(g) + 1] - group_first}, stage.allocator());
    }
    for (std::size_t i = 0; i < rows.counts.size(); ++i) {
      const int s = rows.first + static_cast<int>(i);
      if (step == 0 && cache.length(s) < static_cast<int>(prompts_[static_cast<std::size_t>(s)].size())) continue;
      const auto row = logits.span().subspan(i * vocab, vocab);
      check_finite(s, step, row, stage.options().format);
      const std::int32_t token = nn::sample_token(row, options_.sampling, rngs_[static_cast<std::size_t>(s)]);
      if (!collects_) record(s, step, token, row);
      group_tokens_[s - group_first] = static_cast<float>(token);
    }
  }

  const std::vector<std::unique_ptr<nn::Stage>>& stages_;  // null: another process's
  const std::span<const std::vector<std::int32_t>> prompts_;
  const int first_sequence_;
  const InferenceOptions& options_;
  const int p_;
  const int m_;
  const bool reports_;   // tensor-parallel rank 0's pipeline: the others sample the same tokens silently
  const bool collects_;  // the last stage runs in another process: rank 0 records the tokens it sends
  const std::vector<int> first_;            // group g holds sequences first_[g] … first_[g + 1] − 1
  const std::vector<PrefillChunk> chunks_;  // the prefill's, in order
  const int units_;                         // chunks_.size(): the prefill's micro-batches
  const Schedule prefill_;                  // the inference schedule over the chunks
  const Schedule round_;                    // over the groups, every decode step
  const Clock::duration timeout_;
  std::vector<int> last_chunk_;             // per group: its last chunk (its tokens' message index)
  Tensor group_tokens_;                     // the last stage's tokens of the group being sampled
  std::vector<std::unique_ptr<nn::KvCache>> caches_;  // null for another process's stage
  std::unique_ptr<Transport> transport_;
  std::vector<double> busy_;
  std::vector<double> decode_cpu_;  // per stage: its thread's CPU seconds in the decode's forwards and sampling
  std::vector<nn::Rng> rngs_;  // per sequence, used by the last rank only
  InferenceResult result_;
};

}  // namespace

std::int64_t InferenceResult::new_tokens() const {
  std::int64_t total = 0;
  for (const auto& sequence : tokens) total += static_cast<std::int64_t>(sequence.size());
  return total;
}

double InferenceResult::decode_tokens_per_s() const {
  const double decoding = seconds - prefill_s;
  const auto after_first = static_cast<double>(new_tokens()) - static_cast<double>(tokens.size());
  return decoding > 0 && after_first > 0 ? after_first / decoding : 0;
}

InferencePipeline::InferencePipeline(const nn::Stage& model, int stages, const PartitionMethod& partition,
                                     int tensor_parallel, ComputeFormat format)
    : config_(model.config()), format_(format), own_group_(in_threads(stages, tensor_parallel)), group_(own_group_.get()) {
  start(partition);
  for (auto& pipeline : stages_) {
    for (auto& stage : pipeline) stage->copy_parameters_from(model);
  }
  pack_stages();
}

InferencePipeline::InferencePipeline(const nn::SafetensorsFile& weights, int stages,
                                     const PartitionMethod& partition)
    : config_(nn::read_config(weights)), own_group_(in_threads(stages, 1)), group_(own_group_.get()) {
  start(partition);
  for (auto& stage : stages_.front()) nn::load_parameters(*stage, weights);
  pack_stages();
}

InferencePipeline::InferencePipeline(const nn::SafetensorsFile& weights, RankGroup& group,
                                     const PartitionMethod& partition, ComputeFormat format)
    : config_(nn::read_config(weights)), format_(format), group_(&group) {
  const RankLayout& layout = group.layout();
  if (layout.data_parallel != 1) {
    fail("{} ranks in pipelines of {}: generate runs one pipeline; start mpirun -np {}", layout.world_size(),
         layout.pipeline, layout.pipeline);
  }
  start(partition);
  for (auto& pipeline : stages_) {
    for (auto& stage : pipeline) {
      if (stage) nn::load_parameters(*stage, weights);
    }
  }
  pack_stages();
}

InferencePipeline::~InferencePipeline() = default;

std::unique_ptr<RankGroup> InferencePipeline::in_threads(int stages, int tensor_parallel) {
  if (stages < 1) fail("--stages {}: must be at least 1", stages);
  if (tensor_parallel < 1) fail("--tensor-parallel {}: must be at least 1", tensor_parallel);
  return RankGroup::in_threads({.pipeline = stages, .data_parallel = 1, .tensor = tensor_parallel});
}

void InferencePipeline::start(const PartitionMethod& partition) {
  const RankLayout& layout = group_->layout();
  const int stages = layout.pipeline;
  nn::validate_tensor_parallel(config_, layout.tensor);
  boundaries_ = partition_model(config_, stages, partition, 1, config_.context, hardware_preset("cpu"));
  collectives_.resize(static_cast<std::size_t>(layout.world_size()));
  stages_.resize(static_cast<std::size_t>(layout.tensor));
  for (int t = 0; t < layout.tensor; ++t) {
    for (int i = 0; i < stages; ++i) {
      const int w = layout.world_rank(i, 0, t);
      const auto b = static_cast<std::size_t>(i);
      if (!group_->is_local(w)) {
        stages_[static_cast<std::size_t>(t)].push_back(nullptr);
        continue;
      }
      auto& collectives = collectives_[static_cast<std::size_t>(w)];
      if (layout.tensor > 1) collectives = std::make_unique<TensorCollectives>(group_->tensor(w), std::chrono::hours(1));
      stages_[static_cast<std::size_t>(t)].push_back(std::make_unique<nn::Stage>(
          config_, nn::LayerRange{boundaries_[b], boundaries_[b + 1]},
          nn::StageOptions{.name = layout.tensor > 1 ? fmt::format("stage {} (tensor-parallel rank {})", i, t)
                                                     : fmt::format("stage {}", i),
                           .format = format_,
                           .tensor = collectives.get()}));
    }
  }
}

void InferencePipeline::pack_stages() {
  for (auto& pipeline : stages_) {
    for (auto& stage : pipeline) {
      if (stage) stage->pack_for_inference();
    }
  }
}

std::vector<int> InferencePipeline::pass_starts(const std::vector<std::vector<std::int32_t>>& prompts,
                                                std::int64_t max_pass_bytes) const {
  const double cache = static_cast<double>(
      kv_cache_bytes(config_.n_layer, config_.kv_heads(), config_.head_size(), sizeof(float), config_.context, 1));
  // block.0's activations of one token (every block's are the same).
  const double per_token =
      pipeline_layers(model_spec(config_), {.micro_batch = 1, .seq_length = 1, .bytes_per_element = 4})
          .at(1)
          .activation_bytes;
  const double logits = sizeof(float) * static_cast<double>(config_.vocab_size);
  std::vector<int> starts;
  double bytes = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const double prompt = cache + per_token * static_cast<double>(prompts[i].size()) + logits;
    if (starts.empty() || bytes + prompt > static_cast<double>(max_pass_bytes)) {
      starts.push_back(static_cast<int>(i));
      bytes = 0;
    }
    bytes += prompt;
  }
  starts.push_back(static_cast<int>(prompts.size()));
  return starts;
}

InferenceResult InferencePipeline::generate(const std::vector<std::vector<std::int32_t>>& prompts,
                                            const InferenceOptions& options) {
  options.sampling.validate();
  check_prompts(prompts, config_, options.sampling.new_tokens);
  const int sequences = static_cast<int>(prompts.size());
  if (options.microbatches < 1 || options.microbatches > sequences) {
    fail("--microbatches {}: must lie in [1, {}] (the number of prompts): each micro-batch is a group of at least "
         "one sequence",
         options.microbatches, sequences);
  }
  if (options.prefill_chunk < 0) {
    fail("--prefill-chunk {}: must be >= 0 (tokens of a prompt's prefill each chunk passes the stages with; 0: the "
         "whole prompt at once): give 0 or a positive count such as {}",
         options.prefill_chunk, kDefaultPrefillChunk);
  }
  const std::vector<int> starts = pass_starts(prompts, options.max_pass_bytes);
  InferenceResult all;
  for (std::size_t k = 0; k + 1 < starts.size(); ++k) {
    const int first = starts[k];
    const int count = starts[k + 1] - first;
    InferenceOptions pass = options;
    pass.microbatches = std::min(options.microbatches, count);
    InferenceResult done = generate_pass(std::span(prompts).subspan(first, count), first, pass);
    if (first == 0) {
      all = std::move(done);
      continue;
    }
    ++all.passes;
    for (auto& tokens : done.tokens) all.tokens.push_back(std::move(tokens));
    all.seconds += done.seconds;
    all.prefill_s += done.prefill_s;
    for (std::size_t i = 0; i < all.stages.size(); ++i) {
      all.stages[i].busy_s += done.stages[i].busy_s;
      all.stages[i].decode_cpu_s += done.stages[i].decode_cpu_s;
      all.stages[i].kv_cache_bytes = std::max(all.stages[i].kv_cache_bytes, done.stages[i].kv_cache_bytes);
    }
  }
  for (StageInference& stage : all.stages) stage.busy_share = all.seconds > 0 ? stage.busy_s / all.seconds : 0;
  return all;
}

InferenceResult InferencePipeline::generate_pass(std::span<const std::vector<std::int32_t>> prompts,
                                                 int first_sequence, const InferenceOptions& options) {
  // One pipeline per tensor-parallel rank (those with a stage here).
  const RankLayout& layout = group_->layout();
  std::vector<std::unique_ptr<Decode>> decodes(static_cast<std::size_t>(layout.tensor));
  for (const int w : group_->local_ranks()) {
    auto& decode = decodes[static_cast<std::size_t>(layout.tensor_rank(w))];
    if (!decode) {
      decode = std::make_unique<Decode>(stages_[static_cast<std::size_t>(layout.tensor_rank(w))], *group_,
                                        layout.tensor_rank(w), prompts, first_sequence, options, format_);
    }
  }
  for (auto& collectives : collectives_) {
    if (collectives) collectives->set_timeout(options.timeout);
  }
  std::vector<double> figures;
  group_->run(
      [&](int w) {
        Communicator& pipeline = group_->pipeline(w);
        Decode& decode = *decodes[static_cast<std::size_t>(layout.tensor_rank(w))];
        const int r = pipeline.rank();
        // Every rank starts together: the loading of weights is not the generation's time.
        group_->world(w).barrier(deadline_after(options.timeout), "the start of the generation");
        const Clock::time_point start = Clock::now();
        decode.run_rank(r, start);
        std::vector<double> all = pipeline.all_gather(decode.figures(r, seconds_since(start)),
                                                      deadline_after(options.timeout),
                                                      "every stage's figures of the generation");
        if (w == group_->local_ranks().front()) figures = std::move(all);
      },
      [&] {
        for (auto& decode : decodes) {
          if (decode) decode->abort();
        }
      });
  for (auto& collectives : collectives_) {
    if (collectives) collectives->take(Clock::now());  // timed for training's records; a generation keeps none
  }
  return decodes[static_cast<std::size_t>(layout.tensor_rank(group_->local_ranks().front()))]->result(boundaries_,
                                                                                                      figures);
}

}  // namespace pipeflow::runtime
