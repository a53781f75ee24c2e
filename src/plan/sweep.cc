#include "pipeflow/plan/sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <nlohmann/json.hpp>
#include <utility>

#include "pipeflow/config/run_keys.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/table.h"
#include "pipeflow/core/units.h"
#include "pipeflow/plan/advise_batch.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/prediction.h"
#include "pipeflow/trace/svg.h"

namespace pipeflow {
namespace {

// The key a --vary name sets: a key sweep may vary, by its flag without
// "--" (stages, pp, micro-batch, ...); nullptr for anything else.
const RunKey* option_key(const std::string& name) {
  const RunKey* key = find_run_flag("--" + name);
  return key != nullptr && key->vary ? key : nullptr;
}

// microbatches is derived: the micro-batch for m micro-batches per step at the same global batch.
bool is_option(const std::string& name) { return name == "microbatches" || option_key(name) != nullptr; }


int positive(const std::string& key, const std::string& value) {
  int n = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (error != std::errc() || end != value.data() + value.size() || n < 1) {
    fail("--vary {}: must be a positive integer", quoted_excerpt(key + "=" + value));
  }
  return n;
}

// Writes one option's value over the overrides (microbatches excepted: apply_microbatches).
void apply(const std::string& name, const std::string& value, RunOverrides& o) {
  if (name == "microbatches") return;
  const RunKey& key = *option_key(name);
  const std::string origin = "--vary " + name;
  if (key.path == "pipeline.schedule") {
    // NAME:V sets the virtual stages with the schedule (interleaved-1f1b:2 beside 1f1b).
    const std::size_t colon = value.find(':');
    o.set("pipeline.schedule", value.substr(0, colon));
    if (colon != std::string::npos) o.set("pipeline.virtual_stages", positive(name, value.substr(colon + 1)));
    return;
  }
  o.set_text(key, value, origin);
}

// m micro-batches per step with the global batch as it is: b = B / (m · d).
void apply_microbatches(const ConfigSource& config, const std::string& value, RunOverrides& o) {
  const int m = positive("microbatches", value);
  const RunConfig run = config(o);
  const int replicas = run.data_parallel;
  const int global = resolve_batch_sizes(run.batch_keys, replicas, run.source).global;
  if (global % (m * replicas) != 0) {
    fail("--vary microbatches={}: the global batch {} is not a whole number of {} micro-batches on each of {} "
         "replicas",
         m, global, m, replicas);
  }
  o.set("train_batch_size", global);
  o.set("train_micro_batch_size_per_gpu", global / (m * replicas));
}

constexpr std::array<std::string_view, 3> kBatchKeys = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                                        "gradient_accumulation_steps"};

// The key paths of the configuration: every leaf of its file form (which
// writes every key with its value, the batch keys as given), and the batch
// keys it leaves out.
std::vector<std::string> key_paths(const RunConfig& run) {
  std::vector<std::string> paths;
  const auto walk = [&](const auto& self, const nlohmann::json& node, const std::string& prefix) -> void {
    for (const auto& [key, value] : node.items()) {
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      if (value.is_object()) {
        self(self, value, path);
      } else {
        paths.push_back(path);
      }
    }
  };
  walk(walk, nlohmann::json::parse(run_config_to_json(run)), "");
  for (std::string_view key : kBatchKeys) {
    if (std::find(paths.begin(), paths.end(), key) == paths.end()) paths.emplace_back(key);
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

using KeyValues = std::vector<std::pair<std::string, std::string>>;

// The configuration with the key paths' values written over its file form
// and read again; a value is JSON (a number, true) if it parses as JSON,
// else a string.
RunConfig with_key_paths(const RunConfig& run, const KeyValues& keys) {
  if (keys.empty()) return run;
  nlohmann::json json = nlohmann::json::parse(run_config_to_json(run));
  for (const auto& [path, text] : keys) {
    nlohmann::json* at = &json;
    std::size_t begin = 0;
    for (std::size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', begin)) {
      at = &(*at)[path.substr(begin, dot - begin)];
      begin = dot + 1;
    }
    nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
    (*at)[path.substr(begin)] = value.is_discarded() ? nlohmann::json(text) : std::move(value);
  }
  return parse_run_config(Config::from_json(std::move(json), run.source));
}

// The learning rate at the top of the run's schedule: the warm-up's target
// of WarmupLR and WarmupDecayLR, the optimizer's otherwise (WarmupCosineLR
// warms up to it, no scheduler holds it).
double& peak_lr(RunConfig& run) {
  const std::string& type = run.scheduler.type;
  return type == "WarmupLR" || type == "WarmupDecayLR" ? run.scheduler.warmup_max_lr : run.optimizer.lr;
}

double scaled_lr(LrRule rule, double lr, int base_batch, int batch) {
  if (rule == LrRule::kNone || lr == 0) return lr;
  return advise_batch({.base_batch = base_batch,
                       .base_lr = lr,
                       .base_warmup_steps = 0,
                       .target_batch = batch,
                       .optimizer = rule == LrRule::kSqrt ? OptimizerFamily::kAdam : OptimizerFamily::kSgd,
                       .noise_scale = std::nullopt})
      .lr;
}

// "global-batch=8,schedule=1f1b", '/' replaced by '_' (a directory's name).
std::string point_name(const std::vector<SweepAxis>& axes, const std::vector<std::string>& setting) {
  std::string name;
  for (std::size_t i = 0; i < axes.size(); ++i) name += fmt::format("{}{}={}", i == 0 ? "" : ",", axes[i].key, setting[i]);
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

struct SweepContext {
  const ConfigSource& config;
  const SweepRequest& request;
  int base_batch = 1;  // the global batch without the sweep's values, for the learning-rate rule
  std::optional<Resimulator> resimulator;  // the request's measured run
};

// The point's configuration (see run_sweep).
RunConfig point_config(const SweepContext& c, const std::vector<std::string>& setting) {
  const std::vector<SweepAxis>& axes = c.request.axes;
  RunOverrides o = c.request.base;
  KeyValues keys;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (is_option(axes[i].key)) {
      apply(axes[i].key, setting[i], o);
    } else {
      keys.emplace_back(axes[i].key, setting[i]);
    }
  }
  const ConfigSource configure = [&](const RunOverrides& overrides) { return with_key_paths(c.config(overrides), keys); };
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (axes[i].key == "microbatches") apply_microbatches(configure, setting[i], o);
  }
  RunConfig run = configure(o);
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (axes[i].key != "global-batch") continue;
    double& lr = peak_lr(run);
    lr = scaled_lr(c.request.lr_rule, lr, c.base_batch, positive(axes[i].key, setting[i]));
  }
  return run;
}

SweepPoint run_point(const SweepContext& c, std::vector<std::string> setting) {
  SweepPoint point;
  point.setting = std::move(setting);
  try {
    RunConfig run = point_config(c, point.setting);
    point.lr = peak_lr(run);
    const ResolvedRun resolved = resolve(run);
    point.global_batch = resolved.batch.global;
    const Prediction p = c.resimulator ? c.resimulator->predict(layout_of(resolved)) : predict(layout_of(resolved));
    point.step_time_s = p.result.step_time_s;
    point.bubble_ratio = p.result.bubble_ratio;
    for (const RankResult& r : p.result.ranks) {
      point.peak_memory_bytes = std::max(point.peak_memory_bytes, r.peak_memory_bytes);
      point.peak_activation_bytes = std::max(point.peak_activation_bytes, r.activation_bytes);
    }
    point.tokens_per_s = p.tokens_per_s;
    if (c.request.noise_scale) {
      const BatchEfficiency e = batch_efficiency(point.global_batch, *c.request.noise_scale);
      point.samples_over_minimum = e.samples_over_minimum;
      point.steps_over_minimum = e.steps_over_minimum;
    }
    if (c.request.train) point.measured = c.request.train(resolved, point_name(c.request.axes, point.setting));
  } catch (const Error& error) {
    point.error = error.what();
  }
  return point;
}

struct Metric {
  std::string_view name;   // the JSON key
  std::string_view label;  // the plot's title
  double SweepPoint::*predicted;
  double MeasuredPoint::*measured;  // nullptr: not measured
  std::string_view series = "predicted";  // what the solid line is (data-series)
};
constexpr std::array<Metric, 4> kSimulatedMetrics = {
    {{"step_time_s", "step time (s)", &SweepPoint::step_time_s, nullptr, "predicted"},
     {"bubble_ratio", "bubble", &SweepPoint::bubble_ratio, nullptr, "predicted"},
     {"peak_memory_bytes", "peak memory (bytes)", &SweepPoint::peak_memory_bytes, nullptr, "predicted"},
     {"tokens_per_s", "tokens/s", &SweepPoint::tokens_per_s, nullptr, "predicted"}}};
// The runtime measures activations (pipeflow train's peak activations), not
// the model states beside them: trained sweeps compare those.
constexpr std::array<Metric, 4> kTrainedMetrics = {
    {{"step_time_s", "step time (s)", &SweepPoint::step_time_s, &MeasuredPoint::step_time_s, "predicted"},
     {"bubble_ratio", "bubble", &SweepPoint::bubble_ratio, &MeasuredPoint::bubble_ratio, "predicted"},
     {"peak_activation_bytes", "peak activations (bytes)", &SweepPoint::peak_activation_bytes,
      &MeasuredPoint::peak_activation_bytes, "predicted"},
     {"tokens_per_s", "tokens/s", &SweepPoint::tokens_per_s, &MeasuredPoint::tokens_per_s, "predicted"}}};
// With a noise scale: McCandlish et al. 2018's factors (batch_efficiency), a formula of the global batch.
constexpr std::array<Metric, 2> kNoiseScaleMetrics = {
    {{"samples_over_minimum", "samples / minimum", &SweepPoint::samples_over_minimum, nullptr, "formula"},
     {"steps_over_minimum", "steps / minimum", &SweepPoint::steps_over_minimum, nullptr, "formula"}}};
constexpr std::string_view kPastNoiseScale = "black";  // no line's colour

const std::array<Metric, 4>& metrics_of(const Sweep& sweep) { return sweep.trained ? kTrainedMetrics : kSimulatedMetrics; }

bool shows_lr(const Sweep& sweep) {
  return sweep.trained ||
         std::any_of(sweep.axes.begin(), sweep.axes.end(), [](const SweepAxis& a) { return a.key == "global-batch"; });
}

std::string format_metric(std::string_view name, double value) {
  if (name == "step_time_s") return format_seconds(value);
  if (name == "bubble_ratio") return format_percent(value);
  if (name == "tokens_per_s") return fmt::format("{:.0f}", value);
  return format_bytes(value);
}

std::string setting_text(const SweepPoint& p) { return fmt::format("{}", fmt::join(p.setting, ",")); }

constexpr std::array<std::string_view, 6> kColours = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
constexpr double kPanelW = 300, kPanelH = 230, kLeft = 60, kTop = 40, kPlotW = 220, kPlotH = 150;

// One plot's frame: title, axes, the top of the y axis, the x axis's name.
// y_of maps [0, top] onto the plot.
struct Panel {
  double x0 = 0;
  double top = 1;
  double y_of(double v) const { return kTop + kPlotH * (1 - v / (top * 1.1)); }
};

Panel open_panel(std::string& out, std::size_t index, std::string_view name, std::string_view label, double top,
                 std::string_view x_label) {
  const Panel panel{10 + kPanelW * static_cast<double>(index) + kLeft, top > 0 ? top : 1};
  const double x0 = panel.x0;
  out += fmt::format("<g class=\"plot\" data-metric=\"{}\">\n", name);
  out += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"13\">{}</text>\n", x0, xml_escape(label));
  out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", x0, kTop, kTop + kPlotH);
  out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", x0, kTop + kPlotH,
                     x0 + kPlotW);
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.3g}</text>\n", x0 - 4, panel.y_of(panel.top) + 4,
                     panel.top);
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n", x0 - 4, kTop + kPlotH + 4);
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x0 + kPlotW / 2, kTop + kPlotH + 32,
                     xml_escape(x_label));
  return panel;
}

