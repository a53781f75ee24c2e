// A PyTorch profiler trace (Kineto, legacy or Ascend layout), read as rank 0
// and, a copy, as rank 1, then merged: the reader, the clock alignment, the
// step cut and the wait split.
#include "fuzz_target.h"
#include "pipeflow/core/json.h"
#include "pipeflow/trace/torch_trace.h"

#include <nlohmann/json.hpp>

namespace {

void read_and_merge(std::string_view text) {
  const nlohmann::json trace = pipeflow::parse_json(text, "fuzz.json");
  pipeflow::RankTrace first = pipeflow::read_torch_trace(trace, "rank0.json", 0);
  pipeflow::RankTrace second = first;
  second.rank = 1;
  for (pipeflow::TraceEvent& e : second.events) e.rank = pipeflow::RankId(1);
  second.pipeline_group.clear();
  first.pipeline_group.clear();
  first.rank = 0;
  pipeflow::merge_rank_traces({first, second}, std::nullopt);
}

}  // namespace

PIPEFLOW_FUZZ_READER(read_and_merge(text))
