#pragma once

#include <optional>
#include <string>

#include "pipeflow/config/run_config.h"
#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_spec.h"
#include "pipeflow/model/model_states.h"
#include "pipeflow/model/partition.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/model/training.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/schedule/schedule.h"

namespace pipeflow {

// How a model is trained on a cluster: what `pipeflow simulate` predicts and
// `pipeflow plan` searches over. A plain value.
//
// Devices are numbered as Megatron-LM orders its ranks: tensor parallelism
// innermost, then data parallelism, then pipeline parallelism, i.e. device
//   pp_rank · (tp · dp) + dp_rank · tp + tp_rank,
// with devices_per_node consecutive devices per node. A tensor-parallel group
// is tp neighbours (one node when tp <= devices_per_node); pipeline neighbours
// are tp · dp devices apart. With rank_order tp-pp-dp (Megatron's
// --use-tp-pp-dp-mapping) the device is dp_rank · (tp · pp) + pp_rank · tp +
// tp_rank: pipeline neighbours tp apart, data-parallel ones tp · pp.
struct Layout {
  ModelSpec model;
  HardwareProfile hardware;
  int devices = 1;             // must equal tp · pp · dp
  int tensor_parallel = 1;     // t
  int pipeline_ranks = 1;   // p: pipeline ranks
  int data_parallel = 1;       // d: replicas of the pipeline
  int micro_batch = 1;         // b: sequences per micro-batch
  int global_batch = 1;        // B: sequences per optimizer step over all replicas
  int seq_length = 0;          // s: tokens per sequence (must be set: validate_layout)
  // Micro-batch i's sequences hold variable_seq_lengths[i mod n] tokens each
  // (each in [1, s]; s sizes the buffers); empty: every micro-batch s.
  std::vector<int> variable_seq_lengths = {};
  // A vision-language model's micro-batch i holds variable_images[i mod k]
  // images per sequence (their image tokens counted in its length); empty:
  // the model's images per sequence.
  std::vector<int> variable_images = {};
  std::string schedule = "1f1b";  // a generator's name, or the schedule file's
  int chunks = 1;      // v: model chunks per rank (zbv and dualpipev always hold 2)
  // A schedule file's schedule (pipeline.schedule_file), run instead of a
  // generator's; resolve() checked it against p, v and m.
  std::optional<Schedule> file_schedule;
  Recompute recompute = Recompute::kNone;
  // Full recomputation keeps a block's input only at every k-th layer of its
  // stage (pipeline.activation_checkpoint_interval; Megatron-LM's
  // --recompute-num-layers with its uniform method): fewer inputs held, the
  // same recomputed FLOPs, and a backward that rebuilds k blocks at once.
  int recompute_interval = 1;
  bool sequence_parallel = false;
  PartitionMethod partition{PartitionMethod::Kind::kParameters, {}, {}};  // DeepSpeed's default
  ZeroStage zero = ZeroStage::kNone;
  CommMode comm_mode = CommMode::kOverlapped;
  // Host seconds each transformer block's forward pass adds on the device
  // beyond its kernels' time: host work the device waits for (a framework's
  // per-kernel or per-layer overhead that does not hide behind the kernels).
  // A block's backward pays it twice (input and weight gradients: about twice
  // the forward's kernels), a full recomputation once more. 0: none. Fitted
  // at 4 ms on BigScience's runs, whose cause it does not name
  // (docs/VALIDATION.md).
  double block_launch_overhead_s = 0;
  RankOrder rank_order = RankOrder::kTensorDataPipeline;
  // Weights, activations and messages, and the GEMMs' peak (Precision);
  // the data-parallel gradients travel in `gradient_precision`.
  Precision precision = Precision::kFp32;
  Precision gradient_precision = Precision::kFp32;
  // What the gradients accumulate in across micro-batches (ResolvedRun's):
  // 4 or 2 bytes a parameter of the model states (model_states.h).
  Precision gradient_accumulation = Precision::kFp32;
  // What trains: frozen layers and LoRA adapters (model/training.h).
  TrainingSpec training = {};
};

// The hardware as a layout's GEMMs run on it: its peak at the layout's precision.
HardwareProfile priced_hardware(const Layout& layout);

// The layout a resolved run configuration describes: a projection, checked
// by resolve() already.
Layout layout_of(const ResolvedRun& run);

// Throws Error, naming both sides of the broken rule and the fix, unless
// every count is positive, devices = tp · pp · dp (config/rules.h), the
// global batch is a whole number of micro-batches on every replica:
// B = b · m · d, and with sequence parallelism (t > 1) seq_length is a
// multiple of t. For layouts built in code (a search, a test); a projection
// of a resolved run passes by construction.
void validate_layout(const Layout& layout);

// One micro-batch's sequences where micro-batches differ
// (variable_seq_lengths, variable_images): tokens and images per sequence.
struct MicrobatchShape {
  int seq_length = 0;
  int images = 0;
  friend auto operator<=>(const MicrobatchShape&, const MicrobatchShape&) = default;
};
// Whether the layout's micro-batches differ in length or images.
bool microbatches_differ(const Layout& layout);
// Micro-batch 0 … m − 1's shapes, each list repeated over the m micro-batches
// (the same on every replica); the layout's seq_length and the model's
// images where a list is empty.
std::vector<MicrobatchShape> microbatch_shapes(const Layout& layout, int m);
// The layout with every micro-batch of `shape` (the lists cleared).
Layout with_microbatch_shape(Layout layout, MicrobatchShape shape);

// m: micro-batches per step on each pipeline (DeepSpeed's
// gradient_accumulation_steps) = B / (b · d). Validates the layout.
int microbatches_per_step(const Layout& layout);

// The per-micro-batch, per-device configuration of the model's layers,
// their elements in the layout's precision.
// Megatron's scatter/gather of P2P messages (Narayanan et al. 2021 §4.1) is on
// whenever t > 1, as in Megatron-LM.
ParallelConfig parallel_config(const Layout& layout);

// parallel_config(layout) without tensor parallelism: the whole model's
// layers, as model FLOPs and parameter counts take them.
ParallelConfig whole_model_config(const Layout& layout);

// The model's pipeline layers as the layout trains them: pipeline_layers
// under `config`, with the layout's training applied (apply_training).
std::vector<PipelineLayer> layout_layers(const Layout& layout, const ParallelConfig& config);
inline std::vector<PipelineLayer> layout_layers(const Layout& layout) {
  return layout_layers(layout, parallel_config(layout));
}

// What a layout trains, over the whole model (its layers without tensor
// parallelism): what simulate reports beside the run's other settings, and
// what the advice on recompute and optimizer state (plan, analyze, review)
// must take into account.
struct TrainingSummary {
  std::int64_t parameters = 0;            // LoRA's adapters included
  std::int64_t trainable_parameters = 0;  // with gradients and optimizer state
  int layers = 0;                         // pipeline layers in all
  std::vector<std::string> frozen;        // the layers that train nothing, in pipeline order
  int adapted = 0;                        // layers whose base weights are frozen beside trained LoRA adapters
  // The first frozen layers, before any trainable one: they run no backward
  // at all (no I, no recompute, no activations kept).
  int without_backward = 0;

  // The layers without a backward as a range, "vision.patch_embedding..vision.block.22" (the name alone for
  // one); "" for none.
  std::string without_backward_range() const;
  // What advice on memory must say where layers are frozen ("" where all train):
  //   trainable_note        "the 6.76B trainable parameters (the 291M frozen have no gradients or optimizer
  //                         state)": whose gradients and optimizer state there are, for ZeRO to shard;
  //   no_backward_note      "vision.patch_embedding..vision.block.22, frozen before any trainable layer, run no
  //                         backward: they keep no activations and recompute nothing".
  std::string trainable_note() const;
  std::string no_backward_note() const;
};
TrainingSummary training_summary(const Layout& layout);

}  // namespace pipeflow
