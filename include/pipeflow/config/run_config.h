#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/config/run_keys.h"
#include "pipeflow/core/config.h"
#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_spec.h"
#include "pipeflow/model/model_states.h"
#include "pipeflow/model/partition.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/model/precision.h"
#include "pipeflow/model/training.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/schedule/schedule.h"

namespace pipeflow {

// The one configuration file of a run, read by `pipeflow train --config` and
// `pipeflow simulate --config` alike. DeepSpeed's keys where DeepSpeed has
// one, read as DeepSpeed reads them; pipeflow's beside them. Every key's
// flag, type, rule and default is its row of run_keys() (config/run_keys.h);
// the keys and the rules between them:
//
//   train_batch_size                 B, sequences per step over all replicas  } any two determine the
//   train_micro_batch_size_per_gpu   b, sequences per micro-batch             } third, as DeepSpeed;
//   gradient_accumulation_steps      m, micro-batches per step and replica    } B = b · m · data_parallel
//                                    (none given: b = 1, m = 1)
//   gradient_clipping                global-norm clipping threshold; 0 (default) disables
//   optimizer    {type: "AdamW" | "Adam" (matched without case, as DeepSpeed does),
//                 params: {lr 1e-3, betas [0.9, 0.999], eps 1e-8, weight_decay 0.01,
//                          adam_w_mode true, torch_adam (accepted, no effect)}}
//                DeepSpeed's rule: type AdamW, or Adam with adam_w_mode true, decays weights
//                decoupled (AdamW); Adam with adam_w_mode false adds weight_decay · w to the
//                gradient (Adam with L2).
//   scheduler    {type: WarmupLR | WarmupDecayLR | WarmupCosineLR, params: DeepSpeed's}:
//                   WarmupLR        warmup_min_lr 0, warmup_max_lr 1e-3, warmup_num_steps 1000,
//                                   warmup_type "log" | "linear"
//                   WarmupDecayLR   those and total_num_steps (required)
//                   WarmupCosineLR  total_num_steps (required), warmup_min_ratio 0,
//                                   warmup_num_steps 1000, cos_min_ratio 1e-4, warmup_type
//                absent: the optimizer's lr throughout
//   zero_optimization {stage: 0..3  ZeRO stage (model-state sharding over data_parallel)
//                      reduce_bucket_size 4194304}  elements per data-parallel reduce-scatter
//                                        call (DeepSpeed's key): two are in flight at a time
//   fp16, bf16   {enabled}: mixed precision in fp16 or bf16 (at most one enabled; neither: fp32,
//                as DeepSpeed); fp16's loss scaling {loss_scale 0 (dynamic; > 0 static),
//                initial_scale_power 16, loss_scale_window 1000, hysteresis 2, min_loss_scale 1}
//   communication_data_type   fp32 | bf16 | fp16: the data-parallel gradient reduction's
//                elements (absent: the training precision's)
//   data_types   {grad_accum_dtype}: fp32 | bf16 | fp16, what gradients accumulate in
//                across micro-batches (absent: model_states.h's default_gradient_accumulation)
//   steps_per_print                  steps between progress lines (0, the default: about 50 lines a run)
//   wall_clock_breakdown             accepted: pipeflow times every action of every step anyway
//   pipeline     {stages 1               pipeline ranks p
//                 partition_method "parameters"   uniform | parameters | type:REGEX | balanced |
//                                                 counts:N,... | bounds:B,... (model's partition.h)
//                 activation_checkpoint_interval 0   the recompute interval: k > 0 keeps the input of
//                                        every k-th block and recomputes the rest in the backward
//                 schedule "1f1b"        a registered schedule (schedule/generators.h)
//                 schedule_file          instead of schedule: a schedule file to run as written,
//                                        PyTorch pipelining CSV (either dialect, schedule/io.h)
//                                        or pipeflow JSON; it fixes the ranks, the chunks per
//                                        rank and the micro-batches, so stages, virtual_stages
//                                        and gradient_accumulation_steps default to the file's
//                                        and, if given, must agree; schedule must be absent
//                 virtual_stages 1}      model chunks per rank v
//   model        a preset name, a Hugging Face config.json path, or the small GPT
//                {n_layer, n_head, n_embd, n_ctx (required), vocab_size 256}, with an optional
//                vision tower in front of it (the small vision-language model pipeflow trains:
//                vision {n_layer, n_head, n_embd, image_size, patch_size (required)}: CLIP's
//                embeddings (class token, pre-LayerNorm) and GPT-2 blocks over one RGB image's
//                patches, the patch tokens projected); may be left out
//                when a weights file or checkpoint gives the shape (resolve())
//   data         {path "..." or paths [...] (default: the fortunes corpus), validation_fraction 0.1}
//   steps 100, seed 1234, eval_interval 10 (0: after the last step only), out_dir "runs/pipeflow"
//   checkpoint   {interval 0 (the save interval: steps between checkpoints, and one after the
//                 last step; 0: none), dir (default out_dir/checkpoints), load (a checkpoint file,
//                 a directory or a run's out_dir, whose newest good step_N.safetensors is taken,
//                 to resume from), keep 0 (the newest checkpoints kept; 0: all)}
//   numerics     {max_skipped_steps 3 (steps in a row skipped for a non-finite loss or gradient
//                 norm before the run stops)}
//   metrics      {noise_scale_interval 1 (steps between measurements of the gradient noise
//                 scale, runtime/noise_scale.h; 0: never)}
// and the keys that describe the cluster (what the simulator prices):
//   hardware "cpu"        a preset name or a hardware profile JSON path
//   devices               tensor_parallel · pipeline.stages · data_parallel (checked if given)
//   tensor_parallel 1, data_parallel 1, sequence_parallel false
//                         (Megatron's rules: off, with a warning, when
//                         tensor_parallel is 1; an error unless seq_length
//                         is a multiple of tensor_parallel)
//   recompute             none | selective | full; default full when
//                         activation_checkpoint_interval > 0, else none
//   seq_length            tokens per sequence (default: the model's context)
//   variable_seq_lengths []   tokens per sequence of each micro-batch, the
//                         list repeated over a step's micro-batches (Megatron's
//                         --variable-seq-lengths); each in [1, seq_length],
//                         seq_length the longest (what buffers are sized for);
//                         or {distribution: "uniform", min, max, seed 0} or
//                         {distribution: "normal", mean, std, min, max, seed
//                         0}: a step's m lengths drawn (LengthDistribution)
//   variable_images []    images per sequence of each micro-batch, repeated
//                         the same way (a vision-language model; each >= 1)
//   comm_mode "overlapped" | "blocking"
//   block_launch_overhead_s 0  host seconds each transformer block pass
//                         adds beyond its kernels (0 to 1; sim/layout.h)
// and what trains (model/training.h; simulate and plan price it, train
// runs what its vision-language model can and refuses it for a language
// model, runtime/run_settings.h):
//   freeze []             glob patterns over pipeline layer names ("vision.*")
//   lora                  {r, alpha, target: [matrix names], train: [patterns]}
//
// Paths are used as written (relative to the working directory).

struct OptimizerConfig {
  std::string type = "AdamW";  // as written
  // Decoupled weight decay (AdamW); false: Adam with L2 (DeepSpeed's Adam
  // with adam_w_mode false). Already DeepSpeed's effective value: type AdamW
  // forces it on.
  bool adam_w_mode = true;
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

// The pipeline section. Code says ranks (p), stages (p·v, a schedule's
// stages), chunks (v, model chunks per rank) and cuts; DeepSpeed's words
// (stages for p, virtual_stages for v) are the JSON keys only.
struct PipelineConfig {
  int ranks = 1;  // key pipeline.stages
  PartitionMethod partition_method{PartitionMethod::Kind::kParameters, {}, {}};
  // DeepSpeed's activation_checkpoint_interval: 0 keeps every activation; k
  // recomputes each block's forward from the input of every k-th block.
  int recompute_interval = 0;
  std::string schedule = "1f1b";  // empty when schedule_file is given
  int chunks = 1;  // key pipeline.virtual_stages
  // The key schedule_file as written (empty: none), the schedule read from
  // it (validated by resolve()), and how it was read (describe_schedule_file).
  std::string schedule_file;
  std::optional<Schedule> file_schedule;
  std::string file_note;
};

struct DataConfig {
  std::vector<std::string> paths;  // empty: the default corpus
  double validation_fraction = 0.1;
};

struct CheckpointConfig {
  int save_interval = 0;  // key checkpoint.interval; 0: no checkpoints
  std::string dir;        // empty: out_dir/checkpoints
  std::string load;       // empty: start fresh
  // Key checkpoint.keep: the newest checkpoints kept in dir, older ones
  // deleted after each write; 0 keeps all (a run never deletes what it was
  // not asked to).
  int keep = 0;
};

// DeepSpeed's fp16 section: dynamic loss scaling starts at
// 2^initial_scale_power, halves after `hysteresis` overflowing steps in a
// row (never below min_loss_scale) and doubles after loss_scale_window clean
// steps; loss_scale > 0 is a static scale instead.
struct LossScaleConfig {
  double loss_scale = 0;  // 0: dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1;
};

struct NumericsConfig {
  int max_skipped_steps = 3;  // >= 1
};

struct MetricsConfig {
  int noise_scale_interval = 1;  // >= 0; 0: the noise scale is not measured
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

// Tokens per sequence drawn for each micro-batch of a step
// (variable_seq_lengths as an object): uniform over the whole numbers
// [min, max], or normal (mean, std) rounded and clipped to [min, max]. The
// draws are a splitmix64 stream from `seed` (uniform: inverse transform;
// normal: Box–Muller), so a seed gives the same lengths on every machine.
struct LengthDistribution {
  enum class Kind { kUniform, kNormal };
  Kind kind = Kind::kUniform;
  int min = 1;
  int max = 1;
  double mean = 0;  // kNormal
  double std = 0;   // kNormal
  std::uint64_t seed = 0;
  // Micro-batch 0 … count − 1's lengths.
  std::vector<int> draw(int count) const;
  friend bool operator==(const LengthDistribution&, const LengthDistribution&) = default;
};

// Elements of a gradient bucket reduced over the data-parallel replicas at
// a time (16 MiB of fp32), the default of zero_optimization.reduce_bucket_size.
inline constexpr std::int64_t kReduceBucketSize = std::int64_t{1} << 22;

// The configuration as written: every key read and checked on its own and
// against the keys it is tied to, nothing derived from the model yet.
// How world ranks are numbered over the three dimensions, fastest first
// (Megatron-LM's order strings): "tp-dp-pp", Megatron's default, keeps a
// data-parallel group within few machines; "tp-pp-dp"
// (--use-tp-pp-dp-mapping) keeps a pipeline together instead.
enum class RankOrder { kTensorDataPipeline, kTensorPipelineData };
const char* to_string(RankOrder order);

struct RunConfig {
  std::string source;  // the file, for messages

