#include "pipeflow/config/deepspeed_keys.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <array>

#include "pipeflow/config/run_config.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

using Json = nlohmann::json;

// DeepSpeed's documented keys (and the few its parser takes beside them)
// that pipeflow reads and does not model, by path.
constexpr std::array kNotModelled = {
    DeepSpeedKey{"activation_checkpointing", "how activation checkpoints are kept: partitioned over tensor-parallel ranks, offloaded to the CPU, in contiguous buffers, profiled; pipeflow's recompute is pipeline.activation_checkpoint_interval and recompute"},
    DeepSpeedKey{"aio", "asynchronous I/O to NVMe for ZeRO-Infinity offload"},
    DeepSpeedKey{"amp", "NVIDIA Apex automatic mixed precision; pipeflow's is fp16 or bf16"},
    DeepSpeedKey{"autotuning", "trial runs that search the ZeRO stage and micro-batch size"},
    DeepSpeedKey{"checkpoint.load_universal", "loads a universal checkpoint"},
    DeepSpeedKey{"checkpoint.parallel_write", "writes checkpoints from several ranks at once"},
    DeepSpeedKey{"checkpoint.tag_validation", "checks that every rank saves the same checkpoint tag"},
    DeepSpeedKey{"checkpoint.use_node_local_storage", "saves checkpoints on each node's own disk"},
    DeepSpeedKey{"comms_logger", "logs the communication calls and their sizes"},
    DeepSpeedKey{"compression_training", "quantization, pruning and layer reduction during training"},
    DeepSpeedKey{"csv_monitor", "writes metrics to CSV files"},
    DeepSpeedKey{"curriculum_learning", "the legacy curriculum over sequence length"},
    DeepSpeedKey{"data_efficiency", "data sampling by curriculum and random layerwise token dropping"},
    DeepSpeedKey{"dataloader_drop_last", "drops the last partial batch of DeepSpeed's data loader"},
    DeepSpeedKey{"dump_state", "prints the engine's state at start"},
    DeepSpeedKey{"elasticity", "batch sizes that stay valid as the GPU count changes"},
    DeepSpeedKey{"flops_profiler", "profiles one step's FLOPs and latency per module"},
    DeepSpeedKey{"fp16.auto_cast", "casts the model's inputs to fp16"},
    DeepSpeedKey{"fp16.consecutive_hysteresis", "restores the hysteresis after a clean step"},
    DeepSpeedKey{"fp32_allreduce", "all-reduces gradients in fp32; pipeflow's is communication_data_type"},
    DeepSpeedKey{"gradient_predivide_factor", "divides the gradients before the data-parallel average, for fp16's range"},
    DeepSpeedKey{"memory_breakdown", "logs memory with the timers"},
    DeepSpeedKey{"optimizer.params.coeff_beta", "1-bit LAMB: averaging of the LAMB coefficient"},
    DeepSpeedKey{"optimizer.params.comm_backend_name", "1-bit optimizers: the compressed communication's backend"},
    DeepSpeedKey{"optimizer.params.cuda_aware", "1-bit optimizers: CUDA-aware MPI"},
    DeepSpeedKey{"optimizer.params.factor_max", "1-bit LAMB: the frozen coefficient's largest scaling"},
    DeepSpeedKey{"optimizer.params.factor_min", "1-bit LAMB: the frozen coefficient's smallest scaling"},
    DeepSpeedKey{"optimizer.params.factor_threshold", "1-bit LAMB: how much the scaling may change a step"},
    DeepSpeedKey{"optimizer.params.freeze_step", "1-bit optimizers: warm-up steps before compression"},
    DeepSpeedKey{"optimizer.params.local_step_clipper", "0/1 Adam: the local steps' largest interval"},
    DeepSpeedKey{"optimizer.params.local_step_scaler", "0/1 Adam: how the local steps' interval grows"},
    DeepSpeedKey{"optimizer.params.max_coeff", "LAMB: the trust ratio's upper bound"},
    DeepSpeedKey{"optimizer.params.min_coeff", "LAMB: the trust ratio's lower bound"},
    DeepSpeedKey{"optimizer.params.var_freeze_step", "0/1 Adam: the step after which the variance is frozen"},
    DeepSpeedKey{"optimizer.params.var_update_scaler", "0/1 Adam: how often the variance is updated"},
    DeepSpeedKey{"pipeline.grad_partitioned", "splits the gradients sent between stages over tensor-parallel ranks"},
    DeepSpeedKey{"pipeline.partition", "DeepSpeed's partitioning hint; PipelineModule's partition_method is pipeline.partition_method"},
    DeepSpeedKey{"pipeline.pipe_partitioned", "splits the activations sent between stages over tensor-parallel ranks"},
    DeepSpeedKey{"pipeline.seed_layers", "seeds each layer's initialisation by its index"},
    DeepSpeedKey{"prescale_gradients", "scales the gradients before the all-reduce"},
    DeepSpeedKey{"sparse_attention", "block-sparse attention kernels"},
    DeepSpeedKey{"sparse_gradients", "a sparse all-reduce of embedding gradients"},
    DeepSpeedKey{"tensorboard", "writes metrics for TensorBoard"},
    DeepSpeedKey{"wandb", "writes metrics to Weights & Biases"},
    DeepSpeedKey{"zero_allow_untested_optimizer", "lets ZeRO wrap an optimizer DeepSpeed has not tested"},
    DeepSpeedKey{"zero_optimization.allgather_bucket_size", "elements per all-gather of updated parameters"},
    DeepSpeedKey{"zero_optimization.allgather_partitions", "all-gathers parameters at the step's end rather than broadcasting"},
    DeepSpeedKey{"zero_optimization.contiguous_gradients", "copies gradients into one buffer as they are made"},
    DeepSpeedKey{"zero_optimization.cpu_offload", "the old switch of the optimizer's offload to the CPU"},
    DeepSpeedKey{"zero_optimization.elastic_checkpoint", "checkpoints that load at another data-parallel size"},
    DeepSpeedKey{"zero_optimization.grad_hooks", "ZeRO's gradient hooks (for models that bypass them)"},
    DeepSpeedKey{"zero_optimization.ignore_unused_parameters", "tolerates parameters that get no gradient"},
    DeepSpeedKey{"zero_optimization.offload_optimizer", "keeps the optimizer's states on the CPU or NVMe: device memory may be lower than predicted, steps slower"},
    DeepSpeedKey{"zero_optimization.offload_param", "ZeRO-3: keeps parameters on the CPU or NVMe"},
    DeepSpeedKey{"zero_optimization.overlap_comm", "overlaps the gradient reduction with the backward"},
    DeepSpeedKey{"zero_optimization.reduce_scatter", "reduces gradients by reduce-scatter rather than all-reduce"},
    DeepSpeedKey{"zero_optimization.round_robin_gradients", "spreads the gradient copies of offload over ranks"},
    DeepSpeedKey{"zero_optimization.stage3_gather_16bit_weights_on_model_save", "ZeRO-3: gathers whole 16-bit weights to save them"},
    DeepSpeedKey{"zero_optimization.stage3_gather_fp16_weights_on_model_save", "ZeRO-3: the old name of stage3_gather_16bit_weights_on_model_save"},
    DeepSpeedKey{"zero_optimization.stage3_max_live_parameters", "ZeRO-3: parameters kept gathered at once"},
    DeepSpeedKey{"zero_optimization.stage3_max_reuse_distance", "ZeRO-3: how soon a parameter is reused to stay gathered"},
    DeepSpeedKey{"zero_optimization.stage3_param_persistence_threshold", "ZeRO-3: parameters this small stay whole"},
    DeepSpeedKey{"zero_optimization.stage3_prefetch_bucket_size", "ZeRO-3: parameters fetched ahead"},
    DeepSpeedKey{"zero_optimization.sub_group_size", "parameters per optimizer step group with offload"},
    DeepSpeedKey{"zero_optimization.zero_hpz_partition_size", "ZeRO++: a secondary partition of the weights within a node"},
    DeepSpeedKey{"zero_optimization.zero_quantized_gradients", "ZeRO++: gradients quantized to int4 for the reduction"},
    DeepSpeedKey{"zero_optimization.zero_quantized_weights", "ZeRO++: weights quantized to int8 for the all-gather"},
};

