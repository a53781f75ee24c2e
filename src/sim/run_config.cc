#include "pipeflow/sim/run_config.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "pipeflow/core/error.h"
#include "pipeflow/schedule/generators.h"

namespace pipeflow {
namespace {

using Json = nlohmann::ordered_json;

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

int positive(const Config& c, std::string_view key, int fallback, std::string_view what) {
  const int value = c.get(key, fallback);
  if (value < 1) c.fail_value(key, fmt::format("must be a positive integer: {}", what));
  return value;
}

int non_negative(const Config& c, std::string_view key, int fallback, std::string_view what) {
  const int value = c.get(key, fallback);
  if (value < 0) c.fail_value(key, fmt::format("must be an integer >= 0: {}", what));
  return value;
}

std::optional<int> optional_positive(const Config& c, std::string_view key, std::string_view what) {
  if (!c.has(key)) return std::nullopt;
  return positive(c, key, 1, what);
}

// Runs `body`; an Error it throws becomes "<source>: <key> = <value>: <message>".
template <class F>
auto with_value_context(const Config& c, std::string_view key, F body) {
  try {
    return body();
  } catch (const Error& error) {
    c.fail_value(key, error.what());
  }
}

OptimizerConfig read_optimizer(const Config& section) {
  OptimizerConfig o;
  const std::string type = lower(section.get("type", "AdamW"));
  if (type != "adamw" && type != "adam") {
    section.fail_value("type", "pipeflow's optimizer is AdamW (DeepSpeed's Adam, adam_w_mode on by default, "
                               "reads as AdamW): set \"type\": \"AdamW\"");
  }
  const Config params = section.object("params");
  o.lr = params.get("lr", o.lr);
  if (!(o.lr >= 0)) params.fail_value("lr", "must be >= 0");
  const auto betas = params.get<std::vector<double>>("betas", {o.betas[0], o.betas[1]});
  if (betas.size() != 2) params.fail_value("betas", "must be [beta1, beta2]");
  for (double beta : betas) {
    if (!(beta >= 0 && beta < 1)) params.fail_value("betas", "each beta must lie in [0, 1)");
  }
  o.betas = {betas[0], betas[1]};
  o.eps = params.get("eps", o.eps);
  if (!(o.eps > 0)) params.fail_value("eps", "must be > 0");
  o.weight_decay = params.get("weight_decay", o.weight_decay);
  if (!(o.weight_decay >= 0)) params.fail_value("weight_decay", "must be >= 0");
  return o;
}

void read_warmup(const Config& params, SchedulerConfig& s) {
  s.warmup_num_steps = non_negative(params, "warmup_num_steps", s.warmup_num_steps, "steps of warm-up");
  s.warmup_type = params.get("warmup_type", s.warmup_type);
  if (s.warmup_type != "log" && s.warmup_type != "linear") {
    params.fail_value("warmup_type", "must be \"log\" or \"linear\"");
  }
}

void read_total_steps(const Config& params, SchedulerConfig& s) {
  s.total_num_steps = params.require<int>("total_num_steps");
  if (s.total_num_steps < 1) params.fail_value("total_num_steps", "must be a positive integer: the steps of the run");
}

SchedulerConfig read_scheduler(const Config& config) {
  SchedulerConfig s;
  if (!config.has("scheduler")) return s;
  const Config section = config.object("scheduler");
  s.type = section.require<std::string>("type");
  const Config params = section.object("params");
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR") {
    s.warmup_min_lr = params.get("warmup_min_lr", s.warmup_min_lr);
    s.warmup_max_lr = params.get("warmup_max_lr", s.warmup_max_lr);
    if (!(s.warmup_min_lr >= 0)) params.fail_value("warmup_min_lr", "must be >= 0");
    if (!(s.warmup_max_lr >= s.warmup_min_lr)) params.fail_value("warmup_max_lr", "must be >= warmup_min_lr");
    read_warmup(params, s);
    if (s.type == "WarmupDecayLR") read_total_steps(params, s);
  } else if (s.type == "WarmupCosineLR") {
    read_total_steps(params, s);
    s.warmup_min_ratio = params.get("warmup_min_ratio", s.warmup_min_ratio);
    if (!(s.warmup_min_ratio >= 0 && s.warmup_min_ratio <= 1)) {
      params.fail_value("warmup_min_ratio", "must lie in [0, 1] (a ratio of the optimizer's lr)");
    }
    s.cos_min_ratio = params.get("cos_min_ratio", s.cos_min_ratio);
    if (!(s.cos_min_ratio >= 0 && s.cos_min_ratio <= 1)) {
      params.fail_value("cos_min_ratio", "must lie in [0, 1] (a ratio of the optimizer's lr)");
    }
    read_warmup(params, s);
    // DeepSpeed floors the warm-up at 2 steps; the cosine phase needs steps after it.
    if (s.total_num_steps <= std::max(2, s.warmup_num_steps)) {
      params.fail_value("total_num_steps", "must exceed warmup_num_steps (the cosine phase needs steps)");
    }
  } else {
    section.fail_value("type", "pipeflow runs DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR");
  }
  return s;
}

ModelSpec read_inline_model(const Config& section) {
  const auto required = [&](std::string_view key, std::string_view what) {
    if (!section.has(key)) section.fail_value(key, fmt::format("is required: {}", what));
    return positive(section, key, 1, what);
  };
  const int layers = required("n_layer", "the number of transformer blocks");
  const int heads = required("n_head", "the attention heads");
  const int hidden = required("n_embd", "the model width");
  const int context = required("n_ctx", "the most positions a sequence may have");
  const int vocab = positive(section, "vocab_size", 256, "the vocabulary (256 for bytes)");
  if (hidden % heads != 0) {
    section.fail_value("n_embd", fmt::format("must be a multiple of n_head ({}): pipeflow's GPT splits the width "
                                             "into equal heads",
                                             heads));
  }
  return gpt_model(fmt::format("gpt-{}x{}", layers, hidden), layers, hidden, heads, vocab, context);
}

void read_model(const Config& config, RunConfig& run) {
  if (config.is_object("model")) {
    run.model_source = "inline";
    run.model = read_inline_model(config.object("model"));
    return;
  }
  run.model_source = config.get("model", "");
  if (run.model_source.empty()) return;
  run.model = with_value_context(config, "model", [&] { return resolve_model(run.model_source); });
}

DataConfig read_data(const Config& config) {
  DataConfig data;
  const Config section = config.object("data");
  if (section.has("path") && section.has("paths")) {
    section.fail_value("paths", "give either path or paths, not both");
  }
  if (section.has("path")) data.paths = {section.require<std::string>("path")};
  data.paths = section.get("paths", data.paths);
  for (const std::string& path : data.paths) {
    if (path.empty()) section.fail_value(section.has("path") ? "path" : "paths", "a path must not be empty");
  }
  data.validation_fraction = section.get("validation_fraction", data.validation_fraction);
  if (!(data.validation_fraction >= 0 && data.validation_fraction < 1)) {
    section.fail_value("validation_fraction", "must lie in [0, 1): the share of the text held out");
  }
  return data;
}

PipelineConfig read_pipeline(const Config& config) {
  PipelineConfig p;
  const Config section = config.object("pipeline");
  p.stages = positive(section, "stages", p.stages, "the number of pipeline ranks");
  if (section.has("partition_method")) {
    const std::string method = section.require<std::string>("partition_method");
    p.partition_method = with_value_context(section, "partition_method", [&] { return parse_partition_method(method); });
  }
  p.activation_checkpoint_interval = non_negative(section, "activation_checkpoint_interval",
                                                  p.activation_checkpoint_interval,
                                                  "0 for no checkpointing, k to recompute every block");
  p.schedule = lower(section.get("schedule", p.schedule));
  if (find_schedule(p.schedule) == nullptr) {
    section.fail_value("schedule", fmt::format("known schedules are {}", known_schedule_names()));
  }
  p.virtual_stages = positive(section, "virtual_stages", p.virtual_stages, "model chunks per rank");
  return p;
}

void read_simulation_keys(const Config& config, RunConfig& run) {
  run.hardware_source = config.get("hardware", run.hardware_source);
  run.hardware = with_value_context(config, "hardware", [&] { return resolve_hardware(run.hardware_source); });
  run.devices = optional_positive(config, "devices", "tensor_parallel × pipeline.stages × data_parallel");
  run.tensor_parallel = positive(config, "tensor_parallel", 1, "1 for no tensor parallelism");
  run.data_parallel = positive(config, "data_parallel", 1, "1 for a single replica");
  run.sequence_parallel = config.get("sequence_parallel", false);
  if (config.has("recompute")) {
    const std::string text = config.require<std::string>("recompute");
    run.recompute = with_value_context(config, "recompute", [&] { return parse_recompute(text); });
  }
  run.seq_length = non_negative(config, "seq_length", 0, "tokens per sequence, 0 for the model's context");
  const std::string comm = config.get("comm_mode", "overlapped");
  if (comm == "overlapped") {
    run.comm_mode = CommMode::kOverlapped;
  } else if (comm == "blocking") {
    run.comm_mode = CommMode::kBlocking;
  } else {
    config.fail_value("comm_mode", "must be \"overlapped\" or \"blocking\"");
  }
}

BatchKeys read_batch_keys(const Config& config) {
  BatchKeys keys;
  keys.train_batch_size = optional_positive(config, "train_batch_size", "sequences per step");
  keys.micro_batch = optional_positive(config, "train_micro_batch_size_per_gpu", "sequences per micro-batch");
  keys.gradient_accumulation_steps =
      optional_positive(config, "gradient_accumulation_steps", "micro-batches per step");
  return keys;
}

// tensor_parallel × pipeline.stages × data_parallel, checked to fit an int.
int parallel_devices(const RunConfig& run) {
  return checked_product({run.tensor_parallel, run.pipeline.stages, run.data_parallel},
                         fmt::format("{}: tensor_parallel × pipeline.stages × data_parallel", run.source), "devices");
}

// The rules that tie keys together, checked once every key is read.
void check_consistency(const Config& config, const RunConfig& run) {
  const int t = run.tensor_parallel;
  const int p = run.pipeline.stages;
  const int d = run.data_parallel;
  const int devices = parallel_devices(run);
  if (run.devices && *run.devices != devices) {
    config.fail_value("devices", fmt::format("tensor_parallel × pipeline.stages × data_parallel = {} × {} × {} = {}: "
                                             "drop devices or make them agree",
                                             t, p, d, devices));
  }
  if (run.recompute && run.pipeline.activation_checkpoint_interval > 0 && *run.recompute != Recompute::kFull) {
    config.fail_value("recompute", fmt::format("pipeline.activation_checkpoint_interval = {} recomputes whole "
                                               "blocks: drop recompute or set it to \"full\"",
                                               run.pipeline.activation_checkpoint_interval));
  }
  if (!run.model_source.empty() && run.model.architecture == Architecture::kGpt &&
      run.sequence() > run.model.max_positions) {
    config.fail_value("seq_length", fmt::format("{} has {} positions: use seq_length <= {}", run.model.name,
                                                run.model.max_positions, run.model.max_positions));
  }
  if (run.sequence_parallel && t > 1 && run.sequence() % t != 0) {  // no model yet: sequence() is 0
    const std::string sequence = run.seq_length > 0 ? fmt::format("seq_length {}", run.seq_length)
                                                    : fmt::format("the model's context {}", run.sequence());
    config.fail_value("sequence_parallel",
                      fmt::format("Megatron splits the sequence over the tensor-parallel ranks, so it must be a "
                                  "multiple of tensor_parallel, and {} is not a multiple of {}: use seq_length {}, "
                                  "another tensor_parallel, or drop sequence_parallel",
                                  sequence, t, nearest_multiples(run.sequence(), t)));
  }
  try {
    make_schedule(run.pipeline.schedule, p, run.batch.accumulation, run.pipeline.virtual_stages);
  } catch (const Error& error) {
    fail("{}: pipeline.schedule = \"{}\" (stages = {}, micro-batches per step = {}, virtual_stages = {}): {}",
         run.source, run.pipeline.schedule, p, run.batch.accumulation, run.pipeline.virtual_stages, error.what());
  }
}

Json model_to_json(const RunConfig& run) {
  if (run.model_source != "inline") return run.model_source;
  return Json{{"n_layer", run.model.layers}, {"n_head", run.model.heads}, {"n_embd", run.model.hidden},
              {"n_ctx", run.model.max_positions}, {"vocab_size", run.model.vocab}};
}

Json scheduler_to_json(const SchedulerConfig& s) {
  Json params;
  if (s.type == "WarmupCosineLR") {
    params = {{"total_num_steps", s.total_num_steps}, {"warmup_min_ratio", s.warmup_min_ratio},
              {"warmup_num_steps", s.warmup_num_steps}, {"cos_min_ratio", s.cos_min_ratio},
              {"warmup_type", s.warmup_type}};
  } else {
    params = {{"warmup_min_lr", s.warmup_min_lr}, {"warmup_max_lr", s.warmup_max_lr},
              {"warmup_num_steps", s.warmup_num_steps}, {"warmup_type", s.warmup_type}};
    if (s.type == "WarmupDecayLR") params["total_num_steps"] = s.total_num_steps;
  }
  return Json{{"type", s.type}, {"params", params}};
}

}  // namespace