// A line through (x, y) points, each a circle carrying its number.
struct Series {
  std::string path;
  std::string circles;
  void add(double x, double y, double value, std::string_view colour, bool hollow, std::string_view attributes) {
    path += fmt::format("{}{:.2f},{:.2f}", path.empty() ? "M" : " L", x, y);
    circles += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3\" fill=\"{}\" stroke=\"{}\" {} data-value=\"{}\"/>\n",
                           x, y, hollow ? "white" : colour, colour, attributes, value);
  }
  std::string render(std::string_view colour, bool dashed) const {
    if (path.empty()) return "";
    return fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\"{}/>\n", path, colour,
                       dashed ? " stroke-dasharray=\"5,3\"" : "") +
           circles;
  }
};

// The metric against the first axis, one line (two when trained) per value of the second.
void metric_panel(std::string& out, const Sweep& sweep, std::size_t index, const Metric& metric) {
  const SweepAxis& x_axis = sweep.axes[0];
  const std::size_t lines = sweep.axes.size() == 2 ? sweep.axes[1].values.size() : 1;
  const bool factor = metric.series == "formula";  // where the noise scale lies: 2 on both factors
  double top = factor ? 2 : 0;
  for (const SweepPoint& p : sweep.points) {
    if (!p.error.empty()) continue;
    top = std::max(top, p.*metric.predicted);
    if (metric.measured != nullptr && p.measured) top = std::max(top, *p.measured.*metric.measured);
  }
  const Panel panel = open_panel(out, index, metric.name, metric.label, top, x_axis.key);
  if (factor) {
    out += fmt::format("<line x1=\"{0}\" y1=\"{1:.2f}\" x2=\"{2}\" y2=\"{1:.2f}\" stroke=\"grey\" "
                       "stroke-dasharray=\"4,3\"/>\n<text x=\"{2}\" y=\"{3:.2f}\" text-anchor=\"end\" "
                       "fill=\"grey\">2: B = B_noise</text>\n",
                       panel.x0, panel.y_of(2), panel.x0 + kPlotW, panel.y_of(2) - 4);
  }
  auto x_of = [&](std::size_t i) {
    return panel.x0 + (x_axis.values.size() == 1 ? kPlotW / 2
                                                 : kPlotW * static_cast<double>(i) /
                                                       static_cast<double>(x_axis.values.size() - 1));
  };
  for (std::size_t i = 0; i < x_axis.values.size(); ++i) {
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x_of(i), kTop + kPlotH + 16,
                       xml_escape(x_axis.values[i]));
  }
  std::string rings;
  for (std::size_t line = 0; line < lines; ++line) {
    const std::string_view colour = kColours[line % kColours.size()];
    Series predicted, measured;
    for (std::size_t i = 0; i < x_axis.values.size(); ++i) {
      const SweepPoint& p = sweep.points[i * lines + line];
      if (!p.error.empty()) continue;
      const std::string setting = fmt::format("data-setting=\"{}\"", xml_escape(setting_text(p)));
      const bool past = sweep.noise_scale && p.global_batch > *sweep.noise_scale;
      predicted.add(x_of(i), panel.y_of(p.*metric.predicted), p.*metric.predicted, colour, false,
                    fmt::format("{} data-series=\"{}\"{}", setting, metric.series,
                                past ? " data-past-noise-scale=\"true\"" : ""));
      if (past) {
        rings += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"6\" fill=\"none\" stroke=\"{}\"/>\n", x_of(i),
                             panel.y_of(p.*metric.predicted), kPastNoiseScale);
      }
      if (metric.measured == nullptr || !p.measured) continue;
      const double value = *p.measured.*metric.measured;
      measured.add(x_of(i), panel.y_of(value), value, colour, true, setting + " data-series=\"measured\"");
    }
    out += predicted.render(colour, false) + measured.render(colour, true);
  }
  out += rings + "</g>\n";
}