  BatchKeys batch_keys;
  double gradient_clipping = 0;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroStage zero = ZeroStage::kNone;
  std::int64_t reduce_bucket_size = kReduceBucketSize;  // zero_optimization.reduce_bucket_size
  Precision precision = Precision::kFp32;  // bf16.enabled, fp16.enabled
  LossScaleConfig loss_scale;              // the fp16 section's scaling keys
  std::optional<Precision> communication_data_type;  // absent: the precision's
  std::optional<Precision> grad_accum_dtype;  // data_types.grad_accum_dtype; absent: default_gradient_accumulation
  PipelineConfig pipeline;

  std::string model_source;        // as written: preset, path, or "inline"; empty: none given
  std::optional<ModelSpec> model;  // absent: from a weights file or checkpoint (resolve())
  DataConfig data;
  int steps = 100;
  std::uint64_t seed = 1234;
  int eval_interval = 10;
  int steps_per_print = 0;  // 0: about 50 progress lines a run
  std::string out_dir = "runs/pipeflow";
  CheckpointConfig checkpoint;
  NumericsConfig numerics;
  MetricsConfig metrics;

  std::string hardware_source = "cpu";
  HardwareProfile hardware;
  std::optional<int> devices;
  int tensor_parallel = 1;
  int data_parallel = 1;
  bool data_parallel_given = false;    // the key was written (or --data-parallel given)
  bool sequence_parallel = false;      // as written; ResolvedRun has the effective value
  RankOrder rank_order = RankOrder::kTensorDataPipeline;
  std::optional<Recompute> recompute;  // absent: from pipeline.recompute_interval
  int seq_length = 0;                  // 0: the model's context
  std::vector<int> variable_seq_lengths;  // empty: every micro-batch seq_length
  std::optional<LengthDistribution> seq_length_distribution;  // instead of the list
  std::vector<int> variable_images;       // empty: the model's images per sequence
  CommMode comm_mode = CommMode::kOverlapped;
  double block_launch_overhead_s = 0;  // sim/layout.h
  TrainingSpec training;               // freeze, lora

