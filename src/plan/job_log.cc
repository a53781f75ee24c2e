#include "pipeflow/plan/job_log.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>

#include "pipeflow/config/megatron_args.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/text.h"

namespace pipeflow {
namespace {

constexpr double kMilliseconds = 1e-3;
constexpr std::string_view kMegatronAll = "times across ranks (ms):";
constexpr std::string_view kMegatronIteration = "elapsed time per iteration (ms):";
constexpr std::string_view kDeepSpeedTimes = "time (ms) |";
constexpr std::string_view kDeepSpeedStep = "iter time (s):";
// A log's lines are at most this long: a longer one is no log line.
constexpr std::size_t kMaxLine = std::size_t{1} << 16;
// The most ranks a log may name.
constexpr int kMaxRanks = 1 << 16;

// The number at the start of `s` (after spaces), if there is one.
std::optional<double> number_at(std::string_view s) {
  s = trim(s);
  double value = 0;
  const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (error != std::errc() || end == s.data() || !std::isfinite(value)) return std::nullopt;
  return value;
}

// The number after `key` in `line`.
std::optional<double> number_after(std::string_view line, std::string_view key) {
  const std::size_t at = line.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  return number_at(line.substr(at + key.size()));
}

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    lines.push_back(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return lines;
}

[[noreturn]] void fail_line(const std::string& source, std::size_t line, std::string_view why) {
  fail("{}:{}: {}", source, line + 1, why);
}

// A duration written in `unit` ("milliseconds", "microseconds"), in seconds.
double seconds(std::string_view text, double unit_s, std::string_view unit, const std::string& source,
               std::size_t line) {
  const std::optional<double> value = number_at(text);
  if (!value || *value < 0) fail_line(source, line, fmt::format("\"{}\" is not a time in {}", trim(text), unit));
  return *value * unit_s;
}

double milliseconds(std::string_view text, const std::string& source, std::size_t line) {
  return seconds(text, kMilliseconds, "milliseconds", source, line);
}

// ---- Megatron-LM ----

// Adds `t`'s times into `sum` (a Bubble or Stage column's where `t` has it).
void add_times(RankTimes& sum, const RankTimes& t) {
  sum.forward_s += t.forward_s;
  sum.backward_s += t.backward_s;
  sum.comm_s += t.comm_s;
  sum.optimizer_s += t.optimizer_s;
  if (t.receive_s) sum.receive_s = sum.receive_s.value_or(0) + *t.receive_s;
  if (t.stage_s) sum.stage_s = sum.stage_s.value_or(0) + *t.stage_s;
}

// The mean of `count` times summed by add_times.
RankTimes mean_times(RankTimes sum, int count) {
  for (double* s : {&sum.forward_s, &sum.backward_s, &sum.comm_s, &sum.optimizer_s}) *s /= count;
  for (std::optional<double>* s : {&sum.receive_s, &sum.stage_s}) {
    if (*s) **s /= count;
  }
  return sum;
}

// Global ranks' times as their stages': rank r is stage r / replicas, a
// stage's replicas (tensor and data parallel) averaged; a rank past the
// stages is left out, noted.
std::vector<std::optional<RankTimes>> stages_of_ranks(const std::map<int, RankTimes>& by_rank, int replicas,
                                                      int stages, std::vector<std::string>& notes) {
  std::vector<RankTimes> sum(stages);
  std::vector<int> count(stages, 0);
  for (const auto& [global, times] : by_rank) {
    const int stage = global / replicas;
    if (stage >= stages) {
      notes.push_back(fmt::format("rank {} is past the world of {} ranks: left out", global, replicas * stages));
      continue;
    }
    add_times(sum[stage], times);
    ++count[stage];
  }
  std::vector<std::optional<RankTimes>> out(stages);
  for (int s = 0; s < stages; ++s) {
    if (count[s] > 0) out[s] = mean_times(sum[s], count[s]);
  }
  return out;
}

bool is_comm_timer(std::string_view name) {
  return name.find("-send") != std::string_view::npos || name.find("-recv") != std::string_view::npos;
}

void add_timer(RankTimes& t, std::string_view name, double seconds) {
  if (name == "forward-compute") {
    t.forward_s = seconds;
  } else if (name == "backward-compute") {
    t.backward_s = seconds;
  } else if (name == "optimizer") {
    t.optimizer_s = seconds;
  } else if (is_comm_timer(name)) {
    t.comm_s += seconds;
  }
}

// The arguments block as a launch line: "  name .... value" -> "--name value".
std::string arguments_as_flags(const std::vector<std::string_view>& block, std::map<std::string, std::string>& values) {
  std::string flags;
  bool padded_vocab = false;
  for (std::string_view line : block) {
    line = trim(line);
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos) continue;
    const std::string name(line.substr(0, space));
    std::string_view rest = trim(line.substr(space));
    while (!rest.empty() && rest.front() == '.') rest.remove_prefix(1);
    const std::string value(trim(rest));
    values[name] = value;
    padded_vocab = padded_vocab || name == "padded_vocab_size";
  }
  for (const auto& [name, value] : values) {
    if (name == "vocab_size" && padded_vocab) continue;  // the embedding holds the padded vocabulary
    if (value == "False" || value == "None" || value.empty()) continue;
    if (value.find_first_of(" []{}()'\",") != std::string::npos) continue;  // lists and objects: none is modelled
    std::string flag = name == "padded_vocab_size" ? "vocab_size" : name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    flags += " --" + flag;
    if (value != "True") flags += " " + value;
  }
  return flags;
}

TimerLog read_megatron(const std::vector<std::string_view>& lines, const std::string& source) {
  TimerLog log;
  log.format = "Megatron-LM log";
  std::map<int, std::map<std::string, double>> by_global_rank;  // the last interval's timers
  std::map<int, double> peak_by_global_rank;
  std::vector<std::string_view> arguments;
  bool in_arguments = false;
  bool spread_only = false;
  std::string timer;  // the timer whose rank lines follow
  bool in_all = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string_view line = lines[i];
    if (line.find("-- arguments --") != std::string_view::npos) {
      in_arguments = true;
      arguments.clear();
      continue;
    }
    if (in_arguments) {
      if (line.find("end of arguments") != std::string_view::npos) {
        in_arguments = false;
      } else {
        arguments.push_back(line);
      }
      continue;
    }
    if (const std::optional<double> ms = number_after(line, kMegatronIteration)) {
      if (*ms < 0) fail_line(source, i, "a negative iteration time");
      log.step_s.push_back(*ms * kMilliseconds);
      in_all = false;
      continue;
    }
    if (line.find("time across ranks (ms):") != std::string_view::npos) {  // minmax or max
      spread_only = true;
      in_all = false;
      continue;
    }
    if (line.find(kMegatronAll) != std::string_view::npos) {
      in_all = true;
      timer.clear();
      by_global_rank.clear();  // the last interval's timers only
      continue;
    }
    if (const std::size_t at = line.find("] (after "); at != std::string_view::npos &&
                                                      line.find("memory (MB)") != std::string_view::npos) {
      const std::size_t open = line.rfind("[Rank ", at);
      const double rank = open == std::string_view::npos ? -1.0 : number_at(line.substr(open + 6)).value_or(-1.0);
      const std::optional<double> peak = number_after(line, "| max allocated:");
      if (peak && rank >= 0 && rank < kMaxRanks) {
        double& p = peak_by_global_rank[static_cast<int>(rank)];
        p = std::max(p, *peak * 1024 * 1024);
      }
      continue;
    }
    if (!in_all) continue;
    const std::string_view t = trim(line);
    if (t.starts_with("rank ")) {
      const std::size_t colon = t.find(':');
      const std::optional<double> rank = number_at(t.substr(5, colon == std::string_view::npos ? 0 : colon - 5));
      if (colon == std::string_view::npos || !rank || *rank < 0 || *rank >= kMaxRanks || timer.empty()) {
        fail_line(source, i, "a timer's rank line is \"rank R: MS\" under a timer's name");
      }
      by_global_rank[static_cast<int>(*rank)][timer] = milliseconds(t.substr(colon + 1), source, i);
    } else if (t.ends_with(':') && t.find(' ') == std::string_view::npos && !t.empty()) {
      timer = std::string(t.substr(0, t.size() - 1));
    } else {
      in_all = false;  // the block ended
    }
  }
  if (log.step_s.empty()) {
    fail("{}: no \"iteration ... | elapsed time per iteration (ms): T |\" line: a Megatron-LM log prints one every "
         "--log-interval iterations",
         source);
  }

