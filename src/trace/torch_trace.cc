#include "pipeflow/trace/torch_trace.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

constexpr double kMicroseconds = 1e6;
// Below a clock's resolution: spans this close touch, they do not overlap.
constexpr double kTouch = 1e-9;
// A pipeline rank: the timeline keeps a row per rank.
constexpr int kMaxRank = 1 << 16;

bool starts_with_case(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) != std::tolower(static_cast<unsigned char>(prefix[i]))) {
      return false;
    }
  }
  return true;
}

bool contains_case(std::string_view text, std::string_view part) {
  for (std::size_t i = 0; i + part.size() <= text.size(); ++i) {
    if (starts_with_case(text.substr(i), part)) return true;
  }
  return false;
}

// A time in microseconds: a number, or a number in a string (Ascend).
double microseconds(const nlohmann::json& value, std::string_view key) {
  double us = 0;
  if (value.is_number()) {
    us = value.get<double>();
  } else if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), us);
    if (error != std::errc() || end != text.data() + text.size()) {
      fail("{} {} is not a number of microseconds", key, short_dump(value));
    }
  } else {
    fail("{} {} is not a number of microseconds", key, short_dump(value));
  }
  // Beyond 10^17 us (3000 years) a time is no clock's: sums of such times would overflow.
  if (!std::isfinite(us) || std::abs(us) > 1e17) fail("{} {} is not a time in microseconds", key, short_dump(value));
  return us;
}

std::optional<int> whole_number_after(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  const std::string_view digits = name.substr(prefix.size());
  int value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error != std::errc() || end != digits.data() + digits.size() || digits.empty() || value < 0) return std::nullopt;
  return value;
}

// A communication op of the host: c10d's ops ("c10d::send", "c10d::recv_",
// "c10d::allreduce_") and the backends' spans inside them ("gloo:recv",
// "nccl:send").
std::optional<EventCategory> host_comm_category(const std::string& name) {
  for (std::string_view prefix : {"c10d::", "gloo:", "nccl:"}) {
    if (!name.starts_with(prefix)) continue;
    const std::string_view op = std::string_view(name).substr(prefix.size());
    if (op.starts_with("send") || op.starts_with("isend")) return EventCategory::kSend;
    if (op.starts_with("recv") || op.starts_with("irecv")) return EventCategory::kRecv;
    return EventCategory::kAllreduce;
  }
  return std::nullopt;
}

// A collective kernel's category: NCCL's by its "Collective name", HCCL's by its name.
std::optional<EventCategory> collective_category(const std::string& name, const nlohmann::json& e) {
  if (std::optional<EventCategory> host = host_comm_category(name)) return host;
  if (starts_with_case(name, "hcom_")) {
    if (starts_with_case(name, "hcom_send")) return EventCategory::kSend;
    if (starts_with_case(name, "hcom_receive") || starts_with_case(name, "hcom_recv")) return EventCategory::kRecv;
    return EventCategory::kAllreduce;
  }
  if (!starts_with_case(name, "nccl")) return std::nullopt;
  const nlohmann::json* args = e.contains("args") && e["args"].is_object() ? &e["args"] : nullptr;
  std::string collective;
  if (args != nullptr && args->contains("Collective name") && (*args)["Collective name"].is_string()) {
    collective = (*args)["Collective name"].get<std::string>();
  }
  // A kernel without the argument: the name says as much as it can (ncclDevKernel_SendRecv is either).
  if (collective.empty()) collective = name;
  if (contains_case(collective, "recv") && !contains_case(collective, "send")) return EventCategory::kRecv;
  if (contains_case(collective, "send") && !contains_case(collective, "recv")) return EventCategory::kSend;
  if (contains_case(collective, "sendrecv")) return EventCategory::kRecv;
  return EventCategory::kAllreduce;
}