// Trained: each point's loss against the tokens it has seen, one line per point.
void loss_panel(std::string& out, const Sweep& sweep, std::size_t index) {
  double top = 0, right = 0;
  for (const SweepPoint& p : sweep.points) {
    if (!p.measured) continue;
    for (double loss : p.measured->loss) top = std::max(top, loss);
    for (double tokens : p.measured->tokens_seen) right = std::max(right, tokens);
  }
  const Panel panel = open_panel(out, index, "loss", "loss", top, "tokens seen");
  if (right <= 0) right = 1;
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.3g}</text>\n", panel.x0 + kPlotW,
                     kTop + kPlotH + 16, right);
  for (std::size_t k = 0; k < sweep.points.size(); ++k) {
    const SweepPoint& p = sweep.points[k];
    if (!p.measured) continue;
    const std::string_view colour = kColours[k % kColours.size()];
    Series series;
    for (std::size_t s = 0; s < p.measured->loss.size(); ++s) {
      const double tokens = p.measured->tokens_seen[s];
      series.add(panel.x0 + kPlotW * tokens / right, panel.y_of(p.measured->loss[s]), p.measured->loss[s], colour,
                 false,
                 fmt::format("data-setting=\"{}\" data-series=\"measured\" data-tokens=\"{}\"",
                             xml_escape(setting_text(p)), tokens));
    }
    out += series.render(colour, false);
  }
  out += "</g>\n";
}

