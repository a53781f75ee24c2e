#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pipeflow/trace/event.h"

namespace pipeflow {

// PyTorch profiler traces, one file per rank, read into pipeflow's timeline
// (docs/ANALYZE.md, "Traces of other programs"). Three layouts:
//   Kineto:  {"traceEvents": [...], "distributedInfo": {"rank", "world_size",
//            "pg_config"}, "baseTimeNanoseconds"}; "ts" in microseconds, after
//            baseTimeNanoseconds where it is given;
//   legacy:  the autograd profiler's (torch built without Kineto): a bare list of
//            events, "ts" in microseconds from the process's own profiler start;
//   Ascend:  torch_npu's trace_view.json: a bare list, "ts" often a string.
// What becomes an event of the timeline:
//   - a pipeline action, named as torch.distributed.pipelining labels them:
//     "PP:" + the action ("PP:2F0", "PP:1RECV_B3"), "Forward {i}" / "Backward {i}"
//     (the rank's own stage), or the action's bare text ("0F1"); where the
//     device's copies of the labels ("gpu_user_annotation") are there, those;
//   - a collective kernel outside every action: NCCL's ("nccl...") by its
//     args "Collective name", HCCL's by its name ("hcom_send__", "hcom_receive__",
//     "hcom_allReduce__"); "PP:sREDUCE_GRAD", "PP:sUNSHARD", "PP:sRESHARD" as
//     collectives;
//   - "Optimizer.step#..." as the optimizer.
// "ProfilerStep#N" spans mark the steps; "[memory]" instant events ("Total
// Allocated") the peak memory.

// A step of one rank: the span of its ProfilerStep#N.
struct ProfilerStep {
  int number = 0;
  double start_s = 0;
  double end_s = 0;
};

// One rank's trace as read, times in seconds on the file's own clock.
struct RankTrace {
  std::string source;
  std::string layout;        // "Kineto", "legacy profiler", "Ascend"
  int rank = 0;              // the pipeline rank: events' rank
  std::optional<int> global_rank;            // distributedInfo.rank
  std::vector<int> pipeline_group;           // the global ranks of its pipeline group, where the trace says
  std::vector<TraceEvent> events;            // by start
  std::vector<ProfilerStep> steps;           // by number
  std::optional<double> peak_memory_bytes;   // the largest "Total Allocated"
  int unread_actions = 0;                    // "PP:" labels that name no action pipeflow knows
};

// Whether `trace` (parsed JSON) is a PyTorch or Ascend profiler trace, not
// pipeflow's own: a list of events (one of its first 16 elements an object
// with a "ph"), or an object with distributedInfo, schemaVersion or
// deviceProperties.
bool is_torch_trace(const nlohmann::json& trace);

// The rank a file's name gives: torchtitan's "rank{R}_trace.json", Megatron's
// "rank-{R}.json.gz", "rank_{R}"; none for tensorboard's "{host}_{pid}.{ns}...".
std::optional<int> rank_in_file_name(std::string_view file_name);

// Reads one rank's trace. The rank is the pipeline group's index of
// distributedInfo.rank where pg_config names the pipeline group ("mesh_pp",
// a description with "pipeline" or ending "_pp"), else distributedInfo.rank,
// else `name_rank`. Throws Error naming `source` when none gives it, and for
// a malformed event (with its index).
RankTrace read_torch_trace(const nlohmann::json& trace, const std::string& source, std::optional<int> name_rank);

// The ranks' traces on one clock, cut to one step.
struct MergedTrace {
  Timeline timeline;                       // the step, every rank; starts at 0
  std::optional<int> step;                 // the ProfilerStep chosen; none: the traces mark no steps
  std::vector<int> steps;                  // the steps every rank has
  std::vector<double> step_spans_s;        // per such step, first event to last over the ranks
  std::vector<double> clock_offset_s;      // per rank, added to its times (rank 0's is 0)
  // Per rank r >= 1, what the messages allow for its offset minus rank r-1's:
  // [lower, upper], infinite where nothing bounds it (rank 0's: [0, 0]).
  std::vector<std::pair<double, double>> clock_window_s;
  std::vector<std::optional<double>> peak_memory_bytes;  // per rank
  std::vector<std::string> notes;          // what was aligned, skipped or could not be seen
};

// Merges one pipeline's traces (one per pipeline rank, 0..n-1). Clocks:
// rank r+1's offset against rank r is bounded by the data each passes the
// other -- a stage's F starts after the previous stage's F of that
// micro-batch ended, its B ends before the previous stage's B starts, a
// receive ends after its send started -- and is the middle of those bounds
// (the bounds' width is the messages' time); with no bound, the ranks'
// starts of the step are aligned. `step`: the ProfilerStep to take; none:
// the last that every rank has. A receive whose send started later becomes
// a wait up to the send's start. Throws Error for a missing or repeated rank,
// or a step not in every trace.
MergedTrace merge_rank_traces(std::vector<RankTrace> ranks, std::optional<int> step);

}  // namespace pipeflow
