#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "pipeflow/trace/event.h"

namespace pipeflow {

// Chrome trace JSON (the Trace Event Format that chrome://tracing and
// Perfetto open): {"traceEvents": [{"name", "cat", "ph": "X", "pid", "tid",
// "ts", "dur", "args"}], "displayTimeUnit", "otherData"}. Times are in
// microseconds; one process (pid 0) with one track per rank (tid = rank,
// named "rank r" by a thread_name metadata event); "cat" is the event
// category's name and args.action the action's text when there is one. The
// title, the number of ranks and the run metadata (otherData.pipeflow) travel in otherData, so that
// read_chrome_trace(write_chrome_trace(t)) gives t back.
std::string write_chrome_trace(const Timeline& timeline);

// The most events a trace is written with. Measured at the limit (simulate,
// 4 stages x 125 000 micro-batches, F and B): about 140 bytes an event in the file
// (136 MB, an eighth of what analyze reads, kMaxTraceFileBytes) and 1.5 KB an
// event in memory while the timeline is built and written (1.5 GB).
inline constexpr std::size_t kMaxChromeTraceEvents = 1'000'000;

// Throws Error for a trace of more than kMaxChromeTraceEvents events, with
// the size it would have and `fix`: a caller refuses before building the
// timeline.
void check_chrome_trace_events(std::size_t events, std::string_view fix);

// Reads the "X" events of a Chrome trace (other phases are skipped). Throws
// Error naming the source and the event index for a malformed event.
// Traces of other programs: an event without args.action whose name is an
// action in PyTorch pipelining's text form ("0F1", "1B0", "2I3") is that
// action, and a "cat" that is none of pipeflow's categories is then taken
// from the action's kind (tid must still be the pipeline rank).
Timeline read_chrome_trace(std::string_view text, const std::string& source);
// The same, of a trace already parsed.
Timeline chrome_trace_timeline(const nlohmann::json& trace, const std::string& source);

}  // namespace pipeflow
