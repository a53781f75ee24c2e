// `pipeflow plan`: searches every layout of a model on a cluster, ranks the
// ones that fit by simulated step time, and exports the best as a pipeflow,
// DeepSpeed or Megatron-LM configuration.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "inference_flags.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/log.h"
#include "pipeflow/core/table.h"
#include "pipeflow/core/units.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/plan/planner.h"
#include "pipeflow/sim/report.h"
#include "run_options.h"

namespace pipeflow::cli {
namespace {

struct PlanCommand {
  std::string model;
  std::string hardware = "a100-80g";
  int devices = 0;
  std::optional<int> global_batch;
  std::optional<int> seq_length;
  int top = 5;
  std::string precision = "bf16";
  double memory_fraction = 0.8;
  // Empty: the default, parameters and balanced (PlanRequest's); --inference: parameters.
  std::vector<std::string> partitions;
  bool json = false;
  std::string profile;         // a measured run: the cost model is calibrated by it
  std::string profile_config;  // that run's configuration, where the input does not state it
  std::string write_config;
  std::string deepspeed;
  std::string megatron;
  // --inference: the stage counts that fit generation instead.
  bool inference = false;
  InferenceFlags inference_flags;
  // The run configuration's keys plan reads: what trains (freeze, lora),
  // the host time a block pass adds (block_launch_overhead_s), and the
  // micro-batches' own shapes, which it refuses.
  RunFlags run_key_flags;
};

// --freeze, --lora and --block-launch-overhead read as the run configuration
// reads its keys; --variable-seq-lengths and --variable-images refused with
// the fix.
RunConfig run_keys_of(const PlanCommand& command) {
  const RunConfig config = default_run_config(command.run_key_flags.overrides());
  for (std::string_view key : microbatch_shape_keys(config)) {
    const std::string_view flag = find_run_key(key)->flag;
    fail("{}: plan prices every micro-batch of a layout at one shape (--seq and the model's images per sequence); "
         "write the layout it finds with --write-config and give {} to pipeflow simulate --config with it",
         flag, flag);
  }
  return config;
}

std::string inference_report(const InferencePlanRequest& request, const InferencePlan& plan) {
  const InferenceSetup& s = request.setup;
  std::string out = fmt::format(
      "{} on 1 .. {} × {}: {}, context {} tokens, prompts of {} tokens; memory limit {} × {} = {} per device\n",
      s.model.name, request.max_stages, s.hardware.name, format_count(s.sequences, "sequence"),
      s.context, s.prompt_tokens,
      request.memory_fraction, format_bytes(s.hardware.memory_bytes), format_bytes(plan.limit_bytes));
  TextTable table({"#", "stages", "micro-batches", "time to first token", "per token", "tokens/s", "peak memory"});
  for (std::size_t i = 0; i < plan.fitting.size(); ++i) {
    const InferencePrediction& p = plan.fitting[i].prediction;
    table.add_row({std::to_string(i + 1), std::to_string(plan.fitting[i].stages),
                   std::to_string(p.setup.microbatches), format_seconds(p.time_to_first_token_s),
                   format_seconds(p.per_token_s), fmt::format("{:.1f}", p.tokens_per_s), format_bytes(p.peak_bytes())});
  }
  out += plan.fitting.empty() ? "no stage count fits\n" : table.render();
  if (plan.more_fitting > 0) {
    out += fmt::format("{} more stage {} fit{}: --top {} lists them all\n", plan.more_fitting,
                       plan.more_fitting == 1 ? "count" : "counts", plan.more_fitting == 1 ? "s" : "",
                       plan.fitting.size() + static_cast<std::size_t>(plan.more_fitting));
  }
  if (!plan.rejected.empty() || !plan.untried.empty()) out += "does not fit:\n";
  for (const InferenceOption& o : plan.rejected) {
    out += fmt::format("  {}: {}\n", format_count(o.stages, "stage"), o.rejected);
  }
  if (!plan.untried.empty()) out += fmt::format("  {}\n", plan.untried);
  return out;
}

std::string inference_json_report(const InferencePlanRequest& request, const InferencePlan& plan) {
  nlohmann::ordered_json json;
  json["model"] = request.setup.model.name;
  json["hardware"] = request.setup.hardware.name;
  json["memory_fraction"] = request.memory_fraction;
  json["memory_limit_bytes"] = plan.limit_bytes;
  json["fitting"] = nlohmann::ordered_json::array();
  for (const InferenceOption& o : plan.fitting) json["fitting"].push_back(inference_json(o.prediction));
  json["more_fitting"] = plan.more_fitting;
  json["rejected"] = nlohmann::ordered_json::array();
  for (const InferenceOption& o : plan.rejected) {
    json["rejected"].push_back({{"stages", o.stages}, {"reason", o.rejected}});
  }
  if (!plan.untried.empty()) json["untried"] = plan.untried;
  return json_text(json, 2) + "\n";
}

void run_inference(const PlanCommand& command) {
  if (!command.write_config.empty() || !command.deepspeed.empty() || !command.megatron.empty()) {
    fail("--write-config, --deepspeed and --megatron export a training layout: leave them out with --inference");
  }
  if (!command.profile.empty()) {
    fail("--profile calibrates the training plan by a measured training step: leave it out with --inference");
  }
  if (const double overhead = default_run_config(command.run_key_flags.overrides()).block_launch_overhead_s;
      overhead > 0) {
    fail("--block-launch-overhead {}: the host time of a training step's block passes, which --inference does not "
         "price: leave it out with --inference",
         overhead);
  }
  InferencePlanRequest request;
  request.setup.model = resolve_model(command.model);
  request.setup.hardware = resolve_hardware(command.hardware);
  if (command.seq_length) require_positive_flag("--seq", *command.seq_length, "tokens of each sequence: the context");
  command.inference_flags.apply(request.setup, command.seq_length.value_or(0));
  // Resolved here, so that the report's heading names the defaults, and a
  // setup no stage count can run is refused once rather than for each.
  const InferenceSetup resolved = resolve_inference_setup(request.setup);
  request.setup.context = resolved.context;
  request.setup.prompt_tokens = resolved.prompt_tokens;
  if (command.partitions.size() > 1) {
    fail("--inference takes one --partition method (got {})", command.partitions.size());
  }
  request.setup.partition = parse_partition_method(command.partitions.empty() ? "parameters" : command.partitions.front());
  request.max_stages = command.devices;
  request.memory_fraction = command.memory_fraction;
  request.top_k = command.top;
  const InferencePlan plan = plan_inference(request);
  write_output(command.json ? inference_json_report(request, plan) : inference_report(request, plan), "");
  if (plan.fitting.empty()) {
    fail("no stage count of 1 .. {} fits (reasons above): use more --devices, fewer --sequences, a shorter "
         "--context or a larger --memory-fraction",
         request.max_stages);
  }
}

PlanRequest make_request(const PlanCommand& command) {
  PlanRequest request;
  request.model = resolve_model(command.model);
  request.hardware = resolve_hardware(command.hardware);
  request.devices = command.devices;
  request.global_batch = *command.global_batch;
  request.seq_length = *command.seq_length;
  request.top_k = command.top;
  request.precision = parse_precision(command.precision);
  request.memory_fraction = command.memory_fraction;
  const RunConfig keys = run_keys_of(command);
  request.training = keys.training;
  request.block_launch_overhead_s = keys.block_launch_overhead_s;
  if (!command.partitions.empty()) {
    request.partitions.clear();
    for (const std::string& method : command.partitions) request.partitions.push_back(parse_partition_method(method));
  }
  if (!command.profile.empty()) {
    refuse_launch_overhead_with_profile(request.block_launch_overhead_s);
    const std::optional<std::filesystem::path> config =
        command.profile_config.empty() ? std::nullopt : std::optional<std::filesystem::path>(command.profile_config);
    request.measured = measured_run_of(command.profile, config, "--profile-config");
  }
  return request;
}

// What the measured run calibrated: each kind's measured over modelled.
std::string calibration_line(const PlanRequest& request) {
  const Resimulator run(*request.measured);
  return fmt::format("calibrated by the measured run {}: forward x {:.3g}, backward x {:.3g}, optimizer x {:.3g} "
                     "(measured over the cost model's; its own durations where a layout does its work on its cut)\n",
                     request.measured->costs.source, run.scale(ActionKind::kForward),
                     run.scale(ActionKind::kBackward), run.optimizer_scale());
}

std::string layout_line(const Layout& l) {
  std::string schedule = l.schedule;
  if (l.chunks > 1) schedule += fmt::format(" v={}", l.chunks);
  return fmt::format("tp {} × pp {} × dp {}, b {} (m {}), {}, recompute {}{}, zero {}, {}", l.tensor_parallel,
                     l.pipeline_ranks, l.data_parallel, l.micro_batch, microbatches_per_step(l), schedule,
                     to_string(l.recompute), l.sequence_parallel ? " + SP" : "", static_cast<int>(l.zero),
                     to_string(l.partition));
}

std::string peaks_text(const PlanCandidate& c) {
  double low = c.stage_peak_bytes.front(), high = low;
  for (double bytes : c.stage_peak_bytes) {
    low = std::min(low, bytes);
    high = std::max(high, bytes);
  }
  return low == high ? format_bytes(high) : format_bytes(low) + " .. " + format_bytes(high);
}

std::string text_report(const PlanRequest& request, const PlanResult& result) {
  std::string out = fmt::format(
      "{} on {} × {}, global batch {} × {} tokens: {} candidates, {} simulated, {} skipped by the time bound\n",
      request.model.name, request.devices, request.hardware.name, request.global_batch, request.seq_length,
      result.candidates, result.simulated, result.pruned);
  if (request.measured) out += calibration_line(request);
  TextTable table({"#", "layout", "step", "tokens/s", "MFU", "bubble", "ZB rate", "comm", "recompute",
                   "peak memory per stage"});
  for (std::size_t i = 0; i < result.best.size(); ++i) {
    const PlanCandidate& c = result.best[i];
    table.add_row({std::to_string(i + 1), layout_line(c.layout), format_seconds(c.step_time_s),
                   fmt::format("{:.0f}", c.tokens_per_s), format_percent(c.mfu), format_percent(c.bubble_ratio),
                   format_percent(c.zero_bubble_rate), format_percent(c.communication_share),
                   format_percent(c.recompute_overhead), peaks_text(c)});
  }
  out += table.render();
  out += fmt::format("memory limit: {} × {} = {} per device\nrejected:", request.memory_fraction,
                     format_bytes(request.hardware.memory_bytes),
                     format_bytes(request.memory_fraction * request.hardware.memory_bytes));
  for (int r = 0; r < kRejectReasons; ++r) {
    out += fmt::format(" {} {}{}", result.rejected[r], to_string(static_cast<RejectReason>(r)),
                       r + 1 < kRejectReasons ? "," : "\n");
  }
  return out;
}

std::string json_report(const PlanRequest& request, const PlanResult& result) {
  nlohmann::ordered_json json;
  json["model"] = request.model.name;
  json["hardware"] = request.hardware.name;
  json["memory_fraction"] = request.memory_fraction;
  json["candidates_enumerated"] = result.candidates;
  json["simulated"] = result.simulated;
  json["pruned_by_time_bound"] = result.pruned;
  if (request.measured) {
    const Resimulator run(*request.measured);
    json["calibration"] = {{"source", request.measured->costs.source},
                           {"forward", run.scale(ActionKind::kForward)},
                           {"backward", run.scale(ActionKind::kBackward)},
                           {"optimizer", run.optimizer_scale()}};
  }
  json["candidates"] = nlohmann::ordered_json::array();
  for (const PlanCandidate& c : result.best) {
    json["candidates"].push_back({{"layout", layout_json(c.layout, microbatches_per_step(c.layout),
                                                         c.layout.chunks)},
                                  {"step_time_s", c.step_time_s},
                                  {"tokens_per_s", c.tokens_per_s},
                                  {"mfu", c.mfu},
                                  {"tflops_per_device", c.tflops_per_device},
                                  {"bubble_ratio", c.bubble_ratio},
                                  {"zero_bubble_rate", c.zero_bubble_rate},
                                  {"communication_share", c.communication_share},
                                  {"recompute_overhead", c.recompute_overhead},
                                  {"stage_peak_memory_bytes", c.stage_peak_bytes},
                                  {"memory_headroom_bytes", c.headroom_bytes}});
  }
  nlohmann::ordered_json rejected;
  for (int r = 0; r < kRejectReasons; ++r) {
    rejected[std::string(to_string(static_cast<RejectReason>(r)))] = result.rejected[r];
  }
  json["rejected"] = rejected;
  return json_text(json, 2) + "\n";
}

// A model or hardware file as an absolute path (a preset's name as it is):
// a configuration's paths are read from the working directory of whoever
// runs it, which need not be plan's (resolve_model's rule tells them apart).
std::string from_anywhere(const std::string& name_or_path) {
  const bool is_path = name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json");
  return is_path ? std::filesystem::absolute(name_or_path).lexically_normal().string() : name_or_path;
}

// A run configuration `pipeflow simulate --config` reads (and `train` where
// it supports the layout): the layout's keys over the defaults, every key
// written out (run_config_to_json).
std::string pipeflow_config(const PlanCommand& command, const Layout& l) {
  RunOverrides o;
  o.set("model", from_anywhere(command.model));
  o.set("hardware", from_anywhere(command.hardware));
  o.set("devices", l.devices);
  o.set("tensor_parallel", l.tensor_parallel);
  o.set("data_parallel", l.data_parallel);
  o.set("sequence_parallel", l.sequence_parallel);
  o.set("recompute", to_string(l.recompute));
  o.set("seq_length", l.seq_length);
  o.set("train_batch_size", l.global_batch);
  o.set("train_micro_batch_size_per_gpu", l.micro_batch);
  o.set("zero_optimization.stage", static_cast<int>(l.zero));
  o.set("pipeline.stages", l.pipeline_ranks);
  o.set("pipeline.schedule", l.schedule);
  o.set("pipeline.virtual_stages", l.chunks);
  o.set("pipeline.partition_method", to_string(l.partition));
  o.set("bf16.enabled", l.precision == Precision::kBf16);
  o.set("fp16.enabled", l.precision == Precision::kFp16);
  o.set("freeze", l.training.freeze);
  if (l.block_launch_overhead_s > 0) o.set("block_launch_overhead_s", l.block_launch_overhead_s);
  if (const std::optional<LoraSpec>& lora = l.training.lora) {
    o.set("lora", {{"r", lora->rank}, {"alpha", lora->alpha}, {"target", lora->targets}, {"train", lora->train}});
  }
  return run_config_to_json(default_run_config(o));
}

// DeepSpeed's pipeline engine runs 1F1B only, without tensor parallelism of
// its own, and checkpoints whole layers (activation_checkpoint_interval 1 =
// full recomputation); the best layout it can express is searched for.
std::string deepspeed_config(const Layout& l) {
  nlohmann::ordered_json json;
  json["train_batch_size"] = l.global_batch;
  json["train_micro_batch_size_per_gpu"] = l.micro_batch;
  json["gradient_accumulation_steps"] = microbatches_per_step(l);
  if (l.precision != Precision::kFp32) json[std::string(to_string(l.precision))] = {{"enabled", true}};
  json["zero_optimization"] = {{"stage", static_cast<int>(l.zero)}};
  json["pipeline"] = {{"stages", l.pipeline_ranks},
                      {"partition_method", to_string(l.partition)},
                      {"activation_checkpoint_interval", l.recompute == Recompute::kFull ? 1 : 0}};
  return json_text(json, 2) + "\n";
}

// Megatron-LM's arguments: 1F1B, or its interleaved schedule with
// --num-layers-per-virtual-pipeline-stage; blocks split evenly over stages;
// the model's family and vocabulary, so that `simulate --megatron-args`
// reads back the same model (config/megatron_args.h).
std::string megatron_arguments(const Layout& l) {
  const ModelSpec& m = l.model;
  std::string args = fmt::format(
      "--num-layers {} --hidden-size {} --num-attention-heads {} --ffn-hidden-size {} --seq-length {} "
      "--max-position-embeddings {} --vocab-size {} --tensor-model-parallel-size {} --pipeline-model-parallel-size {} "
      "--micro-batch-size {} --global-batch-size {}",
      m.layers, m.hidden, m.heads, m.ffn, l.seq_length, std::max(m.max_positions, l.seq_length), m.vocab,
      l.tensor_parallel, l.pipeline_ranks, l.micro_batch, l.global_batch);
  if (m.architecture == Architecture::kLlama) {
    args += fmt::format(" --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear "
                        "--rotary-base {:g} --norm-epsilon {:g}",
                        m.llama.rope_theta, m.llama.rms_norm_eps);
    if (m.llama.rope_type == "llama3") {
      args += fmt::format(" --use-rope-scaling --rope-scaling-factor {:g}", m.llama.rope_factor);
    }
    if (m.kv_heads != m.heads) args += fmt::format(" --group-query-attention --num-query-groups {}", m.kv_heads);
  }
  if (!m.tied_embeddings) args += " --untie-embeddings-and-output-weights";
  if (!m.dropout) args += " --hidden-dropout 0 --attention-dropout 0";
  if (l.precision != Precision::kFp32) args += fmt::format(" --{}", to_string(l.precision));
  // Megatron-LM takes hidden / heads as the head width and asserts it is whole;
  // otherwise the width is given (gpt3-13b: 5140 / 40, GPT-3's 128).
  if (m.hidden % m.heads != 0) args += fmt::format(" --kv-channels {}", m.hidden / m.heads);
  if (l.schedule == "interleaved-1f1b" && l.chunks > 1) {
    args += fmt::format(" --num-layers-per-virtual-pipeline-stage {}",
                        m.layers / (l.pipeline_ranks * l.chunks));
  }
  if (l.sequence_parallel) args += " --sequence-parallel";
  if (l.recompute == Recompute::kSelective) args += " --recompute-granularity selective";
  if (l.recompute == Recompute::kFull) {
    args += " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1";
  }
  if (l.zero == ZeroStage::kOne) args += " --use-distributed-optimizer";
  return args + "\n";
}

// The best layout a framework can express: the plan's best if it can, else
// a search within what it runs (noted on standard error).
Layout expressible(const PlanRequest& searched, const PlanResult& plan, const char* framework,
                   const std::vector<std::string>& schedules, const std::vector<Recompute>& recomputes,
                   bool whole_blocks) {
  const auto fits = [&](const Layout& l) {
    const bool schedule = std::find(schedules.begin(), schedules.end(), l.schedule) != schedules.end();
    const bool recompute = std::find(recomputes.begin(), recomputes.end(), l.recompute) != recomputes.end();
    const bool blocks = !whole_blocks || l.model.layers % (l.pipeline_ranks * l.chunks) == 0;
    return schedule && recompute && blocks;
  };
  const Layout& best = plan.best.front().layout;
  if (fits(best)) return best;
  PlanRequest request = searched;
  request.progress = nullptr;
  request.schedules = schedules;
  request.recomputes = recomputes;
  request.top_k = std::max(request.top_k, 32);
  const PlanResult within = plan_layouts(request);
  for (const PlanCandidate& c : within.best) {
    if (fits(c.layout)) {
      log_warning("{} cannot run the best layout ({}): writing the best it can express, {} ({} step against {})",
                  framework, layout_line(best), layout_line(c.layout), format_seconds(c.step_time_s),
                  format_seconds(plan.best.front().step_time_s));
      return c.layout;
    }
  }
  fail("{} can express none of the {} best layouts (blocks must split evenly over its stages): try another "
       "--devices or --global-batch",
       framework, within.best.size());
}

// On a terminal, a line redrawn in place on standard error while the
// search simulates; nothing elsewhere.
void show_progress(PlanRequest& request) {
  if (isatty(STDERR_FILENO) == 0) return;
  request.progress = [shown = std::int64_t{-1}](std::int64_t done, std::int64_t queued) mutable {
    const std::int64_t percent = 100 * done / std::max<std::int64_t>(queued, 1);
    if (percent == shown) return;
    shown = percent;
    const int bar = static_cast<int>(percent / 5);
    fmt::print(stderr, "\rsimulating [{}{}] {}/{} candidates (the bound usually stops it early)", std::string(bar, '='),
               std::string(20 - bar, ' '), done, queued);
    std::fflush(stderr);
  };
}

void run(const PlanCommand& command) {
  for (const auto& [flag, output] : {std::pair{"--write-config", &command.write_config},
                                     std::pair{"--deepspeed", &command.deepspeed},
                                     std::pair{"--megatron", &command.megatron}}) {
    refuse_overwriting({flag, *output}, {{"--model", command.model}, {"--hardware", command.hardware}});
  }
  if (command.inference) return run_inference(command);
  if (command.inference_flags.any_given()) {
    fail("--context, --sequences, --prompt-tokens and --prefill-chunk shape a generation: add --inference, or leave "
         "them out");
  }
  if (!command.global_batch || !command.seq_length) {
    fail("plan needs --global-batch and --seq (or --inference for generation)");
  }
  if (!command.profile_config.empty() && command.profile.empty()) {
    fail("--profile-config {} is the configuration of the run --profile measured: give --profile too, or leave it out",
         quoted_excerpt(command.profile_config));
  }
  PlanRequest request = make_request(command);
  show_progress(request);
  const PlanResult result = plan_layouts(request);
  if (request.progress) fmt::print(stderr, "\r\033[K");
  write_output(command.json ? json_report(request, result) : text_report(request, result), "");
  const Layout& best = result.best.front().layout;
  if (!command.write_config.empty()) write_output(pipeflow_config(command, best), command.write_config);
  if (!command.deepspeed.empty()) {
    const Layout l = expressible(request, result, "DeepSpeed", {"1f1b"}, {Recompute::kNone, Recompute::kFull}, false);
    if (l.tensor_parallel > 1) {
      log_warning("DeepSpeed's configuration has no tensor-parallel key: run {} with Megatron-DeepSpeed's "
                  "--tensor-model-parallel-size {}{}",
                  command.deepspeed, l.tensor_parallel, l.sequence_parallel ? " --sequence-parallel" : "");
    }
    write_output(deepspeed_config(l), command.deepspeed);
  }
  if (!command.megatron.empty()) {
    const Layout l = expressible(request, result, "Megatron-LM", {"1f1b", "interleaved-1f1b"},
                                 {Recompute::kNone, Recompute::kSelective, Recompute::kFull}, true);
    write_output(megatron_arguments(l), command.megatron);
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto c = std::make_shared<PlanCommand>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Search every layout of a model on a cluster and rank those that fit by simulated step time");
  sub->add_option("--model", c->model, "Model preset name or Hugging Face config.json")->required();
  sub->add_option("--hardware", c->hardware, "Hardware preset name or hardware JSON file")->capture_default_str();
  sub->add_option("--devices", c->devices, "Devices in all (dp × tp × pp)")->required();
  sub->add_option("--global-batch", c->global_batch, "Sequences per optimizer step (required but with --inference)");
  sub->add_option("--seq,--seq-length", c->seq_length,
                  "Tokens per sequence (required but with --inference, where it is the context)");
  sub->add_option("--top", c->top, "Layouts to list (with --inference: stage counts that fit)")->capture_default_str();
  sub->add_option("--precision", c->precision,
                  "fp32, bf16 or fp16 (mixed precision): what every layout trains in and the configs say")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_option("--memory-fraction", c->memory_fraction, "Share of device memory a stage may fill")
      ->capture_default_str();
  sub->add_option("--partition", c->partitions,
                  "Partition methods to try, comma-separated; each adds the layouts it cuts differently "
                  "(default parameters,balanced; --inference: one, default parameters)")
      ->delimiter(',');
  sub->add_flag("--json", c->json, "Print one JSON object instead of tables");
  c->run_key_flags.add_to(sub, {"freeze", "lora", "block_launch_overhead_s", "variable_seq_lengths", "variable_images"});
  sub->add_option("--profile", c->profile,
                  "A measured run of the model on the hardware (pipeflow's trace, PyTorch profiler traces, a "
                  "Megatron-LM, DeepSpeed or Ascend log, a profile): every layout's costs are the cost model's "
                  "calibrated by it (docs/ANALYZE.md)");
  sub->add_option("--profile-config", c->profile_config,
                  "The pipeflow configuration of the run --profile measured, where the input does not state it "
                  "(pipeflow's traces and Megatron-LM's logs do)");
  sub->add_option("--write-config", c->write_config, "Write the best layout as a pipeflow run configuration");
  sub->add_option("--deepspeed", c->deepspeed, "Write the best layout DeepSpeed can run as its JSON configuration");
  sub->add_option("--megatron", c->megatron, "Write the best layout Megatron-LM can run as its arguments");
  sub->add_flag("--inference", c->inference,
                "List the pipeline stage counts (1 .. --devices) that fit generation, with time to first token, "
                "per-token latency and tokens/s (docs/INFERENCE.md)");
  c->inference_flags.add_to(sub, false);
  sub->callback([c] { run(*c); });
}

}  // namespace pipeflow::cli
