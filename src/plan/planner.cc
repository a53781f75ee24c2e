#include "pipeflow/plan/planner.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <array>
#include <map>
#include <tuple>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/units.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/sim/cost_model.h"
#include "pipeflow/sim/profile.h"
#include "pipeflow/sim/simulation.h"

namespace pipeflow {
namespace {

void check_memory_fraction(double fraction) {
  if (!(fraction > 0 && fraction <= 1)) {
    fail("memory fraction = {}: must be in (0, 1] (the share of device memory a stage may fill; the course "
         "uses 0.8)",
         fraction);
  }
}

// The divisors of n in increasing order, by trial up to √n (n up to INT_MAX
// without overflow).
std::vector<int> divisors(int n) {
  std::vector<int> small, large;
  for (std::int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    small.push_back(static_cast<int>(d));
    if (d * d != n) large.push_back(static_cast<int>(n / d));
  }
  small.insert(small.end(), large.rbegin(), large.rend());
  return small;
}

// A candidate that passed every check but simulation, with the costs it
// shares with the other schedules of its layout and its lower bound.
struct Queued {
  Layout layout;
  std::shared_ptr<const LayoutCosts> costs;
  double bound_s = 0;
};

// The stages rank r holds under a placement (schedule.h): loop, r + k·p;
// V, r and 2p − 1 − r.
std::vector<int> stages_of(Placement placement, int rank, int ranks, int chunks) {
  if (placement == Placement::kV) return {rank, 2 * ranks - 1 - rank};
  std::vector<int> stages;
  for (int k = 0; k < chunks; ++k) stages.push_back(rank + k * ranks);
  return stages;
}

// The time bound of plan_layouts (planner.h): the largest, over ranks r, of
// the forwards of stages 0 .. r − 1 (no action of r's first stage, r, can
// start before one micro-batch's forward has passed them; an overlapped
// F&B cell lasts at least its F) + m · Σ(F + B − F&B overlap) of r's stages
// + r's all-reduce + its optimizer step.
double step_lower_bound(const LayoutCosts& costs, Placement placement, int ranks, int chunks, int microbatches) {
  double bound = 0;
  double fill = 0;  // Σ F of the stages before rank r's first
  for (int r = 0; r < ranks; ++r) {
    double busy = 0, gradient_bytes = 0, optimizer = 0;
    for (int s : stages_of(placement, r, ranks, chunks)) {
      const StageCosts& c = costs.costs.stages[static_cast<std::size_t>(s)];
      busy += c.forward_s + c.backward_s - c.forward_backward_overlap_s;
      gradient_bytes += c.gradient_bytes;
      optimizer += c.optimizer_s;
    }
    const LinkCost& link = costs.costs.data_parallel_links[static_cast<std::size_t>(r)];
    const double all_reduce = ring_all_reduce_seconds(gradient_bytes, costs.costs.data_parallel, link);
    bound = std::max(bound, fill + microbatches * busy + all_reduce + optimizer);
    fill += costs.costs.stages[static_cast<std::size_t>(r)].forward_s;
  }
  return bound;
}

// The largest model-state bytes of any rank: a lower bound on its peak.
double largest_model_states(const LayoutCosts& costs, Placement placement, int ranks, int chunks) {
  double largest = 0;
  for (int r = 0; r < ranks; ++r) {
    double states = 0;
    for (int s : stages_of(placement, r, ranks, chunks)) {
      states += costs.costs.stages[static_cast<std::size_t>(s)].model_state_bytes;
    }
    largest = std::max(largest, states);
  }
  return largest;
}

// A measured run calibrates the plan's model on its hardware only: its
// measured over modelled durations hold for the model and device it ran.
void check_measured_run(const Layout& run, const PlanRequest& request) {
  const ModelSpec& a = run.model;
  const ModelSpec& b = request.model;
  if (a.layers != b.layers || a.hidden != b.hidden || a.heads != b.heads || a.vocab != b.vocab ||
      a.architecture != b.architecture || a.vision != b.vision) {
    fail("the measured run is of {} ({} layers of width {}, {} heads, vocabulary {}) and the plan of {} ({} layers of "
         "width {}, {} heads, vocabulary {}): its calibration holds for the model it ran; plan that model, or leave "
         "the measurement out",
         a.name, a.layers, a.hidden, a.heads, a.vocab, b.name, b.layers, b.hidden, b.heads, b.vocab);
  }
  if (run.hardware.name != request.hardware.name) {
    fail("the measured run ran on {} and the plan is for {}: its calibration (measured over modelled) holds for the "
         "hardware it ran on; plan for {}, give the run's own configuration (plan --profile-config) where its input "
         "does not name its hardware, or leave the measurement out",
         run.hardware.name, request.hardware.name, run.hardware.name);
  }
}

class Search {
 public:
  explicit Search(const PlanRequest& request) : request_(request) {
    validate_model(request.model);
    validate_hardware(request.hardware);
    if (request.devices < 1) fail("devices = {}: must be >= 1", request.devices);
    if (request.global_batch < 1) fail("global batch = {}: must be >= 1 sequence", request.global_batch);
    if (request.seq_length < 1) fail("seq length = {}: must be >= 1 token", request.seq_length);
    if (request.top_k < 1) fail("top = {}: must be >= 1 (the layouts to list)", request.top_k);
    check_memory_fraction(request.memory_fraction);
    if (request.partitions.empty()) fail("internal: no partition method to search");
    for (const std::string& name : request.schedules) {
      const ScheduleInfo* info = find_schedule(name);
      if (info == nullptr) fail("schedule {}: use one of {}", quoted_excerpt(name), known_schedule_names());
      require_training_schedule(*info);
    }
    limit_bytes_ = request.memory_fraction * request.hardware.memory_bytes;
    if (request.measured) {
      calibration_.emplace(*request.measured);
      check_measured_run(calibration_->layout(), request);
    }
  }

