#include "pipeflow/runtime/measurement.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "pipeflow/core/error.h"
#include "pipeflow/sim/cost_model.h"

namespace pipeflow::runtime {
namespace {

const char* phase_name(FlushPhase phase) {
  switch (phase) {
    case FlushPhase::kDataParallelGradients:
      return "data-parallel reduction";
    case FlushPhase::kDataParallelWeights:
      return "ZeRO-1 weight all-gather";
    case FlushPhase::kTiedGradients:
      return "tied gradients";
    case FlushPhase::kSequenceParallelGradients:
      return "sequence-parallel gradients";
    case FlushPhase::kGradientNorm:
      return "gradient norm";
    case FlushPhase::kOptimizer:
      return "optimizer";
  }
  return "?";
}

std::size_t index_of(ActionKind kind) { return static_cast<std::size_t>(kind); }

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  if (values.size() % 2 == 1) return *middle;
  return (*middle + *std::max_element(values.begin(), middle)) / 2;
}

}  // namespace

Timeline measured_timeline(const StepResult& step, int num_ranks, std::string title, bool with_flush) {
  Timeline timeline;
  timeline.title = std::move(title);
  timeline.num_ranks = num_ranks;
  for (std::size_t r = 0; r < step.ranks.size(); ++r) {
    const RankId rank(static_cast<int>(r));
    for (const ActionTiming& t : step.ranks[r].actions) {
      const std::string name = to_string(t.action);
      if (t.wait_s > 0) timeline.events.push_back({rank, name, EventCategory::kWait, t.action, t.start_s, t.wait_s});
      timeline.events.push_back({rank, name, category_of(t.action.kind), t.action, t.start_s + t.wait_s,
                                 t.duration_s() - t.wait_s});
    }
    for (const CollectiveTiming& c : step.ranks[r].collectives) {  // inside the actions: not the flush
      timeline.events.push_back({rank, "tensor-parallel all-reduce", EventCategory::kTensorParallel, std::nullopt,
                                 c.start_s, c.end_s - c.start_s});
    }
    if (!with_flush) continue;
    for (const PhaseTiming& p : step.ranks[r].phases) {
      const EventCategory category =
          p.phase == FlushPhase::kOptimizer ? EventCategory::kOptimizer : EventCategory::kAllreduce;
      const bool per_stage = p.phase != FlushPhase::kTiedGradients && p.phase != FlushPhase::kGradientNorm;
      const std::string name = per_stage ? fmt::format("{} stage {}", phase_name(p.phase), p.stage) : phase_name(p.phase);
      timeline.events.push_back({rank, name, category, std::nullopt, p.start_s, p.end_s - p.start_s});
    }
  }
  return timeline;
}