  // The layout: the arguments block, else every rank a stage.
  int tp = 1, dp = 1, pp = 0;
  if (!arguments.empty()) {
    std::map<std::string, std::string> values;
    const std::string flags = arguments_as_flags(arguments, values);
    try {
      RunOverrides given;
      if (values.contains("world_size")) given.set("devices", std::stoi(values["world_size"]));
      log.run = megatron_run_config(read_megatron_args(flags, source + " (its arguments block)"), given, source);
      tp = log.run->tensor_parallel;
      pp = log.run->pipeline.ranks;
      dp = log.run->data_parallel;
      log.microbatches = resolve(*log.run).batch.accumulation;
      if (values.contains("context_parallel_size") && values["context_parallel_size"] != "1") {
        log.notes.push_back("context parallelism is not modelled: ranks are mapped as tensor x data x pipeline");
      }
    } catch (const Error& error) {
      log.notes.push_back(fmt::format("the arguments block could not be read as a run ({}): no re-simulation",
                                      error.what()));
    } catch (const std::exception&) {
      log.notes.push_back("the arguments block's world_size is not a number: no re-simulation");
    }
  } else {
    log.notes.push_back("no arguments block (Megatron prints it at its start): each rank is taken as a pipeline "
                        "stage; give the run with --config for the layout");
  }
  if (by_global_rank.empty()) {
    fail("{}: {}", source,
         spread_only ? "the timers give the min and max over ranks, not each rank's: run Megatron-LM with "
                       "--timing-log-level 2 --timing-log-option all"
                     : "no per-rank timers (\"times across ranks (ms):\"): run Megatron-LM with --timing-log-level 2 "
                       "--timing-log-option all");
  }
  if (pp == 0) {
    pp = by_global_rank.empty() ? 1 : by_global_rank.rbegin()->first + 1;
  }
  std::map<int, RankTimes> by_rank;
  for (const auto& [global, timers] : by_global_rank) {
    for (const auto& [name, seconds] : timers) add_timer(by_rank[global], name, seconds);
  }
  log.ranks = stages_of_ranks(by_rank, tp * dp, pp, log.notes);
  for (const auto& [global, peak] : peak_by_global_rank) {
    const int stage = global / (tp * dp);
    if (stage < pp && log.ranks[stage]) {
      log.ranks[stage]->peak_memory_bytes = std::max(log.ranks[stage]->peak_memory_bytes.value_or(0), peak);
    }
  }
  return log;
}