  PlanResult run(bool use_time_bound) {
    enumerate();
    // Stable: among equal bounds, enumeration order (the schedule registry's,
    // simplest first), which also breaks exact ties in the ranking.
    std::stable_sort(queue_.begin(), queue_.end(),
                     [](const Queued& a, const Queued& b) { return a.bound_s < b.bound_s; });
    for (std::size_t i = 0; i < queue_.size(); ++i) {
      const Queued& q = queue_[i];
      if (use_time_bound && result_.best.size() >= static_cast<std::size_t>(request_.top_k) &&
          q.bound_s > result_.best.back().step_time_s) {
        result_.pruned = static_cast<std::int64_t>(queue_.size() - i);
        break;
      }
      score(q);
      if (request_.progress) request_.progress(static_cast<std::int64_t>(i + 1), static_cast<std::int64_t>(queue_.size()));
    }
    if (result_.best.empty()) {
      std::string counts;
      for (int r = 0; r < kRejectReasons; ++r) {
        counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", result_.rejected[r],
                              to_string(static_cast<RejectReason>(r)));
      }
      fail("no layout of {} on {} × {} fits: {} candidates rejected ({}){}; use more devices, a larger "
           "--memory-fraction, or another global batch",
           request_.model.name, request_.devices, request_.hardware.name, result_.candidates, counts, nearest_fit());
    }
    return std::move(result_);
  }

 private:
  void reject(RejectReason reason, std::int64_t count = 1) { result_.rejected[static_cast<int>(reason)] += count; }

  // Schedules × chunk counts for one layout: (schedule, v).
  std::vector<std::pair<const ScheduleInfo*, int>> schedule_choices(int pipeline) const {
    std::vector<std::pair<const ScheduleInfo*, int>> choices;
    for (const ScheduleInfo& info : list_schedules()) {
      if (info.inference) continue;
      const std::vector<std::string>& only = request_.schedules;
      if (!only.empty() && std::find(only.begin(), only.end(), info.name) == only.end()) continue;
      if (info.placement == Placement::kV) {
        choices.emplace_back(&info, 2);
      } else if (info.takes_virtual && pipeline > 1) {
        for (int v = 2; v <= request_.max_virtual; ++v) choices.emplace_back(&info, v);
      } else {
        choices.emplace_back(&info, 1);
      }
    }
    return choices;
  }

