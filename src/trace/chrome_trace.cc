#include "pipeflow/trace/chrome_trace.h"

#include <cmath>
#include <cstdint>

#include <algorithm>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/units.h"

namespace pipeflow {
namespace {

constexpr double kMicroseconds = 1e6;

nlohmann::json metadata(std::string_view name, int tid, const std::string& value) {
  return {{"name", name}, {"ph", "M"}, {"pid", 0}, {"tid", tid}, {"args", {{"name", value}}}};
}

bool is_event_category(const std::string& text) {
  try {
    parse_event_category(text);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The most ranks a trace may have: the reader keeps a row per rank.
constexpr int kMaxTraceRanks = 1 << 16;

TraceEvent read_event(const nlohmann::json& e, std::size_t index, const std::string& source) {
  try {
    TraceEvent event;
    const nlohmann::json& tid = e.at("tid");
    if (!tid.is_number_integer() || tid.get<std::int64_t>() < 0 || tid.get<std::int64_t>() >= kMaxTraceRanks) {
      fail("tid {} is not a rank: a rank is a whole number in [0, {}]", short_dump(tid), kMaxTraceRanks - 1);
    }
    event.rank = RankId(tid.get<int>());
    event.name = e.at("name").get<std::string>();
    const double ts = e.at("ts").get<double>();
    const double dur = e.value("dur", 0.0);
    if (!std::isfinite(ts)) fail("ts {} is not a time: give microseconds", short_dump(e.at("ts")));
    if (!(dur >= 0) || !std::isfinite(dur)) {
      fail("dur {} is not a duration: give microseconds >= 0", short_dump(e.at("dur")));
    }
    event.start_s = ts / kMicroseconds;
    event.duration_s = dur / kMicroseconds;
    if (e.contains("args") && e["args"].contains("action")) {
      event.action = parse_action(e["args"]["action"].get<std::string>());
    } else {
      event.action = action_named(event.name);
    }
    // An action named by another program keeps its own category names: the action's kind gives ours.
    // An action without a category of pipeflow's (none, or another program's) takes its kind's.
    const std::string category = e.value("cat", std::string());
    event.category = event.action && !is_event_category(category) ? category_of(event.action->kind)
                                                                   : parse_event_category(category.empty() ? "other"
                                                                                                           : category);
    return event;
  } catch (const nlohmann::json::exception& error) {
    fail("{}: traceEvents[{}]: {}", source, index, error.what());
  } catch (const Error& error) {
    fail("{}: traceEvents[{}]: {}", source, index, error.what());
  }
}

}  // namespace

void check_chrome_trace_events(std::size_t events, std::string_view fix) {
  if (events > kMaxChromeTraceEvents) {
    fail("a Chrome trace of {} events (about {} of JSON, {} of memory to write) is more than the limit of {}: {}",
         events, format_bytes(140.0 * static_cast<double>(events)), format_bytes(1500.0 * static_cast<double>(events)),
         kMaxChromeTraceEvents, fix);
  }
}

std::string write_chrome_trace(const Timeline& timeline) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back(metadata("process_name", 0, timeline.title));
  for (int r = 0; r < timeline.num_ranks; ++r) events.push_back(metadata("thread_name", r, "rank " + std::to_string(r)));
  for (const TraceEvent& e : timeline.events) {
    nlohmann::json event = {{"name", e.name},
                            {"cat", to_string(e.category)},
                            {"ph", "X"},
                            {"pid", 0},
                            {"tid", e.rank.value()},
                            {"ts", e.start_s * kMicroseconds},
                            {"dur", e.duration_s * kMicroseconds}};
    if (e.action) event["args"] = {{"action", to_string(*e.action)}};
    events.push_back(std::move(event));
  }
  nlohmann::json other = {{"title", timeline.title}, {"num_ranks", timeline.num_ranks}, {"time_unit", timeline.time_unit}};
  if (timeline.run_metadata) other["pipeflow"] = *timeline.run_metadata;
  const nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", other}};
  return json_text(trace) + "\n";
}

Timeline read_chrome_trace(std::string_view text, const std::string& source) {
  return chrome_trace_timeline(parse_json(text, source), source);
}

Timeline chrome_trace_timeline(const nlohmann::json& trace, const std::string& source) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    fail("{}: a Chrome trace is an object with a \"traceEvents\" list", source);
  }
  // A rank is a row of a timeline: past this many the file is not a pipeline's trace.
  Timeline timeline;
  try {
    const nlohmann::json other = trace.value("otherData", nlohmann::json::object());
    timeline.title = other.value("title", std::string());
    timeline.time_unit = other.value("time_unit", std::string("s"));
    int ranks = other.value("num_ranks", 0);
    if (other.contains("pipeflow") && !other["pipeflow"].is_null()) {
      timeline.run_metadata = std::make_shared<const nlohmann::json>(other["pipeflow"]);
    }
    const nlohmann::json& events = trace["traceEvents"];
    for (std::size_t i = 0; i < events.size(); ++i) {
      if (!events[i].is_object()) fail("{}: traceEvents[{}] is not an object", source, i);
      if (events[i].value("ph", std::string()) != "X") continue;
      timeline.events.push_back(read_event(events[i], i, source));
      ranks = std::max(ranks, timeline.events.back().rank.value() + 1);
    }
    if (ranks < 0 || ranks > kMaxTraceRanks) {
      fail("{}: {} ranks: a timeline has 0 to {} (the largest tid + 1, or otherData.num_ranks)", source, ranks,
           kMaxTraceRanks);
    }
    timeline.num_ranks = ranks;
  } catch (const nlohmann::json::exception& error) {  // a value of the wrong type
    fail("{}: {}", source, error.what());
  }
  return timeline;
}

}  // namespace pipeflow
