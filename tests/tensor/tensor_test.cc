#include "pipeflow/tensor/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

TEST(Tensor, IsZeroFilledAlignedAndShaped) {
  const Tensor tensor({3, 5});
  EXPECT_EQ(tensor.shape(), Shape({3, 5}));
  EXPECT_EQ(tensor.numel(), 15);
  EXPECT_EQ(tensor.bytes(), 60);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(tensor.data()) % 64, 0u);
  for (const float value : tensor.span()) EXPECT_EQ(value, 0.0f);
  EXPECT_EQ(tensor.shape().to_string(), "[3, 5]");
}

TEST(Tensor, DefaultIsEmptyAndMovingEmptiesTheSource) {
  Tensor empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.numel(), 0);
  IntTensor source({4});
  source[2] = 7;
  IntTensor target = std::move(source);
  EXPECT_TRUE(source.empty());  // NOLINT(bugprone-use-after-move): the contract under test
  EXPECT_EQ(target[2], 7);
}

TEST(Tensor, CloneCopiesAndReshapeKeepsElements) {
  Tensor tensor({2, 3});
  for (int i = 0; i < 6; ++i) tensor[i] = static_cast<float>(i);
  Tensor copy = tensor.clone();
  copy.reshape({3, 2});
  EXPECT_EQ(copy.shape(), Shape({3, 2}));
  EXPECT_EQ(copy[5], 5.0f);
  EXPECT_NE(copy.data(), tensor.data());
  try {
    copy.reshape({4, 2});
    FAIL();
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "internal: cannot reshape [3, 2] to [4, 2]: element counts differ");
  }
}

TEST(MemoryAccount, ChargesLiveBytesAndRemembersThePeak) {
  MemoryAccount account("stage 0");
  {
    const Tensor a({100}, {nullptr, &account});
    EXPECT_EQ(account.live_bytes(), 400);
    {
      const DoubleTensor b({10}, {nullptr, &account});
      EXPECT_EQ(account.live_bytes(), 480);
    }
    EXPECT_EQ(account.live_bytes(), 400);
  }
  EXPECT_EQ(account.live_bytes(), 0);
  EXPECT_EQ(account.peak_bytes(), 480);
  account.reset_peak();
  EXPECT_EQ(account.peak_bytes(), 0);
}

TEST(MemoryAccount, ChargeMovesWithTheTensorToAnotherOwner) {
  MemoryAccount sender("stage 0");
  MemoryAccount receiver("stage 1");
  Tensor message({8, 4}, {nullptr, &sender});
  message.charge_to(&receiver);
  EXPECT_EQ(sender.live_bytes(), 0);
  EXPECT_EQ(receiver.live_bytes(), 128);
  message.reset();
  EXPECT_EQ(receiver.live_bytes(), 0);
}

TEST(MemoryAccount, CountsExactlyUnderConcurrentOwners) {
  MemoryAccount shared("shared");
  auto churn = [&] {
    for (int i = 0; i < 2000; ++i) {
      const Tensor tensor({16}, {nullptr, &shared});
    }
  };
  std::thread first(churn);
  std::thread second(churn);
  first.join();
  second.join();
  EXPECT_EQ(shared.live_bytes(), 0);
  EXPECT_GE(shared.peak_bytes(), 64);
  EXPECT_LE(shared.peak_bytes(), 128);
}

TEST(BufferPool, ReusesBlocksSoASteadyStateAllocatesNothing) {
  BufferPool pool;
  const Allocator allocator{&pool, nullptr};
  for (int step = 0; step < 3; ++step) {
    const Tensor a({1000}, allocator);
    const Tensor b({1000}, allocator);
    const Tensor c({17}, allocator);
  }
  EXPECT_EQ(pool.system_allocations(), 3);
  // 1000 floats = 4000 bytes round up to 4032; 17 floats to 128.
  EXPECT_EQ(pool.cached_bytes(), 2 * 4032u + 128u);
  pool.trim();
  EXPECT_EQ(pool.cached_bytes(), 0u);
}

TEST(BufferPool, TakesBackBlocksFreedOnAnotherThread) {
  BufferPool pool;
  std::vector<Tensor> made;
  for (int i = 0; i < 4; ++i) made.emplace_back(Shape{256}, Allocator{&pool, nullptr});
  std::thread consumer([&] { made.clear(); });
  consumer.join();
  EXPECT_EQ(pool.cached_bytes(), 4 * 1024u);
  const Tensor again({256}, {&pool, nullptr});
  EXPECT_EQ(pool.system_allocations(), 4);
}

TEST(Tensor, AnImpossibleAllocationIsAnErrorAndLeavesThePoolClean) {
  // (Under AddressSanitizer this needs allocator_may_return_null=1, which the
  // asan test preset sets: ASan would abort instead of returning null.)
  // 2^60 floats: 4 EiB, beyond any address space.
  const Shape huge{std::int64_t{1} << 40, std::int64_t{1} << 20};
  const std::string expected =
      "out of memory: cannot allocate 4611686018427387904 bytes (4294967296.0 GiB) for a tensor: use a smaller "
      "model, batch or sequence";
  try {
    const Tensor t(huge);
    FAIL() << "allocated";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), expected);
  }
  MemoryAccount account;
  {
    BufferPool pool;
    try {
      const Tensor t(huge, {&pool, &account});
      FAIL() << "allocated";
    } catch (const Error& error) {
      EXPECT_EQ(std::string(error.what()), expected);
    }
    EXPECT_EQ(pool.system_allocations(), 0);
  }  // the pool is destroyed with nothing outstanding (it aborts otherwise)
  EXPECT_EQ(account.live_bytes(), 0);
}

}  // namespace
}  // namespace pipeflow
