#pragma once

#include <cstdint>
#include <span>

#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_spec.h"
#include "pipeflow/model/partition.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/schedule/schedule.h"
#include "pipeflow/sim/layout.h"
#include "pipeflow/sim/simulation.h"

namespace pipeflow {

// The cost model: a layout becomes per-stage durations, messages, links and
// memory for simulate(). Every figure and its source is in docs/SIMULATOR.md;
// in short:
//   compute      per layer (layer_compute_seconds): each GEMM at the
//                hardware's efficiency for its shape (model's matmul_seconds),
//                the attention core's batched GEMMs likewise (thin: k = head
//                width), memory-bound kernels (norms, activations, softmax,
//                dropout, cross entropy, embedding) by the bytes they move
//                over HBM; I carrying any recomputation;
//   tensor par.  ring all-reduces of the b·s·h activation on the tensor-parallel
//                group's link: 2 per block in the forward, 2 in I (4 with full
//                recompute, which repeats the forward's), 1 in the embedding's
//                forward, 1 in the head's I; fully exposed;
//   messages     the stage's last layer's output_bytes on the link between the
//                two ranks' first devices;
//   collectives  tensor- and data-parallel all-reduces at the link's
//                bandwidth × the hardware's collective_efficiency;
//   data par.    a ring all-reduce of the gradients (Layout::gradient_precision:
//                2 or 4 bytes per parameter) of the rank, over its d replicas (ZeRO's reduce-scatter plus
//                all-gather moves the same volume);
//   optimizer    memory-bound: kOptimizerBytesPerParameter per local
//                parameter (÷d under ZeRO >= 1) at the HBM bandwidth;
//   memory       model_state_bytes (16 B/param, ZeRO), the stage's activation
//                bytes, weight_gradient_bytes between I and W, and one send and
//                one receive buffer for each message the stage exchanges.

// Mixed-precision Adam step per parameter: reads the bf16 gradient (2) and the
// fp32 master weight, momentum and variance (12); writes those three (12) and
// the bf16 weight (2). fp32 Adam moves the same: reads the weight, gradient
// and moments (16), writes the weight and moments (12).
inline constexpr double kOptimizerBytesPerParameter = 28;

// The bytes of one layer, per micro-batch and device, that a split backward
// keeps from I until W: each weight matrix's input and its output's
// gradient (dW = Xᵀ·dY). Column-parallel matrices take the full input (÷t
// with sequence parallelism, which stores the shard) and give a t-th of the
// output; row-parallel ones the reverse:
//   gpt block   e·b·s·(4h/sp + (4h + 2f)/t)   QKV, out-proj, fc1, fc2
//   llama block e·b·s·(4h/sp + (2h + 2gd + 3f)/t)   QKV, O, gate/up, down
//   head        e·b·s·(h/sp + V/t)            the LM head's input and logits' gradient
//   embedding   e·b·s·h/sp                    the gradient of its output (token ids not counted)
// with sp = t under sequence parallelism, else 1. Recomputation does not
// change it: W needs the recomputed tensors as much as stored ones.
double weight_gradient_bytes(const ModelSpec& model, const ParallelConfig& config, LayerKind kind);

// The tensor-parallel collectives of one layer, per micro-batch: see above.
struct TensorParallelSeconds {
  double forward_s = 0;
  double backward_input_s = 0;
};
TensorParallelSeconds tensor_parallel_seconds(const ModelSpec& model, const ParallelConfig& config, LayerKind kind,
                                              const LinkCost& link);

LinkCost link_cost(const Link& link);
// The link as a collective sees it: bandwidth × collective_efficiency.
LinkCost collective_link_cost(const Link& link, const HardwareProfile& hardware);

// The compute seconds of one layer per micro-batch and device, without
// tensor-parallel communication; recompute_s is the forward work the
// backward repeats under the layout's recompute mode (the whole forward
// for full, the attention core with its softmax for selective).
struct LayerSeconds {
  double forward_s = 0;
  double backward_input_s = 0;
  double backward_weight_s = 0;
  double recompute_s = 0;
};
LayerSeconds layer_compute_seconds(const ModelSpec& model, const ParallelConfig& config, LayerKind kind,
                                   const HardwareProfile& hardware);

// Inference (`simulate --inference`, `plan --inference`; docs/INFERENCE.md),
// on one device (t = 1), weights, activations and the KV cache in
// bytes_per_element:
//   prefill  compute-bound, one chunk at a time: the forward of the chunk's
//            tokens (Σ rows of its pieces); the attention core fused
//            (FlashAttention: its scores never reach HBM, so no softmax
//            traffic), each piece's rows × (cached + rows) scores, so that
//            a chunk's attention grows with the prefix cached before it; the
//            LM head only on the last row of each piece that ends its
//            prompt (what sampling needs);
//   decode   one new token per sequence with `cached` positions in the cache:
//            bandwidth-bound, the larger of the bytes it reads over HBM —
//            every weight of the layer (the head's tied copy included) and
//            its K and V of the cached positions, 2 · kv_heads · head_dim · e
//            · cached per sequence; the embedding gathers only n rows — and
//            its FLOPs (2 per weight per sequence, 4 · cached · h per
//            sequence for the attention) at the achieved rate (roofline).
// A prefill chunk holds consecutive rows of a group's prompts, one after
// another, as `pipeflow generate` cuts them: a piece is `count` sequences'
// rows of the same shape.
struct PrefillPiece {
  std::int64_t rows = 0;       // new tokens
  std::int64_t cached = 0;     // positions of the sequence already in the KV cache
  bool ends_prompt = false;    // its last row is the prompt's: the head runs on it
  std::int64_t count = 1;      // sequences with these rows, side by side
};
double layer_prefill_seconds(const ModelSpec& model, std::span<const PrefillPiece> chunk, int bytes_per_element,
                             LayerKind kind, const HardwareProfile& hardware);
struct DecodeWork {
  double bytes = 0;  // read over HBM
  double flops = 0;
  DecodeWork& operator+=(const DecodeWork& other) {
    bytes += other.bytes;
    flops += other.flops;
    return *this;
  }
};
DecodeWork layer_decode_work(const ModelSpec& model, const PipelineLayer& layer, int sequences, std::int64_t cached,
                             int bytes_per_element);
// max(memory_seconds(bytes), compute_seconds(flops)).
double decode_seconds(const DecodeWork& work, const HardwareProfile& hardware);

struct LayoutCosts {
  Partition partition;  // one stage per schedule stage, on the layout's hardware
  SimulationCosts costs;
  double model_flops_per_step = 0;     // forward + backward, whole model, all replicas (what MFU counts)
  double hardware_flops_per_step = 0;  // plus recomputation (HFU)
  double tokens_per_step = 0;          // B · s
};

// Cuts the model into schedule.num_stages() stages (p · v) with the layout's
// partition method and prices every stage, link and replica. `schedule` must
// be the layout's (layout_schedule) or have its ranks and stages.
LayoutCosts layout_costs(const Layout& layout, const Schedule& schedule);

// The cut layout_costs makes: the layout's pipeline layers into
// schedule.num_stages() stages by its partition method. It depends on the
// model, the hardware, parallel_config(layout), the method and the stage
// count only.
Partition layout_partition(const Layout& layout, const Schedule& schedule);

// layout_costs with the cut given: layout_partition(layout, schedule)'s, or
// that of a layout equal in what the cut depends on (a search prices many
// layouts that share a cut, and makes each cut once).
LayoutCosts layout_costs(const Layout& layout, const Schedule& schedule, Partition partition);

// The schedule of the layout: its schedule file's as written (compute-only
// or lowered), else the compute-only one of its generator with p ranks, m
// micro-batches and v chunks per rank.
Schedule layout_schedule(const Layout& layout);

}  // namespace pipeflow
