#include "pipeflow/config/megatron_args.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

// Shell-style words: quotes group, a backslash-newline joins lines, '#' at
// a word's start comments out the rest of the line.
std::vector<std::string> words(std::string_view text, const std::string& source) {
  std::vector<std::string> out;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        word += c;
      }
      continue;
    }
    if (c == '\\' && i + 1 < text.size() && (text[i + 1] == '\n' || text[i + 1] == '\r')) {
      while (i + 1 < text.size() && (text[i + 1] == '\n' || text[i + 1] == '\r')) ++i;
      continue;
    }
    if (c == '#' && !in_word) {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (in_word) out.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '"' || c == '\'') {
      quote = c;
    } else {
      word += c;
    }
  }
  if (quote != 0) fail("{}: a quote ({}) is not closed", source, quote);
  if (in_word) out.push_back(std::move(word));
  return out;
}

class Arguments {
 public:
  Arguments(std::map<std::string, std::optional<std::string>> values, std::string source)
      : values_(std::move(values)), source_(std::move(source)) {}

  bool flag(const std::string& name) {
    const auto found = values_.find(name);
    if (found == values_.end()) return false;
    used_.push_back(name);
    if (found->second) fail("{}: {} takes no value, got \"{}\"", source_, name, *found->second);
    return true;
  }
  std::optional<std::string> text(const std::string& name) {
    const auto found = values_.find(name);
    if (found == values_.end()) return std::nullopt;
    used_.push_back(name);
    if (!found->second) fail("{}: {} needs a value", source_, name);
    return found->second;
  }
  template <class T>
  std::optional<T> number(const std::string& name, std::string_view rule, bool (*valid)(T)) {
    const std::optional<std::string> value = text(name);
    if (!value) return std::nullopt;
    T parsed{};
    const auto [end, error] = std::from_chars(value->data(), value->data() + value->size(), parsed);
    if (error != std::errc() || end != value->data() + value->size() || !valid(parsed)) {
      fail("{}: {} {}: must be {}", source_, name, *value, rule);
    }
    return parsed;
  }
  std::optional<int> positive(const std::string& name) {
    return number<int>(name, "an integer >= 1", [](int v) { return v >= 1; });
  }
  std::optional<double> nonnegative(const std::string& name) {
    return number<double>(name, "a number >= 0", [](double v) { return std::isfinite(v) && v >= 0; });
  }
  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (const auto& [name, value] : values_) {
      if (std::find(used_.begin(), used_.end(), name) == used_.end()) out.push_back(name);
    }
    return out;
  }
  const std::string& source() const { return source_; }

 private:
  std::map<std::string, std::optional<std::string>> values_;
  std::vector<std::string> used_;
  std::string source_;
};

Arguments parse(std::string_view text, const std::string& source) {
  const std::vector<std::string> list = words(text, source);
  std::map<std::string, std::optional<std::string>> values;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string& word = list[i];
    if (!word.starts_with("--")) {
      fail("{}: \"{}\" is not an argument (Megatron-LM's start with --) nor the value of one", source, word);
    }
    std::optional<std::string> value;
    std::string name = word;
    if (const std::size_t equals = word.find('='); equals != std::string::npos) {
      name = word.substr(0, equals);
      value = word.substr(equals + 1);
    } else if (i + 1 < list.size() && !list[i + 1].starts_with("--")) {
      value = list[++i];
    }
    if (values.contains(name)) fail("{}: {} is given twice", source, name);
    values.emplace(std::move(name), std::move(value));
  }
  return Arguments(std::move(values), source);
}