// The object at a dotted path, if every step is one.
Json* find(Json& json, std::string_view path) {
  Json* at = &json;
  std::size_t begin = 0;
  while (true) {
    const std::size_t dot = path.find('.', begin);
    const std::string part(path.substr(begin, dot == std::string_view::npos ? std::string_view::npos : dot - begin));
    if (!at->is_object() || !at->contains(part)) return nullptr;
    at = &(*at)[part];
    if (dot == std::string_view::npos) return at;
    begin = dot + 1;
  }
}

bool is_auto(const Json* value) { return value != nullptr && value->is_string() && *value == "auto"; }

// A course's spelling of a PipelineModule argument, moved to pipeflow's key.
void move_spelling(Json& json, Json& from, const std::string& from_path, const std::string& key, const std::string& to,
                   std::string_view argument, const std::string& source, std::vector<std::string>& notes) {
  if (!from.is_object() || !from.contains(key)) return;
  if (!json.contains("pipeline")) json["pipeline"] = Json::object();
  Json& pipeline = json["pipeline"];
  if (!pipeline.is_object()) fail("{}: pipeline = {}: an object of pipeline keys", source, short_dump(pipeline));
  if (pipeline.contains(to) && !(&from == &pipeline && key == to)) {
    fail("{}: {} and pipeline.{} both given: {} is DeepSpeed's PipelineModule argument {}, which pipeline.{} is; "
         "keep one",
         source, from_path, to, from_path, argument, to);
  }
  Json value = from[key];
  from.erase(key);
  if (to == "activation_checkpoint_interval" && value.is_boolean()) value = value.get<bool>() ? 1 : 0;
  pipeline[to] = std::move(value);
  notes.push_back(fmt::format("{}: {} read as pipeline.{} (DeepSpeed's PipelineModule({}=...))", source, from_path, to,
                              argument));
}

}  // namespace