BatchSizes resolve_batch_sizes(const BatchKeys& keys, int data_parallel, const std::string& source) {
  const int d = data_parallel;
  const auto& total = keys.train_batch_size;
  const auto& micro = keys.micro_batch;
  const auto& accumulation = keys.gradient_accumulation_steps;
  BatchSizes out;
  const std::string all_three =
      fmt::format("{}: train_micro_batch_size_per_gpu × gradient_accumulation_steps × data_parallel", source);
  if (total && micro && accumulation) {
    out = {*total, *micro, *accumulation};
    const int product = checked_product({*micro, *accumulation, d}, all_three, "sequences per step");
    if (*total != product) {
      fail("{}: train_batch_size = {} but train_micro_batch_size_per_gpu × gradient_accumulation_steps × "
           "data_parallel = {} × {} × {} = {}: give two of the three and let the third follow, or make them agree",
           source, *total, *micro, *accumulation, d, product);
    }
  } else if (total && (micro || accumulation)) {
    const int other = micro ? *micro : *accumulation;
    const char* other_name = micro ? "train_micro_batch_size_per_gpu" : "gradient_accumulation_steps";
    const int per_step = checked_product({other, d}, fmt::format("{}: {} × data_parallel", source, other_name),
                                         micro ? "sequences" : "micro-batches");
    if (*total % per_step != 0) {
      fail("{}: train_batch_size = {} is not a multiple of {} × data_parallel = {} × {} = {}: use "
           "train_batch_size {}",
           source, *total, other_name, other, d, per_step, nearest_multiples(*total, per_step));
    }
    out = micro ? BatchSizes{*total, *micro, *total / per_step} : BatchSizes{*total, *total / per_step, *accumulation};
  } else if (total) {
    if (*total % d != 0) {
      fail("{}: train_batch_size = {} is not a multiple of data_parallel = {}: use train_batch_size {}", source,
           *total, d, nearest_multiples(*total, d));
    }
    out = {*total, *total / d, 1};
  } else {
    const int b = micro.value_or(1);
    const int m = accumulation.value_or(1);
    out = {checked_product({b, m, d}, all_three, "sequences per step"), b, m};
  }
  return out;
}

