#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/model/hardware.h"
#include "pipeflow/model/pipeline_layers.h"

namespace pipeflow {

// Partitioning cuts a sequence of n layers into contiguous, non-empty stages.
// A partition is given by its boundaries: p + 1 increasing layer indices
// 0 = b[0] < b[1] < … < b[p] = n; stage k holds layers [b[k], b[k+1]).
// The functions here are pure and deterministic.

// Equal layer counts, every layer (embedding and head included) counting as
// one, as DeepSpeed's partition_uniform: ⌊n/p⌋ layers each and the first
// n mod p stages one more. Throws Error when p > n or p < 1.
std::vector<int> partition_uniform(int layers, int stages);

// The exact contiguous partition minimising the heaviest stage's summed
// weight (the linear partition problem), by dynamic programming over prefix
// sums, O(p·n²). Among partitions with that heaviest stage it picks one
// whose lightest stage is heaviest (the least spread); remaining ties give
// later stages as many layers as they can take (later stages hold fewer
// micro-batches under 1F1B). Sums within 1e-12 of the total weight count as
// equal, so rounding does not break ties. Weights must be finite and >= 0.
// Throws Error when p > n or p < 1.
std::vector<int> partition_min_max(std::span<const double> weights, int stages);

// How to choose the cuts of a model's pipeline layers.
//   uniform         equal layer counts (partition_uniform)
//   parameters      balance parameters per layer, the tied head counted with
//                   its copy (DeepSpeed's partition_method="parameters")
//   type:REGEX      balance the number of layers whose name matches REGEX
//                   (ECMAScript, case-insensitive, searched anywhere in the
//                   name), as DeepSpeed's "type:" which matches class names;
//                   here the names are "embedding", "block.N", "head",
//                   and with a vision tower "vision.patch_embedding",
//                   "vision.block.N", "projector" ("type:block" balances the
//                   blocks of both towers, "type:^block" the LM's alone)
//   balanced        minimise the slowest stage's forward + backward time
//                   (incl. recompute) on the hardware: embedding and LM head
//                   count with their real cost
//   counts:N,N,...  explicit layers per stage (sum = number of layers)
//   bounds:B,B,...  explicit boundaries 0, …, n
// DeepSpeed's parameters/type: minimise the spread (max − min) of stage
// weights; pipeflow minimises the heaviest stage first (what sets the
// pipeline's pace), then the spread.
struct PartitionMethod {
  enum class Kind { kUniform, kParameters, kType, kBalanced, kCounts, kBounds };
  Kind kind = Kind::kUniform;
  std::string pattern;      // kType
  std::vector<int> values;  // kCounts / kBounds
};

// Parses the text forms above; errors list them.
PartitionMethod parse_partition_method(std::string_view text);
std::string to_string(const PartitionMethod& method);

struct StagePlan {
  int first = 0;  // first layer
  int end = 0;    // one past the last layer
  std::vector<std::string> layer_names;
  std::int64_t parameters = 0;  // per device, including a tied copy held here
  std::int64_t trainable_parameters = 0;  // of those, the ones that train (training.h)
  double model_flops = 0;       // forward + backward, per micro-batch
  double hardware_flops = 0;    // plus recompute
  double seconds = 0;           // hardware_flops at the profile's achieved rate
};

struct Partition {
  std::vector<int> boundaries;  // p + 1 entries
  std::vector<StagePlan> stages;
  // The slowest stage's seconds (what the pipeline's steady state waits on).
  double max_stage_seconds() const;
};

// Cuts `layers` into `stages` stages by `method`, and reports each stage's
// cost on `hardware`. Throws Error (rule and fix in the message) when there
// are more stages than layers, an explicit list does not cover the layers
// exactly, or a type: pattern is invalid or matches no layer.
Partition partition_layers(const std::vector<PipelineLayer>& layers, int stages, const PartitionMethod& method,
                           const HardwareProfile& hardware);

// The per-layer weights `balanced` uses: hardware FLOPs (fwd + I + W +
// recompute) converted to seconds on `hardware`.
std::vector<double> layer_seconds(const std::vector<PipelineLayer>& layers, const HardwareProfile& hardware);

}  // namespace pipeflow