// The pipeline group of distributedInfo.pg_config: torchtitan's "mesh_pp",
// Megatron's PIPELINE_MODEL_PARALLEL_GROUP, any description ending "_pp".
std::vector<int> pipeline_group(const nlohmann::json& info, int global_rank) {
  if (!info.contains("pg_config")) return {};
  const nlohmann::json& config = info["pg_config"];
  std::vector<const nlohmann::json*> groups;
  if (config.is_array()) {
    for (const nlohmann::json& g : config) groups.push_back(&g);
  } else if (config.is_object()) {
    for (const auto& [name, g] : config.items()) groups.push_back(&g);
  }
  for (const nlohmann::json* g : groups) {
    if (!g->is_object() || !g->contains("ranks") || !(*g)["ranks"].is_array()) continue;
    const std::string desc = g->value("pg_desc", std::string()) + " " + g->value("pg_name", std::string());
    const bool pipeline = contains_case(desc, "mesh_pp") || contains_case(desc, "pipeline") ||
                          desc.find("_pp ") != std::string::npos || desc.ends_with("_pp");
    if (!pipeline) continue;
    std::vector<int> ranks;
    for (const nlohmann::json& r : (*g)["ranks"]) {
      if (!r.is_number_integer()) return {};
      ranks.push_back(r.get<int>());
    }
    if (std::find(ranks.begin(), ranks.end(), global_rank) != ranks.end()) return ranks;
  }
  return {};
}

struct Label {
  std::optional<Action> action;
  std::optional<EventCategory> category;  // a non-action label's (REDUCE_GRAD...)
  bool unread = false;                    // "PP:" and nothing pipeflow knows
};

Label read_label(const std::string& name, int stage) {
  if (name.starts_with("PP:")) {
    const std::string_view rest = std::string_view(name).substr(3);
    if (std::optional<Action> action = action_named(rest)) return {action, {}, false};
    for (std::string_view per_stage : {"REDUCE_GRAD", "UNSHARD", "RESHARD"}) {
      if (rest.find(per_stage) != std::string_view::npos) return {{}, EventCategory::kAllreduce, false};
    }
    return {{}, {}, true};
  }
  if (std::optional<int> mb = whole_number_after(name, "Forward ")) {
    return {Action{StageId(stage), ActionKind::kForward, MicrobatchId(*mb)}, {}, false};
  }
  if (std::optional<int> mb = whole_number_after(name, "Backward ")) {
    return {Action{StageId(stage), ActionKind::kBackward, MicrobatchId(*mb)}, {}, false};
  }
  return {action_named(name), {}, false};
}

}  // namespace

bool is_torch_trace(const nlohmann::json& trace) {
  if (trace.is_array()) {
    // A list of trace events, not any list: its first elements are events with a phase.
    const std::size_t look = std::min<std::size_t>(trace.size(), 16);
    for (std::size_t i = 0; i < look; ++i) {
      if (trace[i].is_object() && trace[i].contains("ph") && trace[i]["ph"].is_string()) return true;
    }
    return false;
  }
  return trace.is_object() &&
         (trace.contains("distributedInfo") || trace.contains("schemaVersion") || trace.contains("deviceProperties"));
}

std::optional<int> rank_in_file_name(std::string_view file_name) {
  for (std::size_t i = 0; i + 4 < file_name.size(); ++i) {
    if (!starts_with_case(file_name.substr(i), "rank")) continue;
    std::size_t at = i + 4;
    if (file_name[at] == '-' || file_name[at] == '_') ++at;
    int rank = 0;
    const auto [end, error] = std::from_chars(file_name.data() + at, file_name.data() + file_name.size(), rank);
    if (error == std::errc() && end != file_name.data() + at && rank >= 0) return rank;
  }
  return std::nullopt;
}