Recompute RunConfig::effective_recompute() const {
  if (recompute) return *recompute;
  return pipeline.activation_checkpoint_interval > 0 ? Recompute::kFull : Recompute::kNone;
}

RunConfig parse_run_config(const Config& config) {
  RunConfig run;
  run.source = config.source();
  run.batch_keys = read_batch_keys(config);
  run.gradient_clipping = config.get("gradient_clipping", 0.0);
  if (!(run.gradient_clipping >= 0)) {
    config.fail_value("gradient_clipping", "must be >= 0: the largest global gradient norm, 0 for none");
  }
  run.optimizer = read_optimizer(config.object("optimizer"));
  run.scheduler = read_scheduler(config);
  const int zero = config.object("zero_optimization").get("stage", 0);
  if (zero < 0 || zero > 3) config.object("zero_optimization").fail_value("stage", "must be 0, 1, 2 or 3");
  run.zero = zero_stage_from_int(zero);
  run.pipeline = read_pipeline(config);
  read_model(config, run);
  run.data = read_data(config);
  run.steps = positive(config, "steps", run.steps, "optimizer steps to run");
  const std::int64_t seed = config.get<std::int64_t>("seed", static_cast<std::int64_t>(run.seed));
  if (seed < 0) config.fail_value("seed", "must be an integer >= 0");
  run.seed = static_cast<std::uint64_t>(seed);
  run.eval_interval = non_negative(config, "eval_interval", run.eval_interval, "steps between validations, 0 for the last step only");
  run.out_dir = config.get("out_dir", run.out_dir);
  if (run.out_dir.empty()) config.fail_value("out_dir", "must name a directory");
  const Config checkpoint = config.object("checkpoint");
  run.checkpoint.interval = non_negative(checkpoint, "interval", 0, "steps between checkpoints, 0 for none");
  run.checkpoint.dir = checkpoint.get("dir", "");
  run.checkpoint.load = checkpoint.get("load", "");
  read_simulation_keys(config, run);
  config.check_no_unknown_keys();

  run.batch = resolve_batch_sizes(run.batch_keys, run.data_parallel, run.source);
  check_consistency(config, run);
  if (run.sequence_parallel && run.tensor_parallel == 1) {
    run.warnings.push_back(fmt::format(
        "{}: sequence_parallel = true with tensor_parallel = 1: sequence parallelism splits activations over the "
        "tensor-parallel ranks, so it is off (as Megatron-LM turns it off); use tensor_parallel > 1 for it",
        run.source));
  }
  return run;
}

