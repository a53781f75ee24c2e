#pragma once

// A value for every key of run_keys() that differs from its default and is
// valid with its context (other keys it needs), for the tests that check
// that each key is read, written back, overridden by its flag and varied by
// sweep as its row says (tests/config/run_keys_test.cc, tests/plan/sweep_test.cc,
// tests/cli/run_keys_command_test.cc). A new row needs an example here; the
// tests fail naming the row until it has one.
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace pipeflow::testing {

struct RunKeyExample {
  std::string path;
  nlohmann::json value;
  // Keys the example needs beside it (a scheduler's type for its params).
  std::vector<std::pair<std::string, nlohmann::json>> context = {};
  // Where run_config_to_json writes it, when not at `path` (data.path is
  // written as data.paths); null value: not kept (accepted, no effect).
  std::string written_path = {};
  nlohmann::json written_value = {};
};

inline const std::string kExampleScheduleFile =
    std::string(PIPEFLOW_SOURCE_DIR) + "/examples/schedules/pytorch26_zbh1_2x4.csv";

inline std::vector<RunKeyExample> run_key_examples() {
  using nlohmann::json;
  const auto warmup = std::pair<std::string, json>{"scheduler.type", "WarmupLR"};
  const auto cosine = std::pair<std::string, json>{"scheduler.type", "WarmupCosineLR"};
  const auto total = std::pair<std::string, json>{"scheduler.params.total_num_steps", 2000};
  return {
      {"train_batch_size", 8},
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", 4},
      {"gradient_clipping", 1.0},
      {"optimizer.type", "Adam"},
      {"optimizer.params.lr", 3e-4},
      {"optimizer.params.betas", json::array({0.8, 0.95})},
      {"optimizer.params.eps", 1e-6},
      {"optimizer.params.weight_decay", 0.1},
      {"optimizer.params.adam_w_mode", false, {{"optimizer.type", "Adam"}}},
      {"optimizer.params.torch_adam", true, {}, "optimizer.params.torch_adam", nullptr},
      {"scheduler.type", "WarmupLR"},
      {"scheduler.params.warmup_min_lr", 1e-4, {warmup}},
      {"scheduler.params.warmup_max_lr", 2e-3, {warmup}},
      {"scheduler.params.warmup_num_steps", 50, {warmup}},
      {"scheduler.params.warmup_type", "linear", {warmup}},
      {"scheduler.params.total_num_steps", 500, {{"scheduler.type", "WarmupDecayLR"}}},
      {"scheduler.params.warmup_min_ratio", 0.1, {cosine, total}},
      {"scheduler.params.cos_min_ratio", 0.05, {cosine, total}},
      {"zero_optimization.stage", 1},
      {"zero_optimization.reduce_bucket_size", 1024},
      {"fp16.enabled", true},
      {"fp16.loss_scale", 128.0},
      {"fp16.initial_scale_power", 12},
      {"fp16.loss_scale_window", 500},
      {"fp16.hysteresis", 1},
      {"fp16.min_loss_scale", 0.5},
      {"bf16.enabled", true},
      {"communication_data_type", "fp32"},
      {"data_types.grad_accum_dtype", "fp32"},
      {"steps_per_print", 5},
      {"wall_clock_breakdown", true, {}, "wall_clock_breakdown", nullptr},
      {"pipeline.stages", 2},
      {"pipeline.partition_method", "uniform"},
      {"pipeline.activation_checkpoint_interval", 1},
      {"pipeline.schedule", "gpipe"},
      {"pipeline.schedule_file", kExampleScheduleFile},
      {"pipeline.virtual_stages", 2, {{"pipeline.schedule", "interleaved-1f1b"}, {"pipeline.stages", 2}}},
      {"model", "gpt2-124m"},
      {"data.path", "a.txt", {}, "data.paths", json::array({"a.txt"})},
      {"data.paths", json::array({"a.txt", "b.txt"})},
      {"data.validation_fraction", 0.2},
      {"steps", 7},
      {"seed", 7},
      {"eval_interval", 3},
      {"out_dir", "runs/keys"},
      {"checkpoint.interval", 5},
      {"checkpoint.dir", "ckpt"},
      {"checkpoint.load", "ckpt/step_5"},
      {"checkpoint.keep", 2},
      {"numerics.max_skipped_steps", 5},
      {"metrics.noise_scale_interval", 4},
      {"hardware", "a100-80g"},
      {"devices", 1},
      {"tensor_parallel", 2},
      {"data_parallel", 2},
      {"sequence_parallel", true, {{"tensor_parallel", 2}}},
      {"rank_order", "tp-pp-dp"},
      {"recompute", "selective"},
      {"seq_length", 32},
      {"variable_seq_lengths", json::array({16, 32})},
      {"variable_images",
       json::array({1, 2}),
       {{"model", std::string(PIPEFLOW_SOURCE_DIR) + "/examples/cases/2-multimodal/llava-1.5-7b.json"},
        {"seq_length", 2048}}},
      {"comm_mode", "blocking"},
      {"block_launch_overhead_s", 0.004},
      {"freeze", json::array({"embedding"})},
      {"lora", {{"r", 8}, {"alpha", 16.0}, {"target", {"c_attn"}}, {"train", {"head"}}}},
  };
}

// The value at a dotted path of `json`, or nullptr when absent.
inline const nlohmann::json* at_path(const nlohmann::json& json, const std::string& path) {
  const nlohmann::json* at = &json;
  std::size_t begin = 0;
  while (true) {
    const std::size_t dot = path.find('.', begin);
    const std::string part = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    if (!at->is_object() || !at->contains(part)) return nullptr;
    at = &(*at)[part];
    if (dot == std::string::npos) return at;
    begin = dot + 1;
  }
}

// The example as a command line types it.
inline std::string as_typed(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

}  // namespace pipeflow::testing
