// `pipeflow simulate`: predicts a layout's step (time, bubble, throughput,
// memory per rank) with the cost model and the simulator, and optionally
// writes its timeline as a Chrome trace and an SVG.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "commands.h"
#include "model_options.h"
#include "pipeflow/core/log.h"
#include "pipeflow/core/table.h"
#include "pipeflow/core/units.h"
#include "pipeflow/sim/prediction.h"
#include "pipeflow/sim/run_config.h"
#include "pipeflow/trace/chrome_trace.h"
#include "pipeflow/trace/svg.h"

namespace pipeflow::cli {
namespace {

struct SimulateCommand {
  CLI::App* app = nullptr;
  std::string config;
  std::string profile;
  std::string trace;
  std::string svg;
  bool json = false;
  // Flags that override the configuration; read only when given.
  std::string model, hardware, schedule, recompute, partition, comm;
  int devices = 0, tp = 0, pp = 0, dp = 0, micro_batch = 0, global_batch = 0, seq = 0, virtual_stages = 0, zero = 0;
  bool sequence_parallel = false;

  template <class T>
  std::optional<T> given(const char* flag, const T& value) const {
    return app->count(flag) > 0 ? std::optional<T>(value) : std::nullopt;
  }

  RunOverrides overrides() const {
    RunOverrides o;
    o.model = given("--model", model);
    o.hardware = given("--hardware", hardware);
    o.devices = given("--devices", devices);
    o.tensor_parallel = given("--tp", tp);
    o.pipeline_stages = given("--pp", pp);
    o.data_parallel = given("--dp", dp);
    o.micro_batch = given("--micro-batch", micro_batch);
    o.global_batch = given("--global-batch", global_batch);
    o.seq_length = given("--seq", seq);
    o.schedule = given("--schedule", schedule);
    o.virtual_stages = given("--virtual", virtual_stages);
    o.recompute = given("--recompute", recompute);
    o.sequence_parallel = given("--sequence-parallel", sequence_parallel);
    o.partition = given("--partition", partition);
    o.zero_stage = given("--zero", zero);
    o.comm_mode = given("--comm", comm);
    return o;
  }
};

std::string stage_layers(const StagePlan& plan) {
  if (plan.layer_names.size() == 1) return plan.layer_names.front();
  return plan.layer_names.front() + ".." + plan.layer_names.back();
}

std::string describe_layout(const Prediction& p) {
  const Layout& l = p.layout;
  std::string chunks = p.schedule.stages_per_rank() > 1 ? fmt::format(" (v={})", p.schedule.stages_per_rank()) : "";
  return fmt::format(
      "{} on {} × {}: tp {} × pp {} × dp {}, {}{}, {} micro-batches of {} × {} tokens per replica, recompute {}{}, "
      "{} communication{}",
      l.model.name, l.devices, l.hardware.name, l.tensor_parallel, l.pipeline_parallel, l.data_parallel, l.schedule,
      chunks, p.microbatches, l.micro_batch, sequence_length(l), to_string(l.recompute),
      l.sequence_parallel ? ", sequence parallel" : "", l.comm_mode == CommMode::kBlocking ? "blocking" : "overlapped",
      l.zero == ZeroStage::kNone ? "" : fmt::format(", ZeRO-{}", static_cast<int>(l.zero)));
}

std::string stages_of(const Schedule& schedule, int rank) {
  std::string out;
  for (StageId s : schedule.stages_of(RankId(rank))) {
    if (!out.empty()) out += ',';
    out += std::to_string(s.value());
  }
  return out;
}

std::string text_report(const Prediction& p) {
  const SimulationResult& r = p.result;
  std::string out = describe_layout(p) + "\n\n";
  const SteadyState& steady = *r.steady_state;
  const std::string estimate = steady.converged ? "" : "~";
  TextTable summary({"step time", "bubble", "pipeline bubble", "steady step", "steady bubble", "tokens/s", "MFU",
                     "HFU", "per device"});
  summary.add_row({format_seconds(r.step_time_s), format_percent(r.bubble_ratio),
                   format_percent(r.pipeline_bubble_ratio), estimate + format_seconds(steady.step_time_s),
                   estimate + format_percent(steady.bubble_ratio), fmt::format("{:.0f}", p.tokens_per_s),
                   format_percent(p.mfu), format_percent(p.hfu),
                   fmt::format("{} ({} with recompute)", format_si(p.tflops_per_device * 1e12, "FLOP/s"),
                               format_si(p.hardware_tflops_per_device * 1e12, "FLOP/s"))});
  out += summary.render();
  out += fmt::format("steady: steps back to back, each rank starting the next step once it has finished this "
                     "one (no global sync between steps){}\n\n",
                     steady.converged ? ""
                                      : fmt::format("; ~: still unsettled after {} steps, the mean per step",
                                                    steady.steps));

  TextTable ranks({"rank", "stages", "busy", "comm", "optimizer", "idle", "bubble", "peak memory", "model states",
                   "activations", "buffers", "in flight"});
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    const RankResult& k = r.ranks[i];
    ranks.add_row({std::to_string(i), stages_of(p.schedule, static_cast<int>(i)), format_seconds(k.busy_s),
                   format_seconds(k.comm_s), format_seconds(k.optimizer_s), format_seconds(k.idle_s),
                   format_percent(k.bubble_ratio), format_bytes(k.peak_memory_bytes),
                   format_bytes(k.model_states_bytes), format_bytes(k.activation_bytes),
                   format_bytes(k.comm_buffer_bytes), std::to_string(k.peak_inflight)});
  }
  out += ranks.render() + "\n";