// Colour keys under the plots: a line per value of the second axis, and
// (trained) per point for the loss plot; then, with a noise scale, what the
// black rings mean.
double legend(std::string& out, const Sweep& sweep, double y) {
  const auto key = [&](double x, double at, std::string_view colour, const std::string& text) {
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                       x, at, colour, x + 18, at + 10, xml_escape(text));
  };
  double bottom = y;
  if (sweep.axes.size() == 2) {
    for (std::size_t line = 0; line < sweep.axes[1].values.size(); ++line) {
      key(kLeft, y + 18 * static_cast<double>(line), kColours[line % kColours.size()],
          fmt::format("{} = {}", sweep.axes[1].key, sweep.axes[1].values[line]));
    }
    bottom = y + 18 * static_cast<double>(sweep.axes[1].values.size());
  }
  if (sweep.trained) {
    out += fmt::format("<text x=\"{}\" y=\"{}\">solid, filled: predicted (pipeflow simulate); dashed, hollow: "
                       "measured (pipeflow train)</text>\n",
                       kLeft + kPanelW, y + 10);
    const double x = 10 + kPanelW * static_cast<double>(kTrainedMetrics.size()) + kLeft;
    for (std::size_t k = 0; k < sweep.points.size(); ++k) {
      key(x, y + 18 * static_cast<double>(k), kColours[k % kColours.size()],
          point_name(sweep.axes, sweep.points[k].setting));
    }
    bottom = std::max(bottom, y + 18 * static_cast<double>(sweep.points.size()));
  }
  if (sweep.noise_scale) {
    const double at = std::max(bottom, sweep.trained ? y + 18 : y);
    out += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"6\" fill=\"none\" stroke=\"{}\"/><text x=\"{}\" y=\"{}\">"
                       "past the noise scale B_simple = {:.3g} sequences (samples / minimum over 2): more samples "
                       "than twice the minimum to the same loss (McCandlish et al. 2018)</text>\n",
                       kLeft + 6, at + 6, kPastNoiseScale, kLeft + 18, at + 10, *sweep.noise_scale);
    bottom = at + 18;
  }
  return bottom;
}

}  // namespace

