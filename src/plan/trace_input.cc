// load_trace_input: the files a user points `analyze` at, told apart by
// their content, read into one timeline.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <set>
#include <string_view>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/trace/chrome_trace.h"
#include "pipeflow/trace/torch_trace.h"

namespace pipeflow {
namespace {

namespace fs = std::filesystem;

// How deep a folder of traces is searched: Ascend's sit two folders down
// (*_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json).
constexpr int kMaxFolderDepth = 4;

bool named_like_a_trace(const fs::path& file) {
  const std::string name = file.filename().string();
  for (const char* ending : {".json", ".json.gz", ".log", ".txt", ".out", ".csv"}) {
    if (name.ends_with(ending)) return true;
  }
  return false;
}

// A log's lines may start with "[" (a time stamp, "[Rank 0]"): a bare JSON
// list is told from them by the log's own lines.
bool looks_like_json(std::string_view text) {
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return false;
  return text[first] == '{' || (text[first] == '[' && !is_timer_log(text));
}

// A file given, or one found in a folder given.
struct Candidate {
  fs::path path;
  bool named = false;  // given by the user, not found in a folder
};

std::vector<Candidate> candidates(const std::vector<fs::path>& paths) {
  std::vector<Candidate> out;
  for (const fs::path& path : paths) {
    std::error_code error;
    if (!fs::exists(path, error)) fail("{}: no such file or folder", quoted_excerpt(path.string()));
    if (!fs::is_directory(path, error)) {
      require_regular_file(path);  // /dev/zero would be read up to the limit
      out.push_back({path, true});
      continue;
    }
    if (fs::exists(path / "trace.json", error)) {  // a run directory of pipeflow train
      out.push_back({path / "trace.json", true});
      continue;
    }
    std::vector<fs::path> found;
    std::size_t seen = 0;
    for (auto it = fs::recursive_directory_iterator(path, fs::directory_options::skip_permission_denied, error);
         it != fs::recursive_directory_iterator(); it.increment(error)) {
      if (error) fail("{}: cannot list it: {}", path.string(), error.message());
      if (++seen > 16 * kMaxTraceFiles) {
        fail("{}: more than {} entries: give the folder of one job's traces", path.string(), 16 * kMaxTraceFiles);
      }
      if (it.depth() >= kMaxFolderDepth) it.disable_recursion_pending();
      if (it->is_regular_file(error) && named_like_a_trace(it->path())) found.push_back(it->path());
    }
    if (found.empty()) {
      fail("{}: a folder without trace.json (a pipeflow run) and without traces (*.json, *.json.gz) or logs (*.log, "
           "*.txt, *.out)",
           path.string());
    }
    std::sort(found.begin(), found.end());
    for (fs::path& f : found) out.push_back({std::move(f), false});
  }
  if (out.size() > kMaxTraceFiles) {
    fail("{} files to read: analyze reads at most {} (one job's traces)", out.size(), kMaxTraceFiles);
  }
  return out;
}

// A configuration given for a log that states its run must be that run.
void check_same_run(const RunConfig& logged, const RunConfig& given, const std::string& log, const std::string& config) {
  const auto shape = [](const RunConfig& r) {
    return fmt::format("tensor {} x pipeline {}, {} layers of width {}", r.tensor_parallel, r.pipeline.ranks,
                       r.model ? r.model->layers : 0, r.model ? r.model->hidden : 0);
  };
  if (shape(logged) != shape(given)) {
    fail("--config {}: {}, but {}'s arguments block states {}: give the run's configuration, or leave --config out "
         "to take the log's",
         config, shape(given), log, shape(logged));
  }
}

std::string joined(const std::vector<std::string>& items) {
  return items.size() <= 3 ? fmt::format("{}", fmt::join(items, ", "))
                           : fmt::format("{}, ... ({} files)", fmt::join(items.begin(), items.begin() + 2, ", "),
                                         items.size());
}

std::vector<std::string> sources_of(const std::vector<DeviceLog>& logs) {
  std::vector<std::string> sources;
  for (const DeviceLog& d : logs) sources.push_back(d.source);
  return sources;
}

// R of the one profiler_info_{R}.json in `folder` (torch_npu writes it into each rank's *_ascend_pt folder).
std::optional<int> profiler_info_rank(const fs::path& folder) {
  std::optional<int> rank;
  std::error_code error;
  int found = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(folder, error)) {
    const std::string name = e.path().filename().string();
    constexpr std::string_view kPrefix = "profiler_info_";
    if (!name.starts_with(kPrefix) || !name.ends_with(".json")) continue;
    const std::string_view digits = std::string_view(name).substr(kPrefix.size(), name.size() - kPrefix.size() - 5);
    int r = 0;
    const auto [end, bad] = std::from_chars(digits.data(), digits.data() + digits.size(), r);
    if (bad == std::errc() && end == digits.data() + digits.size() && r >= 0) {
      rank = r;
      ++found;
    }
  }
  return found == 1 ? rank : std::nullopt;
}

// The global rank of one device's step_trace_time.csv (torch_npu writes it
// into {worker}_ascend_pt/ASCEND_PROFILER_OUTPUT/): the profiler_info_{R}.json
// of its folder or the two above, else a "rank{R}" (rank_R, rank-R) in the
// file's or those folders' names, else its Device_id (the device's index on
// its node). `how` collects which told it.
int device_rank(const DeviceLog& d, std::set<std::string>& how) {
  const fs::path file(d.source);
  fs::path folder = file.parent_path();
  for (int up = 0; up < 3 && !folder.empty(); ++up, folder = folder.parent_path()) {
    if (const std::optional<int> rank = profiler_info_rank(folder)) {
      how.insert("profiler_info_{R}.json");
      return *rank;
    }
  }
  folder = file;
  for (int up = 0; up < 4 && !folder.empty(); ++up, folder = folder.parent_path()) {
    if (const std::optional<int> rank = rank_in_file_name(folder.filename().string())) {
      how.insert("rank{R} in the folders' names");
      return *rank;
    }
  }
  if (d.log.device_id) {
    how.insert("Device_id (the device's index on its node: for a job of several nodes, name each device's folder "
               "rank_{R})");
    return *d.log.device_id;
  }
  fail("{}: whose rank? No profiler_info_{{R}}.json beside it (torch_npu writes one into each *_ascend_pt folder), "
       "no rank{{R}} in its folders' names, no Device_id column: put each device's folder under one named rank_{{R}}",
       d.source);
}

// Ascend's step_trace_time.csv, one per device, as one job (merge_device_logs):
// the stages of --config's layout, else each device a stage.
TimerLog merged_devices(std::vector<DeviceLog> logs, const TraceOptions& options) {
  std::set<std::string> how;
  for (DeviceLog& d : logs) d.rank = device_rank(d, how);
  int replicas = 1, stages = 0;
  if (options.config) {
    const Layout layout = layout_of(resolve(load_run_config(*options.config)));
    replicas = layout.tensor_parallel * layout.data_parallel;
    stages = layout.pipeline_ranks;
  }
  const std::size_t count = logs.size();
  TimerLog log = merge_device_logs(std::move(logs), replicas, stages);
  log.notes.push_back(fmt::format("{} devices' step traces, their ranks from {}", count, fmt::join(how, " and ")));
  if (!options.config) {
    log.notes.push_back("no --config: each device is taken as a pipeline stage (give the run's configuration for "
                        "its tensor and data parallel replicas)");
  }
  return log;
}

}  // namespace

