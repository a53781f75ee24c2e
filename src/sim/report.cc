// What `pipeflow simulate` prints: a prediction as tables or as JSON.
#include "pipeflow/sim/report.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "pipeflow/core/json.h"
#include "pipeflow/core/table.h"
#include "pipeflow/core/units.h"

namespace pipeflow {
namespace {

std::string stage_layers(const StagePlan& plan) {
  if (plan.layer_names.size() == 1) return plan.layer_names.front();
  return plan.layer_names.front() + ".." + plan.layer_names.back();
}

std::string describe_layout(const Prediction& p) {
  const Layout& l = p.layout;
  std::string chunks = p.schedule.chunks_per_rank() > 1 ? fmt::format(" (v={})", p.schedule.chunks_per_rank()) : "";
  return fmt::format(
      "{} on {} × {} in {}: tp {} × pp {} × dp {}, {}{}, {} micro-batches of {} × {} tokens per replica, recompute "
      "{}{}, {} communication{}{}",
      l.model.name, l.devices, l.hardware.name, to_string(l.precision), l.tensor_parallel, l.pipeline_ranks,
      l.data_parallel, l.schedule,
      chunks, p.microbatches, l.micro_batch, l.seq_length, to_string(l.recompute),
      l.sequence_parallel ? ", sequence parallel" : "", l.comm_mode == CommMode::kBlocking ? "blocking" : "overlapped",
      l.zero == ZeroStage::kNone ? "" : fmt::format(", ZeRO-{}", static_cast<int>(l.zero)),
      l.block_launch_overhead_s > 0
          ? fmt::format(", host overhead ({} a block pass)", format_seconds(l.block_launch_overhead_s))
          : "");
}

// What trains, in a line (empty when everything does): the run's freeze
// and lora keys, then what they come to.
std::string describe_training(const Layout& l) {
  const TrainingSpec& t = l.training;
  if (t.trains_everything()) return "";
  std::string keys;
  if (!t.freeze.empty()) keys += fmt::format("freeze [\"{}\"]", fmt::join(t.freeze, "\", \""));
  if (t.lora) {
    keys += fmt::format("{}lora r {}, alpha {:g} on {}", keys.empty() ? "" : "; ", t.lora->rank, t.lora->alpha,
                        fmt::join(t.lora->targets, ", "));
    if (!t.lora->train.empty()) keys += fmt::format(", {} trained whole", fmt::join(t.lora->train, ", "));
  }
  const TrainingSummary s = training_summary(l);
  std::string frozen = fmt::format("{} of {} layers frozen", s.frozen.size(), s.layers);
  if (s.adapted > 0) frozen += fmt::format(", {} with frozen base weights beside their adapters", s.adapted);
  if (s.without_backward > 0) {
    frozen += fmt::format(", the first {} ({}) without a backward", s.without_backward, s.without_backward_range());
  }
  return fmt::format("training: {}; {} of {} parameters trainable; {}\n", keys,
                     format_parameters(static_cast<double>(s.trainable_parameters)),
                     format_parameters(static_cast<double>(s.parameters)), frozen);
}

// What variable sequence lengths do to the step, in a line (empty without them).
std::string describe_variable_lengths(const Prediction& p) {
  if (!p.variable_lengths) return "";
  const VariableLengths& v = *p.variable_lengths;
  const auto [shortest, longest] = std::minmax_element(v.lengths.begin(), v.lengths.end());
  std::string images, uniform_images;
  if (!v.images.empty()) {
    const auto [fewest, most] = std::minmax_element(v.images.begin(), v.images.end());
    images = fmt::format(", {} .. {} images", *fewest, *most);
    uniform_images = fmt::format(" and {}", format_count(v.uniform_images, "image"));
  }
  return fmt::format(
      "variable sequence lengths: {} micro-batches of {} .. {} tokens{}: step {} against {} with every micro-batch "
      "at {} tokens{} ({:+.1f}%); micro-batch compute max/mean {:.2f}; rank compute max/mean {:.2f} ({:.2f} "
      "uniform)\n",
      v.lengths.size(), *shortest, *longest, images, format_seconds(p.result.step_time_s),
      format_seconds(v.uniform_step_time_s), v.uniform_length, uniform_images,
      100 * (p.result.step_time_s / v.uniform_step_time_s - 1), v.microbatch_imbalance, v.rank_imbalance,
      v.uniform_rank_imbalance);
}

std::string stages_of(const Schedule& schedule, int rank) {
  std::string out;
  for (StageId s : schedule.stages_of(RankId(rank))) {
    if (!out.empty()) out += ',';
    out += std::to_string(s.value());
  }
  return out;
}

}  // namespace

std::string prediction_text(const Prediction& p) {
  const SimulationResult& r = p.result;
  std::string out = describe_layout(p) + "\n" + describe_training(p.layout) + describe_variable_lengths(p) + "\n";
  const SteadyState& steady = *r.steady_state;
  const std::string estimate = steady.converged ? "" : "~";
  TextTable summary({"step time", "bubble", "pipeline bubble", "ZB bubble rate", "steady step", "steady bubble",
                     "tokens/s", "MFU", "HFU", "per device"});
  summary.add_row({format_seconds(r.step_time_s), format_percent(r.bubble_ratio),
                   format_percent(r.pipeline_bubble_ratio), format_percent(r.zero_bubble_rate),
                   estimate + format_seconds(steady.step_time_s),
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

nlohmann::ordered_json layout_json(const Layout& l, int microbatches, int chunks) {
  return {{"devices", l.devices},
          {"tensor_parallel", l.tensor_parallel},
          {"pipeline_parallel", l.pipeline_ranks},
          {"data_parallel", l.data_parallel},
          {"rank_order", to_string(l.rank_order)},
          {"micro_batch", l.micro_batch},
          {"global_batch", l.global_batch},
          {"microbatches", microbatches},
          {"seq_length", l.seq_length},
          {"schedule", l.schedule},
          {"virtual_stages", chunks},
          {"recompute", to_string(l.recompute)},
          {"sequence_parallel", l.sequence_parallel},
          {"partition", to_string(l.partition)},
          {"zero_stage", static_cast<int>(l.zero)},
          {"comm_mode", l.comm_mode == CommMode::kBlocking ? "blocking" : "overlapped"},
          {"block_launch_overhead_s", l.block_launch_overhead_s},
          {"precision", to_string(l.precision)},
          {"variable_seq_lengths", l.variable_seq_lengths},
          {"variable_images", l.variable_images},
          {"freeze", l.training.freeze},
          {"lora", l.training.lora ? nlohmann::ordered_json{{"r", l.training.lora->rank},
                                                            {"alpha", l.training.lora->alpha},
                                                            {"target", l.training.lora->targets},
                                                            {"train", l.training.lora->train}}
                                   : nlohmann::ordered_json(nullptr)}};
}

std::string prediction_json(const Prediction& p) {
  const SimulationResult& r = p.result;
  const Layout& l = p.layout;
  nlohmann::ordered_json json;
  json["model"] = l.model.name;
  json["hardware"] = l.hardware.name;
  json["layout"] = layout_json(l, p.microbatches, p.schedule.chunks_per_rank());
  const TrainingSummary trains = training_summary(l);
  json["training"] = {{"parameters", trains.parameters},
                      {"trainable_parameters", trains.trainable_parameters},
                      {"frozen_layers", trains.frozen},
                      {"adapted_layers", trains.adapted},
                      {"layers_without_backward", trains.without_backward}};
  if (const std::optional<VariableLengths>& v = p.variable_lengths) {
    json["variable_seq_lengths"] = {{"lengths", v->lengths},
                                    {"images", v->images},
                                    {"uniform_length", v->uniform_length},
                                    {"uniform_images", v->uniform_images},
                                    {"uniform_step_time_s", v->uniform_step_time_s},
                                    {"microbatch_imbalance", v->microbatch_imbalance},
                                    {"rank_imbalance", v->rank_imbalance},
                                    {"uniform_rank_imbalance", v->uniform_rank_imbalance}};
  }
  json["step_time_s"] = r.step_time_s;
  json["pipeline_time_s"] = r.pipeline_time_s;
  json["bubble_ratio"] = r.bubble_ratio;
  json["pipeline_bubble_ratio"] = r.pipeline_bubble_ratio;
  json["zero_bubble_rate"] = r.zero_bubble_rate;
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
  return json_text(json, 2) + "\n";
}

}  // namespace pipeflow
