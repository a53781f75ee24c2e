#include "pipeflow/plan/review.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <utility>

#include <fmt/format.h>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/units.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/plan/advise_batch.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/prediction.h"

namespace pipeflow {

const char* to_string(Severity severity) {
  switch (severity) {
    case Severity::kError: return "error";
    case Severity::kWarning: return "warning";
    case Severity::kNote: return "note";
  }
  return "?";
}

bool Review::has_error() const {
  return std::any_of(findings.begin(), findings.end(), [](const Finding& f) { return f.severity == Severity::kError; });
}

ReviewedConfig read_for_review(const std::filesystem::path& path, const RunOverrides& overrides) {
  try {
    return {load_run_config(path, overrides), std::nullopt};
  } catch (const Error& refused) {
    // The reader refuses ZeRO-2/3 with a pipeline: the same file at stage 1
    // reads, and the stage whose refusal is this one (but for the source) is the file's.
    const auto at_stage = [&](int stage) {
      RunOverrides changed = overrides;
      changed.set("zero_optimization.stage", stage);
      return load_run_config(path, changed);
    };
    RunConfig config;
    try {
      config = at_stage(1);
    } catch (const Error&) {
      throw refused;
    }
    for (int stage : {2, 3}) {
      try {
        at_stage(stage);
      } catch (const Error& again) {
        // The same refusal but for the source, which names the command line now.
        const std::string tail = std::string(again.what()).substr(std::string(again.what()).find(": "));
        const std::string whole = refused.what();
        if (whole.size() < tail.size() || whole.compare(whole.size() - tail.size(), tail.size(), tail) != 0) continue;
        Finding f{Severity::kError, "zero-pipeline",
                  fmt::format("{} (the other checks review the run at ZeRO-1)", refused.what()),
                  static_cast<double>(stage), 1,
                  "zero_optimization.stage 1 (--zero 1): optimizer states stay sharded, gradients whole", {}};
        return {std::move(config), std::move(f)};
      }
    }
    throw refused;
  }
}

namespace {

// What every check reads: the run, its prediction, and re-simulation of a change.
struct Context {
  const ResolvedRun& run;
  const ReviewOptions& options;
  Layout layout;
  Prediction base;
  Review& out;

