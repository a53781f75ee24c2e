#include "pipeflow/config/run_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numbers>
#include <nlohmann/json.hpp>

#include "pipeflow/config/deepspeed_keys.h"
#include "pipeflow/config/rules.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/units.h"
#include "pipeflow/model/hf_config.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/io.h"
#include "pipeflow/schedule/validate.h"

namespace pipeflow {
const char* to_string(RankOrder order) {
  return order == RankOrder::kTensorPipelineData ? "tp-pp-dp" : "tp-dp-pp";
}

namespace {

// variable_seq_lengths as an object: a distribution to draw a step's lengths from.
LengthDistribution parse_length_distribution(const Config& keys) {
  LengthDistribution d;
  const std::string kind = keys.require<std::string>("distribution");
  if (kind == "uniform") {
    d.kind = LengthDistribution::Kind::kUniform;
  } else if (kind == "normal") {
    d.kind = LengthDistribution::Kind::kNormal;
  } else {
    keys.fail_value("distribution", "must be \"uniform\" (min, max) or \"normal\" (mean, std, min, max)");
  }
  if (d.kind == LengthDistribution::Kind::kUniform) {  // known keys of the other distribution: no misspelling
    for (const char* key : {"mean", "std"}) {
      if (keys.has(key)) {
        keys.fail_value(key, "belongs to the distribution \"normal\" (mean, std, min, max); \"uniform\" takes min "
                             "and max alone: remove it, or set distribution to \"normal\" with its mean and std");
      }
    }
  }
  d.min = keys.require<int>("min");
  if (d.min < 1) keys.fail_value("min", "must be >= 1 (tokens per sequence of the shortest micro-batch)");
  d.max = keys.require<int>("max");
  if (d.max < d.min) keys.fail_value("max", fmt::format("must be >= min ({})", d.min));
  if (d.kind == LengthDistribution::Kind::kNormal) {
    d.mean = keys.require<double>("mean");
    if (!(d.mean >= d.min && d.mean <= d.max)) {
      keys.fail_value("mean", fmt::format("must be in [min, max] = [{}, {}]", d.min, d.max));
    }
    d.std = keys.require<double>("std");
    if (!(d.std >= 0)) keys.fail_value("std", "must be >= 0 (tokens)");
  }
  const std::int64_t seed = keys.get<std::int64_t>("seed", 0);
  if (seed < 0) keys.fail_value("seed", "must be >= 0 (the draws' seed)");
  d.seed = static_cast<std::uint64_t>(seed);
  return d;
}

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
  o.type = section.get("type", o.type);
  // DeepSpeed lower-cases the type before matching it, and its Adam is AdamW
  // unless adam_w_mode is false; type AdamW is AdamW whatever adam_w_mode says.
  const std::string type = lower(o.type);
  if (type != "adamw" && type != "adam") {
    section.fail_value("type", "pipeflow runs DeepSpeed's Adam and AdamW: set \"type\": \"AdamW\" (or \"Adam\" "
                               "with adam_w_mode false for Adam with L2 weight decay)");
  }
  const Config params = section.object("params");
  const bool adam_w_mode = params.get("adam_w_mode", true);
  o.adam_w_mode = type == "adamw" || adam_w_mode;
  params.get("torch_adam", false);  // DeepSpeed's choice of implementation; pipeflow has one
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

// The fp16 and bf16 sections: at most one enabled (neither: fp32), and
// fp16's loss scaling, read whether enabled or not (DeepSpeed's defaults).
void read_precision(const Config& config, RunConfig& run) {
  const Config fp16 = config.object("fp16");
  const Config bf16 = config.object("bf16");
  const bool half = fp16.get("enabled", false);
  const bool brain = bf16.get("enabled", false);
  if (half && brain) {
    bf16.fail_value("enabled", "and fp16.enabled are both true: enable one of the two (bf16 needs no loss scaling)");
  }
  run.precision = half ? Precision::kFp16 : brain ? Precision::kBf16 : Precision::kFp32;
  LossScaleConfig& s = run.loss_scale;
  s.loss_scale = fp16.get("loss_scale", s.loss_scale);
  if (!(s.loss_scale >= 0)) fp16.fail_value("loss_scale", "must be >= 0: 0 for dynamic loss scaling, else the scale");
  s.initial_scale_power = fp16.get("initial_scale_power", s.initial_scale_power);
  if (s.initial_scale_power < 0 || s.initial_scale_power > 64) {
    fp16.fail_value("initial_scale_power", "must lie in [0, 64]: the dynamic scale starts at 2^initial_scale_power");
  }
  s.loss_scale_window = positive(fp16, "loss_scale_window", s.loss_scale_window, "clean steps before the scale doubles");
  s.hysteresis = positive(fp16, "hysteresis", s.hysteresis, "overflowing steps in a row before the scale halves");
  s.min_loss_scale = fp16.get("min_loss_scale", s.min_loss_scale);
  if (!(s.min_loss_scale > 0)) fp16.fail_value("min_loss_scale", "must be > 0: the smallest dynamic scale");
  if (config.has("communication_data_type")) {
    const std::string type = config.require<std::string>("communication_data_type");
    run.communication_data_type =
        with_value_context(config, "communication_data_type", [&] { return parse_precision(type); });
  }
  const Config data_types = config.object("data_types");
  if (data_types.has("grad_accum_dtype")) {
    const std::string type = data_types.require<std::string>("grad_accum_dtype");
    run.grad_accum_dtype = with_value_context(data_types, "grad_accum_dtype", [&] { return parse_precision(type); });
  }
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

// A positive integer the section must give (an inline model's shape key).
int required_positive(const Config& section, std::string_view key, std::string_view what) {
  if (!section.has(key)) section.fail_value(key, fmt::format("is required: {}", what));
  return positive(section, key, 1, what);
}

// The small vision tower pipeflow trains (nn/vision_language_model.h), in
// the inline GPT's key names: CLIP's embeddings (class token, pre-LayerNorm)
// and GPT-2 blocks (MLP 4 x n_embd) over the patches of one RGB image, the
// projector taking the patch tokens (LLaVA's "default": the class token dropped).
VisionSpec read_inline_vision(const Config& section) {
  const int layers = required_positive(section, "n_layer", "the vision tower's blocks");
  const int heads = required_positive(section, "n_head", "the vision tower's attention heads");
  const int hidden = required_positive(section, "n_embd", "the vision tower's width");
  const int image_size = required_positive(section, "image_size", "pixels per side of the square image");
  const int patch_size = required_positive(section, "patch_size", "pixels per side of a patch");
  if (hidden % heads != 0) {
    section.fail_value("n_embd", fmt::format("must be a multiple of n_head ({}): the tower splits its width into "
                                             "equal heads",
                                             heads));
  }
  if (image_size % patch_size != 0) {
    section.fail_value("image_size", fmt::format("must be a multiple of patch_size ({}): the image is cut into "
                                                 "whole patches",
                                                 patch_size));
  }
  return VisionSpec{.layers = layers,
                    .hidden = hidden,
                    .heads = heads,
                    .ffn = gpt_ffn(hidden),
                    .image_size = image_size,
                    .patch_size = patch_size,
                    .channels = 3,
                    .class_token = true,
                    .drop_class_token = true,
                    .images = 1};
}

ModelSpec read_inline_model(const Config& section) {
  const int layers = required_positive(section, "n_layer", "the number of transformer blocks");
  const int heads = required_positive(section, "n_head", "the attention heads");
  const int hidden = required_positive(section, "n_embd", "the model width");
  const int context = required_positive(section, "n_ctx", "the most positions a sequence may have");
  const int vocab = positive(section, "vocab_size", 256, "the vocabulary (256 for bytes)");
  if (hidden % heads != 0) {
    section.fail_value("n_embd", fmt::format("must be a multiple of n_head ({}): pipeflow's GPT splits the width "
                                             "into equal heads",
                                             heads));
  }
  ModelSpec spec = gpt_model(fmt::format("gpt-{}x{}", layers, hidden), layers, hidden, heads, vocab, context);
  if (section.has("vision")) spec.vision = read_inline_vision(section.object("vision"));
  return spec;
}

void read_model(const Config& config, RunConfig& run) {
  if (config.is_object("model")) {
    run.model_source = "inline";
    const Config section = config.object("model");
    if (section.has("model_type") || section.has("num_hidden_layers")) {
      // A Hugging Face config.json written inline: its keys, its defaults.
      ModelSpec spec = model_from_hf_config_text(json_text(config.raw("model")), config.source() + " (model)");
      spec.name = fmt::format("{}-{}x{}", to_string(spec.architecture), spec.layers, spec.hidden);
      run.model = spec;
    } else {
      run.model = read_inline_model(section);
    }
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

// pipeline.schedule_file: read here, validated by resolve().
void read_schedule_file(const Config& section, PipelineConfig& p) {
  p.schedule_file = section.require<std::string>("schedule_file");
  if (section.has("schedule")) {
    section.fail_value("schedule", fmt::format("and schedule_file = \"{}\" both choose the schedule: give one of "
                                               "the two",
                                               p.schedule_file));
  }
  CsvReadNotes notes;
  p.file_schedule =
      with_value_context(section, "schedule_file", [&] { return load_schedule_file(p.schedule_file, &notes); });
  p.file_note = describe_schedule_file(p.schedule_file, notes);
  if (p.file_schedule->is_inference()) {
    section.fail_value("schedule_file", "is a forward-only inference schedule: training needs a backward");
  }
  p.schedule.clear();
}

// stages or virtual_stages with a schedule file: given, it must be the file's.
void check_agrees_with_file(const Config& section, std::string_view key, int value, int from_file,
                            const std::string& path, std::string_view unit, std::string_view units) {
  if (value == from_file) return;
  section.fail_value(key, fmt::format("but schedule_file {} has {}: remove {} to take the file's, or use a file "
                                      "dumped for {}",
                                      path, format_count(from_file, std::string(unit), std::string(units)), key,
                                      value));
}

PipelineConfig read_pipeline(const Config& config) {
  PipelineConfig p;
  const Config section = config.object("pipeline");
  if (section.has("schedule_file")) {
    read_schedule_file(section, p);
    p.ranks = p.file_schedule->num_ranks();
    p.chunks = p.file_schedule->chunks_per_rank();
  }
  p.ranks = positive(section, "stages", p.ranks, "the number of pipeline ranks");
  if (section.has("partition_method")) {
    const std::string method = section.require<std::string>("partition_method");
    p.partition_method = with_value_context(section, "partition_method", [&] { return parse_partition_method(method); });
  }
  p.recompute_interval = non_negative(section, "activation_checkpoint_interval", p.recompute_interval,
                                                  "0 for no checkpointing, k to recompute every block");
  if (!p.file_schedule) {
    p.schedule = lower(section.get("schedule", p.schedule));
    const ScheduleInfo* info = find_schedule(p.schedule);
    if (info == nullptr) section.fail_value("schedule", fmt::format("known schedules are {}", known_schedule_names()));
    with_value_context(section, "schedule", [&] { require_training_schedule(*info); });
  }
  p.chunks = positive(section, "virtual_stages", p.chunks, "model chunks per rank");
  if (p.file_schedule) {
    check_agrees_with_file(section, "stages", p.ranks, p.file_schedule->num_ranks(), p.schedule_file, "rank", "ranks");
    check_agrees_with_file(section, "virtual_stages", p.chunks, p.file_schedule->chunks_per_rank(),
                           p.schedule_file, "model chunk per rank", "model chunks per rank");
  }
  return p;
}

// freeze and lora: what can be checked without the model (the patterns and
// the target names are checked against its layers when it is priced).
TrainingSpec read_training(const Config& config) {
  TrainingSpec training;
  training.freeze = config.get("freeze", std::vector<std::string>{});
  for (const std::string& pattern : training.freeze) {
    if (pattern.empty()) config.fail_value("freeze", "a pattern must not be empty; e.g. [\"vision.*\"]");
  }
  if (!config.has("lora")) return training;
  if (!config.is_object("lora")) config.fail_value("lora", "must be an object {r, alpha, target, train}");
  const Config lora = config.object("lora");
  LoraSpec spec;
  spec.rank = lora.require<int>("r");
  if (spec.rank < 1) lora.fail_value("r", "must be >= 1 (the adapters' rank; 8 to 64 are usual)");
  spec.alpha = lora.get("alpha", 2.0 * spec.rank);
  if (!(spec.alpha > 0)) lora.fail_value("alpha", "must be > 0 (the update is scaled by alpha / r)");
  spec.targets = lora.require<std::vector<std::string>>("target");
  if (spec.targets.empty()) lora.fail_value("target", "name the matrices to adapt, e.g. [\"q_proj\", \"v_proj\"]");
  spec.train = lora.get("train", std::vector<std::string>{});
  training.lora = spec;
  return training;
}

void read_simulation_keys(const Config& config, RunConfig& run) {
  run.hardware_source = config.get("hardware", run.hardware_source);
  run.hardware = with_value_context(config, "hardware", [&] { return resolve_hardware(run.hardware_source); });
  run.devices = optional_positive(config, "devices", "tensor_parallel × pipeline.stages × data_parallel");
  run.tensor_parallel = positive(config, "tensor_parallel", 1, "1 for no tensor parallelism");
  run.data_parallel = positive(config, "data_parallel", 1, "1 for a single replica");
  run.data_parallel_given = config.has("data_parallel");
  run.sequence_parallel = config.get("sequence_parallel", false);
  const std::string order = config.get("rank_order", std::string(to_string(RankOrder::kTensorDataPipeline)));
  if (order == to_string(RankOrder::kTensorDataPipeline)) {
    run.rank_order = RankOrder::kTensorDataPipeline;
  } else if (order == to_string(RankOrder::kTensorPipelineData)) {
    run.rank_order = RankOrder::kTensorPipelineData;
  } else {
    config.fail_value("rank_order", "must be \"tp-dp-pp\" (Megatron-LM's default) or \"tp-pp-dp\"");
  }
  if (config.has("recompute")) {
    const std::string text = config.require<std::string>("recompute");
    run.recompute = with_value_context(config, "recompute", [&] { return parse_recompute(text); });
  }
  run.seq_length = non_negative(config, "seq_length", 0, "tokens per sequence, 0 for the model's context");
  if (config.is_object("variable_seq_lengths")) {
    run.seq_length_distribution = parse_length_distribution(config.object("variable_seq_lengths"));
  } else {
    run.variable_seq_lengths = config.get("variable_seq_lengths", std::vector<int>{});  // checked by resolve()
  }
  run.variable_images = config.get("variable_images", std::vector<int>{});
  for (int images : run.variable_images) {
    if (images < 1) {
      config.fail_value("variable_images",
                        "every count must be >= 1 (images per sequence; a micro-batch without images is not "
                        "modelled)");
    }
  }
  const std::string comm = config.get("comm_mode", "overlapped");
  if (comm == "overlapped") {
    run.comm_mode = CommMode::kOverlapped;
  } else if (comm == "blocking") {
    run.comm_mode = CommMode::kBlocking;
  } else {
    config.fail_value("comm_mode", "must be \"overlapped\" or \"blocking\"");
  }
  run.block_launch_overhead_s = config.get("block_launch_overhead_s", 0.0);
  if (!(run.block_launch_overhead_s >= 0 && run.block_launch_overhead_s <= 1)) {
    config.fail_value("block_launch_overhead_s",
                      "must be a number of seconds from 0 to 1: the host time each block pass adds beyond its "
                      "kernels (4 ms is 0.004); 0 or absent leaves it out");
  }
  run.training = read_training(config);
}

BatchKeys read_batch_keys(const Config& config) {
  BatchKeys keys;
  keys.train_batch_size = optional_positive(config, "train_batch_size", "sequences per step");
  keys.micro_batch = optional_positive(config, "train_micro_batch_size_per_gpu", "sequences per micro-batch");
  keys.gradient_accumulation_steps =
      optional_positive(config, "gradient_accumulation_steps", "micro-batches per step");
  return keys;
}

// The rules between keys that need no model, checked once every key is read.
void check_consistency(const Config& config, const RunConfig& run) {
  if (run.devices) {
    with_value_context(config, "devices", [&] {
      check_device_count(*run.devices, run.tensor_parallel, run.pipeline.ranks, run.data_parallel);
    });
  }
  if (static_cast<int>(run.zero) >= 2 && run.pipeline.ranks > 1) {
    config.object("zero_optimization")
        .fail_value("stage", fmt::format("ZeRO-{} shards the gradients, which a pipeline accumulates over its "
                                         "micro-batches: DeepSpeed's pipeline engine refuses it (ZeRO-2 and ZeRO-3 "
                                         "are incompatible with pipeline parallelism) with pipeline.stages = {}; "
                                         "use stage 1 (or 0)",
                                         static_cast<int>(run.zero), run.pipeline.ranks));
  }
  if (run.recompute && run.pipeline.recompute_interval > 0 && *run.recompute != Recompute::kFull) {
    config.fail_value("recompute", fmt::format("pipeline.activation_checkpoint_interval = {} recomputes whole "
                                               "blocks: drop recompute or set it to \"full\"",
                                               run.pipeline.recompute_interval));
  }
}

Json model_to_json(const RunConfig& run) {
  if (run.model_source != "inline") return run.model_source;
  const ModelSpec& m = *run.model;
  if (m.architecture == Architecture::kLlama) return llama_hf_config(m);
  Json json{{"n_layer", m.layers}, {"n_head", m.heads}, {"n_embd", m.hidden}, {"n_ctx", m.max_positions},
            {"vocab_size", m.vocab}};
  if (m.vision) {  // as read_inline_vision's tower: what pipeflow train runs of any vision config
    const VisionSpec& v = *m.vision;
    json["vision"] = Json{{"n_layer", v.layers}, {"n_head", v.heads}, {"n_embd", v.hidden},
                          {"image_size", v.image_size}, {"patch_size", v.patch_size}};
  }
  return json;
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

namespace {

// The file's keys with the command line's written over them (see
// parse_run_config for the rules of derived keys).
Json with_overrides(Json json, const RunOverrides& o) {
  const auto erase = [&](std::string_view path) {
    Json* at = &json;
    std::size_t begin = 0;
    for (std::size_t dot = path.find('.'); dot != std::string_view::npos; dot = path.find('.', begin)) {
      const std::string part(path.substr(begin, dot - begin));
      if (!at->is_object() || !at->contains(part)) return;
      at = &(*at)[part];
      begin = dot + 1;
    }
    if (at->is_object()) at->erase(std::string(path.substr(begin)));
  };
  const bool all_batch_keys = json.contains("train_batch_size") && json.contains("train_micro_batch_size_per_gpu") &&
                              json.contains("gradient_accumulation_steps");
  // Keys that replace another choice, or that another key is derived from.
  if (o.has("pipeline.schedule")) erase("pipeline.schedule_file");
  if (o.has("pipeline.schedule_file")) erase("pipeline.schedule");
  if (o.has("data.path")) erase("data.paths");
  // Enabling one half precision on the command line turns the file's other off.
  const auto enables = [&](std::string_view path) { return o.has(path) && *o.find(path) == true; };
  if (enables("bf16.enabled")) erase("fp16.enabled");
  if (enables("fp16.enabled")) erase("bf16.enabled");
  if (o.has("data.paths")) erase("data.path");
  if (o.has("train_micro_batch_size_per_gpu") || o.has("train_batch_size") ||
      (o.has("data_parallel") && all_batch_keys)) {
    erase("gradient_accumulation_steps");
  }
  if (!o.has("devices") && (o.has("tensor_parallel") || o.has("pipeline.stages") || o.has("data_parallel"))) {
    erase("devices");
  }
  for (const auto& [path, value] : o.values()) {
    Json* at = &json;
    std::size_t begin = 0;
    for (std::size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', begin)) {
      Json& next = (*at)[path.substr(begin, dot - begin)];
      if (!next.is_object()) next = Json::object();
      at = &next;
      begin = dot + 1;
    }
    (*at)[path.substr(begin)] = value;
  }
  return json;
}

RunConfig parse_keys(const Config& config) {
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
  run.reduce_bucket_size = config.object("zero_optimization").get("reduce_bucket_size", kReduceBucketSize);
  if (run.reduce_bucket_size < 1 || run.reduce_bucket_size > std::numeric_limits<int>::max()) {
    config.object("zero_optimization")
        .fail_value("reduce_bucket_size", fmt::format("must lie in [1, {}]: the elements reduced over the data-parallel "
                                                      "replicas per call (MPI counts are int)",
                                                      std::numeric_limits<int>::max()));
  }
  read_precision(config, run);
  run.steps_per_print = non_negative(config, "steps_per_print", 0, "steps between progress lines, 0 for about 50");
  config.get("wall_clock_breakdown", false);  // pipeflow times every action anyway
  run.pipeline = read_pipeline(config);
  read_model(config, run);
  run.data = read_data(config);
  run.steps = positive(config, "steps", run.steps, "optimizer steps to run");
  const std::int64_t seed = config.get<std::int64_t>("seed", static_cast<std::int64_t>(run.seed));
  if (seed < 0) config.fail_value("seed", "must be an integer >= 0");
  run.seed = static_cast<std::uint64_t>(seed);
  run.eval_interval =
      non_negative(config, "eval_interval", run.eval_interval, "steps between validations, 0 for the last step only");
  run.out_dir = config.get("out_dir", run.out_dir);
  if (run.out_dir.empty()) config.fail_value("out_dir", "must name a directory");
  std::error_code unreadable;  // a name too long or a loop of links: creating the folder says so
  if (std::filesystem::exists(run.out_dir, unreadable) && !std::filesystem::is_directory(run.out_dir, unreadable)) {
    config.fail_value("out_dir", "names a file, not a directory: choose another out_dir or move the file away");
  }
  const Config checkpoint = config.object("checkpoint");
  run.checkpoint.save_interval = non_negative(checkpoint, "interval", 0, "steps between checkpoints, 0 for none");
  run.checkpoint.dir = checkpoint.get("dir", "");
  run.checkpoint.load = checkpoint.get("load", "");
  run.checkpoint.keep = non_negative(checkpoint, "keep", run.checkpoint.keep, "the newest checkpoints kept, 0 for all");
  run.numerics.max_skipped_steps = positive(config.object("numerics"), "max_skipped_steps",
                                            run.numerics.max_skipped_steps, "non-finite steps in a row before stopping");
  run.metrics.noise_scale_interval =
      non_negative(config.object("metrics"), "noise_scale_interval", run.metrics.noise_scale_interval,
                   "steps between measurements of the gradient noise scale, 0 for none");
  read_simulation_keys(config, run);
  run.not_modelled = read_keys_not_modelled(config);
  config.check_no_unknown_keys();

  check_consistency(config, run);
  if (run.sequence_parallel && run.tensor_parallel == 1) {
    run.warnings.push_back(fmt::format(
        "{}: sequence_parallel = true with tensor_parallel = 1: sequence parallelism splits activations over the "
        "tensor-parallel ranks, so it is off (as Megatron-LM turns it off); use tensor_parallel > 1 for it",
        run.source));
  }
  return run;
}

std::string shape_of(const ModelSpec& m) {
  std::string text = fmt::format("{} layers, {} heads, width {}, context {}, vocabulary {}", m.layers, m.heads,
                                 m.hidden, m.max_positions, m.vocab);
  if (m.architecture == Architecture::kLlama) {
    text = fmt::format("Llama, {}, {} key/value heads, MLP {}, {} head", text, m.kv_heads, m.ffn,
                       m.tied_embeddings ? "tied" : "untied");
  }
  if (m.vision) {
    text += fmt::format(", vision tower of {} layers, width {}, {} image tokens", m.vision->layers, m.vision->hidden,
                        m.vision->images * image_tokens(*m.vision));
  }
  return text;
}

bool same_shape(const ModelSpec& a, const ModelSpec& b) {
  return a.architecture == b.architecture && a.layers == b.layers && a.heads == b.heads && a.hidden == b.hidden &&
         a.max_positions == b.max_positions && a.vocab == b.vocab && a.kv_heads == b.kv_heads && a.ffn == b.ffn &&
         a.tied_embeddings == b.tied_embeddings && a.vision == b.vision;
}

// The model that runs: the configuration's, or the file's (which then also
// stands in the configuration, inline, for the copy kept beside the outputs).
ModelSpec resolve_model_shape(RunConfig& run, const std::optional<ModelFromFile>& from_file) {
  if (run.model && from_file && !same_shape(*run.model, from_file->model)) {
    fail("{}: model = {} ({}) but {} holds {}: leave model out to take the file's shape, or use a file of this "
         "model",
         run.source, run.model_source == "inline" ? std::string("{...}") : run.model_source, shape_of(*run.model),
         from_file->file, shape_of(from_file->model));
  }
  if (run.model) return *run.model;
  if (!from_file) {
    fail("{}: no model: set \"model\" (a preset such as gpt2-124m, a config.json path, or {{n_layer, n_head, "
         "n_embd, n_ctx}}), pass --model, or start from a weights file or checkpoint (--weights, --resume)",
         run.source);
  }
  run.model = from_file->model;
  run.model_source = "inline";
  return from_file->model;
}

// The file fixes the micro-batches per step, and runs only if valid.
void check_schedule_file(const Schedule& file, const std::string& path, int accumulation, const std::string& source) {
  if (accumulation != file.num_microbatches()) {
    fail("{}: gradient_accumulation_steps = {} (given or derived from the batch keys) but pipeline.schedule_file {} "
         "runs {} per step: leave gradient_accumulation_steps out and give at most one of train_batch_size and "
         "train_micro_batch_size_per_gpu to take the file's, or use a file dumped for {}",
         source, accumulation, path, format_count(file.num_microbatches(), "micro-batch", "micro-batches"),
         accumulation);
  }
  const ValidationReport report = validate(file);
  if (!report.ok()) {
    fail("{}: pipeline.schedule_file {} is no valid schedule ({}): fix the file (pipeflow validate {} shows the "
         "same report)\n{}",
         source, path, format_count(static_cast<std::int64_t>(report.violations.size()), "violation"), path,
         report.render(file));
  }
}

}  // namespace

RunConfig parse_run_config(const Config& config, const RunOverrides& overrides) {
  // DeepSpeed's file as written: "auto" resolved, PipelineModule's spellings moved (deepspeed_keys.h).
  std::vector<std::string> notes;
  Json json = deepspeed_as_written(config.json(), config.source(), notes);
  const std::string source = overrides.empty() ? config.source() : config.source() + " with the command line";
  if (!overrides.empty()) json = with_overrides(std::move(json), overrides);
  RunConfig run = parse_keys(Config::from_json(std::move(json), source));
  run.warnings.insert(run.warnings.begin(), notes.begin(), notes.end());
  return run;
}

RunConfig load_run_config(const std::filesystem::path& path, const RunOverrides& overrides) {
  return parse_run_config(Config::load(path), overrides);
}

RunConfig default_run_config(const RunOverrides& overrides) {
  return parse_keys(Config::from_json(with_overrides(Json::object(), overrides), "the command line"));
}

namespace {

constexpr int kProgressLines = 50;  // about this many progress lines a run, without steps_per_print

// data_parallel of a run started as `world` processes: given, it must make
// the world; absent, the world makes it.
void fit_world(RunConfig& run, int world) {
  const int model_parallel = run.tensor_parallel * run.pipeline.ranks;
  if (run.data_parallel_given) {
    if (model_parallel * run.data_parallel != world) {
      fail("{}: tensor_parallel × pipeline.stages × data_parallel = {} × {} × {} = {} ranks, but {} processes were "
           "started: start {} (mpirun -np {}), or leave data_parallel out to take the processes per pipeline",
           run.source, run.tensor_parallel, run.pipeline.ranks, run.data_parallel, model_parallel * run.data_parallel,
           world, model_parallel * run.data_parallel, model_parallel * run.data_parallel);
    }
    return;
  }
  if (world % model_parallel != 0) {
    fail("{}: {} processes were started, not a multiple of tensor_parallel × pipeline.stages = {}: start {} (mpirun "
         "-np {}), or a multiple of it for data parallelism",
         run.source, world, model_parallel, model_parallel, model_parallel);
  }
  run.data_parallel = world / model_parallel;
  // A data_parallel the file did not give re-derives the accumulation, as
  // --data-parallel does (parse_run_config).
  BatchKeys& keys = run.batch_keys;
  if (keys.train_batch_size && keys.micro_batch && keys.gradient_accumulation_steps) {
    keys.gradient_accumulation_steps.reset();
  }
  run.devices.reset();
}

}  // namespace

ResolvedRun resolve(const RunConfig& given, const std::optional<ModelFromFile>& from_file,
                    std::optional<int> world_size) {
  ResolvedRun r;
  r.config = given;
  if (world_size) fit_world(r.config, *world_size);
  const RunConfig& run = r.config;
  r.model = resolve_model_shape(r.config, from_file);
  const std::string& source = run.source;
  const std::optional<Schedule>& file = run.pipeline.file_schedule;
  BatchKeys batch_keys = run.batch_keys;
  const bool keys_fix_accumulation =
      batch_keys.gradient_accumulation_steps || (batch_keys.train_batch_size && batch_keys.micro_batch);
  if (file && !keys_fix_accumulation) batch_keys.gradient_accumulation_steps = file->num_microbatches();
  r.batch = resolve_batch_sizes(batch_keys, run.data_parallel, source);
  r.devices = run.devices.value_or(checked_product({run.tensor_parallel, run.pipeline.ranks, run.data_parallel},
                                                   fmt::format("{}: tensor_parallel × pipeline.stages × data_parallel",
                                                               source),
                                                   "devices"));
  r.seq_length = run.seq_length > 0 ? run.seq_length : r.model.max_positions;
  if (r.model.architecture == Architecture::kGpt && r.seq_length > r.model.max_positions) {
    fail("{}: seq_length = {}: {} has {} positions: use seq_length <= {}", source, r.seq_length, r.model.name,
         r.model.max_positions, r.model.max_positions);
  }
  r.microbatch_lengths = run.seq_length_distribution ? run.seq_length_distribution->draw(r.batch.accumulation)
                                                     : run.variable_seq_lengths;
  if (const std::optional<LengthDistribution>& d = run.seq_length_distribution) {
    if (d->max > r.seq_length) {
      fail("{}: variable_seq_lengths has max {} > seq_length {}: seq_length is the longest micro-batch's (what the "
           "buffers are sized for): raise seq_length to {} or shorten the lengths",
           source, d->max, r.seq_length, d->max);
    }
    if (r.model.vision) {  // whatever the seed draws
      const int images = run.variable_images.empty()
                             ? r.model.vision->images
                             : *std::max_element(run.variable_images.begin(), run.variable_images.end());
      const std::int64_t tokens = static_cast<std::int64_t>(images) * image_tokens(*r.model.vision);
      if (d->min <= tokens) {
        fail("{}: variable_seq_lengths.min = {}: a sequence holds up to {} image(s) of {} tokens and its text, so a "
             "drawn length must exceed {}: use min >= {}",
             source, d->min, images, image_tokens(*r.model.vision), tokens, tokens + 1);
      }
    }
  }
  r.recompute = run.recompute.value_or(run.pipeline.recompute_interval > 0 ? Recompute::kFull : Recompute::kNone);
  r.sequence_parallel = run.sequence_parallel && run.tensor_parallel > 1;
  r.gradient_accumulation = run.grad_accum_dtype.value_or(default_gradient_accumulation(run.precision, run.zero));
  try {
    check_microbatch_shapes(r.microbatch_lengths, run.variable_images, r.seq_length, r.model, r.batch.accumulation,
                            r.sequence_parallel ? run.tensor_parallel : 1);
  } catch (const Error& error) {
    fail("{}: {}", source, error.what());
  }
  if (r.sequence_parallel) {
    try {
      check_sequence_parallel_split(r.seq_length, run.tensor_parallel);
    } catch (const Error& error) {
      fail("{}: sequence_parallel = true: {}{}", source, error.what(),
           run.seq_length > 0 ? "" : " (seq_length is absent: the model's context)");
    }
  }
  r.checkpoint_dir = run.checkpoint.dir.empty() ? (std::filesystem::path(run.out_dir) / "checkpoints").string()
                                                : run.checkpoint.dir;
  r.steps_per_print =
      run.steps_per_print > 0 ? run.steps_per_print : std::max(1, (run.steps + kProgressLines - 1) / kProgressLines);
  if (file) {
    check_schedule_file(*file, run.pipeline.schedule_file, r.batch.accumulation, source);
    r.schedule = *file;
    return r;
  }
  try {
    r.schedule =
        make_schedule(run.pipeline.schedule, run.pipeline.ranks, r.batch.accumulation, run.pipeline.chunks);
  } catch (const Error& error) {
    fail("{}: pipeline.schedule = \"{}\" (stages = {}, micro-batches per step = {}, virtual_stages = {}): {}", source,
         run.pipeline.schedule, run.pipeline.ranks, r.batch.accumulation, run.pipeline.chunks, error.what());
  }
  return r;
}

std::vector<std::string_view> microbatch_shape_keys(const RunConfig& run) {
  std::vector<std::string_view> keys;
  if (!run.variable_seq_lengths.empty() || run.seq_length_distribution) keys.push_back("variable_seq_lengths");
  if (!run.variable_images.empty()) keys.push_back("variable_images");
  return keys;
}

std::vector<int> LengthDistribution::draw(int count) const {
  std::uint64_t state = seed;
  const auto uniform01 = [&state] {  // splitmix64 (Steele et al. 2014), 53 bits into [0, 1)
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  };
  std::vector<int> lengths;
  for (int i = 0; i < count; ++i) {
    double length = 0;
    if (kind == Kind::kUniform) {
      length = min + std::floor(uniform01() * (max - min + 1));
    } else {
      const double u1 = 1 - uniform01();  // (0, 1]: log(u1) finite
      const double u2 = uniform01();
      length = std::round(mean + std * std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2));
    }
    lengths.push_back(static_cast<int>(std::clamp(length, static_cast<double>(min), static_cast<double>(max))));
  }
  return lengths;
}

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
                         {"weight_decay", run.optimizer.weight_decay},
                         {"adam_w_mode", run.optimizer.adam_w_mode}}}};
  if (!run.scheduler.type.empty()) json["scheduler"] = scheduler_to_json(run.scheduler);
  json["zero_optimization"] = {{"stage", static_cast<int>(run.zero)}, {"reduce_bucket_size", run.reduce_bucket_size}};
  const LossScaleConfig& scale = run.loss_scale;
  json["fp16"] = {{"enabled", run.precision == Precision::kFp16},
                  {"loss_scale", scale.loss_scale},
                  {"initial_scale_power", scale.initial_scale_power},
                  {"loss_scale_window", scale.loss_scale_window},
                  {"hysteresis", scale.hysteresis},
                  {"min_loss_scale", scale.min_loss_scale}};
  json["bf16"] = {{"enabled", run.precision == Precision::kBf16}};
  if (run.communication_data_type) json["communication_data_type"] = std::string(to_string(*run.communication_data_type));
  if (run.grad_accum_dtype) json["data_types"] = {{"grad_accum_dtype", std::string(to_string(*run.grad_accum_dtype))}};
  json["steps_per_print"] = run.steps_per_print;
  json["pipeline"] = {{"stages", run.pipeline.ranks},
                      {"partition_method", to_string(run.pipeline.partition_method)},
                      {"activation_checkpoint_interval", run.pipeline.recompute_interval},
                      {"virtual_stages", run.pipeline.chunks}};
  if (run.pipeline.file_schedule) {
    json["pipeline"]["schedule_file"] = run.pipeline.schedule_file;
  } else {
    json["pipeline"]["schedule"] = run.pipeline.schedule;
  }
  if (run.model) json["model"] = model_to_json(run);
  json["data"] = {{"paths", run.data.paths}, {"validation_fraction", run.data.validation_fraction}};
  json["steps"] = run.steps;
  json["seed"] = run.seed;
  json["eval_interval"] = run.eval_interval;
  json["out_dir"] = run.out_dir;
  json["checkpoint"] = {{"interval", run.checkpoint.save_interval}, {"dir", run.checkpoint.dir},
                        {"load", run.checkpoint.load}, {"keep", run.checkpoint.keep}};
  json["numerics"] = {{"max_skipped_steps", run.numerics.max_skipped_steps}};
  json["metrics"] = {{"noise_scale_interval", run.metrics.noise_scale_interval}};
  json["hardware"] = run.hardware_source;
  if (run.devices) json["devices"] = *run.devices;
  json["tensor_parallel"] = run.tensor_parallel;
  json["data_parallel"] = run.data_parallel;
  json["sequence_parallel"] = run.sequence_parallel;
  json["rank_order"] = to_string(run.rank_order);
  if (run.recompute) json["recompute"] = std::string(to_string(*run.recompute));
  json["seq_length"] = run.seq_length;
  if (const std::optional<LengthDistribution>& d = run.seq_length_distribution) {
    json["variable_seq_lengths"] = {{"distribution", d->kind == LengthDistribution::Kind::kNormal ? "normal" : "uniform"},
                                    {"min", d->min},
                                    {"max", d->max},
                                    {"seed", d->seed}};
    if (d->kind == LengthDistribution::Kind::kNormal) {
      json["variable_seq_lengths"]["mean"] = d->mean;
      json["variable_seq_lengths"]["std"] = d->std;
    }
  } else {
    json["variable_seq_lengths"] = run.variable_seq_lengths;
  }
  json["variable_images"] = run.variable_images;
  json["comm_mode"] = run.comm_mode == CommMode::kBlocking ? "blocking" : "overlapped";
  json["block_launch_overhead_s"] = run.block_launch_overhead_s;
  json["freeze"] = run.training.freeze;
  if (const std::optional<LoraSpec>& lora = run.training.lora) {
    json["lora"] = {{"r", lora->rank}, {"alpha", lora->alpha}, {"target", lora->targets}, {"train", lora->train}};
  }
  return json_text(json, 2) + "\n";
}

}  // namespace pipeflow