std::string sweep_option_names() {
  std::string names = "microbatches";
  for (const RunKey& key : run_keys()) {
    if (key.vary) names += fmt::format(", {}", key.flag.substr(2));
  }
  return names;
}

SweepAxis parse_sweep_axis(std::string_view text) {
  const std::size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    fail("--vary {}: give KEY=V1,V2,... with KEY one of {} or a key path of the run configuration "
         "(pipeline.stages, optimizer.params.lr, ...)",
         quoted_excerpt(text), sweep_option_names());
  }
  SweepAxis axis;
  axis.key = std::string(text.substr(0, eq));
  // Values end at commas outside a JSON object's or list's brackets and
  // strings (an inline model: model=gpt-tiny,{"n_layer": 2, ...}).
  const std::string_view values = text.substr(eq + 1);
  int depth = 0;
  bool in_string = false;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= values.size(); ++i) {
    if (i < values.size()) {  // the end closes the last value, whatever is open
      const char c = values[i];
      if (in_string) {
        if (c == '\\' && i + 1 < values.size()) ++i;  // an escaped character, '"' included
        if (c == '"') in_string = false;
        continue;
      }
      if (c == '"') in_string = true;
      if (c == '{' || c == '[') ++depth;
      if (c == '}' || c == ']') --depth;
      if (c != ',' || depth > 0) continue;
    }
    const std::string_view value = values.substr(start, i - start);
    if (value.empty()) fail("--vary {}: an empty value; separate values by single commas", quoted_excerpt(text));
    axis.values.emplace_back(value);
    start = i + 1;
  }
  return axis;
}