// ---- DeepSpeed ----

constexpr double kMaxSteps = 1e12;

// A whole number >= 1 of DeepSpeed's printed configuration: "  KEY ........ N".
std::optional<double> printed_value(std::string_view line, std::string_view key) {
  const std::size_t at = line.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(at + key.size());
  if (rest.empty() || (rest.front() != ' ' && rest.front() != '.')) return std::nullopt;  // a longer key
  while (!rest.empty() && (rest.front() == '.' || rest.front() == ' ')) rest.remove_prefix(1);
  const std::optional<double> value = number_at(rest);
  if (!value || *value < 1 || *value > 1e9 || *value != std::floor(*value)) return std::nullopt;
  return value;
}

TimerLog read_deepspeed(const std::vector<std::string_view>& lines, const std::string& source) {
  TimerLog log;
  log.format = "DeepSpeed log";
  std::vector<std::int64_t> step_numbers;
  int steps_per_print = 0;  // as the printed configuration gives it; 0: not printed
  std::map<std::string, double> timers;  // the last print's, accumulated over its steps
  std::map<int, int> layers;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string_view line = lines[i];
    if (line.size() > kMaxLine) fail_line(source, i, "a line of more than 64 KiB: is it a log?");
    if (const std::optional<double> seconds = number_after(line, kDeepSpeedStep)) {
      const std::optional<double> step = number_after(line, "steps:");
      if (*seconds < 0 || !step || *step < 1 || *step > kMaxSteps || *step != std::floor(*step)) {
        fail_line(source, i, "a step line is \"steps: N loss: L iter time (s): T ...\" with N a step number >= 1");
      }
      if (!step_numbers.empty() && *step <= static_cast<double>(step_numbers.back())) {
        fail_line(source, i, fmt::format("step {} after step {}: the steps of one run increase (two runs in one log? "
                                         "give one run's)",
                                         *step, step_numbers.back()));
      }
      log.step_s.push_back(*seconds);
      step_numbers.push_back(static_cast<std::int64_t>(*step));
      continue;
    }
    if (const std::size_t at = line.find(kDeepSpeedTimes); at != std::string_view::npos) {
      const bool rank0 = line.find("[Rank 0]") != std::string_view::npos || line.find("rank=0 ") != std::string_view::npos;
      if (!rank0) continue;
      std::string_view rest = line.substr(at + kDeepSpeedTimes.size());
      while (!rest.empty()) {
        const std::size_t bar = rest.find('|');
        const std::string_view item = trim(rest.substr(0, bar));
        rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
        const std::size_t colon = item.find(':');
        if (colon == std::string_view::npos) fail_line(source, i, "a timer is \"NAME: MS\" between bars");
        timers[std::string(trim(item.substr(0, colon)))] = milliseconds(item.substr(colon + 1), source, i);
      }
      continue;
    }
    if (const std::size_t at = line.find("STAGE="); at != std::string_view::npos &&
                                                    line.find("LAYERS=") != std::string_view::npos) {
      const std::optional<double> stage = number_at(line.substr(at + 6));
      const std::optional<double> count = number_after(line, "LAYERS=");
      if (!stage || !count || *stage < 0 || *stage >= kMaxRanks || *count < 0) {
        fail_line(source, i, "a partition line is \"RANK=r STAGE=s LAYERS=n [a, b) STAGE_PARAMS=...\"");
      }
      layers[static_cast<int>(*stage)] = static_cast<int>(*count);
      continue;
    }
    if (const std::optional<double> m = printed_value(line, "gradient_accumulation_steps")) {
      log.microbatches = static_cast<int>(*m);
    }
    if (const std::optional<double> n = printed_value(line, "steps_per_print")) steps_per_print = static_cast<int>(*n);
  }
  if (log.step_s.empty()) {
    fail("{}: no \"steps: N loss: L iter time (s): T\" line: DeepSpeed's pipeline engine prints one every "
         "steps_per_print steps",
         source);
  }
  for (const auto& [stage, count] : layers) log.stage_layers.resize(std::max<std::size_t>(log.stage_layers.size(), stage + 1));
  for (const auto& [stage, count] : layers) log.stage_layers[stage] = count;
  const int stages = std::max<int>(1, static_cast<int>(log.stage_layers.size()));
  if (layers.empty()) {
    log.notes.push_back("no partition lines (RANK= STAGE= LAYERS=): the stage count is unknown; give the run with "
                        "--config");
  }
  log.ranks.resize(stages);
  // The timers accumulate over the steps since the last print: steps_per_print of them.
  std::int64_t per_print = steps_per_print;
  if (per_print < 1) {
    if (step_numbers.size() >= 2) {
      per_print = step_numbers.back() - step_numbers[step_numbers.size() - 2];
    } else {
      per_print = step_numbers.back();
      log.notes.push_back(fmt::format("steps_per_print is not in the log and it prints once: the timers are taken as "
                                      "accumulated over its {} steps",
                                      per_print));
    }
  }
  if (!timers.empty()) {
    const auto timer = [&](std::initializer_list<const char*> names) {
      for (const char* name : names) {
        if (timers.contains(name)) return timers[name] / per_print;
      }
      return 0.0;
    };
    RankTimes t;
    t.forward_s = timer({"fwd_microstep", "forward_microstep"});
    t.backward_s = timer({"bwd_microstep", "backward_microstep"});
    t.optimizer_s = timer({"step_microstep"});
    t.comm_s = timer({"pipe_send_output"}) + timer({"pipe_send_grad"}) + timer({"pipe_recv_input"}) +
               timer({"pipe_recv_grad"});
    log.ranks[0] = t;
  } else {
    fail("{}: no timers (\"[Rank 0] time (ms) | ...\"): set \"wall_clock_breakdown\": true in the DeepSpeed "
         "configuration",
         source);
  }
  if (stages > 1) {
    log.notes.push_back(fmt::format("DeepSpeed prints rank 0's timers only: stages 1 to {} are not seen", stages - 1));
  }
  return log;
}