  void enumerate() {
    const ModelSpec& model = request_.model;
    const int pipeline_layers_count = pipeline_layer_count(model);
    const int per_node = request_.hardware.devices_per_node;
    const std::vector<int> micro_batches = [&] {
      std::vector<int> sizes;
      for (int b = 1; b <= request_.global_batch; b *= 2) sizes.push_back(b);
      return sizes;
    }();
    const std::vector<Recompute> recomputes =
        request_.recomputes.empty() ? std::vector{Recompute::kNone, Recompute::kSelective, Recompute::kFull}
                                    : request_.recomputes;
    for (int tp : divisors(request_.devices)) {
      if (tp > per_node) continue;  // tensor parallelism stays within a node
      for (int pp : divisors(request_.devices / tp)) {
        const int dp = request_.devices / (tp * pp);
        const auto choices = schedule_choices(pp);
        const std::int64_t per_batch = static_cast<std::int64_t>(choices.size()) * recomputes.size() *
                                       (dp > 1 ? 2 : 1) * request_.partitions.size();
        for (int b : micro_batches) {
          result_.candidates += per_batch;
          if (request_.global_batch % (static_cast<std::int64_t>(b) * dp) != 0) {
            reject(RejectReason::kIndivisibleBatch, per_batch);
            continue;
          }
          if (model.heads % tp != 0 || model.kv_heads % tp != 0 || (model.vision && model.vision->heads % tp != 0)) {
            reject(RejectReason::kTensorParallel, per_batch);
            continue;
          }
          const int m = request_.global_batch / (b * dp);
          for (Recompute recompute : recomputes) {
            for (ZeroStage zero : {ZeroStage::kNone, ZeroStage::kOne}) {
              if (zero == ZeroStage::kOne && dp == 1) continue;
              for (const PartitionMethod& partition : request_.partitions) {
                Layout layout;
                layout.model = model;
                layout.training = request_.training;
                layout.hardware = request_.hardware;
                layout.precision = request_.precision;
                layout.block_launch_overhead_s = request_.block_launch_overhead_s;
                layout.gradient_precision = request_.precision;
                layout.gradient_accumulation = default_gradient_accumulation(request_.precision, zero);
                layout.devices = request_.devices;
                layout.tensor_parallel = tp;
                layout.pipeline_ranks = pp;
                layout.data_parallel = dp;
                layout.micro_batch = b;
                layout.global_batch = request_.global_batch;
                layout.seq_length = request_.seq_length;
                layout.recompute = recompute;
                layout.sequence_parallel = tp > 1 && request_.seq_length % tp == 0;
                layout.partition = partition;
                layout.zero = zero;
                if (!training_) training_ = training_summary(layout);
                enqueue_schedules(layout, choices, m, pipeline_layers_count);
              }
            }
          }
        }
      }
    }
  }