StepFigures step_figures(const StepResult& step, int num_ranks) {
  StepFigures figures;
  figures.wall_s = step.wall_s;
  figures.tokens_per_s = step.wall_s > 0 ? static_cast<double>(step.tokens) / step.wall_s : 0;
  const Timeline pipeline = measured_timeline(step, num_ranks, "", false);
  figures.pipeline_s = pipeline.makespan_s();
  const BubbleStats bubble = bubble_stats(pipeline);
  figures.bubble = bubble.overall;
  // When each message's SEND ended, under the RECV it feeds.
  std::unordered_map<Action, double> sent;
  for (const RankRecord& record : step.ranks) {
    for (const ActionTiming& t : record.actions) {
      if (is_send(t.action.kind)) sent[partner(t.action)] = t.end_s;
    }
  }
  for (std::size_t r = 0; r < step.ranks.size(); ++r) {
    const RankRecord& record = step.ranks[r];
    RankFigures rank;
    for (const ActionTiming& t : record.actions) {
      if (is_compute(t.action.kind)) {
        rank.compute_s += t.duration_s();
        rank.off_core_s += std::max(0.0, t.duration_s() - t.cpu_s);
      } else {
        rank.wait_s += t.wait_s;
        rank.comm_s += t.duration_s() - t.wait_s;
        if (const auto send = sent.find(t.action); t.wait_s > 0 && send != sent.end()) {
          rank.wake_s += std::clamp(t.start_s + t.wait_s - send->second, 0.0, t.wait_s);
        }
      }
      rank.pipeline_end_s = std::max(rank.pipeline_end_s, t.end_s);
    }
    rank.other_s = rank.pipeline_end_s - rank.compute_s - rank.comm_s - rank.wait_s;
    double asleep_in_collectives_s = 0;
    for (const CollectiveTiming& c : record.collectives) {
      rank.tensor_parallel_s += c.end_s - c.start_s;
      rank.tensor_parallel_bytes += c.bytes;
      ++rank.tensor_parallel_collectives;
      asleep_in_collectives_s += std::max(0.0, c.end_s - c.start_s - c.cpu_s);
    }
    rank.off_core_s = std::max(0.0, rank.off_core_s - asleep_in_collectives_s);
    for (const PhaseTiming& p : record.phases) {
      rank.flush_s += p.end_s - std::max(p.start_s, rank.pipeline_end_s);  // a reduction may start earlier
      if (p.phase == FlushPhase::kOptimizer) rank.optimizer_s += p.end_s - p.start_s;
      if (p.phase == FlushPhase::kDataParallelGradients || p.phase == FlushPhase::kDataParallelWeights) {
        rank.data_parallel_s += p.end_s - p.start_s;
        rank.data_parallel_early_s += std::max(0.0, std::min(p.end_s, rank.pipeline_end_s) - p.start_s);
      }
    }
    rank.bubble = bubble.per_rank[r];
    rank.peak_activation_bytes = record.peak_activation_bytes;
    figures.ranks.push_back(rank);
  }
  return figures;
}

double predicted_tensor_parallel_s(const RankFigures& rank, int tensor_parallel, const HardwareProfile& hardware) {
  if (tensor_parallel <= 1 || rank.tensor_parallel_collectives == 0) return 0;
  const LinkCost link = collective_link_cost(link_between(hardware, 0, tensor_parallel - 1), hardware);
  const double bytes = static_cast<double>(rank.tensor_parallel_bytes) / rank.tensor_parallel_collectives;
  return rank.tensor_parallel_collectives * ring_all_reduce_seconds(bytes, tensor_parallel, link);
}

CostProfile::CostProfile(int num_stages)
    : samples_(static_cast<std::size_t>(num_stages)), medians_(static_cast<std::size_t>(num_stages)) {}

void CostProfile::add(const StepResult& step) {
  for (const RankRecord& record : step.ranks) {
    for (const ActionTiming& t : record.actions) {
      if (!is_compute(t.action.kind)) continue;
      Samples& s = samples_.at(static_cast<std::size_t>(t.action.stage.value()));
      s.seconds[index_of(t.action.kind)].push_back(t.duration_s());
      s.working_bytes[index_of(t.action.kind)].push_back(static_cast<double>(t.working_bytes));
      if (t.action.kind == ActionKind::kForward) s.activation_bytes.push_back(static_cast<double>(t.held_bytes));
      if (t.action.kind == ActionKind::kBackwardInput) {
        s.weight_gradient_bytes.push_back(static_cast<double>(t.held_bytes));
      }
    }
    for (const PhaseTiming& p : record.phases) {
      if (p.phase != FlushPhase::kOptimizer) continue;
      samples_.at(static_cast<std::size_t>(p.stage.value())).optimizer.push_back(p.end_s - p.start_s);
    }
  }
  ++steps_;
  for (std::size_t s = 0; s < samples_.size(); ++s) {
    const Samples& in = samples_[s];
    StageCosts& out = medians_[s];
    for (const ActionKind kind :
         {ActionKind::kForward, ActionKind::kBackward, ActionKind::kBackwardInput, ActionKind::kBackwardWeight}) {
      out.set_duration(kind, median(in.seconds[index_of(kind)]));
    }
    out.optimizer_s = median(in.optimizer);
    out.activation_bytes = median(in.activation_bytes);
    out.weight_gradient_bytes = median(in.weight_gradient_bytes);
    out.forward_working_bytes = median(in.working_bytes[index_of(ActionKind::kForward)]);
    out.backward_working_bytes = std::max({median(in.working_bytes[index_of(ActionKind::kBackward)]),
                                           median(in.working_bytes[index_of(ActionKind::kBackwardInput)]),
                                           median(in.working_bytes[index_of(ActionKind::kBackwardWeight)])});
  }
}

