#include "pipeflow/sim/inference.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "pipeflow/core/error.h"
#include "pipeflow/core/table.h"
#include "pipeflow/core/units.h"
#include "pipeflow/model/model_states.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/sim/cost_model.h"

namespace pipeflow {

InferenceSetup resolve_inference_setup(const InferenceSetup& in) {
  validate_model(in.model);
  validate_hardware(in.hardware);
  if (in.model.vision) {
    fail("model {} has a vision tower: pipeflow prices the inference of language models; give its language model "
         "alone (a config.json of its text_config)",
         in.model.name);
  }
  InferenceSetup s = in;
  if (s.stages < 1) fail("stages = {}: must be >= 1 (pipeline stages, one device each)", s.stages);
  if (s.sequences < 1) fail("sequences = {}: must be >= 1 (concurrent sequences)", s.sequences);
  if (s.microbatches == 0) s.microbatches = std::min(s.stages, s.sequences);
  if (s.microbatches < 1 || s.microbatches > s.sequences) {
    fail("microbatches = {}: must lie in [1, sequences = {}] (a group holds at least one sequence)", s.microbatches,
         s.sequences);
  }
  if (s.context == 0) s.context = s.model.max_positions;
  if (s.context < 1 || s.context > kMaxModelPositions) {
    fail("context = {}: must lie in [1, {}] tokens", s.context, kMaxModelPositions);
  }
  if (s.model.architecture == Architecture::kGpt && s.context > s.model.max_positions) {
    fail("context = {}: {} has a position table of {} positions; use --context {} or less", s.context, s.model.name,
         s.model.max_positions, s.model.max_positions);
  }
  if (s.prompt_tokens == 0) s.prompt_tokens = s.context;
  if (s.prompt_tokens < 1 || s.prompt_tokens > s.context) {
    fail("prompt tokens = {}: must lie in [1, context = {}]", s.prompt_tokens, s.context);
  }
  if (s.prefill_chunk < 0) {
    fail("prefill chunk = {}: must be >= 0 (tokens per prefill chunk; 0: a group's prompts in one piece)",
         s.prefill_chunk);
  }
  if (s.bytes_per_value != 2 && s.bytes_per_value != 4) {
    fail("bytes per value = {}: must be 2 (bf16) or 4 (fp32)", s.bytes_per_value);
  }
  return s;
}

namespace {

// Group g of M holds ⌊S·g/M⌋ … ⌊S·(g+1)/M⌋ − 1, as pipeflow generate cuts them.
std::vector<int> group_sizes(int sequences, int groups) {
  std::vector<int> sizes;
  for (int g = 0; g < groups; ++g) {
    const auto first = static_cast<std::int64_t>(sequences) * g / groups;
    const auto end = static_cast<std::int64_t>(sequences) * (g + 1) / groups;
    sizes.push_back(static_cast<int>(end - first));
  }
  return sizes;
}

// The chunks a group of n prompts of T tokens makes: ⌈n · T / C⌉ (one for C = 0).
std::int64_t chunk_count(int n, std::int64_t tokens, std::int64_t chunk) {
  return chunk > 0 ? (n * tokens + chunk - 1) / chunk : 1;
}

// A group of n prompts of T tokens, one after another, cut into chunks of at
// most C rows (0: one chunk), as pipeflow generate cuts them; whole prompts
// side by side in a chunk are one piece of their count, so a chunk has at
// most three pieces (the end of a prompt, whole ones, the start of one).
std::vector<std::vector<PrefillPiece>> prefill_chunks(int n, std::int64_t tokens, std::int64_t chunk) {
  std::vector<std::vector<PrefillPiece>> chunks(1);
  const std::int64_t size = chunk > 0 ? chunk : n * tokens;
  std::int64_t room = size;
  std::int64_t done = 0;  // tokens of sequence i in earlier pieces
  for (std::int64_t i = 0; i < n;) {
    if (room == 0) {
      chunks.emplace_back();
      room = size;
    }
    if (done == 0 && room >= tokens) {
      const std::int64_t whole = std::min<std::int64_t>(n - i, room / tokens);
      chunks.back().push_back({.rows = tokens, .cached = 0, .ends_prompt = true, .count = whole});
      i += whole;
      room -= whole * tokens;
      continue;
    }
    const std::int64_t take = std::min(tokens - done, room);
    chunks.back().push_back({.rows = take, .cached = done, .ends_prompt = done + take == tokens});
    done += take;
    room -= take;
    if (done == tokens) {
      ++i;
      done = 0;
    }
  }
  return chunks;
}

std::int64_t chunk_tokens(const std::vector<PrefillPiece>& chunk) {
  std::int64_t tokens = 0;
  for (const PrefillPiece& piece : chunk) tokens += piece.rows * piece.count;
  return tokens;
}

// The prefill of one chunk by each kind of layer (every block costs the same).
struct ChunkSeconds {
  double embedding = 0;
  double block = 0;
  double head = 0;
};

// A stage's layers by kind.
struct StageLayers {
  int embedding = 0;
  int blocks = 0;
  int head = 0;
  double seconds(const ChunkSeconds& c) const { return embedding * c.embedding + blocks * c.block + head * c.head; }
};

StageLayers stage_layers(const std::vector<PipelineLayer>& layers, const StagePlan& plan) {
  StageLayers out;
  for (int i = plan.first; i < plan.end; ++i) {
    const LayerKind kind = layers[static_cast<std::size_t>(i)].kind;
    (kind == LayerKind::kBlock ? out.blocks : kind == LayerKind::kHead ? out.head : out.embedding) += 1;
  }
  return out;
}

// One stage's decode of a group of n sequences.
class DecodePricer {
 public:
  DecodePricer(const InferenceSetup& s, const std::vector<PipelineLayer>& layers, const StagePlan& plan)
      : s_(s), layers_(layers), plan_(plan) {}