ModelSpec read_model(Arguments& a) {
  const std::string& source = a.source();
  ModelSpec m;
  const auto required = [&](const char* name) {
    const std::optional<int> value = a.positive(name);
    if (!value) fail("{}: {} is required (the model's shape)", source, name);
    return *value;
  };
  m.layers = required("--num-layers");
  m.hidden = required("--hidden-size");
  m.heads = required("--num-attention-heads");
  if (const std::optional<int> kv_channels = a.positive("--kv-channels")) {
    if (*kv_channels != m.hidden / m.heads) {
      fail("{}: --kv-channels {}: pipeflow models heads of --hidden-size / --num-attention-heads = {} features; "
           "other head widths are not modelled",
           source, *kv_channels, m.hidden / m.heads);
    }
  }
  const bool swiglu = a.flag("--swiglu");
  const std::string norm = a.text("--normalization").value_or("LayerNorm");
  if (norm != "LayerNorm" && norm != "RMSNorm") fail("{}: --normalization {}: must be LayerNorm or RMSNorm", source, norm);
  const std::string positions = a.text("--position-embedding-type").value_or("learned_absolute");
  if (positions != "learned_absolute" && positions != "rope") {
    fail("{}: --position-embedding-type {}: pipeflow models learned_absolute and rope", source, positions);
  }
  const bool no_bias = a.flag("--disable-bias-linear");
  const bool llama = swiglu && norm == "RMSNorm" && positions == "rope";
  if (!llama && (swiglu || norm == "RMSNorm" || positions == "rope")) {
    fail("{}: --swiglu, --normalization RMSNorm and --position-embedding-type rope together make a Llama, which "
         "pipeflow models; a GPT takes none of them (got swiglu {}, {}, {})",
         source, swiglu, norm, positions);
  }
  m.architecture = llama ? Architecture::kLlama : Architecture::kGpt;
  m.ffn = a.positive("--ffn-hidden-size")
              .value_or(llama ? static_cast<int>(8LL * m.hidden / 3 / 64 * 64) : gpt_ffn(m.hidden));
  const bool grouped = a.flag("--group-query-attention");
  const std::optional<int> groups = a.positive("--num-query-groups");
  m.kv_heads = grouped ? groups.value_or(1) : m.heads;
  if (!llama && m.kv_heads != m.heads) {
    fail("{}: --group-query-attention: pipeflow models grouped-query attention in Llama models (--swiglu "
         "--normalization RMSNorm --position-embedding-type rope)",
         source);
  }
  if (llama && !no_bias) {
    fail("{}: a Llama without --disable-bias-linear: pipeflow models Llama layers without biases; add it", source);
  }
  m.vocab = a.positive("--vocab-size").value_or(50257);
  const std::optional<int> seq = a.positive("--seq-length");
  m.max_positions = a.positive("--max-position-embeddings").value_or(seq.value_or(1024));
  m.tied_embeddings = !a.flag("--untie-embeddings-and-output-weights");
  const double hidden_dropout = a.nonnegative("--hidden-dropout").value_or(0.1);
  const double attention_dropout = a.nonnegative("--attention-dropout").value_or(0.1);
  m.dropout = hidden_dropout > 0 || attention_dropout > 0;
  if (llama) {
    m.llama.rope_theta = a.nonnegative("--rotary-base").value_or(10000);
    m.llama.rms_norm_eps = a.nonnegative("--norm-epsilon").value_or(1e-5);
    // Llama 3.1's scaling: factor 8 (or --rope-scaling-factor), frequency factors 1 and 4, from 8192 positions.
    if (a.flag("--use-rope-scaling")) {
      m.llama.rope_type = "llama3";
      m.llama.rope_factor = a.nonnegative("--rope-scaling-factor").value_or(8);
      m.llama.rope_low_freq_factor = 1;
      m.llama.rope_high_freq_factor = 4;
      m.llama.rope_original_context = 8192;
    }
  }
  m.name = fmt::format("megatron-{}-{}x{}", llama ? "llama" : "gpt", m.layers, m.hidden);
  validate_model(m);
  return m;
}

}  // namespace