LrRule parse_lr_rule(std::string_view text) {
  if (text == "sqrt") return LrRule::kSqrt;
  if (text == "linear") return LrRule::kLinear;
  if (text == "none") return LrRule::kNone;
  fail("--lr-rule {}: use sqrt (Adam, AdamW: advise-batch's rule), linear (SGD's) or none (the configured rate at "
       "every global batch)",
       quoted_excerpt(text));
}

std::string_view to_string(LrRule rule) {
  switch (rule) {
    case LrRule::kSqrt: return "sqrt";
    case LrRule::kLinear: return "linear";
    case LrRule::kNone: return "none";
  }
  return "";
}

Sweep run_sweep(const ConfigSource& config, const SweepRequest& request) {
  const std::vector<SweepAxis>& axes = request.axes;
  if (axes.empty() || axes.size() > 2) fail("--vary given {} times: a sweep varies one or two settings", axes.size());
  if (axes.size() == 2 && axes[0].key == axes[1].key) fail("--vary {} given twice: vary two different settings", axes[0].key);
  for (const SweepAxis& axis : axes) {
    // The folders are sweep's: every point trains into its own under --out-dir (a varied
    // out_dir of "../.." wrote outside it).
    const RunKey* option = option_key(axis.key);
    const RunKey* key = option != nullptr ? option : find_run_key(axis.key);
    if (key != nullptr && (key->path == "out_dir" || key->path.starts_with("checkpoint."))) {
      fail("--vary {}: sweep gives every point its own folder under --out-dir and starts it afresh; vary a setting "
           "of the run instead",
           axis.key);
    }
  }
  SweepContext context{config, request, 1, std::nullopt};
  if (request.measured) context.resimulator.emplace(*request.measured);
  const bool key_path = std::any_of(axes.begin(), axes.end(), [](const SweepAxis& a) { return !is_option(a.key); });
  const bool global_batch =
      std::any_of(axes.begin(), axes.end(), [](const SweepAxis& a) { return a.key == "global-batch"; });
  if (key_path || global_batch) {
    const RunConfig base = config(request.base);
    const std::vector<std::string> paths = key_paths(base);
    for (const SweepAxis& axis : axes) {
      if (is_option(axis.key) || std::binary_search(paths.begin(), paths.end(), axis.key)) continue;
      fail("--vary {}: neither an option ({}) nor a key path of {} ({})", quoted_excerpt(axis.key),
           sweep_option_names(), base.source, fmt::join(paths, ", "));
    }
    context.base_batch = resolve_batch_sizes(base.batch_keys, base.data_parallel, base.source).global;
  }
  if (request.noise_scale && !(*request.noise_scale > 0)) {
    fail("--noise-scale {}: must be a positive number of sequences (B_simple)", *request.noise_scale);
  }
  Sweep sweep{axes, request.lr_rule, static_cast<bool>(request.train), request.noise_scale, {}};
  for (const std::string& first : axes[0].values) {
    if (axes.size() == 1) {
      sweep.points.push_back(run_point(context, {first}));
      continue;
    }
    for (const std::string& second : axes[1].values) sweep.points.push_back(run_point(context, {first, second}));
  }
  return sweep;
}