  double operator()(int n) {
    auto it = priced_.find(n);
    if (it != priced_.end()) return it->second;
    DecodeWork work;
    for (int i = plan_.first; i < plan_.end; ++i) {
      work += layer_decode_work(s_.model, layers_[static_cast<std::size_t>(i)], n, s_.context, s_.bytes_per_value);
    }
    return priced_.emplace(n, decode_seconds(work, s_.hardware)).first->second;
  }

 private:
  const InferenceSetup& s_;
  const std::vector<PipelineLayer>& layers_;
  const StagePlan& plan_;
  std::map<int, double> priced_;
};

InferenceStage stage_memory(const InferenceSetup& s, const std::vector<PipelineLayer>& layers, const StagePlan& plan,
                            int largest_group) {
  InferenceStage stage;
  stage.first_layer = plan.first;
  stage.end_layer = plan.end;
  stage.layers = plan.end - plan.first == 1 ? layers[static_cast<std::size_t>(plan.first)].name
                                            : layers[static_cast<std::size_t>(plan.first)].name + " .. " +
                                                  layers[static_cast<std::size_t>(plan.end - 1)].name;
  for (int i = plan.first; i < plan.end; ++i) {
    if (layers[static_cast<std::size_t>(i)].kind == LayerKind::kBlock) ++stage.blocks;
  }
  stage.parameters = plan.parameters;
  const double e = s.bytes_per_value;
  stage.weight_bytes = e * static_cast<double>(plan.parameters);
  stage.kv_cache_bytes = static_cast<double>(kv_cache_bytes(stage.blocks, s.model.kv_heads,
                                                            s.model.hidden / s.model.heads, s.bytes_per_value,
                                                            s.context, s.sequences));
  const double h = s.model.hidden;
  const bool gpt = s.model.architecture == Architecture::kGpt;
  const double qkv = gpt ? 3 * h : h + kv_width(s.model);
  const double up = gpt ? s.model.ffn : 2.0 * s.model.ffn;
  const std::int64_t group_tokens = largest_group * s.prompt_tokens;
  const double tokens =
      static_cast<double>(s.prefill_chunk > 0 ? std::min(group_tokens, s.prefill_chunk) : group_tokens);
  stage.activation_bytes = e * tokens * (stage.blocks > 0 ? 2 * h + qkv + up : 2 * h);
  return stage;
}

}  // namespace

double InferencePrediction::peak_bytes() const {
  double peak = 0;
  for (const InferenceStage& stage : stages) peak = std::max(peak, stage.peak_bytes());
  return peak;
}

InferencePrediction predict_inference(const InferenceSetup& setup) {
  InferencePrediction out;
  out.setup = resolve_inference_setup(setup);
  const InferenceSetup& s = out.setup;
  ParallelConfig config;
  config.seq_length = static_cast<int>(s.prompt_tokens);
  config.bytes_per_element = s.bytes_per_value;
  const std::vector<PipelineLayer> layers = pipeline_layers(s.model, config);
  if (s.stages > static_cast<int>(layers.size())) {
    fail("stages = {}: {} has {} pipeline layers (embedding, {} blocks, head) and every stage needs one; use {} "
         "stages or fewer",
         s.stages, s.model.name, layers.size(), s.model.layers, layers.size());
  }
  // Made before anything sized by the groups: the generators refuse a
  // schedule past their limit, which bounds the groups too.
  make_schedule("inference", s.stages, s.microbatches);
  out.group_sizes = group_sizes(s.sequences, s.microbatches);
  const int largest = *std::max_element(out.group_sizes.begin(), out.group_sizes.end());
  std::int64_t chunks = 0;
  for (const int n : out.group_sizes) chunks += chunk_count(n, s.prompt_tokens, s.prefill_chunk);
  if (chunks * s.stages > Schedule::kMaxStageMicrobatches) {
    fail("prefill chunk = {}: the prompts make {} chunks, and {} stages × {} chunks pass the inference schedule's "
         "limit of {} (stage, chunk) pairs: use a larger prefill chunk (0: a group's prompts in one piece)",
         s.prefill_chunk, chunks, s.stages, chunks, Schedule::kMaxStageMicrobatches);
  }
  // The prefill's micro-batches: every group's chunks, group after group,
  // each priced once per size of group.
  std::map<int, std::vector<std::vector<PrefillPiece>>> chunks_of;
  std::map<int, std::vector<ChunkSeconds>> chunk_seconds;
  std::vector<std::pair<int, int>> units;  // (group size, chunk of it)
  for (const int n : out.group_sizes) {
    auto [it, added] = chunks_of.try_emplace(n);
    if (added) {
      it->second = prefill_chunks(n, s.prompt_tokens, s.prefill_chunk);
      for (const auto& chunk : it->second) {
        auto price = [&](LayerKind kind) {
          return layer_prefill_seconds(s.model, chunk, s.bytes_per_value, kind, s.hardware);
        };
        chunk_seconds[n].push_back({price(LayerKind::kEmbedding), price(LayerKind::kBlock), price(LayerKind::kHead)});
      }
    }
    for (std::size_t k = 0; k < it->second.size(); ++k) units.emplace_back(n, static_cast<int>(k));
  }
  out.prefill_chunks = static_cast<int>(units.size());
  const Schedule prefill = make_schedule("inference", s.stages, out.prefill_chunks);
  const Partition partition = partition_layers(layers, s.stages, s.partition, s.hardware);

  // prefill[r][u]: stage r's prefill of unit u; decode[r][g] its decode of group g.
  std::vector<std::vector<double>> prefill_s;
  std::vector<std::vector<double>> decode_s;
  for (const StagePlan& plan : partition.stages) {
    const StageLayers kinds = stage_layers(layers, plan);
    DecodePricer price(s, layers, plan);
    InferenceStage stage = stage_memory(s, layers, plan, largest);
    for (const ChunkSeconds& chunk : chunk_seconds.at(largest)) {
      stage.prefill_chunk_s.push_back(kinds.seconds(chunk));
      stage.prefill_s += stage.prefill_chunk_s.back();
    }
    stage.decode_s = price(largest);
    std::vector<double> units_s;
    for (const auto& [n, k] : units) units_s.push_back(kinds.seconds(chunk_seconds.at(n)[static_cast<std::size_t>(k)]));
    std::vector<double> groups_s;
    for (const int n : out.group_sizes) groups_s.push_back(price(n));
    out.stages.push_back(std::move(stage));
    prefill_s.push_back(std::move(units_s));
    decode_s.push_back(std::move(groups_s));
  }

  const double e = s.bytes_per_value;
  const double h = s.model.hidden;
  auto link = [&](int from, int to) { return link_between(s.hardware, from, to); };
  auto unit = [&](MicrobatchId k) { return static_cast<std::size_t>(k.value()); };

  ExecutionCosts costs;
  costs.duration = [&](const Action& a, RankId) {
    return prefill_s[static_cast<std::size_t>(a.stage.value())][unit(a.microbatch)];
  };
  costs.transfer = [&](const Action& a, RankId from, RankId to) {
    const auto& [n, k] = units[unit(a.microbatch)];
    const double tokens = static_cast<double>(chunk_tokens(chunks_of.at(n)[static_cast<std::size_t>(k)]));
    return link(from.value(), to.value()).transfer_seconds(e * tokens * h);
  };
  const Execution execution = execute(prefill, costs);
  out.time_to_first_token_s = execution.makespan;
  out.prefill_bubble = bubble_fraction(execution);

  double busiest = 0;
  for (const auto& stage : decode_s) {
    double busy = 0;
    for (const double g : stage) busy += g;
    busiest = std::max(busiest, busy);
  }
  double trip = 0;
  for (std::size_t g = 0; g < out.group_sizes.size(); ++g) {
    const double n = out.group_sizes[g];
    double around = 0;
    for (int r = 0; r < s.stages; ++r) {
      around += decode_s[static_cast<std::size_t>(r)][g];
      if (s.stages == 1) continue;
      const bool last = r + 1 == s.stages;
      // The next stage's input, or the sampled token ids (floats) back to the first.
      around += last ? link(r, 0).transfer_seconds(4 * n) : link(r, r + 1).transfer_seconds(e * n * h);
    }
    trip = std::max(trip, around);
  }
  out.per_token_s = std::max(busiest, trip);
  out.tokens_per_s = s.sequences / out.per_token_s;
  return out;
}

std::string inference_text(const InferencePrediction& p) {
  const InferenceSetup& s = p.setup;
  const int largest = *std::max_element(p.group_sizes.begin(), p.group_sizes.end());
  std::string out = fmt::format(
      "{} on {} × {} ({} per device), {}: {} of {}-token context, prompts of {} tokens, {} of at most {}\n",
      s.model.name, s.stages, s.hardware.name, format_bytes(s.hardware.memory_bytes),
      s.bytes_per_value == 2 ? "bf16" : "fp32", format_count(s.sequences, "sequence"), s.context, s.prompt_tokens,
      format_count(s.microbatches, "micro-batch", "micro-batches"), format_count(largest, "sequence"));
  out += fmt::format("time to first token {} (prefill in {} {}, bubble {})\n",
                     format_seconds(p.time_to_first_token_s), format_count(p.prefill_chunks, "chunk"),
                     s.prefill_chunk > 0 ? fmt::format("of at most {} tokens", s.prefill_chunk) : "(a group each)",
                     format_percent(p.prefill_bubble));
  out += fmt::format("per token {} at the full context, {:.1f} tokens/s\n", format_seconds(p.per_token_s),
                     p.tokens_per_s);
  TextTable table({"stage", "layers", "weights", "KV cache", "activations", "peak", "prefill", "decode"});
  for (std::size_t r = 0; r < p.stages.size(); ++r) {
    const InferenceStage& st = p.stages[r];
    table.add_row({std::to_string(r), st.layers, format_bytes(st.weight_bytes), format_bytes(st.kv_cache_bytes),
                   format_bytes(st.activation_bytes), format_bytes(st.peak_bytes()), format_seconds(st.prefill_s),
                   format_seconds(st.decode_s)});
  }
  return out + table.render();
}

nlohmann::ordered_json inference_json(const InferencePrediction& p) {
  const InferenceSetup& s = p.setup;
  nlohmann::ordered_json json;
  json["model"] = s.model.name;
  json["hardware"] = s.hardware.name;
  json["microbatches"] = s.microbatches;
  json["sequences"] = s.sequences;
  json["context"] = s.context;
  json["prompt_tokens"] = s.prompt_tokens;
  json["bytes_per_value"] = s.bytes_per_value;
  json["prefill_chunk"] = s.prefill_chunk;
  json["prefill_chunks"] = p.prefill_chunks;
  json["group_sizes"] = p.group_sizes;
  json["time_to_first_token_s"] = p.time_to_first_token_s;
  json["prefill_bubble"] = p.prefill_bubble;
  json["per_token_s"] = p.per_token_s;
  json["tokens_per_s"] = p.tokens_per_s;
  json["peak_memory_bytes"] = p.peak_bytes();
  json["stages"] = nlohmann::ordered_json::array();
  for (const InferenceStage& st : p.stages) {
    json["stages"].push_back({{"layers", st.layers},
                                     {"parameters", st.parameters},
                                     {"weight_bytes", st.weight_bytes},
                                     {"kv_cache_bytes", st.kv_cache_bytes},
                                     {"activation_bytes", st.activation_bytes},
                                     {"peak_bytes", st.peak_bytes()},
                                     {"prefill_s", st.prefill_s},
                                     {"decode_s", st.decode_s}});
  }
  return json;
}

}  // namespace pipeflow
