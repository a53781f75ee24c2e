#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_options.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/table.h"
#include "pipeflow/core/units.h"
#include "pipeflow/model/partition.h"

namespace pipeflow::cli {
namespace {

struct PartitionCommand {
  ModelOptions options;
  int stages = 0;
  std::string method = "parameters";  // DeepSpeed's default, as train, generate and grad
  std::string hardware = "a100-80g";
  bool json = false;
};

nlohmann::ordered_json to_json(const ModelSpec& spec, const PartitionCommand& command, const Partition& partition) {
  nlohmann::ordered_json json;
  json["model"] = spec.name;
  json["method"] = command.method;
  json["hardware"] = command.hardware;
  json["boundaries"] = partition.boundaries;
  json["max_stage_seconds"] = partition.max_stage_seconds();
  json["stages"] = nlohmann::ordered_json::array();
  for (const StagePlan& stage : partition.stages) {
    json["stages"].push_back({{"first", stage.first},
                              {"end", stage.end},
                              {"layers", stage.layer_names},
                              {"parameters", stage.parameters},
                              {"model_flops", stage.model_flops},
                              {"hardware_flops", stage.hardware_flops},
                              {"seconds", stage.seconds}});
  }
  return json;
}

std::string layer_span(const StagePlan& stage) {
  const std::string& first = stage.layer_names.front();
  return stage.layer_names.size() == 1 ? first : first + " .. " + stage.layer_names.back();
}

std::string text_report(const ModelSpec& spec, const PartitionCommand& command, const Partition& partition) {
  std::string out = fmt::format("{} in {} stages, method {}, per micro-batch on {}\n", spec.name, command.stages,
                                command.method, command.hardware);
  TextTable table({"stage", "range", "count", "layers", "params", "FLOPs", "time"});
  for (std::size_t k = 0; k < partition.stages.size(); ++k) {
    const StagePlan& stage = partition.stages[k];
    table.add_row({std::to_string(k), fmt::format("[{}, {})", stage.first, stage.end),
                   std::to_string(stage.end - stage.first), layer_span(stage), format_parameters(stage.parameters),
                   format_si(stage.hardware_flops, "FLOP"), format_seconds(stage.seconds)});
  }
  out += table.render();
  return out + fmt::format("slowest stage: {}\n", format_seconds(partition.max_stage_seconds()));
}

}  // namespace

void add_partition_command(CLI::App& app) {
  auto command = std::make_shared<PartitionCommand>();
  CLI::App* sub = app.add_subcommand("partition", "Cut a model's pipeline layers into stages");
  command->options.add_to(*sub);
  sub->add_option("--stages", command->stages, "Stages to cut the layers into (stages - 1 cuts)")->required();
  sub->add_option("--partition,--method", command->method,
                  "uniform, parameters, type:REGEX, balanced, counts:N,N,... or bounds:0,B,...,LAYERS (the name train, "
                  "simulate and generate use; --method kept)")
      ->capture_default_str();
  sub->add_option("--hardware", command->hardware, "Hardware preset or JSON file (stage times)")
      ->capture_default_str();
  sub->add_flag("--json", command->json, "Print one JSON object");
  sub->callback([command] {
    const ModelSpec spec = command->options.spec();
    const std::vector<PipelineLayer> layers = pipeline_layers(spec, command->options.config(spec));
    const Partition partition = partition_layers(layers, command->stages, parse_partition_method(command->method),
                                                 resolve_hardware(command->hardware));
    if (command->json) {
      fmt::print("{}\n", json_text(to_json(spec, *command, partition), 2));
    } else {
      fmt::print("{}", text_report(spec, *command, partition));
    }
  });
}

}  // namespace pipeflow::cli