  TextTable stages({"stage", "rank", "layers", "params", "F", "B", "I", "W", "activations/mb", "message"});
  for (std::size_t s = 0; s < p.costs.partition.stages.size(); ++s) {
    const StagePlan& plan = p.costs.partition.stages[s];
    const StageCosts& c = p.costs.costs.stages[s];
    stages.add_row({std::to_string(s), std::to_string(p.schedule.rank_of(StageId(static_cast<int>(s))).value()),
                    stage_layers(plan), format_parameters(static_cast<double>(plan.parameters)),
                    format_seconds(c.forward_s), format_seconds(c.backward_s), format_seconds(c.backward_input_s),
                    format_seconds(c.backward_weight_s), format_bytes(c.activation_bytes),
                    format_bytes(c.output_bytes)});
  }
  out += fmt::format("partition ({}):\n", to_string(p.layout.partition)) + stages.render() + "\n";
  return out;
}

nlohmann::ordered_json json_report(const Prediction& p) {
  const SimulationResult& r = p.result;
  const Layout& l = p.layout;
  nlohmann::ordered_json json;
  json["model"] = l.model.name;
  json["hardware"] = l.hardware.name;
  json["layout"] = {{"devices", l.devices},
                    {"tensor_parallel", l.tensor_parallel},
                    {"pipeline_parallel", l.pipeline_parallel},
                    {"data_parallel", l.data_parallel},
                    {"micro_batch", l.micro_batch},
                    {"global_batch", l.global_batch},
                    {"microbatches", p.microbatches},
                    {"sequence", sequence_length(l)},
                    {"schedule", l.schedule},
                    {"virtual_stages", p.schedule.stages_per_rank()},
                    {"recompute", to_string(l.recompute)},
                    {"sequence_parallel", l.sequence_parallel},
                    {"partition", to_string(l.partition)},
                    {"zero_stage", static_cast<int>(l.zero)},
                    {"comm_mode", l.comm_mode == CommMode::kBlocking ? "blocking" : "overlapped"}};
  json["step_time_s"] = r.step_time_s;
  json["pipeline_time_s"] = r.pipeline_time_s;
  json["bubble_ratio"] = r.bubble_ratio;
  json["pipeline_bubble_ratio"] = r.pipeline_bubble_ratio;
  json["steady_step_time_s"] = r.steady_state->step_time_s;
  json["steady_bubble_ratio"] = r.steady_state->bubble_ratio;
  json["steady_state_converged"] = r.steady_state->converged;
  json["tokens_per_s"] = p.tokens_per_s;
  json["mfu"] = p.mfu;
  json["hfu"] = p.hfu;
  json["tflops_per_device"] = p.tflops_per_device;
  json["hardware_tflops_per_device"] = p.hardware_tflops_per_device;
  json["ranks"] = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    const RankResult& k = r.ranks[i];
    json["ranks"].push_back({{"rank", i},
                             {"busy_s", k.busy_s},
                             {"comm_s", k.comm_s},
                             {"optimizer_s", k.optimizer_s},
                             {"idle_s", k.idle_s},
                             {"bubble_ratio", k.bubble_ratio},
                             {"all_reduce_s", k.all_reduce_s},
                             {"overlapped_comm_s", k.overlapped_comm_s},
                             {"peak_memory_bytes", k.peak_memory_bytes},
                             {"model_states_bytes", k.model_states_bytes},
                             {"activation_bytes", k.activation_bytes},
                             {"comm_buffer_bytes", k.comm_buffer_bytes},
                             {"peak_inflight", k.peak_inflight}});
  }
  json["stages"] = nlohmann::ordered_json::array();
  for (std::size_t s = 0; s < p.costs.partition.stages.size(); ++s) {
    const StagePlan& plan = p.costs.partition.stages[s];
    const StageCosts& c = p.costs.costs.stages[s];
    json["stages"].push_back({{"stage", s},
                              {"rank", p.schedule.rank_of(StageId(static_cast<int>(s))).value()},
                              {"first_layer", plan.first},
                              {"end_layer", plan.end},
                              {"parameters", plan.parameters},
                              {"forward_s", c.forward_s},
                              {"backward_s", c.backward_s},
                              {"backward_input_s", c.backward_input_s},
                              {"backward_weight_s", c.backward_weight_s},
                              {"output_bytes", c.output_bytes},
                              {"activation_bytes", c.activation_bytes},
                              {"weight_gradient_bytes", c.weight_gradient_bytes},
                              {"model_state_bytes", c.model_state_bytes}});
  }
  json["warnings"] = p.warnings;
  return json;
}

