#include "pipeflow/config/run_keys.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace pipeflow {
namespace {

using enum KeyType;
using enum FlagScope;

// DeepSpeed's keys where DeepSpeed has one (read as DeepSpeed reads them),
// pipeflow's beside them; run_config.h says the rules between keys.
constexpr std::array kRunKeys = {
    // The batch: any two of the three determine the third (B = b · m · data_parallel); none: b = m = 1.
    RunKey{"train_batch_size", "--global-batch", "", kInteger, ">= 1", "",
           "Sequences per step over all replicas B (without a micro-batch, DeepSpeed's rule gives one micro-batch of "
           "B / data_parallel)", kAll, true},
    RunKey{"train_micro_batch_size_per_gpu", "--micro-batch", "", kInteger, ">= 1", "", "Sequences per micro-batch b",
           kAll, true},
    RunKey{"gradient_accumulation_steps", "", "", kInteger, ">= 1", "", "Micro-batches per step and replica m"},
    RunKey{"gradient_clipping", "", "", kNumber, ">= 0", "0", "Global gradient norm clipped to; 0 for none"},
    RunKey{"optimizer.type", "", "", kString, "AdamW | Adam (any case)", "\"AdamW\"",
           "AdamW, or Adam (decoupled decay unless adam_w_mode is false)"},
    RunKey{"optimizer.params.lr", "", "", kNumber, ">= 0", "0.001", "Learning rate"},
    RunKey{"optimizer.params.betas", "", "", kList, "[beta1, beta2], each in [0, 1)", "[0.9, 0.999]", "Adam's betas"},
    RunKey{"optimizer.params.eps", "", "", kNumber, "> 0", "1e-8", "Adam's epsilon"},
    RunKey{"optimizer.params.weight_decay", "", "", kNumber, ">= 0", "0.01", "Weight decay of 2-D weights"},
    RunKey{"optimizer.params.adam_w_mode", "", "", kBoolean, "true | false", "true",
           "Decoupled weight decay; false: Adam with L2 (type Adam only)"},
    RunKey{"optimizer.params.torch_adam", "", "", kBoolean, "true | false", "",
           "DeepSpeed's choice of implementation: accepted, not kept (pipeflow has one)"},
    RunKey{"scheduler.type", "", "", kString, "WarmupLR | WarmupDecayLR | WarmupCosineLR", "",
           "Learning-rate schedule; absent: the optimizer's lr throughout"},
    RunKey{"scheduler.params.warmup_min_lr", "", "", kNumber, ">= 0", "", "WarmupLR, WarmupDecayLR: lr at step 0 (0)"},
    RunKey{"scheduler.params.warmup_max_lr", "", "", kNumber, ">= warmup_min_lr", "",
           "WarmupLR, WarmupDecayLR: lr after the warm-up (0.001)"},
    RunKey{"scheduler.params.warmup_num_steps", "", "", kInteger, ">= 0", "", "Steps of warm-up (1000)"},
    RunKey{"scheduler.params.warmup_type", "", "", kString, "log | linear", "", "Shape of the warm-up (log)"},
    RunKey{"scheduler.params.total_num_steps", "", "", kInteger, ">= 1", "",
           "WarmupDecayLR, WarmupCosineLR: the steps of the run (required)"},
    RunKey{"scheduler.params.warmup_min_ratio", "", "", kNumber, "[0, 1]", "",
           "WarmupCosineLR: lr at step 0 as a ratio of the optimizer's (0)"},
    RunKey{"scheduler.params.cos_min_ratio", "", "", kNumber, "[0, 1]", "",
           "WarmupCosineLR: lr at the end as a ratio of the optimizer's (0.0001)"},
    RunKey{"zero_optimization.stage", "--zero", "", kInteger, "0 | 1 | 2 | 3", "0",
           "ZeRO stage: model states sharded over data_parallel", kAll, true},
    RunKey{"zero_optimization.reduce_bucket_size", "", "", kInteger, "1 .. 2147483647", "4194304",
           "Elements per data-parallel reduce-scatter call (two in flight)"},
    RunKey{"fp16.enabled", "--fp16", "", kBoolean, "true | false", "false",
           "Mixed precision in fp16 with loss scaling (neither fp16 nor bf16: fp32)", kAll, true},
    RunKey{"fp16.loss_scale", "", "", kNumber, ">= 0", "0", "fp16: a static loss scale; 0: dynamic"},
    RunKey{"fp16.initial_scale_power", "", "", kInteger, "0 .. 64", "16", "fp16: the dynamic scale starts at 2^this"},
    RunKey{"fp16.loss_scale_window", "", "", kInteger, ">= 1", "1000", "fp16: clean steps before the scale doubles"},
    RunKey{"fp16.hysteresis", "", "", kInteger, ">= 1", "2", "fp16: overflowing steps in a row before it halves"},
    RunKey{"fp16.min_loss_scale", "", "", kNumber, "> 0", "1", "fp16: the smallest dynamic scale"},
    RunKey{"bf16.enabled", "--bf16", "", kBoolean, "true | false", "false", "Mixed precision in bf16", kAll, true},
    RunKey{"communication_data_type", "", "", kString, "fp32 | bf16 | fp16", "",
           "Elements of the data-parallel gradient reduction; absent: the training precision's"},
    RunKey{"data_types.grad_accum_dtype", "", "", kString, "fp32 | bf16 | fp16", "",
           "Elements gradients accumulate in across micro-batches; absent: fp32 for bf16 without ZeRO, else the "
           "training precision's (DeepSpeed's)"},
    RunKey{"steps_per_print", "", "", kInteger, ">= 0", "0", "Steps between progress lines; 0: about 50 a run"},
    RunKey{"wall_clock_breakdown", "", "", kBoolean, "true | false", "",
           "Accepted, not kept: pipeflow times every action of every step anyway"},
    RunKey{"pipeline.stages", "--stages", "--pp", kInteger, ">= 1", "1", "Pipeline ranks p", kAll, true},
    RunKey{"pipeline.partition_method", "--partition", "--method", kString,
           "uniform | parameters | type:REGEX | balanced | counts:N,.. | bounds:B,..", "\"parameters\"",
           "How the layers are cut into stages", kAll, true},
    RunKey{"pipeline.activation_checkpoint_interval", "", "", kInteger, ">= 0", "0",
           "Recompute interval k: keep the input of every k-th block, recompute the rest; 0: keep all"},
    RunKey{"pipeline.schedule", "--schedule", "", kString, "a name of pipeflow schedule --list", "\"1f1b\"",
           "Pipeline schedule", kAll, true},
    RunKey{"pipeline.schedule_file", "--schedule-file", "", kString, "a path",
           "", "Run this schedule file instead: PyTorch pipelining CSV or pipeflow JSON; it fixes the ranks, chunks "
           "and micro-batches", kAll},
    RunKey{"pipeline.virtual_stages", "--virtual", "", kInteger, ">= 1", "1", "Model chunks per rank v", kAll, true},
    RunKey{"model", "--model", "", kStringOrObject,
           "a preset, a config.json path, {n_layer, n_head, n_embd, n_ctx, vocab_size}, or a config.json's keys", "",
           "The model; absent: a weights file's or checkpoint's", kAll, true},
    RunKey{"data.path", "", "", kString, "a text file", "", "Training text (or data.paths)"},
    RunKey{"data.paths", "", "", kList, "text files", "[]", "Training texts; none: the fortunes corpus"},
    RunKey{"data.validation_fraction", "", "", kNumber, "[0, 1)", "0.1", "Share of the text held out"},
    RunKey{"steps", "--steps", "", kInteger, ">= 1", "100", "Optimizer steps in all, counting a resumed checkpoint's",
           kTraining},
    RunKey{"seed", "", "", kInteger, ">= 0", "1234", "Seed of the weights and the data"},
    RunKey{"eval_interval", "", "", kInteger, ">= 0", "10", "Steps between validations; 0: after the last step only"},
    RunKey{"out_dir", "--out-dir", "", kString, "a directory", "\"runs/pipeflow\"",
           "Where the report, metrics, timelines and weights go", kTraining},
    RunKey{"checkpoint.interval", "", "", kInteger, ">= 0", "0",
           "Steps between checkpoints (and one after the last step); 0: none"},
    RunKey{"checkpoint.dir", "", "", kString, "a directory", "\"\"", "Checkpoint folder; empty: out_dir/checkpoints"},
    RunKey{"checkpoint.load", "--resume", "", kString, "a checkpoint, its folder or a run's out_dir", "\"\"",
           "Resume from the newest good checkpoint there", kTrain},
    RunKey{"checkpoint.keep", "", "", kInteger, ">= 0", "0", "Newest checkpoints kept; 0: all"},
    RunKey{"numerics.max_skipped_steps", "", "", kInteger, ">= 1", "3",
           "Non-finite steps in a row skipped before the run stops"},
    RunKey{"metrics.noise_scale_interval", "", "", kInteger, ">= 0", "1",
           "Steps between measurements of the gradient noise scale; 0: never"},
    RunKey{"hardware", "--hardware", "", kString, "a preset or a hardware profile JSON path", "\"cpu\"",
           "The hardware the simulator prices", kAll, true},
    RunKey{"devices", "--devices", "", kInteger, "tensor_parallel × pipeline.stages × data_parallel", "",
           "Devices in all (checked if given)", kAll},
    RunKey{"tensor_parallel", "--tensor-parallel", "--tp", kInteger, ">= 1", "1", "Tensor-parallel size", kAll, true},
    RunKey{"data_parallel", "--data-parallel", "--dp", kInteger, ">= 1", "1",
           "Data-parallel replicas (under mpirun, absent: the processes per pipeline)", kAll, true},
    RunKey{"sequence_parallel", "--sequence-parallel", "", kBoolean, "true | false", "false",
           "Megatron's sequence parallelism (off at tensor_parallel 1)", kAll, true},
    RunKey{"rank_order", "--rank-order", "", kString, "tp-dp-pp | tp-pp-dp", "\"tp-dp-pp\"",
           "How world ranks are numbered, fastest first (Megatron-LM's order; tp-pp-dp: --use-tp-pp-dp-mapping)",
           kAll},
    RunKey{"recompute", "--recompute", "", kString, "none | selective | full", "",
           "Activation recomputation; absent: full with an activation_checkpoint_interval, else none", kAll, true},
    RunKey{"seq_length", "--seq-length", "--seq", kInteger, ">= 0", "0", "Tokens per sequence; 0: the model's context",
           kAll, true},
    RunKey{"variable_seq_lengths", "--variable-seq-lengths", "", kListOrObject,
           "[tokens per sequence of micro-batch 1, 2, ...], each in [1, seq_length]; or {distribution: uniform | "
           "normal, min, max, mean, std, seed}",
           "[]",
           "Micro-batches of their own lengths, the list repeated over a step's micro-batches (Megatron's "
           "--variable-seq-lengths) or drawn; []: every one seq_length (simulate)",
           kAll},
    RunKey{"variable_images", "--variable-images", "", kList, "[images per sequence of micro-batch 1, 2, ...], each >= 1",
           "[]",
           "A vision-language model's images per sequence of each micro-batch, the list repeated over a step; []: "
           "the model's (simulate)",
           kAll},
    RunKey{"comm_mode", "--comm", "", kString, "overlapped | blocking", "\"overlapped\"",
           "Stage-to-stage sends: overlapped or blocking", kAll, true},
    RunKey{"block_launch_overhead_s", "--block-launch-overhead", "", kNumber, "0 to 1 (seconds)", "0",
           "Host seconds each transformer block pass adds beyond its kernels: its forward once, its backward "
           "twice, a full recompute once more (fitted on BigScience's runs: docs/VALIDATION.md)",
           kAll, true},
    RunKey{"freeze", "--freeze", "", kList, "glob patterns over layer names, e.g. [\"vision.*\"]", "[]",
           "Frozen layers: no W, gradients, optimizer state or reduction (simulate, plan; train: the vision encoder)", kAll},
    RunKey{"lora", "--lora", "", kObject, "{r >= 1, alpha > 0 (2r), target: [matrix names], train: [patterns]}", "",
           "LoRA adapters on the LM blocks' matrices; other weights frozen but train's patterns (simulate, plan; train: c_attn of the VLM)",
           kAll},
};

bool names(const RunKey& key, std::string_view name) {
  if (key.flag.empty()) return false;
  if (key.flag == name) return true;
  std::string_view rest = key.aliases;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    if (rest.substr(0, comma) == name) return true;
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return false;
}

template <class T>
bool whole(std::string_view text, T& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

std::string_view type_name(KeyType type) {
  switch (type) {
    case kInteger:
      return "an integer";
    case kNumber:
      return "a number";
    case kBoolean:
      return "true or false";
    case kString:
      return "text";
    case kList:
      return "a JSON list";
    case kObject:
      return "a JSON object";
    case kListOrObject:
      return "a JSON list or object";
    case kStringOrObject:
      return "text, or a JSON object";
  }
  return "";
}

}  // namespace

std::span<const RunKey> run_keys() { return kRunKeys; }

const RunKey* find_run_key(std::string_view path) {
  const auto it = std::find_if(kRunKeys.begin(), kRunKeys.end(), [&](const RunKey& k) { return k.path == path; });
  return it == kRunKeys.end() ? nullptr : &*it;
}

const RunKey* find_run_flag(std::string_view name) {
  const auto it = std::find_if(kRunKeys.begin(), kRunKeys.end(), [&](const RunKey& k) { return names(k, name); });
  return it == kRunKeys.end() ? nullptr : &*it;
}

nlohmann::json run_key_value(const RunKey& key, std::string_view text, std::string_view origin) {
  const auto refuse = [&] {
    fail("{} {}: must be {} (key {}: {})", origin, quoted_excerpt(text), type_name(key.type), key.path, key.rule);
  };
  switch (key.type) {
    case kInteger: {
      std::int64_t value = 0;
      if (!whole(text, value)) refuse();
      return value;
    }
    case kNumber: {
      double value = 0;
      if (!whole(text, value)) refuse();
      return value;
    }
    case kBoolean:
      if (text != "true" && text != "false") refuse();
      return text == "true";
    case kString:
      return std::string(text);
    case kStringOrObject: {
      const std::size_t first = text.find_first_not_of(" \t\r\n");
      if (first == std::string_view::npos || text[first] != '{') return std::string(text);
      try {
        return nlohmann::json::parse(text);  // an object: it begins with "{"
      } catch (const nlohmann::json::parse_error& e) {
        std::string_view why = e.what();  // "[json.exception.parse_error.101] parse error at ..."
        if (const std::size_t tag = why.find("] "); tag != std::string_view::npos) why.remove_prefix(tag + 2);
        fail("{} {}: begins with \"{{\" but is not a JSON object: {} (key {}: {})", origin, quoted_excerpt(text),
             why, key.path, key.rule);
      }
    }
    case kList:
    case kObject:
    case kListOrObject: {
      nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
      const bool fits = key.type == kList     ? value.is_array()
                        : key.type == kObject ? value.is_object()
                                              : value.is_array() || value.is_object();
      if (value.is_discarded() || !fits) refuse();
      return value;
    }
  }
  return nullptr;
}

RunOverrides::RunOverrides() = default;
RunOverrides::RunOverrides(const RunOverrides&) = default;
RunOverrides::RunOverrides(RunOverrides&&) noexcept = default;
RunOverrides& RunOverrides::operator=(const RunOverrides&) = default;
RunOverrides& RunOverrides::operator=(RunOverrides&&) noexcept = default;
RunOverrides::~RunOverrides() = default;

bool RunOverrides::empty() const { return values_.empty(); }

void RunOverrides::set(std::string_view path, nlohmann::json value) {
  if (find_run_key(path) == nullptr) fail("{}: no key of the run configuration has this path", path);
  const auto it = std::find_if(values_.begin(), values_.end(), [&](const auto& v) { return v.first == path; });
  if (it != values_.end()) {
    it->second = std::move(value);
  } else {
    values_.emplace_back(std::string(path), std::move(value));
  }
}

void RunOverrides::set_text(const RunKey& key, std::string_view text, std::string_view origin) {
  set(key.path, run_key_value(key, text, origin));
}

const nlohmann::json* RunOverrides::find(std::string_view path) const {
  const auto it = std::find_if(values_.begin(), values_.end(), [&](const auto& v) { return v.first == path; });
  return it == values_.end() ? nullptr : &it->second;
}

}  // namespace pipeflow