RankTrace read_torch_trace(const nlohmann::json& trace, const std::string& source, std::optional<int> name_rank) {
  if (!is_torch_trace(trace)) fail("{}: not a PyTorch profiler trace", source);
  RankTrace out;
  out.source = source;
  const nlohmann::json* events = &trace;
  double base_us = 0;
  bool string_times = false;
  if (trace.is_object()) {
    out.layout = "Kineto";
    if (!trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
      fail("{}: a Kineto trace is an object with a \"traceEvents\" list", source);
    }
    events = &trace["traceEvents"];
    if (trace.contains("baseTimeNanoseconds")) {
      const nlohmann::json& base = trace["baseTimeNanoseconds"];
      if (!base.is_number() || base.get<double>() < 0) {
        fail("{}: baseTimeNanoseconds {} is not a time", source, short_dump(base));
      }
      base_us = base.get<double>() / 1e3;
    }
    if (trace.contains("distributedInfo") && trace["distributedInfo"].is_object()) {
      const nlohmann::json& info = trace["distributedInfo"];
      if (info.contains("rank") && info["rank"].is_number_integer() && info["rank"].get<std::int64_t>() >= 0 &&
          info["rank"].get<std::int64_t>() < kMaxRank) {
        out.global_rank = info["rank"].get<int>();
        out.pipeline_group = pipeline_group(info, *out.global_rank);
      }
    }
  }
  if (!out.pipeline_group.empty()) {
    out.rank = static_cast<int>(std::find(out.pipeline_group.begin(), out.pipeline_group.end(), *out.global_rank) -
                                out.pipeline_group.begin());
  } else if (out.global_rank) {
    out.rank = *out.global_rank;
  } else if (name_rank && *name_rank < kMaxRank) {
    out.rank = *name_rank;
  } else {
    fail("{}: which rank's trace is it? It has no distributedInfo.rank and its name gives none: name the files "
         "rank{{R}}_trace.json (R: the pipeline rank), as torchtitan does",
         source);
  }

  std::vector<TraceEvent> host_actions, device_actions, collectives;
  std::map<int, double> peak_by_device;
  for (std::size_t i = 0; i < events->size(); ++i) {
    const nlohmann::json& e = (*events)[i];
    try {
      if (!e.is_object()) fail("not an object");
      const std::string ph = e.value("ph", std::string());
      if (!e.contains("name") || !e["name"].is_string()) continue;
      const std::string& name = e["name"].get_ref<const std::string&>();
      if ((ph == "i" || ph == "I") && name == "[memory]") {
        const nlohmann::json args = e.value("args", nlohmann::json::object());
        if (!args.is_object() || !args.contains("Total Allocated") || !args["Total Allocated"].is_number()) continue;
        const int device = args.value("Device Id", -1);
        double& peak = peak_by_device[device];
        peak = std::max(peak, args["Total Allocated"].get<double>());
        continue;
      }
      if (ph != "X") continue;
      if (!e.contains("ts")) fail("an \"X\" event without ts");
      string_times = string_times || e["ts"].is_string();
      const double ts = microseconds(e["ts"], "ts") + base_us;
      const double dur = e.contains("dur") ? microseconds(e["dur"], "dur") : 0.0;
      if (dur < 0) fail("dur {} is negative: a span lasts 0 microseconds or more", short_dump(e["dur"]));
      const double start = ts / kMicroseconds, duration = dur / kMicroseconds;
      if (std::optional<int> step = whole_number_after(name, "ProfilerStep#")) {
        out.steps.push_back({*step, start, start + duration});
        continue;
      }
      const RankId rank(out.rank);
      if (name.starts_with("Optimizer.step#")) {
        collectives.push_back({rank, name, EventCategory::kOptimizer, std::nullopt, start, duration});
        continue;
      }
      if (std::optional<EventCategory> category = collective_category(name, e)) {
        collectives.push_back({rank, name, *category, std::nullopt, start, duration});
        continue;
      }
      const Label label = read_label(name, out.rank);
      if (label.unread) ++out.unread_actions;
      if (label.category) collectives.push_back({rank, name, *label.category, std::nullopt, start, duration});
      if (!label.action) continue;
      const TraceEvent event{rank, name, category_of(label.action->kind), label.action, start, duration};
      (e.value("cat", std::string()) == "gpu_user_annotation" ? device_actions : host_actions).push_back(event);
    } catch (const nlohmann::json::exception& error) {
      fail("{}: event {}: {}", source, i, error.what());
    } catch (const Error& error) {
      fail("{}: event {}: {}", source, i, error.what());
    }
  }
  if (out.layout.empty()) out.layout = string_times ? "Ascend" : "legacy profiler";
  // The device's copies of the labels time the device's work: those where there are any.
  out.events = device_actions.empty() ? std::move(host_actions) : std::move(device_actions);
  std::sort(out.events.begin(), out.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_s < b.start_s;
  });
  // A transfer that runs beside an action costs nothing of its own: only those outside every action count.
  // An action overlaps [start, end) when one starting before `end` ends after `start`: the latest end of the
  // actions up to each start says so.
  std::vector<double> latest_end(out.events.size());
  for (std::size_t i = 0; i < out.events.size(); ++i) {
    latest_end[i] = std::max(i > 0 ? latest_end[i - 1] : -std::numeric_limits<double>::infinity(), out.events[i].end_s());
  }
  const std::size_t actions = out.events.size();
  std::stable_sort(collectives.begin(), collectives.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_s < b.start_s;
  });
  double transfer_end = -std::numeric_limits<double>::infinity();  // of the last transfer kept
  for (TraceEvent& c : collectives) {
    if (c.category == EventCategory::kSend || c.category == EventCategory::kRecv) {
      // Spans that only touch (one ends where the other starts, to the clock's nanosecond) do not overlap.
      const auto after = std::lower_bound(out.events.begin(), out.events.begin() + static_cast<std::ptrdiff_t>(actions),
                                          c.end_s() - kTouch, [](const TraceEvent& a, double t) { return a.start_s < t; });
      const std::size_t before = static_cast<std::size_t>(after - out.events.begin());
      if (before > 0 && latest_end[before - 1] > c.start_s + kTouch) continue;
      // A backend's span inside c10d's op ("gloo:recv" in "c10d::recv_") is the same transfer.
      if (c.end_s() <= transfer_end + kTouch) continue;
      transfer_end = c.end_s();
    }
    out.events.push_back(std::move(c));
  }
  std::stable_sort(out.events.begin(), out.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_s < b.start_s;
  });
  std::sort(out.steps.begin(), out.steps.end(), [](const ProfilerStep& a, const ProfilerStep& b) {
    return a.number < b.number;
  });
  if (!peak_by_device.empty()) {
    // A device's memory where the trace has one (Device Id >= 0), else the host's.
    const auto device = peak_by_device.lower_bound(0);
    double peak = 0;
    for (auto it = device != peak_by_device.end() ? device : peak_by_device.begin(); it != peak_by_device.end(); ++it) {
      peak = std::max(peak, it->second);
    }
    out.peak_memory_bytes = peak;
  }
  return out;
}

