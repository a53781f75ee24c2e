#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/config/run_config.h"
#include "pipeflow/config/run_keys.h"
#include "pipeflow/model/model_spec.h"

namespace pipeflow {

// A Megatron-LM launch line's arguments as a pipeflow run: the model, the
// layout and the batch Megatron-LM would train, so that `pipeflow simulate
// --megatron-args` predicts a user's job as it is written.
//
// Modelled (Megatron-LM's names and defaults):
//   model:  --num-layers, --hidden-size, --num-attention-heads,
//           --ffn-hidden-size (default 4·hidden; with --swiglu
//           int(8·hidden/3 / 64)·64), --kv-channels (must be the width
//           over the heads, rounded down), --group-query-attention with
//           --num-query-groups, --swiglu, --normalization (LayerNorm,
//           RMSNorm), --position-embedding-type (learned_absolute, rope),
//           --disable-bias-linear, --untie-embeddings-and-output-weights,
//           --max-position-embeddings, --vocab-size (default 50257, the
//           GPT-2 BPE of Megatron's default tokenizer), --rotary-base,
//           --use-rope-scaling with --rope-scaling-factor (Llama 3.1's),
//           --norm-epsilon, --hidden-dropout and --attention-dropout
//           (default 0.1 each). SwiGLU with RMSNorm and rotary positions
//           is a Llama; otherwise a GPT.
//   layout: --tensor-model-parallel-size, --pipeline-model-parallel-size,
//           --num-layers-per-virtual-pipeline-stage or
//           --virtual-pipeline-model-parallel-size (interleaved 1F1B),
//           --sequence-parallel, --use-distributed-optimizer (ZeRO-1),
//           --recompute-granularity (full, selective) with
//           --recompute-method and --recompute-num-layers.
//   batch:  --micro-batch-size, --global-batch-size, --seq-length.
//   numerics and optimizer: --bf16, --fp16,
//           --accumulate-allreduce-grads-in-fp32 (on by itself under
//           --bf16: gradients held in fp32, 6 + 12/d bytes a parameter
//           under the distributed optimizer), --loss-scale (static; absent:
//           dynamic), --initial-loss-scale (default 2^32, a power of two),
//           --min-loss-scale,
//           --loss-scale-window, --hysteresis, --lr, --weight-decay,
//           --adam-beta1, --adam-beta2, --adam-eps, --clip-grad,
//           --train-iters, --seed.
// Megatron takes the data-parallel size from the world it starts in, which
// the arguments do not hold: the caller gives the devices (else the run is
// one replica). Every other argument is read and listed in not_modelled.
// Text: whitespace-separated, shell-style quotes, a backslash at a line's
// end continues it, '#' starts a comment; a flag's value is the next token
// unless that starts with "--".
struct MegatronArgs {
  RunOverrides overrides;  // the layout, batch, numerics and optimizer keys
  ModelSpec model;
  std::vector<std::string> not_modelled;  // "--flag" as given, once each
};

// Errors name the argument, its value and the rule.
MegatronArgs read_megatron_args(std::string_view text, const std::string& source);

// The run the arguments describe, under `given` (pipeflow's keys: hardware,
// devices, ...; "model" is refused: the arguments give it). Megatron's world
// is `given`'s devices (data parallel = devices / (tensor x pipeline)); without
// them, one replica. Throws Error for a world that tensor x pipeline does not
// divide.
RunConfig megatron_run_config(MegatronArgs args, const RunOverrides& given, const std::string& source);

}  // namespace pipeflow
