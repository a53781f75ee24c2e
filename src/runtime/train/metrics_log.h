#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "pipeflow/runtime/trainer.h"

namespace pipeflow::runtime {

// metrics.jsonl: one JSON object per StepLog, one line each (the keys of
// docs/RUNTIME.md, in StepLog's order; `val_loss` only on validation steps).
std::string metrics_jsonl(const std::vector<StepLog>& log);

// The lines of an earlier run's metrics.jsonl at `path` before step
// `before`, so that a run resumed into the same out_dir keeps the history
// it continues ("" when there is no file). Throws Error naming the line
// when one is not a metrics line.
std::string earlier_metrics(const std::filesystem::path& path, std::int64_t before);

}  // namespace pipeflow::runtime