MegatronArgs read_megatron_args(std::string_view text, const std::string& source) {
  Arguments a = parse(text, source);
  MegatronArgs out;
  out.model = read_model(a);
  RunOverrides& o = out.overrides;
  const int tp = a.positive("--tensor-model-parallel-size").value_or(1);
  const int pp = a.positive("--pipeline-model-parallel-size").value_or(1);
  o.set("tensor_parallel", tp);
  o.set("pipeline.stages", pp);
  int chunks = a.positive("--virtual-pipeline-model-parallel-size").value_or(1);
  if (const std::optional<int> per_chunk = a.positive("--num-layers-per-virtual-pipeline-stage")) {
    if (out.model.layers % (pp * *per_chunk) != 0) {
      fail("{}: --num-layers-per-virtual-pipeline-stage {}: --num-layers {} must split into pipeline stages ({}) of "
           "chunks of that many layers",
           source, *per_chunk, out.model.layers, pp);
    }
    chunks = out.model.layers / (pp * *per_chunk);
  }
  o.set("pipeline.schedule", chunks > 1 ? "interleaved-1f1b" : "1f1b");
  o.set("pipeline.virtual_stages", chunks);
  o.set("pipeline.partition_method", "uniform");  // Megatron splits the blocks evenly
  o.set("sequence_parallel", a.flag("--sequence-parallel"));
  if (a.flag("--use-distributed-optimizer")) o.set("zero_optimization.stage", 1);
  if (a.flag("--use-tp-pp-dp-mapping")) o.set("rank_order", "tp-pp-dp");
  if (const std::optional<std::string> granularity = a.text("--recompute-granularity")) {
    if (*granularity != "full" && *granularity != "selective") {
      fail("{}: --recompute-granularity {}: must be full or selective", source, *granularity);
    }
    o.set("recompute", *granularity);
    if (*granularity == "full") {
      o.set("pipeline.activation_checkpoint_interval", a.positive("--recompute-num-layers").value_or(1));
    }
  }
  a.text("--recompute-method");  // uniform or block: both recompute whole layers, as modelled
  const int micro = a.positive("--micro-batch-size").value_or(1);
  o.set("train_micro_batch_size_per_gpu", micro);
  if (const std::optional<int> global = a.positive("--global-batch-size")) o.set("train_batch_size", *global);
  if (const std::optional<int> seq = a.positive("--seq-length")) o.set("seq_length", *seq);
  const bool bf16 = a.flag("--bf16");
  const bool fp16 = a.flag("--fp16");
  if (bf16 && fp16) fail("{}: --bf16 and --fp16 together: give one", source);
  o.set("bf16.enabled", bf16);
  o.set("fp16.enabled", fp16);
  // Megatron-LM accumulates and all-reduces gradients in fp32 under bf16 (it
  // turns --accumulate-allreduce-grads-in-fp32 on itself), and under fp16
  // when the flag says so; its distributed optimizer keeps them so too.
  const bool fp32_gradients = a.flag("--accumulate-allreduce-grads-in-fp32");
  if (bf16 || fp32_gradients) o.set("data_types.grad_accum_dtype", "fp32");
  if (const std::optional<double> scale = a.nonnegative("--loss-scale")) o.set("fp16.loss_scale", *scale);
  // Megatron-LM's dynamic scale starts at 2^32 unless --initial-loss-scale says otherwise.
  const double initial = a.nonnegative("--initial-loss-scale").value_or(4294967296.0);
  const int power = static_cast<int>(std::lround(std::log2(std::max(initial, 1.0))));
  if (!(initial >= 1) || std::ldexp(1.0, power) != initial) {
    fail("{}: --initial-loss-scale {:g}: pipeflow's dynamic scale starts at a power of two >= 1", source, initial);
  }
  o.set("fp16.initial_scale_power", power);
  if (const std::optional<double> minimum = a.nonnegative("--min-loss-scale")) o.set("fp16.min_loss_scale", *minimum);
  if (const std::optional<int> window = a.positive("--loss-scale-window")) o.set("fp16.loss_scale_window", *window);
  if (const std::optional<int> hysteresis = a.positive("--hysteresis")) o.set("fp16.hysteresis", *hysteresis);
  if (const std::optional<double> lr = a.nonnegative("--lr")) o.set("optimizer.params.lr", *lr);
  if (const std::optional<double> decay = a.nonnegative("--weight-decay")) {
    o.set("optimizer.params.weight_decay", *decay);
  }
  const std::optional<double> beta1 = a.nonnegative("--adam-beta1");
  const std::optional<double> beta2 = a.nonnegative("--adam-beta2");
  if (beta1 || beta2) o.set("optimizer.params.betas", nlohmann::json::array({beta1.value_or(0.9), beta2.value_or(0.999)}));
  if (const std::optional<double> eps = a.nonnegative("--adam-eps")) o.set("optimizer.params.eps", *eps);
  if (const std::optional<double> clip = a.nonnegative("--clip-grad")) o.set("gradient_clipping", *clip);
  if (const std::optional<int> iterations = a.positive("--train-iters")) o.set("steps", *iterations);
  if (const std::optional<int> seed = a.number<int>("--seed", "an integer >= 0", [](int v) { return v >= 0; })) {
    o.set("seed", *seed);
  }
  out.not_modelled = a.unused();
  return out;
}

RunConfig megatron_run_config(MegatronArgs args, const RunOverrides& given, const std::string& source) {
  if (given.has("model")) fail("--model: the Megatron-LM arguments give the model; leave --model out");
  for (const auto& [path, value] : given.values()) args.overrides.set(path, value);
  const int tp = args.overrides.find("tensor_parallel")->get<int>();
  const int pp = args.overrides.find("pipeline.stages")->get<int>();
  if (given.has("devices") && !given.has("data_parallel")) {
    const int devices = given.find("devices")->get<int>();
    if (devices % (tp * pp) != 0) {
      fail("{}: a world of {} devices (--devices, or a log's world_size): Megatron-LM needs a multiple of tensor x "
           "pipeline = {} x {} = {} devices",
           source, devices, tp, pp, tp * pp);
    }
    args.overrides.set("data_parallel", devices / (tp * pp));
  } else if (!given.has("devices") && !given.has("data_parallel")) {
    args.overrides.set("devices", tp * pp);
  }
  RunConfig config = default_run_config(args.overrides);
  config.model = args.model;
  config.model_source = "inline";
  config.source = source;
  return config;
}

}  // namespace pipeflow
