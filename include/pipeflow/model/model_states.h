#pragma once

#include <cstdint>
#include <string_view>

#include "pipeflow/model/precision.h"

namespace pipeflow {

// ZeRO (Rajbhandari et al. 2020): which model states are sharded across the
// d data-parallel ranks. 1: optimizer states; 2: and gradients; 3: and weights.
enum class ZeroStage { kNone = 0, kOne = 1, kTwo = 2, kThree = 3 };

// Bytes per parameter of each model state under Adam.
//   kFp32Adam: 4 (weights) + 4 (grads) + 8 (momentum, variance) = 16 B.
//   kMixedPrecisionAdam (ZeRO paper; DeepSpeed's fp16, and bf16 under ZeRO):
//     2 (bf16/fp16 weights) + 2 (grads) + 12 (fp32 master weights, momentum,
//     variance) = 16 B.
//   kMixedPrecisionFp32Grads (gradients accumulated in fp32: Megatron-LM's
//     bf16, DeepSpeed's bf16 optimizer without ZeRO, pipeflow train): 2 + 4
//     + 12 = 18 B; Megatron's distributed optimizer is ZeRO-1, 6 + 12/d.
enum class StateAccounting { kFp32Adam, kMixedPrecisionAdam, kMixedPrecisionFp32Grads };

// The precision gradients accumulate in across micro-batches when a run
// does not say (DeepSpeed's data_types.grad_accum_dtype absent): fp32 for
// bf16 without ZeRO (DeepSpeed then runs its bf16 optimizer, which keeps
// fp32 gradients; Megatron-LM accumulates bf16 runs' gradients in fp32),
// else the training precision (DeepSpeed's fp16 optimizer and its ZeRO
// optimizers keep the model's 16-bit gradients).
Precision default_gradient_accumulation(Precision precision, ZeroStage stage);

// The accounting of a run trained in `precision` whose gradients accumulate
// in `accumulation`: fp32 Adam, or mixed precision with 16-bit or fp32 gradients.
StateAccounting state_accounting(Precision precision, Precision accumulation);

struct ModelStateBytes {
  double weights = 0;
  double gradients = 0;
  double optimizer = 0;
  double total() const { return weights + gradients + optimizer; }
};

// Model-state bytes on one device holding `parameters` parameters, with the
// states sharded per `stage` over `data_parallel` ranks; mixed precision:
//   none 16Ψ; ZeRO-1 4Ψ + 12Ψ/d; ZeRO-2 2Ψ + 14Ψ/d; ZeRO-3 16Ψ/d;
// fp32: none 16Ψ; ZeRO-1 8Ψ + 8Ψ/d; ZeRO-2 4Ψ + 12Ψ/d; ZeRO-3 16Ψ/d.
// Throws Error when data_parallel < 1.
ModelStateBytes model_state_bytes(std::int64_t parameters, ZeroStage stage, int data_parallel,
                                  StateAccounting accounting = StateAccounting::kMixedPrecisionAdam);

// Bytes of the key/value cache of inference: every one of `layers`
// attention layers keeps a key and a value vector of kv_heads · head_dim
// elements per position, for `context` positions of `batch` sequences:
//   2 · layers · kv_heads · head_dim · bytes_per_value · context · batch.
std::int64_t kv_cache_bytes(int layers, int kv_heads, int head_dim, int bytes_per_value, std::int64_t context,
                            std::int64_t batch);

// 0..3 (DeepSpeed's zero_optimization.stage); anything else is an Error.
ZeroStage zero_stage_from_int(int stage);

}  // namespace pipeflow
