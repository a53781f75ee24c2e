#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pipeflow/core/config.h"
#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_spec.h"
#include "pipeflow/model/model_states.h"
#include "pipeflow/model/partition.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/sim/layout.h"

namespace pipeflow {

// The one configuration file of a run, read by `pipeflow train --config` and
// `pipeflow simulate --config` alike. DeepSpeed's keys where DeepSpeed has
// one, pipeflow's beside them; every key, its default and its rule:
//
//   train_batch_size                 B, sequences per step over all replicas  } any two determine the
//   train_micro_batch_size_per_gpu   b, sequences per micro-batch             } third, as DeepSpeed;
//   gradient_accumulation_steps      m, micro-batches per step and replica    } B = b · m · data_parallel
//                                    (none given: b = 1, m = 1)
//   gradient_clipping                global-norm clipping threshold; 0 (default) disables
//   optimizer    {type: "AdamW" (DeepSpeed's "Adam" is AdamW by default and reads as AdamW),
//                 params: {lr 1e-3, betas [0.9, 0.999], eps 1e-8, weight_decay 0.01}}
//   scheduler    {type: WarmupLR | WarmupDecayLR | WarmupCosineLR, params: DeepSpeed's}:
//                   WarmupLR        warmup_min_lr 0, warmup_max_lr 1e-3, warmup_num_steps 1000,
//                                   warmup_type "log" | "linear"
//                   WarmupDecayLR   those and total_num_steps (required)
//                   WarmupCosineLR  total_num_steps (required), warmup_min_ratio 0,
//                                   warmup_num_steps 1000, cos_min_ratio 1e-4, warmup_type
//                absent: the optimizer's lr throughout
//   zero_optimization {stage: 0..3}  ZeRO stage (model-state sharding over data_parallel)
//   pipeline     {stages 1               pipeline ranks p
//                 partition_method "parameters"   uniform | parameters | type:REGEX | balanced |
//                                                 counts:N,... | bounds:B,... (model's partition.h)
//                 activation_checkpoint_interval 0   k > 0: recompute every block's forward
//                 schedule "1f1b"        a generator name (schedule/generators.h)
//                 virtual_stages 1}      model chunks per rank v
//   model        a preset name, a Hugging Face config.json path, or the small GPT
//                {n_layer, n_head, n_embd, n_ctx (required), vocab_size 256}; required by
//                train and simulate (layout_from_run_config), not by the parser
//   data         {path "..." or paths [...] (default: the fortunes corpus), validation_fraction 0.1}
//   steps 100, seed 1234, eval_interval 10 (0: after the last step only), out_dir "runs/pipeflow"
//   checkpoint   {interval 0 (steps between checkpoints, and one after the last step; 0: none),
//                 dir (default out_dir/checkpoints), load (a checkpoint file, or a directory
//                 whose latest step_N.safetensors is taken, to resume from; default none)}
// and the keys only the simulator reads (what the cluster is):
//   hardware "cpu"        a preset name or a hardware profile JSON path
//   devices               tensor_parallel · pipeline.stages · data_parallel (checked if given)
//   tensor_parallel 1, data_parallel 1, sequence_parallel false
//                         (Megatron's rules: off, with a warning, when
//                         tensor_parallel is 1; an error unless the sequence
//                         length is a multiple of tensor_parallel)
//   recompute             none | selective | full; default full when
//                         activation_checkpoint_interval > 0, else none
//   seq_length            tokens per sequence (default: the model's context)
//   comm_mode "overlapped" | "blocking"
//
// Paths are used as written (relative to the working directory).

struct OptimizerConfig {
  std::string type = "AdamW";
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.01;
};

struct SchedulerConfig {
  std::string type;  // empty: none
  double warmup_min_lr = 0;
  double warmup_max_lr = 1e-3;
  int warmup_num_steps = 1000;
  std::string warmup_type = "log";
  int total_num_steps = 0;
  double warmup_min_ratio = 0;
  double cos_min_ratio = 1e-4;
};

struct PipelineConfig {
  int stages = 1;
  PartitionMethod partition_method{PartitionMethod::Kind::kParameters, {}, {}};
  int activation_checkpoint_interval = 0;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
};

struct DataConfig {
  std::vector<std::string> paths;  // empty: the default corpus
  double validation_fraction = 0.1;
};

struct CheckpointConfig {
  int interval = 0;
  std::string dir;   // empty: out_dir/checkpoints
  std::string load;  // empty: start fresh
};

// The three batch keys as given (before any is derived).
struct BatchKeys {
  std::optional<int> train_batch_size;
  std::optional<int> micro_batch;
  std::optional<int> gradient_accumulation_steps;
};

struct BatchSizes {
  int global = 1;        // B
  int micro = 1;         // b
  int accumulation = 1;  // m
};

// DeepSpeed's rule: with two keys the third is derived, with all three they
// must agree, with one the accumulation is 1; B = b · m · d. Throws Error
// naming `source`, both sides of the rule and the fix.
BatchSizes resolve_batch_sizes(const BatchKeys& keys, int data_parallel, const std::string& source);

struct RunConfig {
  std::string source;  // the file, for messages

