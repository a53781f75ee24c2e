#include "train/run_outputs.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <memory>

#include "pipeflow/core/file.h"
#include "train/metrics_log.h"
#include "pipeflow/sim/profile.h"
#include "pipeflow/sim/run_metadata.h"
#include "pipeflow/trace/chrome_trace.h"
#include "pipeflow/trace/svg.h"

namespace pipeflow::runtime {

std::vector<std::filesystem::path> write_run_outputs(
    const RunRecord& record, const MeasuredProfile& profile, const StepResult& last, const std::string& earlier_metrics,
    const std::function<void(const std::filesystem::path&)>& write_weights) {
  const TrainSettings& settings = *record.settings;
  const Schedule& schedule = *record.schedule;
  const std::filesystem::path& dir = settings.out_dir;
  const std::string step_name = fmt::format("step {}", last.step);
  Timeline measured =
      settings.emulate
          ? timeline_from_execution(schedule, replay(schedule, last),
                                    fmt::format("{} emulated (one core per rank), {}", schedule.name(), step_name))
          : measured_timeline(last, schedule.num_ranks(), fmt::format("{} measured, {}", schedule.name(), step_name),
                              false);
  const Timeline predicted = timeline_from_execution(
      schedule, record.prediction->execution,
      fmt::format("{} predicted from measured action costs", schedule.name()));
  std::vector<std::filesystem::path> files;
  auto write = [&](const std::string& name, const std::string& content) {
    write_file_atomic(dir / name, content);
    files.push_back(dir / name);
  };
  write("metrics.jsonl", earlier_metrics + metrics_jsonl(record.log));
  write("timeline.svg", render_svg(measured));  // the pipeline: its title's bubble is bubble_measured
  if (!settings.emulate) {
    measured = measured_timeline(last, schedule.num_ranks(), measured.title + ", with the flush", true);
  }
  measured.run_metadata =
      std::make_shared<const nlohmann::json>(run_metadata_json(settings.config, profile, true, "pipeflow train"));
  write("trace.json", write_chrome_trace(measured));
  write("predicted.svg", render_svg(predicted));
  write("profile.json", profile_to_json(profile));
  write("run_config.json", settings.config_text);
  write_weights(dir / "weights.safetensors");
  files.push_back(dir / "weights.safetensors");
  write("report.md", training_report(record));
  return files;
}

}  // namespace pipeflow::runtime
