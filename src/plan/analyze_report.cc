// The three forms of an Analysis: terminal text, JSON, and one HTML page.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <optional>

#include "pipeflow/core/json.h"
#include "pipeflow/core/table.h"
#include "pipeflow/core/units.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/trace/svg.h"

namespace pipeflow {
namespace {

// Seconds as the timeline shows them: "12.3 ms", or plain numbers for the
// unit-cost dry run.
std::string duration(const Analysis& a, double seconds) {
  return a.time_unit == "s" ? format_seconds(seconds) : fmt::format("{:.3g} {}", seconds, a.time_unit);
}

std::string gain_text(const Advice& advice) {
  return fmt::format("{:+.1f}%", 100 * advice.gain);
}

// The rows of the per-rank table, shared by the text and the HTML.
std::vector<std::string> rank_header() {
  return {"rank", "busy", "comm", "wait", "flush", "idle", "fill", "stall", "drain", "peak memory"};
}
std::vector<std::string> rank_row(const Analysis& a, std::size_t r) {
  const RankUsage& u = a.ranks[r];
  if (r < a.rank_seen.size() && !a.rank_seen[r]) {
    std::vector<std::string> unseen(rank_header().size(), "-");
    unseen.front() = std::to_string(r);
    if (r < a.peak_memory_bytes.size()) unseen.back() = format_bytes(a.peak_memory_bytes[r]);
    return unseen;
  }
  // A log's totals do not split idle by phase, nor waits from transfers.
  const auto phase = [&](double seconds) { return a.idle_by_phase ? duration(a, seconds) : std::string("-"); };
  // The peak the input measured, else the re-simulation's.
  std::string peak = "-";
  if (r < a.reading.peak_memory_bytes.size() && a.reading.peak_memory_bytes[r]) {
    peak = format_bytes(*a.reading.peak_memory_bytes[r]);
  } else if (r < a.peak_memory_bytes.size()) {
    peak = format_bytes(a.peak_memory_bytes[r]);
  }
  return {std::to_string(r),      duration(a, u.busy_s),  duration(a, u.comm_s),  phase(u.wait_s),
          duration(a, u.flush_s), duration(a, u.idle_s),  phase(u.fill_s),        phase(u.stall_s),
          phase(u.drain_s),         peak};
}

std::vector<std::string> advice_header() { return {"#", "gain", "change", "step", "tokens/s", "bubble", "peak memory"}; }
std::vector<std::string> advice_row(std::size_t i, const Advice& advice) {
  return {std::to_string(i + 1),
          gain_text(advice),
          advice.change,
          format_seconds(advice.step_time_s),
          fmt::format("{:.0f}", advice.tokens_per_s),
          format_percent(advice.bubble_ratio),
          format_bytes(advice.peak_memory_bytes)};
}

// Whether the input measured every rank's peak memory.
bool memory_measured(const Analysis& a) {
  const auto& peaks = a.reading.peak_memory_bytes;
  return !peaks.empty() && std::all_of(peaks.begin(), peaks.end(), [](const auto& p) { return p.has_value(); });
}

// How another program's trace was read: its format, the step and the others'.
std::vector<std::string> reading_lines(const Analysis& a) {
  const TraceReading& r = a.reading;
  std::vector<std::string> lines;
  if (r.format.empty() || r.format == "pipeflow") return lines;
  std::string step;
  if (r.step) {
    std::vector<double> spans = r.step_spans_s;
    std::sort(spans.begin(), spans.end());
    step = fmt::format("; step {} of the {} every rank has ({}..{}), their spans min {} / median {} / max {}", *r.step,
                       r.steps.size(), r.steps.front(), r.steps.back(), format_seconds(spans.front()),
                       format_seconds(spans[spans.size() / 2]), format_seconds(spans.back()));
  }
  lines.push_back(fmt::format("read as {}: {} file{}{}", r.format, r.files.size(), r.files.size() == 1 ? "" : "s",
                              step));
  std::vector<double> peaks;
  for (const std::optional<double>& peak : r.peak_memory_bytes) {
    if (peak) peaks.push_back(*peak);
  }
  if (!peaks.empty() && peaks.size() == r.peak_memory_bytes.size()) {
    std::vector<std::string> shown;
    for (double peak : peaks) shown.push_back(format_bytes(peak));
    lines.push_back(fmt::format("peak memory per rank (measured): {}; skew {:.2f} (largest over smallest)",
                                fmt::join(shown, ", "), a.memory_skew));
  }
  if (!r.step && !r.step_spans_s.empty()) {  // a log's printed intervals
    std::vector<double> spans = r.step_spans_s;
    std::sort(spans.begin(), spans.end());
    lines.push_back(fmt::format("its {} printed intervals' step: min {} / median {} / max {}", spans.size(),
                                format_seconds(spans.front()), format_seconds(spans[spans.size() / 2]),
                                format_seconds(spans.back())));
  }
  return lines;
}

std::vector<std::string> summary_lines(const Analysis& a) {
  std::vector<std::string> lines = reading_lines(a);
  lines.push_back(fmt::format("step {} on {} rank{}; bubble {}{}{}", duration(a, a.step_s), a.num_ranks,
                              a.num_ranks == 1 ? "" : "s",
                              format_percent(a.bubble),
                              a.bubble_source.empty() ? std::string() : " (" + a.bubble_source + ")",
                              a.theoretical_bubble
                                  ? fmt::format(" (the schedule's own: {})", format_percent(*a.theoretical_bubble))
                                  : std::string()));
  if (a.idle_by_phase) {
    lines.push_back(fmt::format("idle: fill and drain {}, steady-state stalls {}; communication and waits {}",
                                format_percent(a.fill_drain_share), format_percent(a.stall_share),
                                format_percent(a.comm_wait_share)));
  } else {
    lines.push_back(fmt::format("communication and waits {}", format_percent(a.comm_wait_share)));
  }
  if (a.tensor_parallel_share > 0) {
    lines.push_back(fmt::format("tensor-parallel collectives inside the actions {} of the step (communication the "
                                "actions' time includes)",
                                format_percent(a.tensor_parallel_share)));
  }
  if (!a.stage_compute_s.empty()) {
    lines.push_back(fmt::format("stage imbalance {:.2f} (slowest stage's compute over the mean)", a.imbalance));
  }
  if (!a.peak_memory_bytes.empty() && !memory_measured(a)) {
    lines.push_back(fmt::format("peak memory per rank (re-simulated): skew {:.2f} (largest over smallest)",
                                a.memory_skew));
  }
  const CriticalPath& c = a.critical_path;
  if (!c.actions.empty()) {
    lines.push_back(fmt::format("critical path: {} actions over {}, {} of it compute ({} .. {})", c.actions.size(),
                                duration(a, c.length_s), duration(a, c.compute_s), c.actions.front(),
                                c.actions.back()));
  }
  if (a.baseline) {
    lines.push_back(fmt::format("re-simulated as run: step {}, {:.0f} tokens/s, bubble {}",
                                format_seconds(a.baseline->result.step_time_s), a.baseline->tokens_per_s,
                                format_percent(a.baseline->result.bubble_ratio)));
  }
  return lines;
}

}  // namespace

std::string analysis_text(const Analysis& a) {
  std::string out = fmt::format("{}{}\n", a.source, a.title.empty() ? std::string() : fmt::format(": {}", a.title));
  for (const std::string& line : summary_lines(a)) out += line + "\n";
  TextTable ranks(rank_header());
  for (std::size_t r = 0; r < a.ranks.size(); ++r) ranks.add_row(rank_row(a, r));
  out += fmt::format("\n{}", ranks.render());
  if (!a.stage_compute_s.empty()) {
    TextTable stages({"stage", "compute", "of the mean", "on the critical path"});
    const double mean = a.imbalance > 0 ? *std::max_element(a.stage_compute_s.begin(), a.stage_compute_s.end()) /
                                              a.imbalance
                                        : 0;
    for (std::size_t s = 0; s < a.stage_compute_s.size(); ++s) {
      stages.add_row({std::to_string(s), duration(a, a.stage_compute_s[s]),
                      fmt::format("{:.2f}", mean > 0 ? a.stage_compute_s[s] / mean : 0),
                      s < a.critical_path.compute_by_stage_s.size()
                          ? duration(a, a.critical_path.compute_by_stage_s[s])
                          : std::string("-")});
    }
    out += fmt::format("\n{}", stages.render());
  }
  if (!a.advice.empty()) {
    out += "\nadvice, by predicted gain in tokens/s (each change re-simulated alone):\n";
    for (std::size_t i = 0; i < a.advice.size(); ++i) {
      const Advice& advice = a.advice[i];
      out += fmt::format("{}. {} {}: {}\n   because {}\n", i + 1, gain_text(advice), advice.kind, advice.change,
                         advice.finding);
      for (const std::string& detail : advice.details) out += fmt::format("   {}\n", detail);
      out += fmt::format("   predicted: step {}, {:.0f} tokens/s, bubble {}, peak memory {}\n",
                         format_seconds(advice.step_time_s), advice.tokens_per_s, format_percent(advice.bubble_ratio),
                         format_bytes(advice.peak_memory_bytes));
    }
  }
  for (const std::string& note : a.reading.notes) out += fmt::format("read: {}\n", note);
  for (const std::string& note : a.notes) out += fmt::format("note: {}\n", note);
  return out;
}

std::string analysis_json(const Analysis& a) {
  nlohmann::ordered_json json;
  json["source"] = a.source;
  json["title"] = a.title;
  json["time_unit"] = a.time_unit;
  json["ranks_count"] = a.num_ranks;
  json["step_s"] = a.step_s;
  json["bubble"] = a.bubble;
  json["bubble_source"] = a.bubble_source.empty() ? "1 - busy / (ranks x step)" : a.bubble_source;
  json["theoretical_bubble"] = a.theoretical_bubble ? nlohmann::ordered_json(*a.theoretical_bubble) : nullptr;
  json["idle_by_phase"] = a.idle_by_phase;
  json["fill_drain_share"] = a.fill_drain_share;
  json["stall_share"] = a.stall_share;
  json["comm_wait_share"] = a.comm_wait_share;
  json["tensor_parallel_share"] = a.tensor_parallel_share;
  json["imbalance"] = a.imbalance;
  json["memory_skew"] = a.memory_skew;
  json["ranks"] = nlohmann::ordered_json::array();
  for (std::size_t r = 0; r < a.ranks.size(); ++r) {
    const RankUsage& u = a.ranks[r];
    nlohmann::ordered_json rank = {{"rank", r},          {"busy_s", u.busy_s},   {"comm_s", u.comm_s},
                                   {"wait_s", u.wait_s}, {"flush_s", u.flush_s}, {"idle_s", u.idle_s},
                                   {"fill_s", u.fill_s}, {"stall_s", u.stall_s}, {"drain_s", u.drain_s},
                                   {"tensor_parallel_s", u.tensor_parallel_s}};
    if (r < a.peak_memory_bytes.size()) rank["peak_memory_bytes"] = a.peak_memory_bytes[r];
    if (r < a.rank_seen.size()) rank["seen"] = static_cast<bool>(a.rank_seen[r]);
    json["ranks"].push_back(rank);
  }
  json["stage_compute_s"] = a.stage_compute_s;
  json["critical_path"] = {{"length_s", a.critical_path.length_s},
                           {"compute_s", a.critical_path.compute_s},
                           {"compute_by_stage_s", a.critical_path.compute_by_stage_s},
                           {"actions", a.critical_path.actions}};
  if (a.baseline) {
    json["resimulated"] = {{"step_time_s", a.baseline->result.step_time_s},
                           {"tokens_per_s", a.baseline->tokens_per_s},
                           {"bubble_ratio", a.baseline->result.bubble_ratio}};
  }
  json["advice"] = nlohmann::ordered_json::array();
  for (const Advice& advice : a.advice) {
    json["advice"].push_back({{"kind", advice.kind},
                              {"gain", advice.gain},
                              {"change", advice.change},
                              {"finding", advice.finding},
                              {"details", advice.details},
                              {"step_time_s", advice.step_time_s},
                              {"tokens_per_s", advice.tokens_per_s},
                              {"bubble_ratio", advice.bubble_ratio},
                              {"peak_memory_bytes", advice.peak_memory_bytes}});
  }
  json["notes"] = a.notes;
  const TraceReading& r = a.reading;
  nlohmann::ordered_json reading = {{"format", r.format}, {"files", r.files}};
  if (r.step) {
    reading["step"] = *r.step;
    reading["steps"] = r.steps;
    reading["step_spans_s"] = r.step_spans_s;
  }
  if (!r.clock_offset_s.empty()) {
    reading["clock_offset_s"] = r.clock_offset_s;
    // JSON has no infinity: an unbounded side is null.
    const auto bound = [](double x) { return std::isfinite(x) ? nlohmann::ordered_json(x) : nullptr; };
    reading["clock_window_s"] = nlohmann::ordered_json::array();
    for (const auto& [lower, upper] : r.clock_window_s) reading["clock_window_s"].push_back({bound(lower), bound(upper)});
  }
  if (!r.peak_memory_bytes.empty()) {
    reading["peak_memory_bytes"] = nlohmann::ordered_json::array();
    for (const std::optional<double>& peak : r.peak_memory_bytes) {
      reading["peak_memory_bytes"].push_back(peak ? nlohmann::ordered_json(*peak) : nullptr);
    }
  }
  reading["notes"] = r.notes;
  json["reading"] = std::move(reading);
  return json_text(json, 2) + "\n";
}

namespace {

std::string html_table(const std::string& id, const std::vector<std::string>& header,
                       const std::vector<std::vector<std::string>>& rows) {
  std::string out = fmt::format("<table id=\"{}\">\n<tr>", id);
  for (const std::string& h : header) out += fmt::format("<th>{}</th>", xml_escape(h));
  out += "</tr>\n";
  for (const auto& row : rows) {
    out += "<tr>";
    for (const std::string& cell : row) out += fmt::format("<td>{}</td>", xml_escape(cell));
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

// The SVG without its XML declaration, to sit inside the page.
std::string inline_svg(const Timeline& timeline) {
  std::string svg = render_svg(timeline);
  const std::size_t start = svg.find("<svg");
  return start == std::string::npos ? svg : svg.substr(start);
}

}  // namespace

std::string analysis_html(const Analysis& a, const Timeline& timeline) {
  std::string body;
  body += fmt::format("<h1>pipeflow analyze: {}</h1>\n<p class=\"source\">{}</p>\n", xml_escape(a.title),
                      xml_escape(a.source));
  body += "<ul id=\"summary\">\n";
  for (const std::string& line : summary_lines(a)) body += fmt::format("<li>{}</li>\n", xml_escape(line));
  body += timeline.events.empty()
              ? std::string("</ul>\n<h2>Timeline</h2>\n<p id=\"timeline\">none: a log's timers are totals</p>\n")
              : fmt::format("</ul>\n<h2>Timeline</h2>\n<div id=\"timeline\">{}</div>\n", inline_svg(timeline));
  body += "<h2>Advice</h2>\n";
  if (a.advice.empty()) {
    body += "<p>No advice.</p>\n";
  } else {
    std::vector<std::vector<std::string>> rows;
    for (std::size_t i = 0; i < a.advice.size(); ++i) rows.push_back(advice_row(i, a.advice[i]));
    body += html_table("advice", advice_header(), rows);
    body += "<ol id=\"advice-details\">\n";
    for (const Advice& advice : a.advice) {
      body += fmt::format("<li><b>{}</b>: {} (because {})", xml_escape(advice.kind), xml_escape(advice.change),
                          xml_escape(advice.finding));
      for (const std::string& detail : advice.details) body += fmt::format("<br>{}", xml_escape(detail));
      body += "</li>\n";
    }
    body += "</ol>\n";
  }
  body += "<h2>Ranks</h2>\n";
  std::vector<std::vector<std::string>> rank_rows;
  for (std::size_t r = 0; r < a.ranks.size(); ++r) rank_rows.push_back(rank_row(a, r));
  body += html_table("ranks", rank_header(), rank_rows);
  for (const std::string& note : a.reading.notes) {
    body += fmt::format("<p class=\"note\">read: {}</p>\n", xml_escape(note));
  }
  for (const std::string& note : a.notes) body += fmt::format("<p class=\"note\">{}</p>\n", xml_escape(note));
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>pipeflow analyze</title>\n"
      "<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}"
      "td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}"
      "#timeline{{overflow-x:auto}}</style>\n</head>\n<body>\n{}</body>\n</html>\n",
      body);
}

namespace {

// One compared figure: its name, each run's value, and how it is shown.
struct Compared {
  std::string name;
  std::optional<double> before, after;
  enum class Kind { kSeconds, kShare, kRatio, kBytes, kRate } kind;
};

std::string shown(const Compared& c, const std::optional<double>& value) {
  if (!value) return "-";
  switch (c.kind) {
    case Compared::Kind::kSeconds: return format_seconds(*value);
    case Compared::Kind::kShare: return format_percent(*value);
    case Compared::Kind::kRatio: return fmt::format("{:.2f}", *value);
    case Compared::Kind::kBytes: return format_bytes(*value);
    case Compared::Kind::kRate: return fmt::format("{:.0f}", *value);
  }
  return "-";
}

// B against A: a share's change in points, anything else's as a ratio.
std::string change(const Compared& c) {
  if (!c.before || !c.after) return "-";
  if (c.kind == Compared::Kind::kShare) return fmt::format("{:+.1f} points", 100 * (*c.after - *c.before));
  if (*c.before == 0) return "-";
  return fmt::format("{:+.1f}%", 100 * (*c.after / *c.before - 1));
}

std::optional<double> peak_of(const Analysis& a, std::size_t r) {
  if (r < a.reading.peak_memory_bytes.size() && a.reading.peak_memory_bytes[r]) return a.reading.peak_memory_bytes[r];
  if (r < a.peak_memory_bytes.size()) return a.peak_memory_bytes[r];
  return std::nullopt;
}

std::vector<Compared> compared(const Analysis& a, const Analysis& b) {
  using Kind = Compared::Kind;
  const auto phase = [](const Analysis& x, double value) {
    return x.idle_by_phase ? std::optional<double>(value) : std::nullopt;
  };
  std::vector<Compared> rows = {
      {"step", a.step_s, b.step_s, Kind::kSeconds},
      {"bubble", a.bubble, b.bubble, Kind::kShare},
      {"fill and drain", phase(a, a.fill_drain_share), phase(b, b.fill_drain_share), Kind::kShare},
      {"steady-state stalls", phase(a, a.stall_share), phase(b, b.stall_share), Kind::kShare},
      {"communication and waits", a.comm_wait_share, b.comm_wait_share, Kind::kShare},
  };
  const auto imbalance = [](const Analysis& x) {
    return x.stage_compute_s.empty() ? std::nullopt : std::optional<double>(x.imbalance);
  };
  rows.push_back({"stage imbalance", imbalance(a), imbalance(b), Kind::kRatio});
  const auto skew = [](const Analysis& x) {
    return memory_measured(x) || !x.peak_memory_bytes.empty() ? std::optional<double>(x.memory_skew) : std::nullopt;
  };
  rows.push_back({"memory skew", skew(a), skew(b), Kind::kRatio});
  const auto rate = [](const Analysis& x) {
    return x.baseline ? std::optional<double>(x.baseline->tokens_per_s) : std::nullopt;
  };
  rows.push_back({"tokens/s (re-simulated)", rate(a), rate(b), Kind::kRate});
  const std::size_t stages = std::max(a.stage_compute_s.size(), b.stage_compute_s.size());
  for (std::size_t s = 0; s < stages; ++s) {
    const auto compute = [s](const Analysis& x) {
      return s < x.stage_compute_s.size() ? std::optional<double>(x.stage_compute_s[s]) : std::nullopt;
    };
    rows.push_back({fmt::format("stage {} compute", s), compute(a), compute(b), Kind::kSeconds});
  }
  const std::size_t ranks = std::max(a.ranks.size(), b.ranks.size());
  for (std::size_t r = 0; r < ranks; ++r) {
    rows.push_back({fmt::format("rank {} peak memory", r), peak_of(a, r), peak_of(b, r), Kind::kBytes});
  }
  return rows;
}

}  // namespace

std::string comparison_text(const Analysis& before, const Analysis& after) {
  std::string out = fmt::format("A: {}{}\nB: {}{}\n\n", before.source,
                                before.title.empty() ? std::string() : " (" + before.title + ")", after.source,
                                after.title.empty() ? std::string() : " (" + after.title + ")");
  TextTable table({"figure", "A", "B", "B against A"});
  for (const Compared& c : compared(before, after)) table.add_row({c.name, shown(c, c.before), shown(c, c.after), change(c)});
  out += table.render();
  if (before.num_ranks != after.num_ranks) {
    out += fmt::format("note: A has {} ranks, B {}: per-rank rows compare rank by rank\n", before.num_ranks,
                       after.num_ranks);
  }
  for (const auto& [name, a] : {std::pair{"A", &before}, std::pair{"B", &after}}) {
    const auto seen = std::count(a->rank_seen.begin(), a->rank_seen.end(), true);
    if (seen < a->num_ranks) {
      out += fmt::format("note: {}'s input shows {} of its {} ranks: its bubble and shares are over those\n", name,
                         seen, a->num_ranks);
    }
    if (!a->idle_by_phase) out += fmt::format("note: {} is a log's totals: no fill, drain or stalls\n", name);
  }
  return out;
}

std::string comparison_json(const Analysis& before, const Analysis& after) {
  nlohmann::ordered_json json = {{"a", before.source}, {"b", after.source}, {"figures", nlohmann::ordered_json::array()}};
  const auto value = [](const std::optional<double>& x) { return x ? nlohmann::ordered_json(*x) : nullptr; };
  for (const Compared& c : compared(before, after)) {
    json["figures"].push_back({{"figure", c.name}, {"a", value(c.before)}, {"b", value(c.after)}});
  }
  return json_text(json, 2) + "\n";
}

}  // namespace pipeflow