  // Keys accepted but overridden, one line each, for the command to print:
  // sequence_parallel with tensor_parallel 1, DeepSpeed's "auto" resolved,
  // a course's spelling of a PipelineModule argument read.
  std::vector<std::string> warnings;
  // DeepSpeed's keys the file holds that pipeflow reads but does not model,
  // each "KEY (what DeepSpeed uses it for)" (deepspeed_keys.h).
  std::vector<std::string> not_modelled;
};

// Reads and checks every key above, with `overrides` written over the
// file's keys first (so a flag is checked exactly as its key in a file; a
// new micro or global batch drops the file's gradient_accumulation_steps,
// derived again, and so does a new data_parallel when the file gives all
// three batch keys; devices follow a new parallel layout unless given too;
// a schedule and a schedule file replace each other, and so do data.path
// and data.paths).
// Unknown keys and bad values are Errors naming the source ("<file> with
// the command line" when there are overrides), the key path, the value, the
// rule and the fix, e.g.
//   run.json: pipeline.stages = 0: must be a positive integer: the number of pipeline ranks
RunConfig parse_run_config(const Config& config, const RunOverrides& overrides = {});
// The keys given that make micro-batches of their own shapes
// ("variable_seq_lengths", "variable_images"), for a command that runs one
// shape to refuse by name.
std::vector<std::string_view> microbatch_shape_keys(const RunConfig& run);
RunConfig load_run_config(const std::filesystem::path& path, const RunOverrides& overrides = {});

// The keys whose string values parse_run_config opens as files (model and
// hardware when they are a path rather than a preset's name), as JSON
// pointers into the configuration.
inline constexpr std::array<const char*, 3> kRunConfigFileKeys = {"/model", "/hardware", "/pipeline/schedule_file"};
// The defaults alone (a command line without --config), with the overrides;
// source "the command line".
RunConfig default_run_config(const RunOverrides& overrides = {});

// A model shape that comes with a file (a weights file or a checkpoint).
struct ModelFromFile {
  ModelSpec model;
  std::string file;
};

// The run as it will run: every "absent" and "0 means" fixed once, from the
// keys, the model's shape and the world the run starts in. Commands resolve
// once; Layout (sim), the trainer's settings and the engine's options are
// projections of this. runtime::train_settings still refuses what the
// runtime cannot run (tensor parallelism, ZeRO-2/3, blocking sends,
// selective recompute).
struct ResolvedRun {
  // As given, with what resolve() fills in: the model a file gave (inline)
  // and data_parallel from the world size. Written beside a run's outputs.
  RunConfig config;
  ModelSpec model;      // what runs
  BatchSizes batch;     // B, b, m
  int seq_length = 0;   // tokens per sequence, > 0
  // Tokens per sequence of each micro-batch (the list, repeated over a
  // step's m, or m lengths drawn from the distribution); empty: seq_length.
  std::vector<int> microbatch_lengths;
  int devices = 1;      // tensor_parallel · stages · data_parallel
  Recompute recompute = Recompute::kNone;
  bool sequence_parallel = false;  // effective: off at tensor_parallel 1
  // What gradients accumulate in: data_types.grad_accum_dtype, else
  // default_gradient_accumulation(precision, zero).
  Precision gradient_accumulation = Precision::kFp32;
  // What runs: pipeline.schedule_file's schedule, or the generator's for
  // (pipeline.stages, micro-batches per step, pipeline.virtual_stages).
  Schedule schedule{"unresolved", 1, 1, 1, Placement::kLoop};
  std::string checkpoint_dir;  // checkpoint.dir, else out_dir/checkpoints
  int steps_per_print = 1;     // steps_per_print, else about 50 progress lines a run
};

// The model is the configuration's, or the file's when the configuration
// has none; both given and different is an Error naming both shapes. No
// model at all is an Error naming the key and the flags. With a world size
// (the processes mpirun started), data_parallel not given is the world over
// tensor_parallel · pipeline.stages (an Error unless it divides), and given
// must make the world. Then the batch sizes (DeepSpeed's rule), the sequence
// length (seq_length, else the model's context; at most a GPT's learned
// positions), recompute, sequence parallelism (a multiple of
// tensor_parallel) and the schedule, built for (stages, micro-batches,
// virtual stages); a schedule file must have the resolved micro-batches and
// pass validate() (the Error holds the validator's report).
ResolvedRun resolve(const RunConfig& run, const std::optional<ModelFromFile>& from_file = std::nullopt,
                    std::optional<int> world_size = std::nullopt);

// The configuration in the file's form, to keep beside a run's outputs:
// every key with its value (defaults written out), the batch keys as given,
// the model and hardware as their sources. parse_run_config reads it back to
// the same RunConfig.
std::string run_config_to_json(const RunConfig& run);

}  // namespace pipeflow
