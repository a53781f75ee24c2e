#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_options.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/table.h"
#include "pipeflow/core/units.h"

namespace pipeflow::cli {
namespace {

struct ModelCommand {
  ModelOptions options;
  bool json = false;
};

nlohmann::ordered_json to_json(const ModelSpec& spec, const ParallelConfig& config,
                               const std::vector<PipelineLayer>& layers) {
  nlohmann::ordered_json json;
  json["name"] = spec.name;
  json["architecture"] = to_string(spec.architecture);
  json["layers"] = spec.layers;
  json["hidden"] = spec.hidden;
  json["heads"] = spec.heads;
  json["kv_heads"] = spec.kv_heads;
  json["ffn"] = spec.ffn;
  json["vocab"] = spec.vocab;
  json["max_positions"] = spec.max_positions;
  json["tied_embeddings"] = spec.tied_embeddings;
  json["dropout"] = spec.dropout;
  if (const std::optional<VisionSpec>& v = spec.vision) {
    json["vision"] = {{"layers", v->layers},         {"hidden", v->hidden},
                      {"heads", v->heads},           {"ffn", v->ffn},
                      {"image_size", v->image_size}, {"patch_size", v->patch_size},
                      {"channels", v->channels},     {"class_token", v->class_token},
                      {"image_tokens", image_tokens(*v)}, {"images", v->images}};
  }
  json["parameters"] = parameter_count(spec);
  json["config"] = {{"micro_batch", config.micro_batch},
                    {"sequence", config.seq_length},
                    {"tensor_parallel", config.tensor_parallel},
                    {"sequence_parallel", config.sequence_parallel},
                    {"recompute", to_string(config.recompute)},
                    {"bytes_per_element", config.bytes_per_element}};
  json["pipeline_layers"] = nlohmann::ordered_json::array();
  for (const PipelineLayer& layer : layers) {
    json["pipeline_layers"].push_back({{"name", layer.name},
                                       {"kind", to_string(layer.kind)},
                                       {"parameters", layer.parameters},
                                       {"tied_parameters", layer.tied_parameters},
                                       {"forward_flops", layer.forward_flops},
                                       {"backward_input_flops", layer.backward_input_flops},
                                       {"backward_weight_flops", layer.backward_weight_flops},
                                       {"recompute_flops", layer.recompute_flops},
                                       {"activation_bytes", layer.activation_bytes},
                                       {"output_bytes", layer.output_bytes}});
  }
  return json;
}

std::string text_report(const ModelSpec& spec, const ParallelConfig& config, const std::vector<PipelineLayer>& layers) {
  std::string out = fmt::format(
      "{}: {}, {} layers, hidden {}, heads {} (kv {}), ffn {}, vocab {}, context {}, {} embeddings{}\n", spec.name,
      to_string(spec.architecture), spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.ffn, spec.vocab,
      spec.max_positions, spec.tied_embeddings ? "tied" : "untied", spec.dropout ? ", dropout" : "");
  if (const std::optional<VisionSpec>& v = spec.vision) {
    out += fmt::format("vision tower: {} layers run, hidden {}, heads {}, ffn {}, {} px in {} px patches, {} tokens "
                       "per image into the language model ({} per sequence of {})\n",
                       v->layers, v->hidden, v->heads, v->ffn, v->image_size, v->patch_size, image_tokens(*v),
                       v->images, config.seq_length);
  }
  out += fmt::format("parameters: {} ({})\n", parameter_count(spec), format_parameters(parameter_count(spec)));
  out += fmt::format("per micro-batch and device: b={} s={} t={}{} recompute={}\n", config.micro_batch,
                     config.seq_length, config.tensor_parallel, config.sequence_parallel ? " sp" : "",
                     to_string(config.recompute));
  TextTable table({"layer", "params", "forward", "backward I", "backward W", "recompute", "activations", "message"});
  for (const PipelineLayer& layer : layers) {
    table.add_row({layer.name, format_parameters(layer.parameters + layer.tied_parameters),
                   format_si(layer.forward_flops, "FLOP"), format_si(layer.backward_input_flops, "FLOP"),
                   format_si(layer.backward_weight_flops, "FLOP"), format_si(layer.recompute_flops, "FLOP"),
                   format_bytes(layer.activation_bytes), format_bytes(layer.output_bytes)});
  }
  const LayerTotals totals = sum_layers(layers);
  table.add_row({"total", format_parameters(totals.parameters), format_si(totals.forward_flops, "FLOP"),
                 format_si(totals.backward_input_flops, "FLOP"), format_si(totals.backward_weight_flops, "FLOP"),
                 format_si(totals.recompute_flops, "FLOP"), format_bytes(totals.activation_bytes), ""});
  return out + table.render();
}

}  // namespace

void add_model_command(CLI::App& app) {
  auto command = std::make_shared<ModelCommand>();
  CLI::App* sub = app.add_subcommand("model", "Show a model's pipeline layers: parameters, FLOPs, activation memory");
  command->options.add_to(*sub);
  sub->add_flag("--json", command->json, "Print one JSON object");
  sub->callback([command] {
    const ModelSpec spec = command->options.spec();
    const ParallelConfig config = command->options.config(spec);
    const std::vector<PipelineLayer> layers = pipeline_layers(spec, config);
    if (command->json) {
      fmt::print("{}\n", json_text(to_json(spec, config, layers), 2));
    } else {
      fmt::print("{}", text_report(spec, config, layers));
    }
  });
}

}  // namespace pipeflow::cli
