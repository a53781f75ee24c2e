#include "pipeflow/sim/inference.h"

#include <algorithm>
#include <map>

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

// One stage's prefill and decode of a group of n sequences.
struct GroupSeconds {
  double prefill_s = 0;
  double decode_s = 0;
};

class StagePricer {
 public:
  StagePricer(const InferenceSetup& s, const std::vector<PipelineLayer>& layers, const StagePlan& plan)
      : s_(s), layers_(layers), plan_(plan) {}

  const GroupSeconds& operator()(int n) {
    auto it = priced_.find(n);
    if (it != priced_.end()) return it->second;
    ParallelConfig config;
    config.micro_batch = n;
    config.seq_length = static_cast<int>(s_.prompt_tokens);
    config.bytes_per_element = s_.bytes_per_value;
    GroupSeconds out;
    DecodeWork work;
    for (int i = plan_.first; i < plan_.end; ++i) {
      const PipelineLayer& layer = layers_[static_cast<std::size_t>(i)];
      out.prefill_s += layer_prefill_seconds(s_.model, config, layer.kind, s_.hardware);
      work += layer_decode_work(s_.model, layer, n, s_.context, s_.bytes_per_value);
    }
    out.decode_s = decode_seconds(work, s_.hardware);
    return priced_.emplace(n, out).first->second;
  }

 private:
  const InferenceSetup& s_;
  const std::vector<PipelineLayer>& layers_;
  const StagePlan& plan_;
  std::map<int, GroupSeconds> priced_;
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
  const double tokens =
      static_cast<double>(std::min<std::int64_t>(largest_group * s.prompt_tokens, kPrefillChunkTokens));
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
  const Schedule prefill = make_schedule("inference", s.stages, s.microbatches);
  const Partition partition = partition_layers(layers, s.stages, s.partition, s.hardware);
  out.group_sizes = group_sizes(s.sequences, s.microbatches);
  const int largest = *std::max_element(out.group_sizes.begin(), out.group_sizes.end());

  // seconds[r][g]: stage r's prefill and decode of group g.
  std::vector<std::vector<GroupSeconds>> seconds;
  for (const StagePlan& plan : partition.stages) {
    StagePricer price(s, layers, plan);
    InferenceStage stage = stage_memory(s, layers, plan, largest);
    std::vector<GroupSeconds> groups;
    for (int n : out.group_sizes) groups.push_back(price(n));
    stage.prefill_s = price(largest).prefill_s;
    stage.decode_s = price(largest).decode_s;
    out.stages.push_back(stage);
    seconds.push_back(std::move(groups));
  }

  const double e = s.bytes_per_value;
  const double h = s.model.hidden;
  auto link = [&](int from, int to) { return link_between(s.hardware, from, to); };
  auto group = [&](MicrobatchId k) { return static_cast<std::size_t>(k.value()); };

  ExecutionCosts costs;
  costs.duration = [&](const Action& a, RankId) {
    return seconds[static_cast<std::size_t>(a.stage.value())][group(a.microbatch)].prefill_s;
  };
  costs.transfer = [&](const Action& a, RankId from, RankId to) {
    const double n = out.group_sizes[group(a.microbatch)];
    return link(from.value(), to.value()).transfer_seconds(e * n * static_cast<double>(s.prompt_tokens) * h);
  };
  const Execution execution = execute(prefill, costs);
  out.time_to_first_token_s = execution.makespan;
  out.prefill_bubble = bubble_fraction(execution);

  double busiest = 0;
  for (const auto& stage : seconds) {
    double busy = 0;
    for (const GroupSeconds& g : stage) busy += g.decode_s;
    busiest = std::max(busiest, busy);
  }
  double trip = 0;
  for (std::size_t g = 0; g < out.group_sizes.size(); ++g) {
    const double n = out.group_sizes[g];
    double around = 0;
    for (int r = 0; r < s.stages; ++r) {
      around += seconds[static_cast<std::size_t>(r)][g].decode_s;
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
  out += fmt::format("time to first token {} (prefill bubble {})\n", format_seconds(p.time_to_first_token_s),
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