void run(const SimulateCommand& command) {
  RunConfig config = command.config.empty() ? default_run_config() : load_run_config(command.config);
  apply_overrides(config, command.overrides());
  for (const std::string& warning : config.warnings) log_warning("{}", warning);
  const Layout layout = layout_from_run_config(config);
  std::optional<MeasuredProfile> profile;
  if (!command.profile.empty()) profile = load_profile(command.profile);
  const Prediction p = predict(layout, profile ? &*profile : nullptr);
  for (const std::string& warning : p.warnings) log_warning("{}", warning);

  if (!command.trace.empty() || !command.svg.empty()) {
    const std::string title =
        fmt::format("{} {}: {} ranks, {} micro-batches, simulated{}", layout.model.name, layout.schedule,
                    p.schedule.num_ranks(), p.microbatches, profile ? " from a measured profile" : "");
    const Timeline timeline = simulation_timeline(p.schedule, p.result, title);
    if (!command.trace.empty()) write_output(write_chrome_trace(timeline), command.trace);
    if (!command.svg.empty()) write_output(render_svg(timeline), command.svg);
  }
  write_output(command.json ? json_report(p).dump(2) + "\n" : text_report(p), "");
}

}  // namespace

void add_simulate_command(CLI::App& app) {
  auto c = std::make_shared<SimulateCommand>();
  CLI::App* sub = app.add_subcommand(
      "simulate", "Predict a layout's step: time, bubble, tokens/s, MFU and memory per rank, and its timeline");
  c->app = sub;
  sub->add_option("--config", c->config, "Run configuration JSON (the keys of pipeflow train); flags override it");
  sub->add_option("--model", c->model, "Model preset or Hugging Face config.json path (key: model)");
  sub->add_option("--hardware", c->hardware, "Hardware preset or profile JSON path (key: hardware; default cpu)");
  sub->add_option("--devices", c->devices, "Devices in all: tp × pp × dp (key: devices)");
  sub->add_option("--tp", c->tp, "Tensor-parallel size (key: tensor_parallel)");
  sub->add_option("--pp", c->pp, "Pipeline ranks (key: pipeline.stages)");
  sub->add_option("--dp", c->dp, "Data-parallel replicas (key: data_parallel)");
  sub->add_option("--micro-batch", c->micro_batch, "Sequences per micro-batch (key: train_micro_batch_size_per_gpu)");
  sub->add_option("--global-batch", c->global_batch,
                  "Sequences per step over all replicas (key: train_batch_size; without a micro-batch, DeepSpeed's "
                  "rule gives one micro-batch of global / dp)");
  sub->add_option("--seq", c->seq, "Tokens per sequence (key: seq_length; default the model's context)");
  sub->add_option("--schedule", c->schedule, "Schedule name, see pipeflow schedule --list (key: pipeline.schedule)");
  sub->add_option("--virtual", c->virtual_stages, "Model chunks per rank (key: pipeline.virtual_stages)");
  sub->add_option("--recompute", c->recompute, "none, selective or full (key: recompute)")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  sub->add_option("--partition", c->partition,
                  "uniform, parameters, type:REGEX, balanced, counts:N,.. or bounds:B,.. (key: pipeline.partition_method)");
  sub->add_flag("--sequence-parallel", c->sequence_parallel, "Megatron sequence parallelism (key: sequence_parallel)");
  sub->add_option("--zero", c->zero, "ZeRO stage 0..3 (key: zero_optimization.stage)");
  sub->add_option("--comm", c->comm, "P2P communication: overlapped or blocking (key: comm_mode)")
      ->check(CLI::IsMember({"overlapped", "blocking"}));
  sub->add_option("--profile", c->profile, "Measured per-stage costs (JSON, as pipeflow train writes them)");
  sub->add_option("--trace", c->trace, "Write the simulated timeline as Chrome-trace JSON (Perfetto)");
  sub->add_option("--svg", c->svg, "Write the simulated timeline as SVG");
  sub->add_flag("--json", c->json, "Print one JSON object instead of tables");
  sub->callback([c] { run(*c); });
}

}  // namespace pipeflow::cli
