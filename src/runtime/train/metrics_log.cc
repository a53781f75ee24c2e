#include "train/metrics_log.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <sstream>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"

namespace pipeflow::runtime {
namespace {

// A step's prediction and figures per rank.
void add_trace_figures(const StepLog& log, nlohmann::ordered_json& json) {
  json["tokens_per_s_predicted"] = log.tokens_per_s_predicted;
  json["bubble_measured"] = log.bubble_measured;
  json["bubble_predicted"] = log.bubble_predicted;
  json["ideal_fraction"] = log.ideal_fraction;
  json["busy_s"] = log.busy_s;
  json["busy_predicted_s"] = log.busy_predicted_s;
  json["idle_s"] = log.idle_s;
  json["idle_predicted_s"] = log.idle_predicted_s;
  json["comm_s"] = log.comm_s;
  json["off_core_s"] = log.off_core_s;
  json["wake_s"] = log.wake_s;
  if (!log.data_parallel_s.empty()) {
    json["data_parallel_s"] = log.data_parallel_s;
    json["data_parallel_early_s"] = log.data_parallel_early_s;
  }
  if (!log.tensor_parallel_s.empty()) {
    json["tensor_parallel_s"] = log.tensor_parallel_s;
    json["tensor_parallel_predicted_s"] = log.tensor_parallel_predicted_s;
  }
  json["peak_activation_bytes"] = log.peak_activation_bytes;
  json["peak_activation_bytes_predicted"] = log.peak_activation_bytes_predicted;
}

nlohmann::ordered_json to_json(const StepLog& log) {
  nlohmann::ordered_json json;
  json["step"] = log.step;
  json["loss"] = log.loss;
  json["lr"] = log.lr;
  json["grad_norm"] = log.grad_norm;
  json["step_time_s"] = log.step_time_s;
  json["step_time_predicted_s"] = log.step_time_predicted_s;
  json["tokens_per_s"] = log.tokens_per_s;
  add_trace_figures(log, json);
  if (log.val_loss) json["val_loss"] = *log.val_loss;
  if (log.skipped) json["skipped"] = true;
  if (log.loss_scale) json["loss_scale"] = *log.loss_scale;
  if (log.overflow) json["overflow"] = true;
  if (log.grad_square_small) json["grad_square_small"] = *log.grad_square_small;
  if (log.grad_square_big) json["grad_square_big"] = *log.grad_square_big;
  // The key `pipeflow advise-batch --metrics` reads (plan/advise_batch.h).
  if (log.noise_scale) json["noise_scale"] = *log.noise_scale;
  return json;
}

}  // namespace

std::string metrics_jsonl(const std::vector<StepLog>& log) {
  std::string text;
  for (const StepLog& line : log) text += json_text(to_json(line)) + "\n";
  return text;
}

std::string earlier_metrics(const std::filesystem::path& path, std::int64_t before) {
  if (!std::filesystem::exists(path)) return "";
  std::istringstream lines(read_file(path, kMaxMetricsFileBytes, "metrics file"));
  std::string kept;
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    nlohmann::json json;
    try {
      json = parse_json(line, fmt::format("{} line {}", path.string(), number));
    } catch (const Error&) {
      json = nullptr;  // reported below, as any other line that is no metrics line
    }
    if (!json.is_object() || !json.contains("step") || !json["step"].is_number_integer()) {
      fail("{} line {} is no metrics line (JSON with a \"step\"): move the file away or resume into another "
           "out_dir",
           path.string(), number);
    }
    if (json["step"].get<std::int64_t>() < before) kept += line + "\n";
  }
  return kept;
}

}  // namespace pipeflow::runtime
