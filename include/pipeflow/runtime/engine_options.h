#pragma once

#include <chrono>
#include <functional>
#include <optional>

#include "pipeflow/config/run_config.h"
#include "pipeflow/core/ids.h"
#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/lr_schedule.h"
#include "pipeflow/schedule/action.h"
#include "pipeflow/tensor/half.h"

namespace pipeflow::runtime {

// How the pipeline engine trains: the settings of a run that are not the
// model's shape, the schedule or the partition.
struct EngineOptions {
  int micro_batch = 1;  // b: sequences per micro-batch
  // T: tokens per sample, the shape of every message [b, T, C]; 1 … the
  // model's context (resolve() fixes it from the configuration).
  int seq_length = 0;
  // DeepSpeed's activation_checkpoint_interval, for every stage (see
  // nn::StageOptions): 0 keeps all activations; k keeps only the input of
  // every k-th layer and recomputes in the backward.
  int recompute_interval = 0;
  // Longest any blocking wait (a message, an inbox slot, the all-reduce) may
  // last before the step fails with the rank, the action and the grid.
  std::chrono::duration<double> timeout = std::chrono::seconds(60);
  nn::AdamWOptions optimizer;
  nn::LrSchedule lr_schedule = nn::LrSchedule::constant(1e-3);
  // DeepSpeed's gradient_clipping: the largest global gradient norm; <= 0 disables it.
  double gradient_clipping = 0;
  // Data parallelism (under MPI: the engine sets them from its MpiGroups):
  // replica `data_rank` of `data_parallel` runs micro-batches
  // data_rank · m … data_rank · m + m − 1 of the step's global batch.
  int data_parallel = 1;
  int data_rank = 0;
  // Tensor parallelism (Megatron-LM's, nn::StageOptions::tensor): each stage
  // split over `tensor_parallel` ranks, which run the same micro-batches.
  int tensor_parallel = 1;
  // Megatron-LM's sequence parallelism beside it (nn::StageOptions::
  // sequence_parallel; ignored at tensor_parallel 1): seq_length must be a
  // multiple of tensor_parallel.
  bool sequence_parallel = false;
  // ZeRO stage 1 (zero_optimization.stage 1): with data_parallel > 1, each
  // replica's AdamW keeps the moments of 1/data_parallel of every stage's
  // parameters (nn::OptimizerShard), updates those, and the replicas
  // all-gather the updated parameters.
  bool shard_optimizer = false;
  // zero_optimization.reduce_bucket_size: elements per reduce-scatter call.
  std::int64_t reduce_bucket_size = kReduceBucketSize;
  // metrics.noise_scale_interval: every k-th step (from step 0) measures the
  // squared norm of one micro-batch's gradient for the gradient noise scale
  // (runtime/noise_scale.h, StepResult::grad_square_small); 0: never.
  int noise_scale_interval = 0;
  // bf16 / fp16 (nn::StageOptions::format): every stage computes in it,
  // over fp32 master weights, gradients and AdamW moments.
  ComputeFormat format = ComputeFormat::kFp32;
  // fp16's loss scale (LossScaler): the backward starts from scale · loss and
  // the update divides it out; none: from the loss itself.
  std::optional<LossScaleConfig> loss_scale;
  // For tests: called on the worker's thread before each of its actions
  // (an exception or a delay there acts as a failing or a slow worker).
  std::function<void(RankId, const Action&)> before_action;
};

}  // namespace pipeflow::runtime
