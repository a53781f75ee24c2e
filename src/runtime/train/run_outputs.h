#pragma once

#include <array>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/runtime/report.h"

namespace pipeflow::runtime {

// Writes what a finished training run leaves in `record.settings->out_dir`
// (each file atomically; see train() in trainer.h): metrics.jsonl
// (`earlier_metrics`, then this run's lines), timeline.svg and trace.json
// of `last` (replayed with --emulate; the trace carries the run's metadata,
// sim/run_metadata.h), predicted.svg, profile.json (`profile`: the measured
// costs, measured_profile), run_config.json (the resolved configuration,
// settings.config_text), weights.safetensors (by `write_weights`, given the
// path) and report.md. Returns the paths written.
// The names of the files write_run_outputs writes, in its order.
inline constexpr std::array<std::string_view, 8> kRunOutputFiles = {
    "metrics.jsonl", "timeline.svg",        "trace.json", "predicted.svg", "profile.json",
    "run_config.json", "weights.safetensors", "report.md"};

std::vector<std::filesystem::path> write_run_outputs(
    const RunRecord& record, const MeasuredProfile& profile, const StepResult& last, const std::string& earlier_metrics,
    const std::function<void(const std::filesystem::path&)>& write_weights);

}  // namespace pipeflow::runtime