RunConfig load_run_config(const std::filesystem::path& path) { return parse_run_config(Config::load(path)); }

RunConfig default_run_config() { return parse_run_config(Config::parse("{}", "the command line")); }

std::string run_config_to_json(const RunConfig& run) {
  Json json;
  if (run.batch_keys.train_batch_size) json["train_batch_size"] = *run.batch_keys.train_batch_size;
  if (run.batch_keys.micro_batch) json["train_micro_batch_size_per_gpu"] = *run.batch_keys.micro_batch;
  if (run.batch_keys.gradient_accumulation_steps) {
    json["gradient_accumulation_steps"] = *run.batch_keys.gradient_accumulation_steps;
  }
  json["gradient_clipping"] = run.gradient_clipping;
  json["optimizer"] = {{"type", run.optimizer.type},
                       {"params",
                        {{"lr", run.optimizer.lr},
                         {"betas", {run.optimizer.betas[0], run.optimizer.betas[1]}},
                         {"eps", run.optimizer.eps},
                         {"weight_decay", run.optimizer.weight_decay}}}};
  if (!run.scheduler.type.empty()) json["scheduler"] = scheduler_to_json(run.scheduler);
  json["zero_optimization"] = {{"stage", static_cast<int>(run.zero)}};
  json["pipeline"] = {{"stages", run.pipeline.stages},
                      {"partition_method", to_string(run.pipeline.partition_method)},
                      {"activation_checkpoint_interval", run.pipeline.activation_checkpoint_interval},
                      {"schedule", run.pipeline.schedule},
                      {"virtual_stages", run.pipeline.virtual_stages}};
  if (!run.model_source.empty()) json["model"] = model_to_json(run);
  json["data"] = {{"paths", run.data.paths}, {"validation_fraction", run.data.validation_fraction}};
  json["steps"] = run.steps;
  json["seed"] = run.seed;
  json["eval_interval"] = run.eval_interval;
  json["out_dir"] = run.out_dir;
  json["checkpoint"] = {{"interval", run.checkpoint.interval}, {"dir", run.checkpoint.dir},
                        {"load", run.checkpoint.load}};
  json["hardware"] = run.hardware_source;
  if (run.devices) json["devices"] = *run.devices;
  json["tensor_parallel"] = run.tensor_parallel;
  json["data_parallel"] = run.data_parallel;
  json["sequence_parallel"] = run.sequence_parallel;
  if (run.recompute) json["recompute"] = std::string(to_string(*run.recompute));
  json["seq_length"] = run.seq_length;
  json["comm_mode"] = run.comm_mode == CommMode::kBlocking ? "blocking" : "overlapped";
  return json.dump(2) + "\n";
}

