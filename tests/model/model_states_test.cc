#include "pipeflow/model/model_states.h"

#include <gtest/gtest.h>

#include "../support/error_of.h"

namespace pipeflow {
namespace {

using testing::error_of;

TEST(ModelStates, MixedPrecisionAdamIsSixteenBytesPerParameter) {
  const ModelStateBytes bytes = model_state_bytes(1'000'000, ZeroStage::kNone, 64);
  EXPECT_EQ(bytes.weights, 2e6);
  EXPECT_EQ(bytes.gradients, 2e6);
  EXPECT_EQ(bytes.optimizer, 12e6);
  EXPECT_EQ(bytes.total(), 16e6);
}

// The ZeRO paper's Figure 1 example: Ψ = 7.5B, N_d = 64 → 120 GB, 31.4 GB,
// 16.6 GB, 1.9 GB for baseline, P_os, P_os+g, P_os+g+p.
TEST(ModelStates, ZeroStagesReproduceTheZeroPaperExample) {
  const std::int64_t psi = 7'500'000'000;
  EXPECT_EQ(model_state_bytes(psi, ZeroStage::kNone, 64).total(), 120e9);
  EXPECT_EQ(model_state_bytes(psi, ZeroStage::kOne, 64).total(), 4 * 7.5e9 + 12 * 7.5e9 / 64);  // 31.4 GB
  EXPECT_EQ(model_state_bytes(psi, ZeroStage::kTwo, 64).total(), 2 * 7.5e9 + 14 * 7.5e9 / 64);  // 16.6 GB
  EXPECT_EQ(model_state_bytes(psi, ZeroStage::kThree, 64).total(), 16 * 7.5e9 / 64);            // 1.9 GB
  EXPECT_EQ(model_state_bytes(psi, ZeroStage::kOne, 64).total(), 31'406'250'000);
  EXPECT_EQ(model_state_bytes(psi, ZeroStage::kTwo, 64).total(), 16'640'625'000);
  EXPECT_EQ(model_state_bytes(psi, ZeroStage::kThree, 64).total(), 1'875'000'000);
}

TEST(ModelStates, Fp32GradientsCountEighteenBytesAndSixPlusTwelveOverD) {
  const StateAccounting fp32_grads = StateAccounting::kMixedPrecisionFp32Grads;
  EXPECT_EQ(model_state_bytes(1000, ZeroStage::kNone, 8, fp32_grads).total(), 18000);
  EXPECT_EQ(model_state_bytes(1000, ZeroStage::kNone, 8, fp32_grads).gradients, 4000);
  EXPECT_EQ(model_state_bytes(1000, ZeroStage::kOne, 8, fp32_grads).total(), 6000 + 12000 / 8);
}

// DeepSpeed: bf16 without ZeRO runs the bf16 optimizer (fp32 gradients, 18
// B); fp16, and bf16 under ZeRO, keep 16-bit gradients (16 B); fp32 is fp32.
TEST(ModelStates, GradientsAccumulateInFp32ForBf16WithoutZeroUnlessTheRunSays) {
  EXPECT_EQ(default_gradient_accumulation(Precision::kBf16, ZeroStage::kNone), Precision::kFp32);
  EXPECT_EQ(default_gradient_accumulation(Precision::kBf16, ZeroStage::kOne), Precision::kBf16);
  EXPECT_EQ(default_gradient_accumulation(Precision::kFp16, ZeroStage::kNone), Precision::kFp16);
  EXPECT_EQ(default_gradient_accumulation(Precision::kFp32, ZeroStage::kTwo), Precision::kFp32);
  EXPECT_EQ(state_accounting(Precision::kBf16, Precision::kFp32), StateAccounting::kMixedPrecisionFp32Grads);
  EXPECT_EQ(state_accounting(Precision::kFp16, Precision::kFp16), StateAccounting::kMixedPrecisionAdam);
  EXPECT_EQ(state_accounting(Precision::kFp32, Precision::kFp32), StateAccounting::kFp32Adam);
}

// fp32 Adam: 4 (weights) + 4 (gradients) + 8 (moments); ZeRO-1 8Ψ + 8Ψ/d,
// ZeRO-2 4Ψ + 12Ψ/d, ZeRO-3 16Ψ/d.
TEST(ModelStates, Fp32AdamIsSixteenBytesShardedOtherwise) {
  const auto fp32 = [](ZeroStage stage) { return model_state_bytes(1000, stage, 8, StateAccounting::kFp32Adam); };
  EXPECT_EQ(fp32(ZeroStage::kNone).weights, 4000);
  EXPECT_EQ(fp32(ZeroStage::kNone).gradients, 4000);
  EXPECT_EQ(fp32(ZeroStage::kNone).optimizer, 8000);
  EXPECT_EQ(fp32(ZeroStage::kOne).total(), 8000 + 8000 / 8);
  EXPECT_EQ(fp32(ZeroStage::kTwo).total(), 4000 + 12000 / 8);
  EXPECT_EQ(fp32(ZeroStage::kThree).total(), 16000 / 8);
}

TEST(ModelStates, OneDataParallelRankShardsNothing) {
  EXPECT_EQ(model_state_bytes(1000, ZeroStage::kThree, 1).total(), 16000);
}

TEST(ModelStates, ErrorsNameTheValue) {
  EXPECT_EQ(error_of([] { model_state_bytes(1, ZeroStage::kOne, 0); }), "data_parallel = 0: must be >= 1");
  EXPECT_EQ(zero_stage_from_int(2), ZeroStage::kTwo);
  EXPECT_EQ(error_of([] { zero_stage_from_int(4); }), "zero stage 4: use 0 (off), 1, 2 or 3");
}

}  // namespace
}  // namespace pipeflow
