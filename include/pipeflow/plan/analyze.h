#pragma once

#include <array>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pipeflow/plan/job_log.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/prediction.h"
#include "pipeflow/sim/run_metadata.h"
#include "pipeflow/trace/event.h"

namespace pipeflow {

// `pipeflow analyze`: reads one step's trace back, says where its time went,
// and predicts what each change would gain by re-simulating the changed
// setup (docs/ANALYZE.md).
//
// The figures of the trace itself come from its events (any Chrome trace
// whose events carry pipeline actions, args.action, as pipeflow writes
// them). The advice needs the run behind the trace: the run metadata that
// `pipeflow train` and `pipeflow simulate` write into it (sim/run_metadata.h).

// How a trace was read: what pipeflow's own traces need no word on, and
// what another program's (a PyTorch profiler trace per rank) needs said.
struct TraceReading {
  std::string format;                  // "pipeflow", "PyTorch profiler (Kineto)", ...
  std::vector<std::string> files;      // the files read
  std::optional<int> step;             // the ProfilerStep taken
  std::vector<int> steps;              // the steps every rank's trace has
  std::vector<double> step_spans_s;    // per such step, its span over the ranks
  std::vector<double> clock_offset_s;  // per rank, the shift that put the ranks on one clock
  std::vector<std::pair<double, double>> clock_window_s;  // MergedTrace::clock_window_s
  std::vector<std::optional<double>> peak_memory_bytes;  // per rank, measured
  std::vector<std::string> notes;      // what was aligned, skipped, or could not be seen
};

// A trace (or a log) and what it says about its run.
struct TraceInput {
  std::string source;  // the file (or folder) read
  Timeline timeline;   // empty for a log
  std::optional<TimerLog> log;     // a Megatron-LM or DeepSpeed log's timers, instead of a timeline
  std::optional<RunMetadata> run;  // absent: the trace has no otherData.pipeflow, no --config
  TraceReading reading;
};

// A trace file is read up to this size (inflated), and a folder up to this many files.
inline constexpr std::size_t kMaxTraceFileBytes = std::size_t{1} << 30;
inline constexpr std::size_t kMaxTraceFiles = 4096;

struct TraceOptions {
  std::optional<int> step;  // the ProfilerStep of a PyTorch trace; none: the last every rank has
  // The run behind another program's trace, as a pipeflow configuration
  // (measured_run): what the advice re-simulates. A pipeflow trace carries its own.
  std::optional<std::filesystem::path> config;
};

// `paths`: a Chrome-trace file of pipeflow's, a run directory of `pipeflow
// train` (its trace.json), PyTorch profiler traces, one per rank (files,
// .json.gz too, or folders of them; torch_trace.h), or a Megatron-LM or
// DeepSpeed log (job_log.h). The format is told by the content, not the
// name. Throws Error naming the path for what is not there or not a trace,
// and for a mix of formats.
TraceInput load_trace_input(const std::vector<std::filesystem::path>& paths, const TraceOptions& options = {});

// Where one rank's step went. busy + comm + wait + flush + idle = the step
// (the timeline's makespan); idle + wait = fill + stall + drain.
struct RankUsage {
  double busy_s = 0;   // F, B, I, W
  // Of busy_s: tensor-parallel collectives inside the actions (pipeflow's
  // tensor_parallel events), communication that the action's span holds.
  double tensor_parallel_s = 0;
  double comm_s = 0;   // send and receive events (the rank held by a transfer)
  double wait_s = 0;   // wait events: a send or receive waiting for its partner
  double flush_s = 0;  // the data-parallel reduction (where no earlier event covers it) and the optimizer step
  double idle_s = 0;   // no event
  // Idle and waits by phase: the warm-up runs until the rank's first backward (B or
  // I) starts, the cool-down from its last forward's end; between them is
  // the steady state. With equal stage costs and free messages GPipe's and
  // 1F1B's idle is all fill and drain, and a stall is a slow stage or link.
  double fill_s = 0;   // idle in the warm-up
  double stall_s = 0;  // idle in the steady state
  double drain_s = 0;  // idle in the cool-down
};

// The chain of actions that set the step's length, walked back from the
// action that ends last: each action's predecessor is whichever ended later
// of the previous compute action on its rank and the action whose output it
// needs (F: the previous stage's F; B or I: the next stage's B or I, the last
// stage's own F; W: its own I).
struct CriticalPath {
  std::vector<std::string> actions;  // first to last, in the action IR's text
  double length_s = 0;               // first start to last end
  double compute_s = 0;              // the actions' own durations
  std::vector<double> compute_by_stage_s;  // of compute_s, per stage
};

// A change to the run and what re-simulating it predicts.
struct Advice {
  std::string kind;     // "partition", "microbatches", "schedule", "recompute", "overlap"
  std::string finding;  // what the trace shows that this addresses
  std::string change;   // what to change, as the keys or flags to set
  std::vector<std::string> details;  // e.g. which layers move where
  Layout layout;        // the changed setup, as re-simulated
  double step_time_s = 0;
  double tokens_per_s = 0;
  double bubble_ratio = 0;
  double peak_memory_bytes = 0;  // the largest rank's
  double gain = 0;               // tokens/s over the re-simulated run's, minus 1
};

struct Analysis {
  std::string source;
  std::string title;
  std::string time_unit = "s";
  int num_ranks = 0;
  double step_s = 0;  // the timeline's makespan
  std::vector<RankUsage> ranks;
  double bubble = 0;  // 1 − Σ busy / (ranks · step), or as bubble_source says
  // Empty: the bubble is 1 − Σ busy / (ranks · step). Else where it came
  // from: an Ascend log's Bubble column (Σ receive time / (ranks · step)).
  std::string bubble_source;
  double fill_drain_share = 0;  // Σ (fill + drain) / (ranks · step)
  double stall_share = 0;       // Σ stall / (ranks · step)
  double comm_wait_share = 0;   // Σ (comm + wait) / (ranks · step)
  double tensor_parallel_share = 0;  // Σ tensor_parallel_s / (ranks · step): inside the actions
  bool idle_by_phase = true;    // false: a log's totals, whose idle is not split into fill, stall and drain
  std::vector<bool> rank_seen;  // per rank, whether the input has its times (DeepSpeed's log: rank 0's only)
  std::vector<double> stage_compute_s;  // compute per stage over the step, from the actions
  double imbalance = 1;                 // slowest stage over the mean (1: balanced)
  CriticalPath critical_path;

