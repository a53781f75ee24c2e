// HalfStash: a stage's saved tensors in 16 bits between passes, each rounded
// once, widened for the pass that reads them, and lent to a bf16 GEMM as
// their bits.

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <vector>

#include "pipeflow/nn/half_stash.h"
#include "pipeflow/tensor/memory_account.h"
#include "test_support.h"

namespace pipeflow::nn {
namespace {

Tensor filled(Shape shape, float first, float step, Allocator allocator) {
  Tensor t = Tensor::uninitialized(shape, allocator);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = first + step * static_cast<float>(i);
  return t;
}

std::vector<std::uint32_t> bits_of(std::span<const float> values) {
  std::vector<std::uint32_t> bits;
  for (const float v : values) bits.push_back(std::bit_cast<std::uint32_t>(v));
  return bits;
}

// bf16 keeps 8 significant bits: 1 + 2^-8 + 2^-10 rounds up to 1 + 2^-7,
// 1.25 + 2^-12 down to 1.25, 2 + 2^-6 + 2^-9 (ulp 2^-6 there) down to
// 2 + 2^-6. A widened tensor packed again keeps the bits it came from (it
// is not rounded again), one in `keep` is rounded in place and keeps its
// floats (with its bits only where a lend follows), one unpacked without
// being retained frees its bits, and one retained that the pass then
// emptied loses them at the next pack.
TEST(HalfStash, EachTensorIsRoundedOnceAndWidenedWhereAPassReadsIt) {
  MemoryAccount account("test");
  const Allocator allocator{nullptr, &account};
  Tensor read = filled({2, 4}, 1 + 0x1p-8f + 0x1p-10f, 0, allocator);
  Tensor kept = filled({8}, 1.25f + 0x1p-12f, 0, allocator);
  Tensor untouched = filled({4, 2}, 3.0f, 0.5f, allocator);
  std::array<Tensor*, 3> tensors{&read, &kept, &untouched};
  HalfStash<float> stash;
  stash.pack(ComputeFormat::kBf16, tensors, allocator);
  EXPECT_TRUE(read.empty() && kept.empty() && untouched.empty());
  EXPECT_EQ(account.live_bytes(), 3 * 8 * 2);  // 16 bits a value

  // I reads `read` and `kept`, and W reads `read` again: its bits stay.
  std::array<Tensor*, 2> wanted{&read, &kept};
  std::array<Tensor*, 1> retained{&read};
  stash.unpack(tensors, wanted, retained, allocator);
  EXPECT_EQ(read.shape(), (Shape{2, 4}));
  EXPECT_EQ(read[0], 1 + 0x1p-7f);
  EXPECT_EQ(kept[7], 1.25f);
  EXPECT_TRUE(untouched.empty());
  EXPECT_EQ(account.live_bytes(), 8 * 4 + 8 * 2 + 8 * 4 + 8 * 2);  // read: both; kept: floats; untouched: bits

  // Packed again: `read` is not rounded again (a value written into its
  // floats, which a pass must not do, shows that its old bits were kept).
  // `kept` has new values: rounded in place, its floats kept beside its
  // bits (a lend follows).
  read[0] = 7.0f + 0x1p-10f;
  kept[0] = 1 + 0x1p-8f + 0x1p-10f;
  std::array<Tensor*, 1> keep{&kept};
  stash.pack(ComputeFormat::kBf16, tensors, allocator, keep, true);
  EXPECT_TRUE(read.empty());
  EXPECT_EQ(kept[0], 1 + 0x1p-7f);
  EXPECT_EQ(kept[1], 1.25f);
  EXPECT_EQ(account.live_bytes(), 8 * 2 + 8 * 4 + 8 * 2 + 8 * 2);
  // Every tensor widened; only `untouched` retains its bits (`kept`, widened
  // already, frees them).
  std::array<Tensor*, 1> retain_untouched{&untouched};
  stash.unpack(tensors, tensors, retain_untouched, allocator);
  EXPECT_EQ(read[0], 1 + 0x1p-7f);
  EXPECT_EQ(kept[0], 1 + 0x1p-7f);
  EXPECT_EQ(untouched[3], 4.5f);
  EXPECT_EQ(account.live_bytes(), 3 * 8 * 4 + 8 * 2);

  // A tensor the pass emptied loses its bits at the next pack.
  untouched.reset();
  stash.pack(ComputeFormat::kBf16, tensors, allocator);
  EXPECT_EQ(account.live_bytes(), 2 * 8 * 2);
  stash.unpack(tensors, tensors, {}, allocator);
  EXPECT_TRUE(untouched.empty());
  EXPECT_EQ(read[7], 1 + 0x1p-7f);

  // Kept where no lend follows: rounded in place, no bits held.
  read[1] = 2 + 0x1p-6f + 0x1p-9f;
  stash.pack(ComputeFormat::kBf16, tensors, allocator, tensors);
  EXPECT_EQ(read[1], 2 + 0x1p-6f);
  EXPECT_EQ(kept[0], 1 + 0x1p-7f);
  EXPECT_EQ(account.live_bytes(), 2 * 8 * 4);
}

// The buffer pool hands a freed block to the next request of its size: a
// pass that frees a tensor it was handed widened and makes one of the same
// shape in its place gets the same address back. Its new values are what
// the stash must keep (rounded once), not the bits of the tensor it freed;
// and a lend must not pair the old bits with the new floats.
TEST(HalfStash, ATensorMadeWhereAWidenedOneWasFreedIsStashedAnew) {
  BufferPool pool;
  const Allocator allocator{&pool, nullptr};
  Tensor t = filled({4, 16}, 1.0f, 0, allocator);
  std::array<Tensor*, 1> tensors{&t};
  HalfStash<float> stash;
  stash.pack(ComputeFormat::kBf16, tensors, allocator, tensors, true);  // widened, its bits beside
  const float* freed = t.data();
  t.reset();
  t = filled({4, 16}, 3.0f + 0x1p-10f, 0, allocator);  // rounds to 3 in bf16
  ASSERT_EQ(t.data(), freed);  // the pool's reuse this test is about
  stash.pack(ComputeFormat::kBf16, tensors, allocator);
  stash.unpack(tensors, tensors, tensors, allocator);
  EXPECT_EQ(t[0], 3.0f);
  EXPECT_EQ(t[63], 3.0f);

  if (!bf16_matmul_available()) GTEST_SKIP() << "the lend below needs a bf16 matmul";
  const GemmPrecisionScope bf16(GemmPrecision::kBf16);
  t.reset();
  t = filled({4, 16}, 5.0f, 0, allocator);
  ASSERT_EQ(t.data(), freed);
  const Tensor ones = filled({16, 1}, 1.0f, 0, {});
  Bf16Operands operands;
  stash.lend(tensors, tensors, allocator, operands);
  std::vector<float> product(4, 0.0f);
  gemm<float>(Transpose::kNo, Transpose::kNo, 4, 1, 16, 1.0f, t.data(), 16, ones.data(), 1, 0.0f, product.data(), 1);
  EXPECT_EQ(product[0], 16 * 5.0f);  // the new floats, not the bits of 3
}

// The mirror case: packed away (its floats freed), then a tensor made in its
// place before the unpack; the unpack leaves the new floats, not the bits.
TEST(HalfStash, ATensorMadeWhereAPackedOneWasKeepsItsOwnFloats) {
  BufferPool pool;
  const Allocator allocator{&pool, nullptr};
  Tensor t = filled({4, 16}, 3.0f, 0, allocator);
  std::array<Tensor*, 1> tensors{&t};
  HalfStash<float> stash;
  stash.pack(ComputeFormat::kBf16, tensors, allocator);
  ASSERT_TRUE(t.empty());
  t = filled({4, 16}, 7.0f, 0, allocator);
  stash.unpack(tensors, tensors, tensors, allocator);
  EXPECT_EQ(t[0], 7.0f);
  EXPECT_EQ(t[63], 7.0f);
}

// What W's GEMMs get: a tensor lent while still packed stands in floats that
// are never read (NaN here), a widened one keeps its floats; either way the
// bf16 GEMM multiplies the stashed bits, bit for bit what it computed on the
// floats widened from them (rounding them again is exact).
TEST(HalfStash, ABf16GemmReadsTheLentBitsAsTheWidenedFloats) {
  if (!bf16_matmul_available()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (AVX2 alone)";
  const GemmPrecisionScope bf16(GemmPrecision::kBf16);
  const int m = 12, n = 20, k = 16;
  const auto pair = [&] {
    return std::array<Tensor, 2>{filled({m, k}, -1.1f, 0.0113f, {}), filled({k, n}, 0.7f, -0.0071f, {})};
  };
  const auto product = [&](const Tensor& a, const Tensor& b) {
    std::vector<float> c(static_cast<std::size_t>(m) * n, 0.25f);
    gemm<float>(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data(), k, b.data(), n, 1.0f, c.data(), n);
    return bits_of(c);
  };

  auto widened = pair();
  std::array<Tensor*, 2> widened_tensors{&widened[0], &widened[1]};
  HalfStash<float> widening;
  widening.pack(ComputeFormat::kBf16, widened_tensors, {});
  widening.unpack(widened_tensors, widened_tensors, {}, {});
  const std::vector<std::uint32_t> expected = product(widened[0], widened[1]);

  auto lent = pair();
  std::array<Tensor*, 2> lent_tensors{&lent[0], &lent[1]};
  std::array<Tensor*, 1> a_only{&lent[0]};
  HalfStash<float> lending;
  lending.pack(ComputeFormat::kBf16, lent_tensors, {});
  lending.unpack(lent_tensors, a_only, lent_tensors, {});  // A widened, B still packed
  {
    Bf16Operands operands;
    lending.lend(lent_tensors, lent_tensors, {}, operands);
    ASSERT_EQ(lent[1].shape(), (Shape{k, n}));
    for (float& v : lent[1].span()) v = std::nanf("");  // B's stand-in floats: never read
    EXPECT_EQ(product(lent[0], lent[1]), expected);
  }
  EXPECT_TRUE(std::isnan(std::bit_cast<float>(product(lent[0], lent[1])[0])));  // the operands gone: floats read
}

// A tensor rounded ahead (as a block rounds what its bf16 GEMMs read, as
// soon as it is made): its GEMMs read the bits, and the pack that ends the
// pass keeps those bits rather than rounding the floats again: values
// written into the floats since (which a pass must not do) show it. Its
// floats stay as computed until that pack, which rounds them where it keeps
// them.
TEST(HalfStash, ATensorRoundedAheadIsPackedFromTheBitsItsGemmsRead) {
  MemoryAccount account("test");
  const Allocator allocator{nullptr, &account};
  Tensor dropped = filled({4, 16}, 1 + 0x1p-8f + 0x1p-10f, 0, allocator);  // 1 + 2^-7 in bf16
  Tensor kept = filled({4, 16}, 1.25f + 0x1p-12f, 0, allocator);          // 1.25 in bf16
  std::array<Tensor*, 2> tensors{&dropped, &kept};
  HalfStash<float> stash;
  {
    Bf16Operands operands;
    stash.round_ahead(tensors, dropped, allocator, operands);
    stash.round_ahead(tensors, kept, allocator, operands);
    EXPECT_EQ(dropped[0], 1 + 0x1p-8f + 0x1p-10f);  // the floats as computed
    EXPECT_EQ(kept[63], 1.25f + 0x1p-12f);
    EXPECT_EQ(account.live_bytes(), 2 * 64 * (4 + 2));
    if (bf16_matmul_available()) {
      const GemmPrecisionScope bf16(GemmPrecision::kBf16);
      const Tensor ones = filled({16, 1}, 1.0f, 0, {});
      std::vector<float> product(4, 0.0f);
      dropped[0] = 100.0f;  // not read: the GEMM takes the bits
      gemm<float>(Transpose::kNo, Transpose::kNo, 4, 1, 16, 1.0f, dropped.data(), 16, ones.data(), 1, 0.0f,
                  product.data(), 1);
      EXPECT_EQ(product[0], 16 * (1 + 0x1p-7f));
    }
  }
  dropped[1] = 7.0f;
  kept[0] = 7.0f;
  std::array<Tensor*, 1> keep{&kept};
  stash.pack(ComputeFormat::kBf16, tensors, allocator, keep, true);
  EXPECT_TRUE(dropped.empty());
  EXPECT_EQ(kept[0], 1.25f);  // widened from the bits rounded ahead
  EXPECT_EQ(kept[63], 1.25f);
  EXPECT_EQ(account.live_bytes(), 64 * 2 + 64 * (4 + 2));
  stash.unpack(tensors, tensors, {}, allocator);
  EXPECT_EQ(dropped[0], 1 + 0x1p-7f);
  EXPECT_EQ(dropped[1], 1 + 0x1p-7f);
}

}  // namespace
}  // namespace pipeflow::nn