  // Costs are shared by every schedule of one placement and chunk count.
  void enqueue_schedules(Layout layout, const std::vector<std::pair<const ScheduleInfo*, int>>& choices, int m,
                         int layer_count) {
    std::map<std::pair<Placement, int>, std::shared_ptr<const LayoutCosts>> shared;
    std::map<std::pair<Placement, int>, std::shared_ptr<const LayoutCosts>> scaled;  // shared's, calibrated
    std::vector<double> one_stage_peaks;  // of the schedules queued at p = 1, v = 1 (kSameSchedule)
    for (const auto& [info, v] : choices) {
      const int p = layout.pipeline_ranks;
      if (static_cast<std::int64_t>(p) * v > layer_count) {
        reject(RejectReason::kTooFewLayers);
        continue;
      }
      try {
        info->check(p, m, v);
      } catch (const Error&) {
        reject(RejectReason::kSchedule);
        continue;
      }
      layout.schedule = info->name;
      layout.chunks = v;
      // The costs read the schedule's shape only (ranks, stages, placement):
      // one without actions saves generating up to p · v · m × 3 of them.
      const Schedule shape(info->name, p, p * v, m, info->placement);
      if (repeats_a_cut(layout, shape)) {
        reject(RejectReason::kSameCut);
        continue;
      }
      std::shared_ptr<const LayoutCosts>& modelled = shared[{info->placement, v}];
      if (!modelled) modelled = std::make_shared<const LayoutCosts>(layout_costs(layout, shape, cut(layout, shape)));
      std::shared_ptr<const LayoutCosts> costs = modelled;
      if (calibration_) costs = calibrated(layout, shape, *modelled, scaled[{info->placement, v}]);
      const double states = largest_model_states(*costs, info->placement, p, v);
      least_model_states_bytes_ = std::min(least_model_states_bytes_, states);
      if (states > limit_bytes_) {
        reject(RejectReason::kOutOfMemory);
        continue;
      }
      if (p * v == 1 && repeats_a_peak(layout, *costs, one_stage_peaks)) {
        reject(RejectReason::kSameSchedule);
        continue;
      }
      queue_.push_back(Queued{layout, costs, step_lower_bound(*costs, info->placement, p, v, m)});
    }
  }

  // `modelled` as the measured run calibrates it (Resimulator::profile_for).
  // A layout that does the run's work on its cut may take the run's own
  // durations, which depends on its schedule's actions (a split backward the
  // run did not measure); any other takes the scaled cost model's, the same
  // for every schedule of its shape: made once into `scaled`.
  std::shared_ptr<const LayoutCosts> calibrated(const Layout& layout, const Schedule& shape,
                                                const LayoutCosts& modelled,
                                                std::shared_ptr<const LayoutCosts>& scaled) const {
    const bool own = calibration_->does_the_runs_work(layout, modelled);
    if (!own && scaled) return scaled;
    LayoutCosts costs = modelled;
    apply_profile(*calibration_->profile_for(layout, own ? layout_schedule(layout) : shape, modelled), costs.costs);
    auto priced = std::make_shared<const LayoutCosts>(std::move(costs));
    if (!own) scaled = priced;
    return priced;
  }

  // layout_partition's cut, made once per parallel_config, method and stage
  // count: all it depends on within a search. ZeRO stages and placements of
  // as many stages (V, and v = 2 looped) share it.
  const Partition& cut(const Layout& layout, const Schedule& schedule) {
    const CutKey key{parallel_config(layout), to_string(layout.partition), schedule.num_stages()};
    auto it = cuts_.find(key);
    if (it == cuts_.end()) it = cuts_.emplace(key, layout_partition(layout, schedule)).first;
    return it->second;
  }

  // Whether a partition method listed before the layout's cuts its stages
  // where its own does: then it is that method's candidate again.
  bool repeats_a_cut(const Layout& layout, const Schedule& shape) {
    const std::string own = to_string(layout.partition);
    const std::vector<int>& own_cut = cut(layout, shape).boundaries;  // cuts_ is a map: the reference stays
    Layout other = layout;
    for (const PartitionMethod& method : request_.partitions) {
      if (to_string(method) == own) return false;
      other.partition = method;
      if (cut(other, shape).boundaries == own_cut) return true;
    }
    return false;
  }

  // At one stage (planner.h): whether an earlier schedule of the layout
  // peaks as this one does; else its peak joins `peaks`.
  static bool repeats_a_peak(const Layout& layout, const LayoutCosts& costs, std::vector<double>& peaks) {
    const double peak = peak_memory_bytes(layout_schedule(layout), costs.costs, RankId(0));
    if (std::find(peaks.begin(), peaks.end(), peak) != peaks.end()) return true;
    peaks.push_back(peak);
    return false;
  }

