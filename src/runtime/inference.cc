#include "pipeflow/runtime/inference.h"

#include <fmt/format.h>

#include <exception>
#include <mutex>

#include "pipeflow/core/error.h"
#include "pipeflow/model/hardware.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/runtime/in_process_transport.h"
#include "pipeflow/runtime/rank_threads.h"
#include "pipeflow/runtime/report.h"
#include "pipeflow/runtime/stage_partition.h"

namespace pipeflow::runtime {
namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void check_prompts(const std::vector<std::vector<std::int32_t>>& prompts, const nn::GptConfig& config,
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

}  // namespace

std::int64_t InferenceResult::new_tokens() const {
  std::int64_t total = 0;
  for (const auto& sequence : tokens) total += static_cast<std::int64_t>(sequence.size());
  return total;
}

struct InferencePipeline::Workers {
  explicit Workers(int ranks) : threads(ranks) {}
  RankThreads threads;
};

InferencePipeline::InferencePipeline(const nn::Stage& model, int stages, const PartitionMethod& partition)
    : config_(model.config()) {
  if (stages < 1) fail("--stages {}: must be at least 1", stages);
  start(partition_model(config_, stages, partition, 1, config_.context, hardware_preset("cpu")));
  for (auto& stage : stages_) stage->copy_parameters_from(model);
}

InferencePipeline::InferencePipeline(const nn::SafetensorsFile& weights, int stages,
                                     const PartitionMethod& partition)
    : config_(nn::read_config(weights)) {
  if (stages < 1) fail("--stages {}: must be at least 1", stages);
  start(partition_model(config_, stages, partition, 1, config_.context, hardware_preset("cpu")));
  for (auto& stage : stages_) nn::load_parameters(*stage, weights);
}

InferencePipeline::~InferencePipeline() = default;

void InferencePipeline::start(const std::vector<int>& boundaries) {
  for (std::size_t i = 0; i + 1 < boundaries.size(); ++i) {
    stages_.push_back(std::make_unique<nn::Stage>(config_, nn::LayerRange{boundaries[i], boundaries[i + 1]},
                                                  nn::StageOptions{.name = fmt::format("stage {}", i)}));
  }
  workers_ = std::make_unique<Workers>(num_stages());
}

InferenceResult InferencePipeline::generate(const std::vector<std::vector<std::int32_t>>& prompts,
                                            const InferenceOptions& options) {
  options.sampling.validate();
  const int new_tokens = options.sampling.new_tokens;
  check_prompts(prompts, config_, new_tokens);
  const int sequences = static_cast<int>(prompts.size());
  const int p = num_stages();
  const int m = options.microbatches;
  if (m < 1 || m > sequences) {
    fail("--microbatches {}: must lie in [1, {}] (the number of prompts): each micro-batch is a group of at least "
         "one sequence",
         m, sequences);
  }
  // Group g holds sequences first[g] … first[g + 1] − 1.
  std::vector<int> first(static_cast<std::size_t>(m) + 1);
  for (int g = 0; g <= m; ++g) first[static_cast<std::size_t>(g)] = sequences * g / m;

  std::vector<std::unique_ptr<nn::KvCache>> caches;
  for (auto& stage : stages_) {
    // A cache does not move (its tensor is charged to its own account): new
    // constructs it in place from make_kv_cache's result.
    caches.emplace_back(new nn::KvCache(stage->make_kv_cache(sequences)));
  }
  InProcessTransport transport(std::vector<int>(static_cast<std::size_t>(p), m + 1),
                               p <= usable_cores() ? kHandoffSpin : std::chrono::nanoseconds(0));
  InferenceResult result;
  result.tokens.resize(static_cast<std::size_t>(sequences));
  std::vector<double> busy(static_cast<std::size_t>(p), 0.0);
  std::mutex error_mutex;
  std::exception_ptr error;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(options.timeout);
  const Clock::time_point start = Clock::now();

  auto run_rank = [&](int r) {
    nn::Stage& stage = *stages_[static_cast<std::size_t>(r)];
    nn::KvCache& cache = *caches[static_cast<std::size_t>(r)];
    const bool last = r == p - 1;
    std::vector<nn::Rng> rngs;
    for (int s = 0; last && s < sequences; ++s) rngs.emplace_back(nn::derive_seed(options.sampling.seed, s));
    auto wait = [&](WaitStatus status, const MessageKey& key) {
      if (status == WaitStatus::kTimedOut) {
        fail("rank {} waited {} s for the {} and gave up: another stage stalled", r, options.timeout.count(),
             describe(key));
      }
      return status == WaitStatus::kOk;
    };
    for (int step = 0; step < new_tokens; ++step) {
      for (int g = 0; g < m; ++g) {
        const int begin = first[static_cast<std::size_t>(g)];
        const int end = first[static_cast<std::size_t>(g) + 1];
        nn::SequenceRows rows{begin, {}};
        for (int s = begin; s < end; ++s) {
          rows.counts.push_back(step == 0 ? static_cast<int>(prompts[static_cast<std::size_t>(s)].size()) : 1);
        }
        const MicrobatchId id(step * m + g);
        const MicrobatchId previous(step * m + g - m);
        nn::StageInput input;
        if (r == 0) {
          input.tokens = IntTensor(Shape{1, rows.total()});
          if (step == 0) {
            std::int32_t* out = input.tokens.data();
            for (int s = begin; s < end; ++s) out = std::copy(prompts[s].begin(), prompts[s].end(), out);
          } else if (p == 1) {
            for (int s = begin; s < end; ++s) input.tokens[s - begin] = result.tokens[s].back();
          } else {
            const MessageKey key{RankId(p - 1), RankId(0), StageId(p - 1), previous};
            Tensor tokens;
            if (!wait(transport.receive(key, Shape{1, end - begin}, stage.allocator(), Clock::now() + timeout, tokens),
                      key)) {
              return;
            }
            for (int s = begin; s < end; ++s) input.tokens[s - begin] = static_cast<std::int32_t>(tokens[s - begin]);
          }
        } else {
          const MessageKey key{RankId(r - 1), RankId(r), StageId(r - 1), id};
          if (!wait(transport.receive(key, Shape{1, rows.total(), config_.n_embd}, stage.allocator(),
                                      Clock::now() + timeout, input.activation),
                    key)) {
            return;
          }
        }
        const Clock::time_point busy_from = Clock::now();
        Tensor out = stage.forward_cached(cache, rows, std::move(input));
        if (!last) {
          busy[static_cast<std::size_t>(r)] += seconds_since(busy_from);
          const MessageKey key{RankId(r), RankId(r + 1), StageId(r), id};
          if (!wait(transport.send(key, std::move(out), Clock::now() + timeout), key)) return;
          continue;
        }
        Tensor tokens(Shape{1, end - begin}, stage.allocator());
        for (int s = begin; s < end; ++s) {
          const auto logits = out.span().subspan(static_cast<std::size_t>(s - begin) * config_.vocab_size,
                                                 static_cast<std::size_t>(config_.vocab_size));
          const std::int32_t token = nn::sample_token(logits, options.sampling, rngs[static_cast<std::size_t>(s)]);
          result.tokens[static_cast<std::size_t>(s)].push_back(token);
          tokens[s - begin] = static_cast<float>(token);
          if (options.on_token) options.on_token({s, step, token, logits});
        }
        busy[static_cast<std::size_t>(r)] += seconds_since(busy_from);
        if (step == 0 && g == m - 1) result.time_to_first_token_s = seconds_since(start);
        if (p > 1 && step + 1 < new_tokens) {
          const MessageKey key{RankId(p - 1), RankId(0), StageId(p - 1), id};
          if (!wait(transport.send(key, std::move(tokens), Clock::now() + timeout), key)) return;
        }
      }
    }
  };
  workers_->threads.run([&](int r) {
    try {
      run_rank(r);
    } catch (...) {
      const std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
      transport.abort();
    }
  });
  if (error) std::rethrow_exception(error);
  result.seconds = seconds_since(start);
  for (int r = 0; r < p; ++r) {
    const auto i = static_cast<std::size_t>(r);
    result.stages.push_back({.layers = stages_[i]->layers(),
                             .busy_s = busy[i],
                             .busy_share = result.seconds > 0 ? busy[i] / result.seconds : 0,
                             .kv_cache_bytes = caches[i]->memory().live_bytes()});
  }
  return result;
}

}  // namespace pipeflow::runtime