  BatchKeys batch_keys;
  BatchSizes batch;  // resolved from batch_keys and data_parallel
  double gradient_clipping = 0;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroStage zero = ZeroStage::kNone;
  PipelineConfig pipeline;

  std::string model_source;  // as written: preset, path, or "inline"
  ModelSpec model;
  DataConfig data;
  int steps = 100;
  std::uint64_t seed = 1234;
  int eval_interval = 10;
  std::string out_dir = "runs/pipeflow";
  CheckpointConfig checkpoint;

  std::string hardware_source = "cpu";
  HardwareProfile hardware;
  std::optional<int> devices;
  int tensor_parallel = 1;
  int data_parallel = 1;
  bool sequence_parallel = false;      // as written; see effective_sequence_parallel()
  std::optional<Recompute> recompute;  // absent: from activation_checkpoint_interval
  int seq_length = 0;                  // 0: the model's context
  CommMode comm_mode = CommMode::kOverlapped;

  // Keys accepted but overridden, one line each, for the command to print:
  // sequence_parallel with tensor_parallel 1.
  std::vector<std::string> warnings;

  // recompute, else full with activation checkpointing, else none.
  Recompute effective_recompute() const;
  // sequence_parallel, off for tensor_parallel 1: it splits the activations
  // over the tensor-parallel ranks, of which there is one (Megatron-LM turns
  // it off there with a warning, so does parse_run_config()).
  bool effective_sequence_parallel() const { return sequence_parallel && tensor_parallel > 1; }
  int sequence() const { return seq_length > 0 ? seq_length : model.max_positions; }
};

// Reads and checks every key above; unknown keys and bad values are Errors
// naming the source, the key path, the value, the rule and the fix, e.g.
//   run.json: pipeline.stages = 0: must be a positive integer: the number of pipeline ranks
RunConfig parse_run_config(const Config& config);
RunConfig load_run_config(const std::filesystem::path& path);

// The configuration with nothing but defaults (what a command line without
// --config starts from); its model is unset (model_source empty).
RunConfig default_run_config();

// Command-line values that replace the file's (absent: keep the file's).
// Names are the `pipeflow simulate` flags.
struct RunOverrides {
  std::optional<std::string> model;     // --model: preset or config.json path
  std::optional<std::string> hardware;  // --hardware: preset or profile path
  std::optional<int> devices;           // --devices
  std::optional<int> tensor_parallel;   // --tp
  std::optional<int> pipeline_stages;   // --pp
  std::optional<int> data_parallel;     // --dp
  std::optional<int> micro_batch;       // --micro-batch
  std::optional<int> global_batch;      // --global-batch
  std::optional<int> seq_length;        // --seq
  std::optional<std::string> schedule;  // --schedule
  std::optional<int> virtual_stages;    // --virtual
  std::optional<std::string> recompute; // --recompute
  std::optional<bool> sequence_parallel;  // --sequence-parallel
  std::optional<std::string> partition;   // --partition
  std::optional<int> zero_stage;          // --zero
  std::optional<std::string> comm_mode;   // --comm
};

// Writes the overrides into run_config_to_json(run) under their keys (--pp is
// pipeline.stages, --global-batch train_batch_size, --micro-batch
// train_micro_batch_size_per_gpu, --zero zero_optimization.stage, ...) and
// parses it again, so a flag is checked exactly as the key would be in a
// file. A new micro or global batch drops the file's
// gradient_accumulation_steps (derived again); so does a new data parallel
// size when the file gives all three batch keys. Errors name "<file> with
// the command line" (or "the command line") as their source.
void apply_overrides(RunConfig& run, const RunOverrides& overrides);

// The layout a run configuration describes, for the simulator. Throws Error
// for a layout that breaks a rule (validate_layout).
Layout layout_from_run_config(const RunConfig& run);

// The configuration in the file's form, to keep beside a run's outputs:
// every key with its value (defaults written out), the batch keys as given,
// the model and hardware as their sources. parse_run_config reads it back to
// the same RunConfig.
std::string run_config_to_json(const RunConfig& run);

}  // namespace pipeflow