namespace {

// The events of one rank that start within its step (all of them without
// steps): the rank's events are sorted by start, its steps by number.
std::vector<TraceEvent> cut(const RankTrace& trace, std::optional<int> step) {
  if (!step) return trace.events;
  const auto it = std::lower_bound(trace.steps.begin(), trace.steps.end(), *step,
                                   [](const ProfilerStep& s, int number) { return s.number < number; });
  const auto first = std::lower_bound(trace.events.begin(), trace.events.end(), it->start_s,
                                      [](const TraceEvent& e, double t) { return e.start_s < t; });
  std::vector<TraceEvent> events;
  for (auto e = first; e != trace.events.end() && e->start_s < it->end_s; ++e) events.push_back(*e);
  return events;
}

// What the data between two ranks says about their clocks: d = offset of the
// later rank minus the earlier's lies in [lower, upper].
struct ClockBounds {
  double lower = -std::numeric_limits<double>::infinity();
  double upper = std::numeric_limits<double>::infinity();
  int messages = 0;
};

ClockBounds bounds_between(const std::vector<TraceEvent>& a, const std::vector<TraceEvent>& b) {
  std::map<Action, const TraceEvent*> in_a, in_b;
  for (const TraceEvent& e : a) {
    if (e.action) in_a[*e.action] = &e;
  }
  for (const TraceEvent& e : b) {
    if (e.action) in_b[*e.action] = &e;
  }
  ClockBounds bounds;
  auto later_starts_after = [&](const TraceEvent& earlier_end_on_a, const TraceEvent& start_on_b) {
    bounds.lower = std::max(bounds.lower, earlier_end_on_a.end_s() - start_on_b.start_s);
    ++bounds.messages;
  };
  auto earlier_starts_after = [&](const TraceEvent& end_on_b, const TraceEvent& start_on_a) {
    bounds.upper = std::min(bounds.upper, start_on_a.start_s - end_on_b.end_s());
    ++bounds.messages;
  };
  const auto find = [](const std::map<Action, const TraceEvent*>& events, const Action& action) -> const TraceEvent* {
    const auto it = events.find(action);
    return it == events.end() ? nullptr : it->second;
  };
  for (const auto& [action, e] : in_b) {
    const Action previous{StageId(action.stage.value() - 1), action.kind, action.microbatch};
    if (action.kind == ActionKind::kForward) {
      if (const TraceEvent* f = find(in_a, previous)) later_starts_after(*f, *e);  // F s+1 after F s
    } else if (is_input_backward(action.kind)) {
      for (ActionKind kind : {ActionKind::kBackward, ActionKind::kBackwardInput}) {
        const Action before{previous.stage, kind, action.microbatch};
        if (const TraceEvent* bwd = find(in_a, before)) earlier_starts_after(*e, *bwd);  // B s after B s+1
      }
    } else if (action.kind == ActionKind::kRecvForward) {
      if (const TraceEvent* send = find(in_a, partner(action))) {  // the receive ends after the send starts
        bounds.lower = std::max(bounds.lower, send->start_s - e->end_s());
        ++bounds.messages;
      }
    } else if (action.kind == ActionKind::kSendBackward) {
      if (const TraceEvent* recv = find(in_a, partner(action))) {
        bounds.upper = std::min(bounds.upper, recv->end_s() - e->start_s);
        ++bounds.messages;
      }
    }
  }
  return bounds;
}

double step_start(const std::vector<TraceEvent>& events) {
  double start = std::numeric_limits<double>::infinity();
  for (const TraceEvent& e : events) start = std::min(start, e.start_s);
  return std::isfinite(start) ? start : 0.0;
}

struct Alignment {
  std::vector<double> offset_s;
  std::vector<std::pair<double, double>> window_s;
  std::vector<std::string> notes;
};

// Clock offsets for one step's events per rank (see merge_rank_traces).
Alignment align(const std::vector<std::vector<TraceEvent>>& events, const std::vector<RankTrace>& ranks) {
  Alignment out;
  out.offset_s.assign(events.size(), 0.0);
  out.window_s.assign(events.size(), {0.0, 0.0});
  for (std::size_t r = 0; r + 1 < events.size(); ++r) {
    const ClockBounds b = bounds_between(events[r], events[r + 1]);
    out.window_s[r + 1] = {b.lower, b.upper};
    const bool wall_clocks = ranks[r].layout != "legacy profiler" && ranks[r + 1].layout != "legacy profiler";
    // Without data between them: the ranks' first events of the step together.
    const double starts = step_start(events[r]) - step_start(events[r + 1]);
    double d = 0;
    const bool lower = std::isfinite(b.lower), upper = std::isfinite(b.upper);
    if (wall_clocks && (!lower || b.lower <= 0) && (!upper || b.upper >= 0)) {
      d = 0;  // one clock that every message agrees with: no shift
    } else if (lower && upper) {
      d = (b.lower + b.upper) / 2;
      if (b.lower > b.upper) {
        out.notes.push_back(fmt::format(
            "ranks {} and {}: the messages between them disagree by {:.0f} us (a clock that drifts within the step?); "
            "aligned on the middle",
            r, r + 1, (b.lower - b.upper) * kMicroseconds));
      }
    } else if (lower) {
      d = wall_clocks ? b.lower : std::max(b.lower, starts);
    } else if (upper) {
      d = wall_clocks ? b.upper : std::min(b.upper, starts);
    } else {
      d = wall_clocks ? 0.0 : starts;
    }
    out.offset_s[r + 1] = out.offset_s[r] + d;
    if (d != 0 || !wall_clocks) {
      const std::string window =
          lower && upper ? fmt::format(" (the {} messages allow {:+.0f} to {:+.0f} us)", b.messages,
                                       b.lower * kMicroseconds, b.upper * kMicroseconds)
          : lower || upper ? fmt::format(" (from {} messages, one-sided)", b.messages)
                           : std::string(" (no message between them: their first events aligned)");
      out.notes.push_back(fmt::format("clock of rank {} shifted {:+.0f} us against rank {}{}", r + 1,
                                      d * kMicroseconds, r, window));
    }
  }
  return out;
}

void shift(std::vector<TraceEvent>& events, double by) {
  for (TraceEvent& e : events) e.start_s += by;
}

// A receive (or a send) whose partner started later waited for it until then.
std::vector<TraceEvent> split_waits(std::vector<TraceEvent> events) {
  std::map<Action, const TraceEvent*> by_action;
  for (const TraceEvent& e : events) {
    if (e.action && is_communication(e.action->kind)) by_action[*e.action] = &e;
  }
  std::vector<TraceEvent> out;
  out.reserve(events.size());
  for (const TraceEvent& e : events) {
    if (e.action && is_communication(e.action->kind)) {
      const auto it = by_action.find(partner(*e.action));
      if (it != by_action.end() && it->second->start_s > e.start_s) {
        const double wait = std::min(it->second->start_s - e.start_s, e.duration_s);
        if (wait > 0) {
          out.push_back({e.rank, e.name, EventCategory::kWait, e.action, e.start_s, wait});
          out.push_back({e.rank, e.name, e.category, e.action, e.start_s + wait, e.duration_s - wait});
          continue;
        }
      }
    }
    out.push_back(e);
  }
  return out;
}

// Each rank's labels are its own stages', and every stage a message names is
// some rank's: a file read as the wrong rank, or a rank's file missing, would
// otherwise give a pipeline that never ran.
void check_stages(const std::vector<RankTrace>& ranks) {
  const int p = static_cast<int>(ranks.size());
  std::set<int> held;
  for (const RankTrace& r : ranks) {
    for (const TraceEvent& e : r.events) {
      if (!e.action) continue;
      const int s = e.action->stage.value();
      // Stage s sits on rank s mod p (1F1B, interleaved), or on 2p-1-s past the turn of a V (ZB-V, DualPipe).
      if (s % p != r.rank && !(s >= p && s < 2 * p && 2 * p - 1 - s == r.rank)) {
        fail("{} is read as pipeline rank {} of {}, but its {} is stage {}'s: name the files by their pipeline rank "
             "(rank{{R}}_trace.json) or give every rank's trace",
             r.source, r.rank, p, e.name, s);
      }
      held.insert(s);
    }
  }
  for (const RankTrace& r : ranks) {
    for (const TraceEvent& e : r.events) {
      if (!e.action || !is_communication(e.action->kind)) continue;
      const int peer = partner(*e.action).stage.value();
      if (peer >= 0 && !held.contains(peer)) {
        fail("{}: {} names stage {}, which no given trace holds: give every pipeline rank's trace (the ranks given "
             "are 0 to {})",
             r.source, e.name, peer, p - 1);
      }
    }
  }
}

// The traces of one pipeline: where the traces name their pipeline groups,
// the group of the lowest global rank.
std::vector<RankTrace> one_pipeline(std::vector<RankTrace> ranks, std::vector<std::string>& notes) {
  std::set<std::vector<int>> groups;
  for (const RankTrace& r : ranks) {
    if (!r.pipeline_group.empty()) groups.insert(r.pipeline_group);
  }
  if (groups.size() <= 1) return ranks;
  const std::vector<int> chosen = *std::min_element(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    return *std::min_element(a.begin(), a.end()) < *std::min_element(b.begin(), b.end());
  });
  std::vector<RankTrace> kept;
  std::size_t skipped = 0;
  for (RankTrace& r : ranks) {
    if (r.pipeline_group == chosen) {
      kept.push_back(std::move(r));
    } else {
      ++skipped;
    }
  }
  notes.push_back(fmt::format("{} pipelines in the traces: read the one of global ranks {} and skipped {} files of "
                              "the others (data-parallel replicas)",
                              groups.size(), fmt::join(chosen, ","), skipped));
  return kept;
}

}  // namespace