// ---- Ascend (torch_npu's step_trace_time.csv, msprof-analyze's cluster_step_trace_time.csv) ----

constexpr std::string_view kAscendComputing = "Computing";
constexpr std::string_view kAscendNotOverlapped = "Communication(Not Overlapped)";

std::vector<std::string_view> csv_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  while (true) {
    const std::size_t comma = line.find(',');
    fields.push_back(trim(line.substr(0, comma)));
    if (comma == std::string_view::npos) return fields;
    line.remove_prefix(comma + 1);
  }
}

bool is_ascend_step_trace(std::string_view text) {
  const std::string_view header = trim(text.substr(0, text.find('\n')));
  const std::vector<std::string_view> fields = csv_fields(header);
  const auto has = [&](std::string_view name) { return std::find(fields.begin(), fields.end(), name) != fields.end(); };
  return has("Step") && has(kAscendComputing) && has(kAscendNotOverlapped) && has("Free");
}

TimerLog read_ascend_step_trace(const std::vector<std::string_view>& lines, const std::string& source) {
  TimerLog log;
  log.format = "Ascend step trace";
  const std::vector<std::string_view> header = csv_fields(lines.front());
  const auto column = [&](std::string_view name) -> std::optional<std::size_t> {
    const auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? std::nullopt : std::optional<std::size_t>(it - header.begin());
  };
  const std::size_t step = *column("Step"), computing = *column(kAscendComputing),
                    not_overlapped = *column(kAscendNotOverlapped), free = *column("Free");
  const std::optional<std::size_t> type = column("Type"), index = column("Index"), bubble = column("Bubble"),
                                   stage = column("Stage"), device = column("Device_id");
  log.one_device = !type;
  // A cluster's file has a row per step and rank ("rank") or stage ("stage"): the stages' rows where there are
  // any. A device's own file has a row per step.
  bool stage_rows = false;
  for (std::size_t i = 1; i < lines.size() && type; ++i) {
    const std::vector<std::string_view> f = csv_fields(lines[i]);
    stage_rows = stage_rows || (f.size() > *type && f[*type] == "stage");
  }
  const std::string_view kind = stage_rows ? "stage" : "rank";
  struct Sum {
    RankTimes times;
    int steps = 0;
  };
  std::map<int, Sum> by_index;
  std::map<std::int64_t, double> step_s;  // the slowest index's time per step
  const auto microseconds = [&](std::string_view field, std::size_t line) {
    return seconds(field, 1e-6, "microseconds", source, line);
  };
  for (std::size_t i = 1; i < lines.size(); ++i) {
    if (trim(lines[i]).empty()) continue;
    const std::vector<std::string_view> f = csv_fields(lines[i]);
    if (f.size() < header.size()) fail_line(source, i, fmt::format("{} fields, the header has {}", f.size(), header.size()));
    if (type && f[*type] != kind) continue;
    const double number = index ? number_at(f[*index]).value_or(-1) : 0;
    const std::optional<double> step_number = number_at(f[step]);
    if (number < 0 || number >= kMaxRanks || !step_number || *step_number < 0 || *step_number > 1e12) {
      fail_line(source, i, "Step and Index are whole numbers >= 0");
    }
    if (device && !log.device_id) {
      const std::optional<double> id = number_at(f[*device]);
      if (!id || *id < 0 || *id >= kMaxRanks || *id != std::floor(*id)) {
        fail_line(source, i, fmt::format("Device_id \"{}\" is not a device's index (a whole number >= 0)", f[*device]));
      }
      log.device_id = static_cast<int>(*id);
    }
    const double compute = microseconds(f[computing], i);
    const double comm = microseconds(f[not_overlapped], i);
    const double idle = microseconds(f[free], i);
    RankTimes row;
    // Ascend does not split the computing time into forward and backward: a backward twice its forward.
    row.forward_s = compute / 3;
    row.backward_s = 2 * compute / 3;
    row.comm_s = comm;
    if (bubble) row.receive_s = microseconds(f[*bubble], i);
    if (stage) row.stage_s = microseconds(f[*stage], i);
    Sum& sum = by_index[static_cast<int>(number)];
    add_times(sum.times, row);
    ++sum.steps;
    double& s = step_s[static_cast<std::int64_t>(*step_number)];
    s = std::max(s, compute + comm + idle);
  }
  if (by_index.empty()) fail("{}: no rows of {}s", source, kind);
  const int count = by_index.rbegin()->first + 1;
  log.ranks.resize(count);
  for (auto& [i, sum] : by_index) log.ranks[i] = mean_times(sum.times, sum.steps);
  for (const auto& [number, seconds] : step_s) log.step_s.push_back(seconds);
  log.notes.push_back("Ascend's step trace does not split computing into forward and backward: taken as 1 to 2");
  if (!stage_rows && by_index.size() > 1) {
    log.notes.push_back("the file has no stage rows: each rank is taken as a pipeline stage (give --config for the "
                        "layout)");
  }
  return log;
}

}  // namespace