std::string sweep_text(const Sweep& sweep) {
  const bool lr = shows_lr(sweep);
  std::vector<std::string> header;
  for (const SweepAxis& axis : sweep.axes) header.push_back(axis.key);
  if (lr) header.emplace_back("lr");
  if (sweep.noise_scale) {
    header.emplace_back("samples / min");
    header.emplace_back("steps / min");
  }
  if (sweep.trained) {
    for (const char* h : {"step time pred / meas", "bubble pred / meas", "activations pred / meas",
                          "tokens/s pred / meas", "peak memory", "loss", "val loss"}) {
      header.emplace_back(h);
    }
  } else {
    for (const char* h : {"step time", "bubble", "peak memory", "tokens/s"}) header.emplace_back(h);
  }
  TextTable table(header);
  std::string errors;
  for (const SweepPoint& p : sweep.points) {
    std::vector<std::string> row = p.setting;
    if (lr) row.push_back(fmt::format("{:.4g}", p.lr));
    if (sweep.noise_scale && p.error.empty()) {
      row.push_back(fmt::format("{:.2f}{}", p.samples_over_minimum, p.global_batch > *sweep.noise_scale ? " *" : ""));
      row.push_back(fmt::format("{:.2f}", p.steps_over_minimum));
    }
    if (!p.error.empty()) {
      row.insert(row.end(), header.size() - row.size(), "-");
      errors += fmt::format("{}: {}\n", fmt::join(p.setting, ", "), p.error);
    } else if (p.measured) {
      for (const Metric& m : kTrainedMetrics) {
        row.push_back(format_metric(m.name, p.*m.predicted) + " / " + format_metric(m.name, *p.measured.*m.measured));
      }
      row.push_back(format_bytes(p.peak_memory_bytes));
      row.push_back(fmt::format("{:.4f}", p.measured->loss.back()));
      row.push_back(p.measured->val_loss ? fmt::format("{:.4f}", *p.measured->val_loss) : "-");
    } else {
      for (const Metric& m : kSimulatedMetrics) row.push_back(format_metric(m.name, p.*m.predicted));
    }
    table.add_row(std::move(row));
  }
  std::string note;
  if (sweep.noise_scale) {
    note = fmt::format(
        "samples / min, steps / min: to the same loss, over their minimum at the gradient noise scale B_simple = "
        "{:.3g} sequences (McCandlish et al. 2018); * past it: more than twice the minimum samples\n",
        *sweep.noise_scale);
  }
  return table.render() + note + errors;
}

std::string sweep_json(const Sweep& sweep) {
  nlohmann::ordered_json json;
  json["axes"] = nlohmann::ordered_json::array();
  for (const SweepAxis& axis : sweep.axes) json["axes"].push_back({{"key", axis.key}, {"values", axis.values}});
  json["lr_rule"] = to_string(sweep.lr_rule);
  json["trained"] = sweep.trained;
  if (sweep.noise_scale) json["noise_scale"] = *sweep.noise_scale;
  json["points"] = nlohmann::ordered_json::array();
  for (const SweepPoint& p : sweep.points) {
    nlohmann::ordered_json point;
    for (std::size_t i = 0; i < sweep.axes.size(); ++i) point[sweep.axes[i].key] = p.setting[i];
    if (!p.error.empty()) {
      point["error"] = p.error;
      json["points"].push_back(point);
      continue;
    }
    point["lr"] = p.lr;
    point["global_batch"] = p.global_batch;
    if (sweep.noise_scale) {
      point["samples_over_minimum"] = p.samples_over_minimum;
      point["steps_over_minimum"] = p.steps_over_minimum;
    }
    point["step_time_s"] = p.step_time_s;
    point["bubble_ratio"] = p.bubble_ratio;
    point["peak_memory_bytes"] = p.peak_memory_bytes;
    point["peak_activation_bytes"] = p.peak_activation_bytes;
    point["tokens_per_s"] = p.tokens_per_s;
    if (p.measured) {
      const MeasuredPoint& m = *p.measured;
      point["measured"] = {{"step_time_s", m.step_time_s},     {"bubble_ratio", m.bubble_ratio},
                           {"peak_activation_bytes", m.peak_activation_bytes},
                           {"tokens_per_s", m.tokens_per_s},   {"tokens_seen", m.tokens_seen},
                           {"loss", m.loss},                   {"out_dir", m.out_dir}};
      if (m.val_loss) point["measured"]["val_loss"] = *m.val_loss;
    }
    json["points"].push_back(point);
  }
  return json_text(json, 2) + "\n";
}

std::string sweep_svg(const Sweep& sweep) {
  const std::array<Metric, 4>& metrics = metrics_of(sweep);
  std::size_t panels = metrics.size() + (sweep.trained ? 1 : 0);
  std::string body;
  for (std::size_t k = 0; k < metrics.size(); ++k) metric_panel(body, sweep, k, metrics[k]);
  if (sweep.trained) loss_panel(body, sweep, metrics.size());
  if (sweep.noise_scale) {
    for (const Metric& metric : kNoiseScaleMetrics) metric_panel(body, sweep, panels++, metric);
  }
  const double bottom = legend(body, sweep, kPanelH + 20);
  const double width = kPanelW * static_cast<double>(panels) + 20;
  const double height = bottom + 10;
  return fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
                     "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" "
                     "fill=\"white\"/>\n",
                     width, height, width, height) +
         body + "</svg>\n";
}

}  // namespace pipeflow