MergedTrace merge_rank_traces(std::vector<RankTrace> ranks, std::optional<int> step) {
  MergedTrace out;
  ranks = one_pipeline(std::move(ranks), out.notes);
  if (ranks.empty()) fail("no trace to merge");
  std::sort(ranks.begin(), ranks.end(), [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0 && ranks[i].rank == ranks[i - 1].rank) {
      fail("{} and {} are both pipeline rank {}: give one trace per rank of one pipeline (one data-parallel replica)",
           ranks[i - 1].source, ranks[i].source, ranks[i].rank);
    }
    if (ranks[i].rank != static_cast<int>(i)) {
      fail("no trace of pipeline rank {} among the {} given (the ranks run 0 to {}; {} is rank {}): give every rank's "
           "trace",
           i, ranks.size(), ranks.back().rank, ranks[i].source, ranks[i].rank);
    }
  }
  const std::size_t n = ranks.size();
  check_stages(ranks);
  // The steps every rank has.
  std::vector<int> common;
  bool any_steps = false;
  for (const RankTrace& r : ranks) any_steps = any_steps || !r.steps.empty();
  if (any_steps) {
    std::vector<std::set<int>> numbers;
    for (const RankTrace& r : ranks) {
      std::set<int>& seen = numbers.emplace_back();
      for (const ProfilerStep& t : r.steps) {
        if (!seen.insert(t.number).second) {
          fail("{}: ProfilerStep#{} twice: one trace holds one run's steps", r.source, t.number);
        }
      }
    }
    for (int number : numbers.front()) {
      const bool everywhere =
          std::all_of(numbers.begin(), numbers.end(), [&](const std::set<int>& held) { return held.contains(number); });
      if (everywhere) common.push_back(number);
    }
    if (common.empty()) {
      fail("the traces mark steps (ProfilerStep#N) but no step is in every rank's trace: give traces of the same "
           "steps");
    }
    if (step && std::find(common.begin(), common.end(), *step) == common.end()) {
      fail("--step {}: not a step of every rank's trace; the steps are {}", *step, fmt::join(common, ", "));
    }
    out.step = step ? *step : common.back();
    out.steps = common;
  } else {
    if (step) fail("--step {}: the traces mark no steps (no ProfilerStep#N: call prof.step() each step)", *step);
    out.notes.push_back("the traces mark no steps (no ProfilerStep#N): the whole trace is read as one step");
  }

  // Each step on one clock: the spans of all, the chosen one's events kept.
  const auto aligned_step = [&](std::optional<int> number) {
    std::vector<std::vector<TraceEvent>> events(n);
    for (std::size_t r = 0; r < n; ++r) events[r] = cut(ranks[r], number);
    Alignment alignment = align(events, ranks);
    for (std::size_t r = 0; r < n; ++r) shift(events[r], alignment.offset_s[r]);
    return std::pair(std::move(events), std::move(alignment));
  };
  std::vector<std::vector<TraceEvent>> events;
  Alignment alignment;
  for (int s : out.steps) {
    auto [step_events, step_alignment] = aligned_step(s);
    double first = std::numeric_limits<double>::infinity(), last = -first;
    for (const auto& rank_events : step_events) {
      for (const TraceEvent& e : rank_events) {
        first = std::min(first, e.start_s);
        last = std::max(last, e.end_s());
      }
    }
    out.step_spans_s.push_back(std::isfinite(first) ? last - first : 0.0);
    if (s == out.step) std::tie(events, alignment) = std::pair(std::move(step_events), std::move(step_alignment));
  }
  if (!out.step) std::tie(events, alignment) = aligned_step(std::nullopt);
  out.notes.insert(out.notes.end(), alignment.notes.begin(), alignment.notes.end());
  out.clock_offset_s = alignment.offset_s;
  out.clock_window_s = alignment.window_s;
  std::vector<TraceEvent> all;
  for (auto& rank_events : events) all.insert(all.end(), rank_events.begin(), rank_events.end());
  all = split_waits(std::move(all));
  const double origin = step_start(all);
  shift(all, -origin);
  std::stable_sort(all.begin(), all.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.start_s < b.start_s;
  });
  out.timeline.title = fmt::format("PyTorch profiler ({}), {} ranks{}", ranks.front().layout, n,
                                   out.step ? fmt::format(", step {}", *out.step) : std::string());
  out.timeline.num_ranks = static_cast<int>(n);
  out.timeline.events = std::move(all);
  int unread = 0;
  for (const RankTrace& r : ranks) {
    out.peak_memory_bytes.push_back(r.peak_memory_bytes);
    unread += r.unread_actions;
  }
  if (unread > 0) {
    out.notes.push_back(fmt::format("{} \"PP:\" labels name no action pipeflow reads (F, B, I, W, SEND_F, RECV_F, "
                                    "SEND_B, RECV_B, REDUCE_GRAD, UNSHARD, RESHARD): left out",
                                    unread));
  }
  return out;
}

}  // namespace pipeflow