bool is_timer_log(std::string_view text) {
  const std::string_view head = text.substr(0, std::min<std::size_t>(text.size(), std::size_t{64} << 20));
  return head.find(kMegatronIteration) != std::string_view::npos ||
         head.find(kDeepSpeedStep) != std::string_view::npos || is_ascend_step_trace(text);
}

TimerLog read_timer_log(std::string_view text, const std::string& source) {
  const std::vector<std::string_view> lines = lines_of(text);
  if (is_ascend_step_trace(text)) return read_ascend_step_trace(lines, source);
  if (text.find(kMegatronIteration) != std::string_view::npos) return read_megatron(lines, source);
  if (text.find(kDeepSpeedStep) != std::string_view::npos) return read_deepspeed(lines, source);
  fail("{}: not a Megatron-LM or DeepSpeed log (no iteration time line) nor an Ascend step_trace_time.csv", source);
}

TimerLog merge_device_logs(std::vector<DeviceLog> devices, int replicas, int stages) {
  if (devices.empty()) fail("internal: no device's log to merge");
  std::sort(devices.begin(), devices.end(), [](const DeviceLog& a, const DeviceLog& b) { return a.rank < b.rank; });
  TimerLog log;
  log.format = devices.front().log.format + fmt::format(" ({} devices)", devices.size());
  log.notes = devices.front().log.notes;
  if (stages == 0) stages = devices.back().rank / replicas + 1;
  std::map<int, RankTimes> by_rank;
  const std::size_t steps = devices.front().log.step_s.size();
  log.step_s.assign(steps, 0.0);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const DeviceLog& d = devices[i];
    if (i > 0 && devices[i - 1].rank == d.rank) {
      fail("{} and {} are both rank {}: give one job's devices, one file each", devices[i - 1].source, d.source,
           d.rank);
    }
    if (d.log.ranks.size() != 1 || !d.log.ranks.front()) fail("{}: not one device's step trace", d.source);
    if (d.log.step_s.size() != steps) {
      fail("{} has {} steps and {} {}: give the devices' traces of the same steps", d.source, d.log.step_s.size(),
           devices.front().source, steps);
    }
    if (d.rank / replicas >= stages) {
      fail("{}: rank {} is past the {} ranks of {} stages x {} replicas: give the run's layout (--config)", d.source,
           d.rank, stages * replicas, stages, replicas);
    }
    by_rank[d.rank] = *d.log.ranks.front();
    for (std::size_t s = 0; s < steps; ++s) log.step_s[s] = std::max(log.step_s[s], d.log.step_s[s]);
  }
  log.ranks = stages_of_ranks(by_rank, replicas, stages, log.notes);
  for (int s = 0; s < stages; ++s) {
    if (!log.ranks[s]) log.notes.push_back(fmt::format("no device of stage {} among the files", s));
  }
  return log;
}

}  // namespace pipeflow