  // The changed layout's prediction, or none where it does not run.
  std::optional<Prediction> predict_changed(const Layout& changed) const {
    try {
      return predict(changed);
    } catch (const Error&) {
      return std::nullopt;
    }
  }
  double gain_of(const Prediction& changed) const { return changed.tokens_per_s / base.tokens_per_s - 1; }
  double capacity() const { return layout.hardware.memory_bytes; }
  bool fits(const Prediction& p) const { return peak_memory(p) <= kMemoryLine * capacity(); }
};

std::string with_gain(const std::string& fix, double gain) {
  return fmt::format("{} ({}{} tokens/s, re-simulated)", fix, gain >= 0 ? "+" : "", format_percent(gain));
}

// The same global batch in m' micro-batches of m instead: b' = b · m / m'
// sequences each (none when m' does not divide b · m).
std::optional<Layout> same_batch_in(const Layout& layout, int m, int m_new) {
  const int sequences = layout.micro_batch * m;  // per replica
  if (m_new < 1 || sequences % m_new != 0) return std::nullopt;
  Layout changed = layout;
  changed.micro_batch = sequences / m_new;
  return changed;
}

// The same global batch in the fewest m' >= `at_least` (and > m) micro-batches.
std::optional<Layout> more_microbatches_same_batch(const Layout& layout, int m, int at_least) {
  for (int target = std::max(at_least, m + 1); target <= layout.micro_batch * m; ++target) {
    if (std::optional<Layout> changed = same_batch_in(layout, m, target)) return changed;
  }
  return std::nullopt;
}

std::string microbatch_keys(const Layout& changed) {
  const int m = changed.global_batch / (changed.micro_batch * changed.data_parallel);
  return fmt::format("train_micro_batch_size_per_gpu {}, gradient_accumulation_steps {} (train_batch_size {})",
                     changed.micro_batch, m, changed.global_batch);
}

// ---- the checks, one function each ----

void check_memory(Context& c) {
  std::size_t worst = 0;
  for (std::size_t r = 0; r < c.base.result.ranks.size(); ++r) {
    if (c.base.result.ranks[r].peak_memory_bytes > c.base.result.ranks[worst].peak_memory_bytes) worst = r;
  }
  const double peak = c.base.result.ranks[worst].peak_memory_bytes;
  const double share = peak / c.capacity();
  if (share <= kMemoryLine) return;
  Finding f{share > 1 ? Severity::kError : Severity::kWarning, "memory",
            fmt::format("rank {}'s peak memory {} is {} of the device's {} (the line: {})", worst, format_bytes(peak),
                        format_percent(share), format_bytes(c.capacity()), format_percent(kMemoryLine)),
            share, kMemoryLine, "", {}};
  // The first change, cheapest first, that brings every rank under the line.
  std::vector<std::pair<std::string, Layout>> changes;
  if (c.layout.recompute == Recompute::kNone) {
    Layout l = c.layout;
    l.recompute = Recompute::kSelective;
    changes.emplace_back("recompute \"selective\" (--recompute selective)", l);
  }
  if (c.layout.recompute != Recompute::kFull) {
    Layout l = c.layout;
    l.recompute = Recompute::kFull;
    changes.emplace_back("recompute \"full\" (--recompute full)", l);
  }
  if (c.layout.zero == ZeroStage::kNone && c.layout.data_parallel > 1) {
    Layout l = c.layout;
    l.zero = ZeroStage::kOne;
    const std::string whose = training_summary(c.layout).trainable_note();
    changes.emplace_back(whose.empty() ? "zero_optimization.stage 1 (--zero 1)"
                                       : "zero_optimization.stage 1 (--zero 1), which shards the optimizer state of " +
                                             whose,
                         l);
  }
  if (c.layout.micro_batch % 2 == 0) {
    Layout l = c.layout;
    l.micro_batch /= 2;
    changes.emplace_back(microbatch_keys(l), l);
  }
  for (const auto& [keys, changed] : changes) {
    const std::optional<Prediction> p = c.predict_changed(changed);
    if (!p || !c.fits(*p)) continue;
    f.fix = with_gain(fmt::format("{}: peak {} ({})", keys, format_bytes(peak_memory(*p)),
                                  format_percent(peak_memory(*p) / c.capacity())),
                      c.gain_of(*p));
    f.gain = c.gain_of(*p);
    break;
  }
  if (f.fix.empty()) {
    f.fix = "none of recompute, ZeRO-1 or a smaller micro-batch brings it under the line: more pipeline stages "
            "(pipeline.stages) or tensor parallelism (tensor_parallel) on more devices";
    const TrainingSummary trains = training_summary(c.layout);
    if (!trains.trainable_note().empty()) f.fix += "; ZeRO-1 shards only the optimizer state of " + trains.trainable_note();
    if (!trains.no_backward_note().empty()) f.fix += "; " + trains.no_backward_note();
  }
  c.out.findings.push_back(std::move(f));
}

// The pipeline's bubble (SimulationResult::pipeline_bubble_ratio: the
// schedule's idle, what (p − 1) / (m + p − 1) gives for 1F1B with equal
// stages and free messages; the all-reduce and the optimizer are not in it).
double pipeline_bubble(const Prediction& p) { return p.result.pipeline_bubble_ratio; }

// The best re-simulated way to a smaller bubble: more micro-batches for the
// same global batch, interleaving, or zero bubble.
void check_bubble(Context& c) {
  const double bubble = pipeline_bubble(c.base);
  if (bubble <= kBubbleLine) return;
  Finding f{Severity::kWarning, "bubble",
            fmt::format("pipeline bubble {} with {} on {} pipeline ranks and {} micro-batches (the line: {})",
                        format_percent(bubble), c.layout.schedule, c.layout.pipeline_ranks, c.base.microbatches,
                        format_percent(kBubbleLine)),
            bubble, kBubbleLine, "", {}};
  std::vector<std::pair<std::string, Layout>> changes;
  const int p = c.layout.pipeline_ranks;
  if (auto l = more_microbatches_same_batch(c.layout, c.base.microbatches, kMicrobatchesPerStage * p)) {
    changes.emplace_back(microbatch_keys(*l), *l);
  }
  if (!c.layout.file_schedule) {
    // Every other schedule of the next steps up (GPipe's bubble is 1F1B's, at more memory).
    const int layers = static_cast<int>(pipeline_layers(c.layout.model, parallel_config(c.layout)).size());
    for (const auto& [name, v] :
         std::vector<std::pair<std::string, int>>{{"1f1b", 1}, {"interleaved-1f1b", 2}, {"zb-h1", 1}}) {
      if (name == c.layout.schedule || p * v > layers) continue;
      Layout l = c.layout;
      l.schedule = name;
      l.chunks = v;
      changes.emplace_back(v > 1 ? fmt::format("pipeline.schedule \"{}\", virtual_stages {}", name, v)
                                 : fmt::format("pipeline.schedule \"{}\"", name),
                           l);
    }
  }
  double best_gain = 0;
  for (const auto& [keys, changed] : changes) {
    const std::optional<Prediction> pr = c.predict_changed(changed);
    if (!pr || peak_memory(*pr) > c.capacity() || c.gain_of(*pr) <= best_gain) continue;
    best_gain = c.gain_of(*pr);
    f.fix = with_gain(fmt::format("{}: bubble {}", keys, format_percent(pipeline_bubble(*pr))), best_gain);
    f.gain = best_gain;
  }
  c.out.findings.push_back(std::move(f));
}

void check_microbatches(Context& c) {
  const int m = c.base.microbatches, p = c.layout.pipeline_ranks;
  if (p < 2 || m >= kMicrobatchesPerStage * p) return;
  // Zero-bubble schedules or few stages may keep the bubble small anyway: then a note.
  const double bubble = pipeline_bubble(c.base);
  Finding f{bubble > kBubbleLine ? Severity::kWarning : Severity::kNote, "microbatches",
            fmt::format("{} micro-batches per step on {} pipeline ranks: fewer than {} x {} = {} (bubble {})", m, p,
                        kMicrobatchesPerStage, p, kMicrobatchesPerStage * p, format_percent(bubble)),
            static_cast<double>(m), static_cast<double>(kMicrobatchesPerStage * p), "", {}};
  std::optional<Layout> changed = more_microbatches_same_batch(c.layout, m, kMicrobatchesPerStage * p);
  std::string why = "the same global batch";
  if (!changed) {
    // More accumulation steps at the same micro-batch: a larger global batch (its learning rate changes too).
    changed = c.layout;
    changed->global_batch = c.layout.micro_batch * kMicrobatchesPerStage * p * c.layout.data_parallel;
    why = "a larger global batch: scale the learning rate with it (pipeflow advise-batch)";
  }
  if (const std::optional<Prediction> pr = c.predict_changed(*changed)) {
    f.fix = with_gain(fmt::format("{}, {}: bubble {}", microbatch_keys(*changed), why,
                                  format_percent(pipeline_bubble(*pr))),
                      c.gain_of(*pr));
    f.gain = c.gain_of(*pr);
  } else {
    f.fix = microbatch_keys(*changed) + ", " + why;
  }
  c.out.findings.push_back(std::move(f));
}

void check_tensor_across_nodes(Context& c) {
  const int t = c.layout.tensor_parallel, node = c.layout.hardware.devices_per_node;
  if (t <= node) return;
  Finding f{Severity::kWarning, "tensor-across-nodes",
            fmt::format("tensor_parallel {} spans {} nodes of {} devices ({}): its all-reduces inside every layer "
                        "cross the inter-node link",
                        t, (t + node - 1) / node, node, c.layout.hardware.name),
            static_cast<double>(t), static_cast<double>(node), "", {}};
  Layout l = c.layout;
  l.tensor_parallel = node;
  l.pipeline_ranks = c.layout.pipeline_ranks * t / node;
  const std::string keys =
      fmt::format("tensor_parallel {}, pipeline.stages {} (the same devices)", node, l.pipeline_ranks);
  if (t % node == 0) {
    if (const std::optional<Prediction> pr = c.predict_changed(l)) {
      f.fix = with_gain(keys, c.gain_of(*pr));
      f.gain = c.gain_of(*pr);
    }
  }
  if (f.fix.empty()) f.fix = fmt::format("tensor_parallel <= {} (devices_per_node)", node);
  c.out.findings.push_back(std::move(f));
}

void check_noise_scale(Context& c) {
  if (!c.options.noise_scale) {
    c.out.skipped.push_back("batch past the noise scale: give --noise-scale (pipeflow train measures it)");
    return;
  }
  const double noise = *c.options.noise_scale, batch = c.layout.global_batch;
  if (batch <= noise) return;
  const BatchEfficiency at = batch_efficiency(batch, noise);
  Finding f{Severity::kWarning, "noise-scale",
            fmt::format("global batch {} is past the gradient noise scale {:.6g} (McCandlish et al. 2018): it needs "
                        "{:.2f}x the minimum samples to reach the same loss",
                        c.layout.global_batch, noise, at.samples_over_minimum),
            batch, noise, "", {}};
  // Smaller micro-batches first (the pipeline keeps its m micro-batches and
  // its bubble), else fewer of them: B = b · m · d.
  const int m = c.base.microbatches, d = c.layout.data_parallel;
  const int micro = static_cast<int>(std::floor(noise / (m * d)));
  const int unit = c.layout.micro_batch * d;
  const int target = static_cast<int>(std::floor(noise / unit)) * unit;
  if (micro >= 1) {
    f.fix = fmt::format("train_micro_batch_size_per_gpu {} (train_batch_size {}, the same {} micro-batches): {:.2f}x "
                        "the minimum samples",
                        micro, micro * m * d, m, batch_efficiency(micro * m * d, noise).samples_over_minimum);
  } else if (target >= unit) {
    f.fix = fmt::format("train_batch_size {} (gradient_accumulation_steps {}): {:.2f}x the minimum samples", target,
                        target / unit, batch_efficiency(target, noise).samples_over_minimum);
  } else {
    f.fix = fmt::format("a smaller train_micro_batch_size_per_gpu or data_parallel: one micro-batch per replica "
                        "is already {} sequences",
                        unit);
  }
  c.out.findings.push_back(std::move(f));
}

// The learning rate the run peaks at, and its key: the warm-up's target for
// WarmupLR and WarmupDecayLR, else the optimizer's (WarmupCosineLR warms up to it).
std::pair<double, std::string> peak_learning_rate(const RunConfig& config) {
  if (config.scheduler.type == "WarmupLR" || config.scheduler.type == "WarmupDecayLR") {
    return {config.scheduler.warmup_max_lr, "scheduler.params.warmup_max_lr"};
  }
  return {config.optimizer.lr, "optimizer.params.lr"};
}

void check_learning_rate(Context& c) {
  const ReviewOptions& o = c.options;
  if (!o.base_batch || !o.base_lr) {
    c.out.skipped.push_back(
        "learning rate scaled with the batch: give --base-batch and --base-lr (a reference run that trains well)");
    return;
  }
  const BatchAdvice advice = advise_batch({.base_batch = *o.base_batch,
                                           .base_lr = *o.base_lr,
                                           .base_warmup_steps = 0,
                                           .target_batch = c.layout.global_batch,
                                           .optimizer = OptimizerFamily::kAdam,
                                           .noise_scale = std::nullopt});
  const auto [lr, key] = peak_learning_rate(c.run.config);
  const double ratio = lr / advice.lr;
  if (ratio <= kLearningRateTolerance && ratio >= 1 / kLearningRateTolerance) return;
  c.out.findings.push_back(
      {Severity::kWarning, "learning-rate",
       fmt::format("{} = {:.4g} at global batch {} is {:.2f}x the {:.4g} that {} gives from --base-lr {:.4g} at "
                   "--base-batch {} (tolerated: {:.3g}x either way)",
                   key, lr, c.layout.global_batch, ratio, advice.lr, advice.rule, *o.base_lr, *o.base_batch,
                   kLearningRateTolerance),
       ratio, kLearningRateTolerance, fmt::format("{} {:.4g}", key, advice.lr), {}});
}

void check_imbalance(Context& c) {
  const double imbalance = modelled_imbalance(c.base);
  if (imbalance <= kImbalanceLine) return;
  Finding f{Severity::kWarning, "imbalance",
            fmt::format("the slowest stage's compute is {:.3f}x the stages' mean (the line: {:.2f})", imbalance,
                        kImbalanceLine),
            imbalance, kImbalanceLine, "", {}};
  if (c.layout.partition.kind != PartitionMethod::Kind::kBalanced) {
    Layout l = c.layout;
    l.partition = PartitionMethod{PartitionMethod::Kind::kBalanced, {}, {}};
    if (const std::optional<Prediction> pr = c.predict_changed(l)) {
      f.fix = with_gain(fmt::format("pipeline.partition_method \"balanced\" (--partition balanced): imbalance {:.3f}",
                                    modelled_imbalance(*pr)),
                        c.gain_of(*pr));
      f.gain = c.gain_of(*pr);
      if (*f.gain <= 0) {
        // Balancing each stage's compute does not shorten this schedule's step (a V placement pairs stages).
        f.severity = Severity::kNote;
        f.fix = with_gain("none: pipeline.partition_method \"balanced\" re-simulates slower", *f.gain);
      }
    }
  } else {
    f.severity = Severity::kNote;
    f.fix = "already balanced: whole layers cannot split the work more evenly over these stages; fewer stages "
            "(pipeline.stages) or virtual_stages";
  }
  c.out.findings.push_back(std::move(f));
}

void check_overlap(Context& c) {
  if (c.layout.comm_mode != CommMode::kBlocking) return;
  Layout l = c.layout;
  l.comm_mode = CommMode::kOverlapped;
  const std::optional<Prediction> pr = c.predict_changed(l);
  if (!pr || c.gain_of(*pr) < kOverlapGainLine) return;
  c.out.findings.push_back(
      {Severity::kWarning, "overlap",
       fmt::format("blocking sends and receives hold the ranks: overlapping them gains {} tokens/s (the line: {})",
                   format_percent(c.gain_of(*pr)), format_percent(kOverlapGainLine)),
       c.gain_of(*pr), kOverlapGainLine,
       with_gain("comm_mode \"overlapped\" (--comm overlapped): a separate communication stream", c.gain_of(*pr)),
       c.gain_of(*pr)});
}

void check_recompute(Context& c) {
  if (c.layout.recompute == Recompute::kNone) return;
  Layout l = c.layout;
  l.recompute = Recompute::kNone;
  l.recompute_interval = 1;
  const std::optional<Prediction> pr = c.predict_changed(l);
  if (!pr || !c.fits(*pr)) return;
  const double share = peak_memory(*pr) / c.capacity();
  const double saved = c.base.result.step_time_s - pr->result.step_time_s;
  c.out.findings.push_back(
      {Severity::kWarning, "recompute",
       fmt::format("recompute {} is not needed: without it the peak is {} ({} of the device, under the {} line), "
                   "and each step saves {}",
                   to_string(c.layout.recompute), format_bytes(peak_memory(*pr)), format_percent(share),
                   format_percent(kMemoryLine), format_seconds(saved)),
       share, kMemoryLine,
       with_gain(c.run.config.pipeline.recompute_interval > 0
                     ? "pipeline.activation_checkpoint_interval 0 and no recompute key"
                     : "recompute \"none\" (--recompute none)",
                 c.gain_of(*pr)),
       c.gain_of(*pr)});
}

// The host time of the block passes (block_launch_overhead_s, paid per
// block pass of every micro-batch): its share of the step is the step less
// the same run re-simulated without it. Fewer, larger micro-batches for the
// same global batch pay it fewer times (at a larger bubble): the best such
// change that fits is the fix.
void check_launch_overhead(Context& c) {
  if (c.layout.block_launch_overhead_s <= 0) return;
  Layout without = c.layout;
  without.block_launch_overhead_s = 0;
  const double step = c.base.result.step_time_s;
  const double share = (step - predict(without).result.step_time_s) / step;
  if (share <= kLaunchOverheadLine) return;
  Finding f{Severity::kWarning, "launch-overhead",
            fmt::format("block_launch_overhead_s = {} (host time each block pass adds) is {} of the step ({} of {}; "
                        "the line: {}), paid in each of {} micro-batches",
                        format_seconds(c.layout.block_launch_overhead_s), format_percent(share),
                        format_seconds(share * step), format_seconds(step), format_percent(kLaunchOverheadLine),
                        c.base.microbatches),
            share, kLaunchOverheadLine, "", {}};
  double best_gain = 0;
  for (int m = c.base.microbatches - 1; m >= 1; --m) {
    const std::optional<Layout> changed = same_batch_in(c.layout, c.base.microbatches, m);
    if (!changed) continue;
    const std::optional<Prediction> pr = c.predict_changed(*changed);
    if (!pr || !c.fits(*pr) || c.gain_of(*pr) <= best_gain) continue;
    best_gain = c.gain_of(*pr);
    f.fix = with_gain(fmt::format("fewer, larger micro-batches: {}", microbatch_keys(*changed)), best_gain);
    f.gain = best_gain;
  }
  if (f.fix.empty()) {
    f.fix = "fewer, larger micro-batches (train_micro_batch_size_per_gpu up, gradient_accumulation_steps down) "
            "where memory allows; none of the same global batch fits and gains here";
  }
  c.out.findings.push_back(std::move(f));
}

using Check = void (*)(Context&);
constexpr std::pair<const char*, Check> kChecks[] = {
    {"memory", check_memory},           {"bubble", check_bubble},
    {"microbatches", check_microbatches}, {"tensor-across-nodes", check_tensor_across_nodes},
    {"noise-scale", check_noise_scale}, {"learning-rate", check_learning_rate},
    {"imbalance", check_imbalance},     {"overlap", check_overlap},
    {"recompute", check_recompute},     {"launch-overhead", check_launch_overhead},
};

}  // namespace

Review review(const ResolvedRun& run, const ReviewOptions& options, const std::optional<Finding>& refusal) {
  if (options.noise_scale && !(*options.noise_scale > 0 && std::isfinite(*options.noise_scale))) {
    fail("--noise-scale {}: must be a positive number of sequences (B_simple, the gradient noise scale); "
         "pipeflow train measures it into metrics.jsonl",
         *options.noise_scale);
  }
  if (options.base_batch.has_value() != options.base_lr.has_value()) {
    fail("{} given alone: the learning-rate check needs both --base-batch and --base-lr (a reference run that "
         "trains well); give the other or neither",
         options.base_batch ? "--base-batch" : "--base-lr");
  }
  Review out;
  if (refusal) out.findings.push_back(*refusal);
  const Layout layout = layout_of(run);
  Context c{run, options, layout, predict(layout), out};
  for (const auto& [name, check] : kChecks) check(c);
  std::stable_sort(out.findings.begin(), out.findings.end(),
                   [](const Finding& a, const Finding& b) { return a.severity < b.severity; });
  return out;
}

std::string finding_line(const Finding& f) {
  return fmt::format("{} {}: {}{}", to_string(f.severity), f.check, f.finding, f.fix.empty() ? "" : "; fix: " + f.fix);
}

std::string review_text(const Review& r) {
  std::string text;
  int counts[3] = {0, 0, 0};
  for (const Finding& f : r.findings) {
    text += finding_line(f) + "\n";
    ++counts[static_cast<int>(f.severity)];
  }
  for (const std::string& s : r.skipped) text += "not checked: " + s + "\n";
  text += fmt::format("review: {}, {}, {}\n", format_count(counts[0], "error"), format_count(counts[1], "warning"),
                      format_count(counts[2], "note"));
  return text;
}

std::string review_json(const Review& r) {
  nlohmann::json findings = nlohmann::json::array();
  int counts[3] = {0, 0, 0};
  for (const Finding& f : r.findings) {
    nlohmann::json j{{"severity", to_string(f.severity)}, {"check", f.check}, {"finding", f.finding},
                     {"value", f.value}, {"limit", f.limit}, {"fix", f.fix}};
    j["gain"] = f.gain ? nlohmann::json(*f.gain) : nlohmann::json(nullptr);
    findings.push_back(std::move(j));
    ++counts[static_cast<int>(f.severity)];
  }
  nlohmann::json out{{"findings", std::move(findings)}, {"skipped", r.skipped}, {"errors", counts[0]},
                     {"warnings", counts[1]}, {"notes", counts[2]}};
  return json_text(out, 2) + "\n";
}

}  // namespace pipeflow