  // Memory first: the peaks simulate() would report follow from the action
  // lists alone (peak_memory_bytes), and most candidates the bound lets
  // through need more than the limit.
  void score(const Queued& q) {
    const Schedule schedule = layout_schedule(q.layout);
    PlanCandidate c;
    double largest = 0;
    for (int r = 0; r < schedule.num_ranks(); ++r) {
      c.stage_peak_bytes.push_back(peak_memory_bytes(schedule, q.costs->costs, RankId(r)));
      largest = std::max(largest, c.stage_peak_bytes.back());
    }
    if (largest > limit_bytes_) {
      least_peak_bytes_ = std::min(least_peak_bytes_, largest);
      reject(RejectReason::kOutOfMemory);
      return;
    }
    ++result_.simulated;
    const SimulationResult sim = simulate(schedule, q.costs->costs);
    double comm = 0;
    for (const RankResult& rank : sim.ranks) comm += rank.comm_s + rank.overlapped_comm_s;
    const double step = sim.step_time_s;
    const LayoutCosts& costs = *q.costs;
    c.layout = q.layout;
    c.step_time_s = step;
    c.tokens_per_s = costs.tokens_per_step / step;
    c.tflops_per_device = costs.model_flops_per_step / (step * q.layout.devices) / 1e12;
    c.mfu = c.tflops_per_device * 1e12 / q.layout.hardware.peak_at(q.layout.precision);
    c.bubble_ratio = sim.bubble_ratio;
    c.zero_bubble_rate = sim.zero_bubble_rate;
    c.communication_share = comm / (static_cast<double>(sim.ranks.size()) * step);
    c.recompute_overhead = costs.hardware_flops_per_step / costs.model_flops_per_step - 1;
    c.headroom_bytes = limit_bytes_ - largest;
    insert(std::move(c));
  }

  // Keeps the top_k, best first: shorter step, then more headroom.
  void insert(PlanCandidate c) {
    std::vector<PlanCandidate>& best = result_.best;
    const auto better = [](const PlanCandidate& a, const PlanCandidate& b) {
      if (a.step_time_s != b.step_time_s) return a.step_time_s < b.step_time_s;
      return a.headroom_bytes > b.headroom_bytes;
    };
    const auto at = std::upper_bound(best.begin(), best.end(), c, better);
    if (at - best.begin() >= request_.top_k) return;
    best.insert(at, std::move(c));
    if (best.size() > static_cast<std::size_t>(request_.top_k)) best.pop_back();
  }

  // Where nothing fits for memory: what the layout that came nearest needs
  // on its fullest rank, against the limit ("" when none got that far).
  std::string nearest_fit() const {
    const std::string limit = fmt::format("the limit {} × {} = {}", request_.memory_fraction,
                                          format_bytes(request_.hardware.memory_bytes), format_bytes(limit_bytes_));
    if (least_model_states_bytes_ > limit_bytes_ && least_model_states_bytes_ < kNone) {
      return fmt::format(
          "; the fewest model states of any layout's fullest rank are {} (weights, gradients and optimizer state, "
          "before activations{}) > {}",
          format_bytes(least_model_states_bytes_), states_of_trainable(), limit);
    }
    if (least_peak_bytes_ < kNone) {
      return fmt::format("; the lowest peak of any layout's fullest rank is {} > {}", format_bytes(least_peak_bytes_),
                         limit);
    }
    return "";
  }

  // "; gradients and optimizer state are those of the 6.76B trainable parameters (...)": where layers are
  // frozen, whose states those are ("" where all train).
  std::string states_of_trainable() const {
    if (!training_) return "";
    const std::string whose = training_->trainable_note();
    return whose.empty() ? "" : "; gradients and optimizer state are those of " + whose;
  }

  using CutKey = std::tuple<ParallelConfig, std::string, int>;
  static constexpr double kNone = std::numeric_limits<double>::infinity();