void apply_overrides(RunConfig& run, const RunOverrides& o) {
  Json json = Json::parse(run_config_to_json(run));
  const auto set = [&](const char* key, const auto& value) {
    if (value) json[key] = *value;
  };
  set("model", o.model);
  set("hardware", o.hardware);
  set("devices", o.devices);
  set("tensor_parallel", o.tensor_parallel);
  if (o.pipeline_stages) json["pipeline"]["stages"] = *o.pipeline_stages;
  if (o.schedule) json["pipeline"]["schedule"] = *o.schedule;
  if (o.virtual_stages) json["pipeline"]["virtual_stages"] = *o.virtual_stages;
  if (o.partition) json["pipeline"]["partition_method"] = *o.partition;
  if (o.zero_stage) json["zero_optimization"]["stage"] = *o.zero_stage;
  set("data_parallel", o.data_parallel);
  set("seq_length", o.seq_length);
  set("recompute", o.recompute);
  set("sequence_parallel", o.sequence_parallel);
  set("comm_mode", o.comm_mode);
  const bool all_batch_keys = run.batch_keys.train_batch_size && run.batch_keys.micro_batch &&
                              run.batch_keys.gradient_accumulation_steps;
  if (o.micro_batch || o.global_batch || (o.data_parallel && all_batch_keys)) {
    json.erase("gradient_accumulation_steps");
  }
  if (o.micro_batch) json["train_micro_batch_size_per_gpu"] = *o.micro_batch;
  if (o.global_batch) json["train_batch_size"] = *o.global_batch;
  // Devices follow a new parallel layout unless given too.
  if (!o.devices && (o.tensor_parallel || o.pipeline_stages || o.data_parallel)) json.erase("devices");
  const std::string suffix = " with the command line";
  const bool marked = run.source == "the command line" ||
                      (run.source.size() > suffix.size() && run.source.ends_with(suffix));
  const std::string source = marked ? run.source : run.source + suffix;
  run = parse_run_config(Config::from_json(nlohmann::json::parse(json.dump()), source));
}

Layout layout_from_run_config(const RunConfig& run) {
  if (run.model_source.empty()) {
    fail("{}: no model: set \"model\" (a preset such as gpt2-124m, a config.json path, or {{n_layer, n_head, "
         "n_embd, n_ctx}}) or pass --model",
         run.source);
  }
  Layout layout;
  layout.model = run.model;
  layout.hardware = run.hardware;
  layout.tensor_parallel = run.tensor_parallel;
  layout.pipeline_parallel = run.pipeline.stages;
  layout.data_parallel = run.data_parallel;
  layout.devices = run.devices.value_or(parallel_devices(run));
  layout.micro_batch = run.batch.micro;
  layout.global_batch = run.batch.global;
  layout.sequence = run.sequence();
  layout.schedule = run.pipeline.schedule;
  layout.virtual_stages = run.pipeline.virtual_stages;
  layout.recompute = run.effective_recompute();
  layout.sequence_parallel = run.effective_sequence_parallel();
  layout.partition = run.pipeline.partition_method;
  layout.zero = run.zero;
  layout.comm_mode = run.comm_mode;
  validate_layout(layout);
  return layout;
}

}  // namespace pipeflow