  // From the run metadata (absent: none in the trace).
  std::optional<Prediction> baseline;  // the run re-simulated unchanged
  // The schedule's own bubble: its execution with every stage's costs the
  // mean stage's and free messages (GPipe's and 1F1B's (p−1)/(m+p−1)).
  std::optional<double> theoretical_bubble;
  std::vector<double> peak_memory_bytes;  // per rank, the re-simulation's
  double memory_skew = 1;                 // largest over smallest: measured where the trace has it
  // Highest gain first. A change whose peak memory exceeds both the
  // device's and the run's is not advice but a note.
  std::vector<Advice> advice;
  std::vector<std::string> notes;  // what could not be done, and why
  TraceReading reading;            // the input's
};

// What a trace or log measured of one stage: per compute kind F, B, I, W,
// one micro-batch's duration, and the optimizer step; none: not seen.
struct MeasuredStage {
  std::array<std::optional<double>, 4> duration_s;
  std::optional<double> optimizer_s;
};

// The run a configuration describes with the measured durations; the rest
// (memory, messages, the link) the cost model's, and a stage not seen the
// cost model's scaled as the seen stages' measured over modelled. Throws
// Error naming `source` when the configuration's stages are not the trace's.
RunMetadata measured_run(const RunConfig& config, const std::vector<MeasuredStage>& stages, const std::string& source);
// From a timeline: per stage and kind, the mean over its micro-batches, and
// the optimizer events of the stage's rank. Throws Error naming `source`
// when the configuration's stages or micro-batches are not the trace's.
RunMetadata measured_run(const RunConfig& config, const Timeline& timeline, const std::string& source);
// From a log: a rank's forward and backward timers over its micro-batches
// (and chunks). Throws Error when the configuration's pipeline ranks or
// micro-batches are not the log's.
RunMetadata measured_run(const RunConfig& config, const TimerLog& log, const std::string& source);

// The measured run of `path` under `config`: a profile (profile.json, as
// train writes it), or anything load_trace_input reads (pipeflow's trace,
// PyTorch traces, a Megatron-LM or DeepSpeed log), whose measured durations
// are set into `config` (measured_run). For `simulate --profile` and `sweep
// --profile`.
RunMetadata measured_run_from(const std::filesystem::path& path, const RunConfig& config);

// The run `path` measured, under its own configuration: `config` (the run's,
// as a pipeflow configuration) where given, else the one the input states (a
// pipeflow trace's otherData.pipeflow, a Megatron-LM log's arguments block).
// For `plan --profile` and `simulate --profile-config`, which predict other
// layouts from it (Resimulator). Throws Error naming `config_flag` when
// neither gives the run, and for a trace whose costs are the cost model's
// (pipeflow simulate's without --profile): nothing measured.
RunMetadata measured_run_of(const std::filesystem::path& path, const std::optional<std::filesystem::path>& config,
                            std::string_view config_flag);

// The largest rank's predicted peak memory, in bytes.
double peak_memory(const Prediction& p);
// The slowest stage's compute (F + B + I + W of a micro-batch) over the
// stages' mean, in a prediction's costs: 1 is balanced.
double modelled_imbalance(const Prediction& p);

// Analyses `input`. Throws Error for a timeline without events, or run
// metadata whose configuration does not resolve.
Analysis analyze(const TraceInput& input);

// The run a metadata record describes, and its re-simulation: the cost
// model, or the measured costs when the trace has them. A changed partition,
// other work per micro-batch (model, micro-batch, sequence, tensor
// parallelism, recompute, precision, hardware), or a split backward (I, W)
// where the run measured full ones, takes the
// cost model's durations scaled by the measured over modelled total of each
// action kind (I and W by B's when the run had none), and its optimizer
// steps by the optimizer's.
class Resimulator {
 public:
  explicit Resimulator(const RunMetadata& run);
  const Layout& layout() const { return layout_; }
  Prediction predict(const Layout& changed) const;
  // The measured costs `changed` runs with (predict's): none without
  // measured costs; `schedule` and `modelled` are changed's
  // (layout_schedule, layout_costs; the schedule's actions are read only
  // where the run's own durations could hold: same work, same cut).
  std::optional<MeasuredProfile> profile_for(const Layout& changed) const;
  std::optional<MeasuredProfile> profile_for(const Layout& changed, const Schedule& schedule,
                                             const LayoutCosts& modelled) const;
  // Whether `changed` does the run's work per micro-batch on the run's
  // partition (`modelled`, its costs, gives its cut): then the measured
  // durations are its own, but for a split backward the run did not measure.
  bool does_the_runs_work(const Layout& changed, const LayoutCosts& modelled) const;
  bool measured() const { return measured_.has_value(); }
  // Per compute kind F, B, I, W: measured over modelled (1 without measured costs).
  double scale(ActionKind kind) const;
  double optimizer_scale() const { return optimizer_scale_; }

 private:
  Layout layout_;
  std::optional<MeasuredProfile> measured_;
  std::vector<int> boundaries_;  // the run's partition
  std::vector<double> scale_;    // per compute kind F, B, I, W: measured / modelled
  double optimizer_scale_ = 1;   // the optimizer step's, measured / modelled
  bool measured_split_ = false;  // the run measured I and W
};

// The terminal summary, the JSON form (pretty, 2 spaces) and a
// self-contained HTML page (inline SVG timeline, tables, the advice).
std::string analysis_text(const Analysis& analysis);
std::string analysis_json(const Analysis& analysis);
std::string analysis_html(const Analysis& analysis, const Timeline& timeline);

// `analyze --compare A B`: two runs' figures side by side (before and after
// a change) with B's change over A's; per stage, compute and peak memory.
std::string comparison_text(const Analysis& before, const Analysis& after);
std::string comparison_json(const Analysis& before, const Analysis& after);

}  // namespace pipeflow