std::span<const DeepSpeedKey> deepspeed_keys_not_modelled() { return kNotModelled; }

Json deepspeed_as_written(Json json, const std::string& source, std::vector<std::string>& notes) {
  if (!json.is_object()) return json;
  // DeepSpeed's old name of bf16.
  if (json.contains("bfloat16")) {
    if (json.contains("bf16")) fail("{}: bf16 and bfloat16 both given: bfloat16 is DeepSpeed's old name of bf16; keep one", source);
    json["bf16"] = json["bfloat16"];
    json.erase("bfloat16");
    notes.push_back(fmt::format("{}: bfloat16 read as bf16 (DeepSpeed's old name of it)", source));
  }
  // The course's spellings of PipelineModule's arguments.
  move_spelling(json, json, "num_stages", "num_stages", "stages", "num_stages", source, notes);
  move_spelling(json, json, "pipe_partition_method", "pipe_partition_method", "partition_method", "partition_method",
                source, notes);
  move_spelling(json, json, "partition_method", "partition_method", "partition_method", "partition_method", source,
                notes);
  if (json.contains("pipeline") && json["pipeline"].is_object()) {
    Json& pipeline = json["pipeline"];
    move_spelling(json, pipeline, "pipeline.num_stages", "num_stages", "stages", "num_stages", source, notes);
    move_spelling(json, pipeline, "pipeline.pipe_partition_method", "pipe_partition_method", "partition_method",
                  "partition_method", source, notes);
    move_spelling(json, pipeline, "pipeline.activation_checkpointing", "activation_checkpointing",
                  "activation_checkpoint_interval", "activation_checkpoint_interval", source, notes);
    if (is_auto(find(json, "pipeline.stages"))) {
      fail("{}: pipeline.stages = \"auto\": DeepSpeed takes the stages from PipelineModule(num_stages=...), which a "
           "configuration file does not hold: give the number",
           source);
    }
  }

  // "auto" as Hugging Face's Trainer resolves it from its TrainingArguments' defaults.
  const auto resolve = [&](std::string_view path, const Json& value, std::string_view why) {
    Json* at = find(json, path);
    if (!is_auto(at)) return;
    *at = value;
    notes.push_back(fmt::format("{}: {} = \"auto\" resolved to {} ({})", source, path, json_text(value), why));
  };
  if (Json* global = find(json, "train_batch_size"); is_auto(global)) {
    json.erase("train_batch_size");
    notes.push_back(fmt::format("{}: train_batch_size = \"auto\": derived as micro-batch x accumulation x data "
                                "parallel (DeepSpeed's rule)",
                                source));
  }
  resolve("train_micro_batch_size_per_gpu", 8, "the Trainer's per_device_train_batch_size default");
  resolve("gradient_accumulation_steps", 1, "the Trainer's gradient_accumulation_steps default");
  resolve("gradient_clipping", 1.0, "the Trainer's max_grad_norm default");
  resolve("optimizer.params.lr", 5e-5, "the Trainer's learning_rate default");
  resolve("optimizer.params.betas", Json::array({0.9, 0.999}), "the Trainer's adam_beta1 and adam_beta2 defaults");
  resolve("optimizer.params.eps", 1e-8, "the Trainer's adam_epsilon default");
  resolve("optimizer.params.weight_decay", 0.0, "the Trainer's weight_decay default");
  resolve("fp16.enabled", false, "the Trainer's fp16 default");
  resolve("bf16.enabled", false, "the Trainer's bf16 default");
  resolve("scheduler.params.warmup_min_lr", 0.0, "the Trainer's warm-up starts at 0");
  const Json* lr = find(json, "optimizer.params.lr");
  resolve("scheduler.params.warmup_max_lr", lr != nullptr && lr->is_number() ? *lr : Json(5e-5),
          "the optimizer's learning rate, as the Trainer sets it");
  resolve("scheduler.params.warmup_num_steps", 0, "the Trainer's warmup_steps default");
  const Json* steps = find(json, "steps");
  resolve("scheduler.params.total_num_steps", steps != nullptr && steps->is_number_integer() ? *steps : Json(RunConfig{}.steps),
          "the run's steps, as the Trainer sets its max_steps");
  if (is_auto(find(json, "zero_optimization.reduce_bucket_size"))) {
    const Json* width = find(json, "model.n_embd");
    if (width == nullptr) width = find(json, "model.hidden_size");
    if (width != nullptr && width->is_number_integer()) {
      resolve("zero_optimization.reduce_bucket_size", width->get<std::int64_t>() * width->get<std::int64_t>(),
              "the model's width squared, as the Trainer sets it");
    } else {
      json["zero_optimization"].erase("reduce_bucket_size");
      notes.push_back(fmt::format("{}: zero_optimization.reduce_bucket_size = \"auto\": the Trainer sets the model's "
                                  "width squared, which the configuration does not give inline: pipeflow's default",
                                  source));
    }
  }
  return json;
}

std::vector<std::string> read_keys_not_modelled(const Config& config) {
  std::vector<std::string> read;
  for (const DeepSpeedKey& key : kNotModelled) {
    Config section = config;
    std::string_view rest = key.path;
    for (std::size_t dot = rest.find('.'); dot != std::string_view::npos; dot = rest.find('.')) {
      const std::string part(rest.substr(0, dot));
      const nlohmann::json& here = section.json();
      if (!here.contains(part) || !here[part].is_object()) break;
      section = section.object(part);
      rest.remove_prefix(dot + 1);
    }
    if (rest.find('.') != std::string_view::npos) continue;  // an object on the way is not there
    const std::string last(rest);
    if (section.json().contains(last)) {
      section.raw(last);  // the key and all below it are known
      read.push_back(fmt::format("{} ({})", key.path, key.use));
    } else {
      section.has(last);  // asked for, so that a misspelling of it gets a "did you mean"
    }
  }
  return read;
}

}  // namespace pipeflow