StageCosts CostProfile::stage(StageId s) const { return medians_.at(static_cast<std::size_t>(s.value())); }

double CostProfile::duration(const Action& action) const {
  return medians_.at(static_cast<std::size_t>(action.stage.value())).duration(action.kind);
}

template <class StageT>
MeasuredProfile measured_profile(const CostProfile& costs, const BasicPipelineEngine<StageT>& engine,
                                 std::string source) {
  if (costs.num_stages() != engine.num_stages()) {
    fail("measured costs have {} stages, the engine {}", costs.num_stages(), engine.num_stages());
  }
  const EngineOptions& options = engine.options();
  // A message's bytes on the wire: 2 a value in bf16/fp16 (MpiTransport packs them), else 4.
  const double bytes_per_value = options.format == ComputeFormat::kFp32 ? 4.0 : 2.0;
  MeasuredProfile profile;
  profile.source = std::move(source);
  for (int s = 0; s < engine.num_stages(); ++s) {
    StageCosts stage_costs = costs.stage(StageId(s));
    const int cut = engine.boundaries()[static_cast<std::size_t>(s) + 1];
    stage_costs.output_bytes =
        engine.schedule().is_last_stage(StageId(s))
            ? 0.0
            : bytes_per_value *
                  static_cast<double>(StageTraits<StageT>::boundary_elements(engine.config(), options, cut));
    // parameters, gradients and AdamW's two moments, float each, and in
    // bf16/fp16 the rounded copy the layers read in 16 bits: 16 or 18 B a
    // parameter, as the memory model prices them (model/model_states.h)
    const double bytes_per_parameter = options.format == ComputeFormat::kFp32 ? 16.0 : 18.0;
    stage_costs.model_state_bytes =
        bytes_per_parameter * static_cast<double>(engine.stage_parameter_count(StageId(s)));
    profile.stages.push_back(ProfiledStage::all_measured(stage_costs));
  }
  return profile;
}

template <class StageT>
SimulationResult predict_step(const BasicPipelineEngine<StageT>& engine, const CostProfile& costs) {
  SimulationCosts simulation = costs_from_profile(measured_profile(costs, engine, "measured"));
  simulation.comm_mode = CommMode::kOverlapped;
  return simulate(engine.schedule(), simulation);
}

template MeasuredProfile measured_profile(const CostProfile&, const PipelineEngine&, std::string);
template MeasuredProfile measured_profile(const CostProfile&, const VlmPipelineEngine&, std::string);
template SimulationResult predict_step(const PipelineEngine&, const CostProfile&);
template SimulationResult predict_step(const VlmPipelineEngine&, const CostProfile&);

Execution replay(const Schedule& schedule, const StepResult& serial_step) {
  std::unordered_map<Action, double> measured;
  for (const RankRecord& record : serial_step.ranks) {
    for (const ActionTiming& t : record.actions) measured[t.action] = t.duration_s();
  }
  ExecutionCosts costs{
      .duration = [&](const Action& a, RankId) { return measured.at(a); },
      .transfer = [](const Action&, RankId, RankId) { return 0.0; },
      .mode = CommMode::kOverlapped,
  };
  Execution execution = execute(schedule, costs);
  if (execution.deadlocked) fail("{}", execution.deadlock_message());
  return execution;
}

}  // namespace pipeflow::runtime