TraceInput load_trace_input(const std::vector<fs::path>& paths, const TraceOptions& options) {
  if (paths.empty()) fail("analyze needs a trace: a file, a run directory of pipeflow train, or a folder of traces");
  TraceInput input;
  std::vector<RankTrace> ranks;
  std::optional<std::string> own;  // a pipeflow trace's file
  std::vector<DeviceLog> logs;  // the logs read, their ranks not yet known
  std::vector<std::string> skipped;  // files of a folder that are neither
  for (const Candidate& c : candidates(paths)) {
    // torch_npu's profiler_info_{R}.json beside a device's output: device_rank reads its name.
    if (!c.named && c.path.filename().string().starts_with("profiler_info_")) continue;
    const std::string source = c.path.string();
    const std::string text = read_file_inflated(c.path, kMaxTraceFileBytes, "trace");
    if (!looks_like_json(text)) {
      if (is_timer_log(text)) {
        logs.push_back({0, read_timer_log(text, source), source});
        input.reading.files.push_back(source);
      } else if (c.named) {
        fail("{}: neither a trace (JSON) nor a Megatron-LM or DeepSpeed log (no iteration time line)", source);
      } else {
        skipped.push_back(source);
      }
      continue;
    }
    const nlohmann::json trace = parse_json(text, source);
    if (is_torch_trace(trace)) {
      ranks.push_back(read_torch_trace(trace, source, rank_in_file_name(c.path.filename().string())));
      input.reading.files.push_back(source);
    } else if (trace.is_object() && trace.contains("traceEvents")) {
      if (own) fail("{} and {}: analyze reads one pipeflow trace at a time", *own, source);
      input.timeline = chrome_trace_timeline(trace, source);
      own = source;
      input.reading.files.push_back(source);
    } else if (c.named) {
      fail("{}: not a trace: neither a Chrome trace (an object with \"traceEvents\") nor a PyTorch profiler trace",
           source);
    } else {
      skipped.push_back(source);
    }
  }
  if (!skipped.empty()) {
    input.reading.notes.push_back(fmt::format("skipped {} file{} that {} no trace or log: {}", skipped.size(),
                                              skipped.size() == 1 ? "" : "s", skipped.size() == 1 ? "is" : "are",
                                              joined(skipped)));
  }
  const bool devices = !logs.empty() && std::all_of(logs.begin(), logs.end(), [](const DeviceLog& d) {
    return d.log.one_device;
  });
  if (devices && !ranks.empty()) {
    // torch_npu writes a step_trace_time.csv beside each device's trace_view.json: the timelines say more.
    input.reading.notes.push_back(fmt::format("read the devices' timelines; their step_trace_time.csv left out: {}",
                                              joined(sources_of(logs))));
    for (const DeviceLog& d : logs) std::erase(input.reading.files, d.source);
    logs.clear();
  }
  std::optional<std::string> log;  // the log's file, or the folder of the devices' logs
  if (logs.size() > 1 && !devices) {
    fail("{} and {}: analyze reads one log at a time (Megatron and DeepSpeed print every rank's timers into one; "
         "Ascend's step_trace_time.csv, one per device, are read together)",
         logs[0].source, logs[1].source);
  }
  if (logs.size() == 1) {
    input.log = std::move(logs.front().log);
    log = logs.front().source;
  } else if (logs.size() > 1) {
    input.log = merged_devices(std::move(logs), options);
    log = paths.size() == 1 ? paths.front().string() : joined(input.reading.files);
  }
  if (log && (own || !ranks.empty())) {
    fail("{} is a log and {} a trace: analyze one job's trace or its log", *log, own ? *own : ranks.front().source);
  }
  if (log) {
    if (options.step) fail("--step {}: a log's timers are totals over its steps; --step picks a PyTorch trace's", *options.step);
    TimerLog& l = *input.log;
    input.source = *log;
    TraceReading& r = input.reading;
    r.format = l.format;
    r.step_spans_s = l.step_s;
    for (const std::optional<RankTimes>& t : l.ranks) r.peak_memory_bytes.push_back(t ? t->peak_memory_bytes : std::nullopt);
    r.notes.insert(r.notes.end(), l.notes.begin(), l.notes.end());
    if (options.config) {
      const RunConfig config = load_run_config(*options.config);
      if (l.run) check_same_run(*l.run, config, *log, options.config->string());
      input.run = measured_run(config, l, options.config->string());
    } else if (l.run) {
      input.run = measured_run(*l.run, l, *log + " (its arguments block)");
    }
    return input;
  }
  if (own && !ranks.empty()) {
    fail("{} is pipeflow's trace and {} a PyTorch profiler's: analyze one job at a time", *own, ranks.front().source);
  }
  if (own) {
    input.source = *own;
    input.reading.format = "pipeflow";
    if (options.step) fail("--step {}: a pipeflow trace holds one step; --step picks one of a PyTorch trace's", *options.step);
    if (input.timeline.run_metadata) {
      if (options.config) {
        fail("--config {}: {} carries its run (otherData.pipeflow), which the advice re-simulates; --config is for "
             "traces without one",
             quoted_excerpt(options.config->string()), input.source);
      }
      input.run = read_run_metadata(*input.timeline.run_metadata, input.source);
    } else if (options.config) {
      input.run = measured_run(load_run_config(*options.config), input.timeline, options.config->string());
    }
    return input;
  }
  if (ranks.empty()) {
    std::vector<std::string> given;
    for (const fs::path& p : paths) given.push_back(p.string());
    fail("{}: no trace among the files", fmt::join(given, ", "));
  }
  std::string layout = ranks.front().layout;
  for (const RankTrace& r : ranks) {
    if (r.layout != layout) layout = "mixed layouts";
  }
  MergedTrace merged = merge_rank_traces(std::move(ranks), options.step);
  input.source = paths.size() == 1 ? paths.front().string() : joined(input.reading.files);
  input.timeline = std::move(merged.timeline);
  TraceReading& r = input.reading;
  r.format = fmt::format("PyTorch profiler ({})", layout);
  r.step = merged.step;
  r.steps = std::move(merged.steps);
  r.step_spans_s = std::move(merged.step_spans_s);
  r.clock_offset_s = std::move(merged.clock_offset_s);
  r.clock_window_s = std::move(merged.clock_window_s);
  r.peak_memory_bytes = std::move(merged.peak_memory_bytes);
  r.notes.insert(r.notes.end(), merged.notes.begin(), merged.notes.end());
  if (options.config) {
    input.run = measured_run(load_run_config(*options.config), input.timeline, options.config->string());
  }
  return input;
}

}  // namespace pipeflow
