#include "pipeflow/plan/sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <nlohmann/json.hpp>

#include "pipeflow/core/error.h"
#include "pipeflow/core/table.h"
#include "pipeflow/core/units.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/prediction.h"
#include "pipeflow/trace/svg.h"

namespace pipeflow {
namespace {

constexpr std::array<std::string_view, 12> kKeys = {
    "microbatches", "micro-batch", "global-batch",    "stages",        "schedule",   "virtual",
    "recompute",    "partition",   "comm",            "tensor-parallel", "data-parallel", "seq-length"};

int positive(const std::string& key, const std::string& value) {
  int n = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (error != std::errc() || end != value.data() + value.size() || n < 1) {
    fail("--vary {}={}: must be a positive integer", key, value);
  }
  return n;
}

// Writes one value over the overrides (microbatches excepted: apply_microbatches).
void apply(const std::string& key, const std::string& value, RunOverrides& o) {
  if (key == "micro-batch") o.micro_batch = positive(key, value);
  if (key == "global-batch") o.global_batch = positive(key, value);
  if (key == "stages") o.stages = positive(key, value);
  if (key == "virtual") o.virtual_stages = positive(key, value);
  if (key == "tensor-parallel") o.tensor_parallel = positive(key, value);
  if (key == "data-parallel") o.data_parallel = positive(key, value);
  if (key == "seq-length") o.seq_length = positive(key, value);
  if (key == "schedule") {
    // NAME:V sets the virtual stages with the schedule (interleaved-1f1b:2 beside 1f1b).
    const std::size_t colon = value.find(':');
    o.schedule = value.substr(0, colon);
    if (colon != std::string::npos) o.virtual_stages = positive(key, value.substr(colon + 1));
  }
  if (key == "recompute") o.recompute = value;
  if (key == "partition") o.partition = value;
  if (key == "comm") o.comm_mode = value;
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
  o.global_batch = global;
  o.micro_batch = global / (m * replicas);
}

SweepPoint simulate_point(const ConfigSource& config, const RunOverrides& base, const std::vector<SweepAxis>& axes,
                          std::vector<std::string> setting) {
  SweepPoint point;
  point.setting = std::move(setting);
  try {
    RunOverrides o = base;
    for (std::size_t i = 0; i < axes.size(); ++i) apply(axes[i].key, point.setting[i], o);
    for (std::size_t i = 0; i < axes.size(); ++i) {
      if (axes[i].key == "microbatches") apply_microbatches(config, point.setting[i], o);
    }
    const Prediction p = predict(layout_of(resolve(config(o))));
    point.step_time_s = p.result.step_time_s;
    point.bubble_ratio = p.result.bubble_ratio;
    for (const RankResult& r : p.result.ranks) point.peak_memory_bytes = std::max(point.peak_memory_bytes, r.peak_memory_bytes);
    point.tokens_per_s = p.tokens_per_s;
  } catch (const Error& error) {
    point.error = error.what();
  }
  return point;
}

struct Metric {
  std::string_view name;   // the JSON key
  std::string_view label;  // the plot's title
  double SweepPoint::*value;
};
constexpr std::array<Metric, 4> kMetrics = {{{"step_time_s", "step time (s)", &SweepPoint::step_time_s},
                                             {"bubble_ratio", "bubble", &SweepPoint::bubble_ratio},
                                             {"peak_memory_bytes", "peak memory (bytes)", &SweepPoint::peak_memory_bytes},
                                             {"tokens_per_s", "tokens/s", &SweepPoint::tokens_per_s}}};

}  // namespace

SweepAxis parse_sweep_axis(std::string_view text) {
  const std::size_t eq = text.find('=');
  SweepAxis axis;
  if (eq != std::string_view::npos) axis.key = std::string(text.substr(0, eq));
  if (eq == std::string_view::npos || std::find(kKeys.begin(), kKeys.end(), axis.key) == kKeys.end()) {
    fail("--vary {}: give KEY=V1,V2,... with KEY one of {}", text, fmt::join(kKeys, ", "));
  }
  std::string_view rest = text.substr(eq + 1);
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view value = rest.substr(0, comma);
    if (value.empty()) fail("--vary {}: an empty value; separate values by single commas", text);
    axis.values.emplace_back(value);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return axis;
}

Sweep run_sweep(const ConfigSource& config, const RunOverrides& base, const std::vector<SweepAxis>& axes) {
  if (axes.empty() || axes.size() > 2) fail("--vary given {} times: a sweep varies one or two settings", axes.size());
  if (axes.size() == 2 && axes[0].key == axes[1].key) fail("--vary {} given twice: vary two different settings", axes[0].key);
  Sweep sweep{axes, {}};
  for (const std::string& first : axes[0].values) {
    if (axes.size() == 1) {
      sweep.points.push_back(simulate_point(config, base, axes, {first}));
      continue;
    }
    for (const std::string& second : axes[1].values) {
      sweep.points.push_back(simulate_point(config, base, axes, {first, second}));
    }
  }
  return sweep;
}

std::string sweep_text(const Sweep& sweep) {
  std::vector<std::string> header;
  for (const SweepAxis& axis : sweep.axes) header.push_back(axis.key);
  for (const char* h : {"step time", "bubble", "peak memory", "tokens/s"}) header.push_back(h);
  TextTable table(header);
  std::string errors;
  for (const SweepPoint& p : sweep.points) {
    std::vector<std::string> row = p.setting;
    if (p.error.empty()) {
      for (std::string cell : {format_seconds(p.step_time_s), format_percent(p.bubble_ratio),
                               format_bytes(p.peak_memory_bytes), fmt::format("{:.0f}", p.tokens_per_s)}) {
        row.push_back(std::move(cell));
      }
    } else {
      row.insert(row.end(), 4, "-");
      errors += fmt::format("{}: {}\n", fmt::join(p.setting, ", "), p.error);
    }
    table.add_row(std::move(row));
  }
  return table.render() + errors;
}

std::string sweep_json(const Sweep& sweep) {
  nlohmann::ordered_json json;
  json["axes"] = nlohmann::ordered_json::array();
  for (const SweepAxis& axis : sweep.axes) json["axes"].push_back({{"key", axis.key}, {"values", axis.values}});
  json["points"] = nlohmann::ordered_json::array();
  for (const SweepPoint& p : sweep.points) {
    nlohmann::ordered_json point;
    for (std::size_t i = 0; i < sweep.axes.size(); ++i) point[sweep.axes[i].key] = p.setting[i];
    if (!p.error.empty()) {
      point["error"] = p.error;
    } else {
      for (const Metric& m : kMetrics) point[std::string(m.name)] = p.*m.value;
    }
    json["points"].push_back(point);
  }
  return json.dump(2) + "\n";
}

std::string sweep_svg(const Sweep& sweep) {
  constexpr double kPanelW = 300, kPanelH = 230, kLeft = 60, kTop = 40, kPlotW = 220, kPlotH = 150;
  constexpr std::array<std::string_view, 6> kColours = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                                        "#8c564b"};
  const SweepAxis& x_axis = sweep.axes[0];
  const std::size_t lines = sweep.axes.size() == 2 ? sweep.axes[1].values.size() : 1;
  const double width = kPanelW * kMetrics.size() + 20;
  const double height = kPanelH + 20 + 18 * static_cast<double>(lines);
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, width, height);
  for (std::size_t k = 0; k < kMetrics.size(); ++k) {
    const Metric& metric = kMetrics[k];
    double top = 0;
    for (const SweepPoint& p : sweep.points) {
      if (p.error.empty()) top = std::max(top, p.*metric.value);
    }
    if (top <= 0) top = 1;
    const double x0 = 10 + kPanelW * static_cast<double>(k) + kLeft;
    auto x_of = [&](std::size_t i) {
      return x0 + (x_axis.values.size() == 1 ? kPlotW / 2
                                             : kPlotW * static_cast<double>(i) / static_cast<double>(x_axis.values.size() - 1));
    };
    auto y_of = [&](double v) { return kTop + kPlotH * (1 - v / (top * 1.1)); };
    out += fmt::format("<g class=\"plot\" data-metric=\"{}\">\n", metric.name);
    out += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"13\">{}</text>\n", x0, xml_escape(metric.label));
    out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", x0, kTop, kTop + kPlotH);
    out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", x0, kTop + kPlotH,
                       x0 + kPlotW);
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.3g}</text>\n", x0 - 4, y_of(top) + 4, top);
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n", x0 - 4, kTop + kPlotH + 4);
    for (std::size_t i = 0; i < x_axis.values.size(); ++i) {
      out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x_of(i), kTop + kPlotH + 16,
                         xml_escape(x_axis.values[i]));
    }
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x0 + kPlotW / 2,
                       kTop + kPlotH + 32, xml_escape(x_axis.key));
    for (std::size_t line = 0; line < lines; ++line) {
      const std::string_view colour = kColours[line % kColours.size()];
      std::string path;
      for (std::size_t i = 0; i < x_axis.values.size(); ++i) {
        const SweepPoint& p = sweep.points[i * lines + line];
        if (!p.error.empty()) continue;
        path += fmt::format("{}{:.2f},{:.2f}", path.empty() ? "M" : " L", x_of(i), y_of(p.*metric.value));
        out += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3\" fill=\"{}\" data-setting=\"{}\" "
                           "data-value=\"{}\"/>\n",
                           x_of(i), y_of(p.*metric.value), colour, xml_escape(fmt::format("{}", fmt::join(p.setting, ","))),
                           p.*metric.value);
      }
      if (!path.empty()) out += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\"/>\n", path, colour);
    }
    out += "</g>\n";
  }
  if (sweep.axes.size() == 2) {
    for (std::size_t line = 0; line < lines; ++line) {
      const double y = kPanelH + 20 + 18 * static_cast<double>(line);
      out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{} = "
                         "{}</text>\n",
                         kLeft, y, kColours[line % kColours.size()], kLeft + 18, y + 10, xml_escape(sweep.axes[1].key),
                         xml_escape(sweep.axes[1].values[line]));
    }
  }
  return out + "</svg>\n";
}

}  // namespace pipeflow
