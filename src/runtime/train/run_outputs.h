#pragma once

#include <array>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/report.h"

namespace pipeflow::runtime {

// Writes what a finished training run leaves in `record.settings->out_dir`
// (each file atomically; see train() in trainer.h): metrics.jsonl
// (`earlier_metrics`, then this run's lines), timeline.svg and trace.json
// of `last` (replayed with --emulate; the trace carries the run's metadata,
// sim/run_metadata.h), predicted.svg, profile.json, run_config.json (the
// resolved configuration, settings.config_text), weights.safetensors
// (`model`: the engine's, assembled) and report.md. Returns the paths written.
// The names of the files write_run_outputs writes, in its order.
inline constexpr std::array<std::string_view, 8> kRunOutputFiles = {
    "metrics.jsonl", "timeline.svg",        "trace.json", "predicted.svg", "profile.json",
    "run_config.json", "weights.safetensors", "report.md"};

std::vector<std::filesystem::path> write_run_outputs(const RunRecord& record, const PipelineEngine& engine,
                                                     const nn::Stage& model, const StepResult& last,
                                                     const std::string& earlier_metrics);

}  // namespace pipeflow::runtime
