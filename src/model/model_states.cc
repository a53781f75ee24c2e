#include "pipeflow/model/model_states.h"

#include "pipeflow/core/error.h"

namespace pipeflow {

ModelStateBytes model_state_bytes(std::int64_t parameters, ZeroStage stage, int data_parallel,
                                  StateAccounting accounting) {
  if (data_parallel < 1) fail("data_parallel = {}: must be >= 1", data_parallel);
  if (parameters < 0) fail("internal: negative parameter count {}", parameters);
  const double psi = static_cast<double>(parameters);
  const double d = data_parallel;
  const bool fp32 = accounting == StateAccounting::kFp32Adam;
  const double gradient_bytes = accounting == StateAccounting::kMixedPrecisionAdam ? 2 : 4;
  ModelStateBytes bytes{.weights = (fp32 ? 4 : 2) * psi, .gradients = gradient_bytes * psi,
                        .optimizer = (fp32 ? 8 : 12) * psi};
  if (stage >= ZeroStage::kOne) bytes.optimizer /= d;
  if (stage >= ZeroStage::kTwo) bytes.gradients /= d;
  if (stage >= ZeroStage::kThree) bytes.weights /= d;
  return bytes;
}

Precision default_gradient_accumulation(Precision precision, ZeroStage stage) {
  return precision == Precision::kBf16 && stage == ZeroStage::kNone ? Precision::kFp32 : precision;
}

StateAccounting state_accounting(Precision precision, Precision accumulation) {
  if (precision == Precision::kFp32) return StateAccounting::kFp32Adam;
  return accumulation == Precision::kFp32 ? StateAccounting::kMixedPrecisionFp32Grads
                                          : StateAccounting::kMixedPrecisionAdam;
}

ZeroStage zero_stage_from_int(int stage) {
  if (stage < 0 || stage > 3) fail("zero stage {}: use 0 (off), 1, 2 or 3", stage);
  return static_cast<ZeroStage>(stage);
}

std::int64_t kv_cache_bytes(int layers, int kv_heads, int head_dim, int bytes_per_value, std::int64_t context,
                            std::int64_t batch) {
  return 2 * static_cast<std::int64_t>(layers) * kv_heads * head_dim * bytes_per_value * context * batch;
}

}  // namespace pipeflow
