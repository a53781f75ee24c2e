#include "pipeflow/plan/analyze.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <fstream>
#include <map>
#include <numeric>
#include <set>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/log.h"
#include "pipeflow/core/units.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/sim/cost_model.h"
#include "pipeflow/sim/run_metadata.h"
#include "pipeflow/trace/chrome_trace.h"

namespace pipeflow {

double peak_memory(const Prediction& p) {
  double peak = 0;
  for (const RankResult& r : p.result.ranks) peak = std::max(peak, r.peak_memory_bytes);
  return peak;
}

double modelled_imbalance(const Prediction& p) {
  double slowest = 0, sum = 0;
  for (const StageCosts& s : p.costs.costs.stages) {
    const double compute = s.forward_s + s.backward_s + s.backward_input_s + s.backward_weight_s;
    slowest = std::max(slowest, compute);
    sum += compute;
  }
  return sum > 0 ? slowest * static_cast<double>(p.costs.costs.stages.size()) / sum : 1.0;
}

namespace {

constexpr std::array<ActionKind, 4> kComputeKinds = {ActionKind::kForward, ActionKind::kBackward,
                                                     ActionKind::kBackwardInput, ActionKind::kBackwardWeight};

// ---- the trace's own figures ----

// The time `e` runs under the rank's compute actions.
double overlap_with_compute(const std::vector<const TraceEvent*>& events, const TraceEvent& e) {
  double overlap = 0;
  for (const TraceEvent* other : events) {
    if (!is_compute(other->category)) continue;
    overlap += std::max(0.0, std::min(e.end_s(), other->end_s()) - std::max(e.start_s, other->start_s));
  }
  return overlap;
}

std::vector<RankUsage> rank_usage(const Timeline& timeline) {
  const double start = timeline.start_s();
  const double end = timeline.end_s();
  std::vector<std::vector<const TraceEvent*>> by_rank(timeline.num_ranks);
  for (const TraceEvent& e : timeline.events) by_rank[e.rank.value()].push_back(&e);
  std::vector<RankUsage> usage(timeline.num_ranks);
  for (int r = 0; r < timeline.num_ranks; ++r) {
    std::vector<const TraceEvent*>& events = by_rank[r];
    std::sort(events.begin(), events.end(), [](const TraceEvent* a, const TraceEvent* b) {
      return a->start_s < b->start_s;
    });
    RankUsage& u = usage[r];
    // The warm-up ends where the rank's first backward starts, the
    // cool-down begins where its last forward ends.
    double first_backward = end, last_forward_end = start;
    for (const TraceEvent* e : events) {
      switch (e->category) {
        case EventCategory::kForward:
          u.busy_s += e->duration_s;
          last_forward_end = std::max(last_forward_end, e->end_s());
          break;
        case EventCategory::kBackward:
        case EventCategory::kBackwardInput:
          first_backward = std::min(first_backward, e->start_s);
          u.busy_s += e->duration_s;
          break;
        case EventCategory::kBackwardWeight:
          u.busy_s += e->duration_s;
          break;
        case EventCategory::kSend:
        case EventCategory::kRecv:
          u.comm_s += e->duration_s;
          break;
        case EventCategory::kWait:
          u.wait_s += e->duration_s;
          break;
        case EventCategory::kTensorParallel: {
          // Inside a compute action: communication the action's span holds
          // (the bubble is the pipeline's, outside the actions); one outside
          // every action is communication of the rank.
          const double inside = overlap_with_compute(events, *e);
          u.tensor_parallel_s += inside;
          u.comm_s += e->duration_s - inside;
          break;
        }
        case EventCategory::kAllreduce:
        case EventCategory::kOptimizer:
        case EventCategory::kOther:
          break;  // flush: below, where it is not under another event
      }
    }
    const double cool_down = std::max(last_forward_end, first_backward);
    // Idle: the gaps between the rank's events, by the phase they fall in.
    double cursor = start;
    auto add_gap = [&](double from, double to) {
      if (to <= from) return;
      const double fill = std::max(0.0, std::min(to, first_backward) - from);
      const double drain = std::max(0.0, to - std::max(from, cool_down));
      u.fill_s += fill;
      u.drain_s += drain;
      u.stall_s += (to - from) - fill - drain;
    };
    // A flush event counts where no action runs beside it (a data-parallel
    // reduction posted while the rank still computes), so the figures add up.
    const auto is_flush = [](const TraceEvent* e) {
      return e->category == EventCategory::kAllreduce || e->category == EventCategory::kOptimizer ||
             e->category == EventCategory::kOther;
    };
    for (const TraceEvent* flush : events) {
      if (!is_flush(flush)) continue;
      u.flush_s += flush->duration_s;
      for (const TraceEvent* e : events) {
        if (is_flush(e)) continue;
        u.flush_s -= std::max(0.0, std::min(flush->end_s(), e->end_s()) - std::max(flush->start_s, e->start_s));
      }
    }
    for (const TraceEvent* e : events) {
      add_gap(cursor, e->start_s);
      if (e->category == EventCategory::kWait) add_gap(std::max(cursor, e->start_s), e->end_s());
      cursor = std::max(cursor, e->end_s());
    }
    add_gap(cursor, end);
    u.idle_s = u.fill_s + u.stall_s + u.drain_s - u.wait_s;
  }
  return usage;
}

struct ActionEvents {
  std::map<Action, const TraceEvent*> by_action;
  int num_stages = 0;
};

ActionEvents compute_actions(const Timeline& timeline) {
  ActionEvents a;
  for (const TraceEvent& e : timeline.events) {
    if (!e.action || !is_compute(e.action->kind)) continue;
    a.by_action[*e.action] = &e;
    a.num_stages = std::max(a.num_stages, e.action->stage.value() + 1);
  }
  return a;
}

const TraceEvent* find(const ActionEvents& a, StageId stage, ActionKind kind, MicrobatchId mb) {
  const auto it = a.by_action.find(Action{stage, kind, mb});
  return it == a.by_action.end() ? nullptr : it->second;
}

// The action whose output `action` needs (see CriticalPath).
const TraceEvent* data_predecessor(const ActionEvents& a, const Action& action) {
  const int s = action.stage.value();
  switch (action.kind) {
    case ActionKind::kForward:
      return s > 0 ? find(a, StageId(s - 1), ActionKind::kForward, action.microbatch) : nullptr;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      if (s + 1 == a.num_stages) return find(a, action.stage, ActionKind::kForward, action.microbatch);
      if (const TraceEvent* b = find(a, StageId(s + 1), ActionKind::kBackward, action.microbatch)) return b;
      return find(a, StageId(s + 1), ActionKind::kBackwardInput, action.microbatch);
    case ActionKind::kBackwardWeight:
      return find(a, action.stage, ActionKind::kBackwardInput, action.microbatch);
    default:
      return nullptr;
  }
}

CriticalPath critical_path(const ActionEvents& a) {
  CriticalPath path;
  path.compute_by_stage_s.assign(a.num_stages, 0.0);
  if (a.by_action.empty()) return path;
  // The compute actions of each rank in time order, to find the previous one.
  std::map<int, std::vector<const TraceEvent*>> by_rank;
  for (const auto& [action, e] : a.by_action) by_rank[e->rank.value()].push_back(e);
  for (auto& [rank, events] : by_rank) {
    std::sort(events.begin(), events.end(), [](const TraceEvent* x, const TraceEvent* y) {
      return x->start_s < y->start_s;
    });
  }
  auto previous_on_rank = [&](const TraceEvent* e) -> const TraceEvent* {
    const auto& events = by_rank[e->rank.value()];
    const auto it = std::lower_bound(events.begin(), events.end(), e, [](const TraceEvent* x, const TraceEvent* y) {
      return x->start_s < y->start_s;
    });
    return it == events.begin() ? nullptr : *std::prev(it);
  };
  const TraceEvent* e = std::max_element(a.by_action.begin(), a.by_action.end(), [](const auto& x, const auto& y) {
                          return x.second->end_s() < y.second->end_s();
                        })->second;
  const double end = e->end_s();
  std::vector<const TraceEvent*> chain;
  std::set<const TraceEvent*> visited;
  while (e != nullptr && visited.insert(e).second) {
    chain.push_back(e);
    const TraceEvent* on_rank = previous_on_rank(e);
    const TraceEvent* data = data_predecessor(a, *e->action);
    // A data predecessor that starts after its successor (clocks that disagree, a mislabelled action) is no
    // predecessor: every step of the walk goes to an earlier start, so it ends.
    if (data != nullptr && !(data->start_s < e->start_s)) data = nullptr;
    if (on_rank == nullptr || (data != nullptr && data->end_s() > on_rank->end_s())) on_rank = data;
    e = on_rank;
  }
  std::reverse(chain.begin(), chain.end());
  for (const TraceEvent* step : chain) {
    path.actions.push_back(to_string(*step->action));
    path.compute_s += step->duration_s;
    path.compute_by_stage_s[step->action->stage.value()] += step->duration_s;
  }
  path.length_s = end - chain.front()->start_s;
  return path;
}

// ---- re-simulation ----

std::size_t kind_index(ActionKind kind) {
  return static_cast<std::size_t>(std::find(kComputeKinds.begin(), kComputeKinds.end(), kind) - kComputeKinds.begin());
}

std::string stage_layers(const Partition& partition, std::size_t stage) {
  const StagePlan& s = partition.stages[stage];
  return s.layer_names.size() == 1 ? s.layer_names.front()
                                   : s.layer_names.front() + ".." + s.layer_names.back();
}

bool splits_backward(const Schedule& schedule) {
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    for (const Action& action : schedule.actions(RankId(r))) {
      if (action.kind == ActionKind::kBackwardInput) return true;
    }
  }
  return false;
}

// ---- advice ----

struct Candidate {
  std::string kind, finding, change;
  std::vector<std::string> details;
  Layout layout;
};

Layout with_microbatches(Layout layout, int microbatches) {
  layout.global_batch = layout.micro_batch * microbatches * layout.data_parallel;
  return layout;
}

// Whether the schedule `name` runs at (p, m, v).
bool schedule_runs(const std::string& name, int p, int m, int v) {
  try {
    make_schedule(name, p, m, v);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::vector<Candidate> candidates(const Analysis& a, const Layout& run, int m) {
  std::vector<Candidate> out;
  const Prediction& base = *a.baseline;
  const int p = run.pipeline_ranks;
  const bool generated = !run.file_schedule.has_value();

  // A rebalanced partition.
  if (run.partition.kind != PartitionMethod::Kind::kBalanced) {
    Layout changed = run;
    changed.partition = PartitionMethod{PartitionMethod::Kind::kBalanced, {}, {}};
    const Partition& before = base.costs.partition;
    const Partition after = layout_costs(changed, base.schedule).partition;
    if (after.boundaries != before.boundaries) {
      Candidate c{"partition",
                  a.stage_compute_s.empty()
                      ? fmt::format("the re-simulated stages' imbalance {:.2f} (the input does not show every "
                                    "stage's compute)",
                                    modelled_imbalance(base))
                      : fmt::format("stage imbalance {:.2f} (the slowest stage's compute over the mean)",
                                    a.imbalance),
                  "pipeline.partition_method \"balanced\" (--partition balanced)",
                  {},
                  changed};
      for (std::size_t s = 0; s < after.stages.size(); ++s) {
        if (before.boundaries[s] == after.boundaries[s] && before.boundaries[s + 1] == after.boundaries[s + 1]) continue;
        c.details.push_back(fmt::format("stage {}: {} -> {}", s, stage_layers(before, s), stage_layers(after, s)));
      }
      out.push_back(std::move(c));
    }
  }

  // More micro-batches; GPipe, which holds every micro-batch's activations,
  // moves to 1F1B (the same bubble, at most p in flight) as it does.
  if (generated) {
    Layout changed = with_microbatches(run, 2 * m);
    std::string change = fmt::format("{} micro-batches per step (gradient_accumulation_steps {}, global batch {})",
                                     2 * m, 2 * m, changed.global_batch);
    if (run.schedule == "gpipe") {
      changed.schedule = "1f1b";
      change = "pipeline.schedule \"1f1b\" (--schedule 1f1b) with " + change;
    }
    if (schedule_runs(changed.schedule, p, 2 * m, changed.chunks)) {
      out.push_back({"microbatches",
                     a.idle_by_phase ? fmt::format("fill and drain idle {} of the step with {} micro-batches on {} "
                                                   "stages",
                                                   format_percent(a.fill_drain_share), m, p)
                                     : fmt::format("bubble {} with {} micro-batches on {} stages",
                                                   format_percent(a.bubble), m, p),
                     change, {}, changed});
    }
  }

  // Another schedule, the next step up from 1F1B: interleaving or zero
  // bubble (every one that runs here is simulated; the best is kept).
  if (generated && run.schedule != "gpipe") {
    const int layers = static_cast<int>(pipeline_layers(run.model, parallel_config(run)).size());
    for (const auto& [name, v] :
         std::vector<std::pair<std::string, int>>{{"interleaved-1f1b", 2}, {"zb-h1", 1}, {"zbv", 2}}) {
      if (name == run.schedule || p * v > layers || !schedule_runs(name, p, m, v)) continue;
      Layout changed = run;
      changed.schedule = name;
      changed.chunks = v;
      out.push_back({"schedule",
                     fmt::format("bubble {} with {}: the schedule's own bubble is {}", format_percent(a.bubble),
                                 run.schedule, format_percent(a.theoretical_bubble.value_or(0))),
                     v > 1 ? fmt::format("pipeline.schedule \"{}\" with virtual_stages {} (--schedule {} --virtual {})",
                                         name, v, name, v)
                           : fmt::format("pipeline.schedule \"{}\" (--schedule {})", name, name),
                     {}, changed});
    }
  }

  // Communication overlapped with compute.
  if (run.comm_mode == CommMode::kBlocking) {
    Layout changed = run;
    changed.comm_mode = CommMode::kOverlapped;
    out.push_back({"overlap",
                   fmt::format("communication and waits {} of the step, with blocking sends and receives",
                               format_percent(a.comm_wait_share)),
                   "comm_mode \"overlapped\" (--comm overlapped): a separate communication stream", {}, changed});
  }

  // Recompute: off when memory allows, on when it does not fit. A frozen
  // prefix runs no backward: it neither recomputes nor keeps anything.
  const std::string no_backward = training_summary(run).no_backward_note();
  const std::string frozen_note = no_backward.empty() ? "" : " (" + no_backward + ")";
  if (run.recompute != Recompute::kNone) {
    Layout changed = run;
    changed.recompute = Recompute::kNone;
    out.push_back({"recompute",
                   fmt::format("recompute {} repeats forward work in the backward{}", to_string(run.recompute),
                               frozen_note),
                   "recompute \"none\" (--recompute none)", {}, changed});
  } else if (peak_memory(base) > run.hardware.memory_bytes) {
    Layout changed = run;
    changed.recompute = Recompute::kSelective;
    out.push_back({"recompute",
                   fmt::format("peak memory {} exceeds the device's {}{}", format_bytes(peak_memory(base)),
                               format_bytes(run.hardware.memory_bytes), frozen_note),
                   "recompute \"selective\" (--recompute selective)", {}, changed});
  }
  return out;
}

}  // namespace

Resimulator::Resimulator(const RunMetadata& run) : layout_(layout_of(resolve(run.config))) {
  if (!run.costs_measured) return;
  measured_ = run.costs;
  const LayoutCosts modelled = layout_costs(layout_, layout_schedule(layout_));
  boundaries_ = modelled.partition.boundaries;
  for (ActionKind kind : kComputeKinds) {
    double measured = 0, model = 0;
    for (const ProfiledStage& s : run.costs.stages) measured += s.costs.duration(kind);
    for (const StageCosts& s : modelled.costs.stages) model += s.duration(kind);
    scale_.push_back(model > 0 ? measured / model : 1.0);
  }
  double measured_optimizer = 0, model_optimizer = 0;
  for (const ProfiledStage& s : run.costs.stages) measured_optimizer += s.costs.optimizer_s;
  for (const StageCosts& s : modelled.costs.stages) model_optimizer += s.optimizer_s;
  optimizer_scale_ = model_optimizer > 0 ? measured_optimizer / model_optimizer : 1.0;
  // A run with full backwards measured no I or W: a split backward takes B's calibration.
  measured_split_ = scale_[kind_index(ActionKind::kBackwardInput)] > 0;
  if (!measured_split_) {
    scale_[kind_index(ActionKind::kBackwardInput)] = scale_[kind_index(ActionKind::kBackward)];
    scale_[kind_index(ActionKind::kBackwardWeight)] = scale_[kind_index(ActionKind::kBackward)];
  }
}

namespace {

// Whether `a` and `b` do the same work per micro-batch and stage layer: the
// measured durations of one hold for the other.
bool same_work(const Layout& a, const Layout& b) {
  const ModelSpec& x = a.model;
  const ModelSpec& y = b.model;
  const bool model = x.architecture == y.architecture && x.layers == y.layers && x.hidden == y.hidden &&
                     x.heads == y.heads && x.kv_heads == y.kv_heads && x.ffn == y.ffn && x.vocab == y.vocab &&
                     x.tied_embeddings == y.tied_embeddings && x.dropout == y.dropout && x.vision == y.vision;
  return model && a.hardware.name == b.hardware.name && a.micro_batch == b.micro_batch &&
         a.seq_length == b.seq_length && a.tensor_parallel == b.tensor_parallel && a.recompute == b.recompute &&
         a.sequence_parallel == b.sequence_parallel && a.precision == b.precision;
}

}  // namespace

double Resimulator::scale(ActionKind kind) const { return measured_ ? scale_[kind_index(kind)] : 1.0; }

bool Resimulator::does_the_runs_work(const Layout& changed, const LayoutCosts& modelled) const {
  return measured_ && same_work(changed, layout_) && modelled.partition.boundaries == boundaries_;
}

std::optional<MeasuredProfile> Resimulator::profile_for(const Layout& changed, const Schedule& schedule,
                                                        const LayoutCosts& modelled) const {
  if (!measured_) return std::nullopt;
  if (does_the_runs_work(changed, modelled) && (measured_split_ || !splits_backward(schedule))) return measured_;
  // Another cut or other work per micro-batch, or a split backward the run
  // did not measure: the cost model's durations, calibrated by the run's.
  MeasuredProfile scaled{measured_->source + ", scaled to another partition by the cost model", {}, measured_->link};
  for (const StageCosts& stage : modelled.costs.stages) {
    ProfiledStage s{stage, {}};
    for (ActionKind kind : kComputeKinds) s.costs.set_duration(kind, stage.duration(kind) * scale_[kind_index(kind)]);
    s.set_measured(&StageCosts::optimizer_s, stage.optimizer_s * optimizer_scale_);
    scaled.stages.push_back(std::move(s));
  }
  return scaled;
}

std::optional<MeasuredProfile> Resimulator::profile_for(const Layout& changed) const {
  if (!measured_) return std::nullopt;
  const Schedule schedule = layout_schedule(changed);
  return profile_for(changed, schedule, layout_costs(changed, schedule));
}

Prediction Resimulator::predict(const Layout& changed) const {
  const std::optional<MeasuredProfile> profile = profile_for(changed);
  return pipeflow::predict(changed, profile ? &*profile : nullptr);
}

namespace {

// The schedule's own bubble (Analysis::theoretical_bubble).
double schedule_bubble(const Prediction& base) {
  SimulationCosts uniform;
  StageCosts mean;
  const std::vector<StageCosts>& stages = base.costs.costs.stages;
  for (ActionKind kind : kComputeKinds) {
    double sum = 0;
    for (const StageCosts& s : stages) sum += s.duration(kind);
    mean.set_duration(kind, sum / static_cast<double>(stages.size()));
  }
  uniform.stages.assign(stages.size(), mean);
  return simulate(layout_schedule(base.layout), uniform).pipeline_bubble_ratio;
}

void advise(Analysis& a, const Resimulator& sim) {
  const Prediction& base = *a.baseline;
  const double capacity = base.layout.hardware.memory_bytes;
  const double base_peak = peak_memory(base);
  std::optional<Advice> best_schedule;
  for (Candidate& c : candidates(a, sim.layout(), base.microbatches)) {
    std::optional<Prediction> predicted;
    try {
      predicted = sim.predict(c.layout);
    } catch (const Error& error) {
      a.notes.push_back(fmt::format("{} ({}) could not be simulated: {}", c.kind, c.change, error.what()));
      continue;
    }
    const Prediction& p = *predicted;
    Advice advice{std::move(c.kind), std::move(c.finding), std::move(c.change), std::move(c.details), c.layout,
                  p.result.step_time_s, p.tokens_per_s, p.result.bubble_ratio, peak_memory(p), 0};
    advice.gain = p.tokens_per_s / base.tokens_per_s - 1;
    const bool fixes_memory = base_peak > capacity && advice.peak_memory_bytes <= capacity;
    if (advice.gain <= 1e-9 && !fixes_memory) continue;
    if (advice.peak_memory_bytes > capacity && advice.peak_memory_bytes > base_peak) {
      a.notes.push_back(fmt::format("{} ({}) would gain {:+.1f}% but needs {} per device, over the {} of {}",
                                    advice.kind, advice.change, 100 * advice.gain,
                                    format_bytes(advice.peak_memory_bytes), format_bytes(capacity),
                                    base.layout.hardware.name));
      continue;
    }
    if (advice.kind == "schedule") {
      if (!best_schedule || advice.gain > best_schedule->gain) best_schedule = std::move(advice);
      continue;
    }
    a.advice.push_back(std::move(advice));
  }
  if (best_schedule) a.advice.push_back(std::move(*best_schedule));
  std::stable_sort(a.advice.begin(), a.advice.end(), [](const Advice& x, const Advice& y) { return x.gain > y.gain; });
}

}  // namespace

RunMetadata measured_run(const RunConfig& config, const std::vector<MeasuredStage>& stages,
                         const std::string& source) {
  const Layout layout = layout_of(resolve(config));
  const Schedule schedule = layout_schedule(layout);
  const LayoutCosts modelled = layout_costs(layout, schedule);
  if (stages.size() != modelled.costs.stages.size()) {
    fail("{}: the configuration runs {} stages ({} ranks x {} chunks), the trace {}: set pipeline.stages and "
         "virtual_stages to the run's",
         source, modelled.costs.stages.size(), layout.pipeline_ranks, layout.chunks, stages.size());
  }
  // A stage the trace did not see: the cost model's, scaled as the seen stages' measured over modelled.
  std::array<double, 4> seen{}, model{};
  for (std::size_t s = 0; s < stages.size(); ++s) {
    for (ActionKind kind : kComputeKinds) {
      if (!stages[s].duration_s[kind_index(kind)]) continue;
      seen[kind_index(kind)] += *stages[s].duration_s[kind_index(kind)];
      model[kind_index(kind)] += modelled.costs.stages[s].duration(kind);
    }
  }
  double seen_optimizer = 0, model_optimizer = 0;
  std::vector<std::size_t> unseen;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    if (stages[s].optimizer_s) {
      seen_optimizer += *stages[s].optimizer_s;
      model_optimizer += modelled.costs.stages[s].optimizer_s;
    }
    if (!stages[s].duration_s[kind_index(ActionKind::kForward)]) unseen.push_back(s);
  }
  if (unseen.size() == stages.size()) fail("{}: no stage's durations were measured: nothing to re-simulate", source);
  if (!unseen.empty()) {
    log_warning("{}: stages {} were not measured: their durations are the cost model's scaled as the measured "
                "stages' ({:.2f} of the model's forward): a guess, as good as the model's balance of the stages",
                source, fmt::join(unseen, ", "), model[0] > 0 ? seen[0] / model[0] : 0.0);
  }
  MeasuredProfile profile =
      profile_of_costs(modelled.costs, source + ": durations measured, the rest the cost model's");
  for (std::size_t s = 0; s < stages.size(); ++s) {
    StageCosts& costs = profile.stages[s].costs;
    for (ActionKind kind : kComputeKinds) {
      const std::size_t k = kind_index(kind);
      const std::optional<double>& measured = stages[s].duration_s[k];
      costs.set_duration(kind, measured ? *measured : costs.duration(kind) * (model[k] > 0 ? seen[k] / model[k] : 0.0));
    }
    if (stages[s].optimizer_s) {
      costs.optimizer_s = *stages[s].optimizer_s;
    } else if (model_optimizer > 0) {
      costs.optimizer_s *= seen_optimizer / model_optimizer;
    }
  }
  return RunMetadata{"pipeflow analyze --config", config, std::move(profile), true};
}

RunMetadata measured_run(const RunConfig& config, const Timeline& timeline, const std::string& source) {
  const Layout layout = layout_of(resolve(config));
  const int microbatches = layout_schedule(layout).num_microbatches();
  // Per stage and compute kind: the durations' sum and the micro-batches seen.
  int stages = 0, trace_microbatches = 0;
  for (const TraceEvent& e : timeline.events) {
    if (!e.action || !is_compute(e.action->kind) || e.category == EventCategory::kWait) continue;
    stages = std::max(stages, e.action->stage.value() + 1);
    if (e.action->stage.value() == 0 && e.action->kind == ActionKind::kForward) ++trace_microbatches;
  }
  if (trace_microbatches != microbatches) {
    fail("{}: the configuration runs {} micro-batches per step, the trace {}: set the batch sizes "
         "(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps) to the run's",
         source, microbatches, trace_microbatches);
  }
  std::vector<std::array<double, 4>> sum(stages, {0, 0, 0, 0});
  std::vector<std::array<int, 4>> count(stages, {0, 0, 0, 0});
  // The optimizer's time per rank, shared by the rank's stages.
  std::vector<double> optimizer_by_rank(timeline.num_ranks, 0.0);
  std::vector<int> stages_on_rank(timeline.num_ranks, 0);
  std::vector<int> rank_of_stage(stages, -1);
  for (const TraceEvent& e : timeline.events) {
    if (e.category == EventCategory::kOptimizer) optimizer_by_rank[e.rank.value()] += e.duration_s;
    if (!e.action) continue;
    const int s = e.action->stage.value();
    if (s < stages && rank_of_stage[s] < 0) {
      rank_of_stage[s] = e.rank.value();
      ++stages_on_rank[e.rank.value()];
    }
    if (!is_compute(e.action->kind) || e.category == EventCategory::kWait) continue;
    sum[s][kind_index(e.action->kind)] += e.duration_s;
    ++count[s][kind_index(e.action->kind)];
  }
  std::vector<MeasuredStage> measured(stages);
  for (int s = 0; s < stages; ++s) {
    for (ActionKind kind : kComputeKinds) {
      const std::size_t k = kind_index(kind);
      measured[s].duration_s[k] = count[s][k] > 0 ? sum[s][k] / count[s][k] : 0.0;
    }
    const int rank = rank_of_stage[s];
    if (rank >= 0 && optimizer_by_rank[rank] > 0) measured[s].optimizer_s = optimizer_by_rank[rank] / stages_on_rank[rank];
  }
  return measured_run(config, measured, source);
}

namespace {

double fraction(double part, double whole) { return whole > 0 ? part / whole : 0.0; }

void set_imbalance(Analysis& a) {
  if (a.stage_compute_s.empty()) return;
  const double mean = std::accumulate(a.stage_compute_s.begin(), a.stage_compute_s.end(), 0.0) /
                      static_cast<double>(a.stage_compute_s.size());
  if (mean > 0) a.imbalance = *std::max_element(a.stage_compute_s.begin(), a.stage_compute_s.end()) / mean;
}

// The figures of a timeline.
Analysis timeline_figures(const TraceInput& input) {
  const Timeline& t = input.timeline;
  if (t.events.empty() || t.num_ranks < 1) {
    if (input.reading.format != "pipeflow" && !input.reading.format.empty()) {
      fail("{}: no pipeline action, transfer or collective{}: label the actions as torch.distributed.pipelining "
           "does (\"PP:0F1\", \"Forward 1\"), or pick another --step",
           input.source, input.reading.step ? fmt::format(" in step {}", *input.reading.step) : std::string());
    }
    fail("{}: the trace has no events (\"X\" events, tid = rank): nothing to analyse", input.source);
  }
  Analysis a;
  a.title = t.title;
  a.time_unit = t.time_unit;
  a.num_ranks = t.num_ranks;
  a.step_s = t.makespan_s();
  a.ranks = rank_usage(t);
  a.rank_seen.assign(a.ranks.size(), true);
  double busy = 0, fill_drain = 0, stall = 0, comm_wait = 0, tensor = 0;
  for (const RankUsage& u : a.ranks) {
    busy += u.busy_s;
    fill_drain += u.fill_s + u.drain_s;
    stall += u.stall_s;
    comm_wait += u.comm_s + u.wait_s;
    tensor += u.tensor_parallel_s;
  }
  const double total = a.step_s * a.num_ranks;
  a.bubble = total > 0 ? 1 - busy / total : 0.0;
  a.fill_drain_share = fraction(fill_drain, total);
  a.stall_share = fraction(stall, total);
  a.comm_wait_share = fraction(comm_wait, total);
  a.tensor_parallel_share = fraction(tensor, total);
  const ActionEvents actions = compute_actions(t);
  a.stage_compute_s.assign(actions.num_stages, 0.0);
  for (const auto& [action, e] : actions.by_action) a.stage_compute_s[action.stage.value()] += e->duration_s;
  if (a.stage_compute_s.empty()) {
    a.notes.push_back("no event names a pipeline action (args.action such as \"0F1\"): no stages, no critical path");
  }
  set_imbalance(a);
  a.critical_path = critical_path(actions);
  return a;
}

// Ascend's Bubble column, where every seen rank has it and it holds any
// time: in a pipeline job a stage's receives hold its waits for the
// neighbouring stages, so their share of the step is the bubble (torch_npu
// counts the receive operators' time as the bubble); busy counts Ascend's
// Computing, the optimizer step's kernels among them.
void set_bubble_from_receives(Analysis& a, const TimerLog& log, double total) {
  double receive = 0;
  for (const std::optional<RankTimes>& t : log.ranks) {
    if (!t) continue;
    if (!t->receive_s) return;
    receive += *t->receive_s;
  }
  if (!(receive > 0 && total > 0)) return;
  a.notes.push_back(fmt::format("bubble from the Bubble column (receive time) {}; from busy time it would be {} "
                                "(1 - busy / (ranks x step), the idle outside receives counted)",
                                format_percent(receive / total), format_percent(a.bubble)));
  a.bubble = receive / total;
  a.bubble_source = "Ascend's Bubble column: receive time / (ranks x step)";
}

// Ascend's Stage column: each stage's step less its receives; the slowest is named.
void note_slowest_stage_time(Analysis& a, const TimerLog& log) {
  std::optional<std::size_t> slowest;
  double sum = 0;
  for (std::size_t s = 0; s < log.ranks.size(); ++s) {
    if (!log.ranks[s] || !log.ranks[s]->stage_s) return;
    sum += *log.ranks[s]->stage_s;
    if (!slowest || *log.ranks[s]->stage_s > *log.ranks[*slowest]->stage_s) slowest = s;
  }
  if (!slowest || log.ranks.size() < 2 || !(sum > 0)) return;
  const double time = *log.ranks[*slowest]->stage_s;
  a.notes.push_back(fmt::format("the Stage column (the step less its receives): stage {} is the slowest, {} against "
                                "a mean of {}",
                                *slowest, format_seconds(time), format_seconds(sum / log.ranks.size())));
}

// The figures of a timer log: per-rank totals, no timeline.
Analysis log_figures(const TimerLog& log) {
  Analysis a;
  a.title = log.format;
  a.idle_by_phase = false;
  a.num_ranks = static_cast<int>(log.ranks.size());
  std::vector<double> steps = log.step_s;
  std::sort(steps.begin(), steps.end());
  a.step_s = steps[steps.size() / 2];
  double busy = 0, comm = 0;
  int seen = 0;
  bool all_seen = true;
  for (const std::optional<RankTimes>& t : log.ranks) {
    RankUsage u;
    if (t) {
      u.busy_s = t->forward_s + t->backward_s;
      u.comm_s = t->comm_s;
      u.flush_s = t->optimizer_s;
      u.idle_s = std::max(0.0, a.step_s - u.busy_s - u.comm_s - u.flush_s);
      busy += u.busy_s;
      comm += u.comm_s;
      ++seen;
    }
    all_seen = all_seen && t.has_value();
    a.ranks.push_back(u);
    a.rank_seen.push_back(t.has_value());
  }
  const double total = a.step_s * seen;
  a.bubble = seen > 0 && total > 0 ? 1 - busy / total : 0.0;
  a.comm_wait_share = fraction(comm, total);
  set_bubble_from_receives(a, log, total);
  note_slowest_stage_time(a, log);
  if (all_seen) {
    for (const std::optional<RankTimes>& t : log.ranks) a.stage_compute_s.push_back(t->forward_s + t->backward_s);
    set_imbalance(a);
  } else if (seen > 0) {
    a.notes.push_back(fmt::format("bubble and shares over the {} of {} ranks whose timers the log has; no stage "
                                  "imbalance without every stage's",
                                  seen, log.ranks.size()));
  }
  a.notes.push_back("a log's timers give totals, not a timeline: idle is not split into fill, stall and drain, the "
                    "waits for a peer are inside the send and receive timers (comm), and there is no critical path");
  return a;
}

// The run's stages as the log measured them.
std::vector<MeasuredStage> measured_stages(const TimerLog& log, const RunConfig& config) {
  const Layout layout = layout_of(resolve(config));
  const int m = layout_schedule(layout).num_microbatches();
  if (log.microbatches > 0 && log.microbatches != m) {
    fail("{}: the configuration runs {} micro-batches per step, the log {}: set the batch sizes to the run's",
         config.source, m, log.microbatches);
  }
  if (static_cast<int>(log.ranks.size()) != layout.pipeline_ranks) {
    fail("{}: the configuration runs {} pipeline ranks, the log {}: set pipeline.stages to the run's", config.source,
         layout.pipeline_ranks, log.ranks.size());
  }
  std::vector<MeasuredStage> stages(static_cast<std::size_t>(layout.pipeline_ranks * layout.chunks));
  for (std::size_t r = 0; r < log.ranks.size(); ++r) {
    if (!log.ranks[r]) continue;
    // A rank's chunks share its timers (interleaved: stage r + k·p for k < v).
    for (int k = 0; k < layout.chunks; ++k) {
      MeasuredStage& s = stages[r + static_cast<std::size_t>(k * layout.pipeline_ranks)];
      s.duration_s[kind_index(ActionKind::kForward)] = log.ranks[r]->forward_s / (m * layout.chunks);
      s.duration_s[kind_index(ActionKind::kBackward)] = log.ranks[r]->backward_s / (m * layout.chunks);
      s.duration_s[kind_index(ActionKind::kBackwardInput)] = 0.0;
      s.duration_s[kind_index(ActionKind::kBackwardWeight)] = 0.0;
      if (log.ranks[r]->optimizer_s > 0) s.optimizer_s = log.ranks[r]->optimizer_s / layout.chunks;
    }
  }
  return stages;
}

}  // namespace

Analysis analyze(const TraceInput& input) {
  Analysis a = input.log ? log_figures(*input.log) : timeline_figures(input);
  a.source = input.source;
  a.reading = input.reading;
  const std::vector<std::optional<double>>& measured = input.reading.peak_memory_bytes;
  const bool memory_measured =
      !measured.empty() && std::all_of(measured.begin(), measured.end(), [](auto p) { return p && *p > 0; });
  if (memory_measured) {
    const auto [low, high] = std::minmax_element(measured.begin(), measured.end());
    a.memory_skew = **high / **low;
  }

  if (!input.run) {
    a.notes.push_back(input.log ? "the log states no run (as Megatron's arguments block does): no re-simulation, no "
                                  "advice; give the run's layout with --config"
                                : "the trace carries no run metadata (otherData.pipeflow, written by pipeflow train and "
                                  "simulate): no re-simulation, no advice; give the run's layout with --config (a "
                                  "pipeflow configuration)");
    return a;
  }
  const Resimulator sim(*input.run);
  a.baseline = sim.predict(sim.layout());
  a.theoretical_bubble = schedule_bubble(*a.baseline);
  for (const RankResult& r : a.baseline->result.ranks) a.peak_memory_bytes.push_back(r.peak_memory_bytes);
  const auto [low, high] = std::minmax_element(a.peak_memory_bytes.begin(), a.peak_memory_bytes.end());
  if (*low > 0 && !memory_measured) a.memory_skew = *high / *low;
  advise(a, sim);
  return a;
}

RunMetadata measured_run(const RunConfig& config, const TimerLog& log, const std::string& source) {
  return measured_run(config, measured_stages(log, config), source);
}

RunMetadata measured_run_from(const std::filesystem::path& path, const RunConfig& config) {
  std::error_code unreadable;  // a name too long, a loop of links: reading it says so
  if (std::filesystem::is_regular_file(path, unreadable)) {
    // A profile (profile.json as train writes it) is one JSON object with "stages" and no "traceEvents".
    const std::string text = read_file_inflated(path, kMaxTraceFileBytes, "profile or trace");
    const std::size_t first = text.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text[first] == '{' && text.find("\"traceEvents\"") == std::string::npos &&
        text.find("\"distributedInfo\"") == std::string::npos) {
      return RunMetadata{"a measured profile", config, load_profile(path), true};
    }
  }
  TraceOptions options;
  TraceInput input = load_trace_input({path}, options);
  if (input.run && input.reading.format == "pipeflow") {
    // pipeflow's own trace: its run's measured costs, under the configuration given.
    return RunMetadata{input.run->producer, config, input.run->costs, input.run->costs_measured};
  }
  if (input.log) return measured_run(config, *input.log, path.string());
  return measured_run(config, input.timeline, path.string());
}

RunMetadata measured_run_of(const std::filesystem::path& path, const std::optional<std::filesystem::path>& config,
                            std::string_view config_flag) {
  if (config) return measured_run_from(path, load_run_config(*config));
  // A profile (profile.json, as train writes it) opens with its format's key and states no run.
  std::ifstream head(path, std::ios::binary);
  std::string opening(256, '\0');
  head.read(opening.data(), static_cast<std::streamsize>(opening.size()));
  opening.resize(static_cast<std::size_t>(head.gcount()));
  std::optional<RunMetadata> run;
  if (opening.find("\"pipeflow_profile\"") == std::string::npos) run = load_trace_input({path}).run;
  if (!run) {
    fail("{}: it does not state the run it measured (as pipeflow's traces and Megatron-LM's arguments block do): "
         "give that run's pipeflow configuration with {} FILE",
         path.string(), config_flag);
  }
  if (!run->costs_measured) {
    fail("{}: its costs are the cost model's ({}), nothing measured: give a trace or log of a run (pipeflow train's, "
         "or one simulated with --profile)",
         path.string(), run->producer);
  }
  return *run;
}

}  // namespace pipeflow