  const PlanRequest& request_;
  std::optional<Resimulator> calibration_;  // request_.measured's
  double limit_bytes_ = 0;
  double least_model_states_bytes_ = kNone;  // over the candidates whose model states were weighed
  double least_peak_bytes_ = kNone;          // over those whose peaks were walked and over the limit
  std::map<CutKey, Partition> cuts_;
  std::optional<TrainingSummary> training_;  // the first layout's: every layout trains the same
  std::vector<Queued> queue_;
  PlanResult result_;
};

}  // namespace

std::string_view to_string(RejectReason reason) {
  switch (reason) {
    case RejectReason::kIndivisibleBatch: return "indivisible batch";
    case RejectReason::kTensorParallel: return "tensor parallel does not divide the heads";
    case RejectReason::kTooFewLayers: return "more stages than layers";
    case RejectReason::kSchedule: return "schedule constraint";
    case RejectReason::kOutOfMemory: return "out of memory";
    case RejectReason::kSameCut: return "same cut as an earlier partition method";
    case RejectReason::kSameSchedule: return "same as an earlier schedule at one stage";
  }
  return "?";
}

PlanResult plan_layouts(const PlanRequest& request) { return Search(request).run(true); }

PlanResult plan_layouts_exhaustively(const PlanRequest& request) { return Search(request).run(false); }

InferencePlan plan_inference(const InferencePlanRequest& request) {
  if (request.max_stages < 1) fail("devices = {}: must be >= 1 (the most pipeline stages to try)", request.max_stages);
  if (request.top_k < 1) fail("top = {}: must be >= 1 (the stage counts to list)", request.top_k);
  check_memory_fraction(request.memory_fraction);
  validate_model(request.setup.model);
  InferencePlan plan;
  plan.limit_bytes = request.memory_fraction * request.setup.hardware.memory_bytes;
  const int layers = request.setup.model.layers + 2;  // embedding, blocks, head
  const int most = std::min(request.max_stages, layers);
  if (most < request.max_stages) {
    plan.untried = fmt::format("{} .. {} stages: more than the {} pipeline layers of {} (embedding, {} blocks, "
                               "head), and every stage needs one",
                               most + 1, request.max_stages, layers, request.setup.model.name,
                               request.setup.model.layers);
  }
  for (int p = 1; p <= most; ++p) {
    InferenceOption option;
    option.stages = p;
    InferenceSetup setup = request.setup;
    setup.stages = p;
    try {
      option.prediction = predict_inference(setup);
    } catch (const Error& error) {
      option.rejected = error.what();
      plan.rejected.push_back(std::move(option));
      continue;
    }
    const std::vector<InferenceStage>& stages = option.prediction.stages;
    const auto peak = std::max_element(stages.begin(), stages.end(), [](const auto& a, const auto& b) {
      return a.peak_bytes() < b.peak_bytes();
    });
    if (peak->peak_bytes() > plan.limit_bytes) {
      option.rejected = fmt::format(
          "out of memory: stage {} needs {} (weights {}, KV cache {}, activations {}) > {}", peak - stages.begin(),
          format_bytes(peak->peak_bytes()), format_bytes(peak->weight_bytes), format_bytes(peak->kv_cache_bytes),
          format_bytes(peak->activation_bytes), format_bytes(plan.limit_bytes));
      plan.rejected.push_back(std::move(option));
    } else {
      plan.fitting.push_back(std::move(option));
    }
  }
  std::stable_sort(plan.fitting.begin(), plan.fitting.end(), [](const InferenceOption& a, const InferenceOption& b) {
    const InferencePrediction& x = a.prediction;
    const InferencePrediction& y = b.prediction;
    if (x.tokens_per_s != y.tokens_per_s) return x.tokens_per_s > y.tokens_per_s;
    return x.time_to_first_token_s < y.time_to_first_token_s;
  });
  if (plan.fitting.size() > static_cast<std::size_t>(request.top_k)) {
    plan.more_fitting = static_cast<int>(plan.fitting.size()) - request.top_k;
    plan.fitting.resize(static_cast<std::size_t>(request.top_k));
  }
  return plan;
}

}  // namespace pipeflow
