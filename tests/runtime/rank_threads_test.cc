#include "pipeflow/runtime/rank_threads.h"

#include <gtest/gtest.h>

#include <sched.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "pipeflow/runtime/report.h"

namespace pipeflow::runtime {
namespace {

TEST(RankThreads, EachRankRunsOnItsOwnThreadPinnedToItsOwnCoreAcrossRuns) {
  const int ranks = usable_cores();
  RankThreads threads(ranks);
  EXPECT_TRUE(threads.pinned());
  std::vector<std::thread::id> first(static_cast<std::size_t>(ranks)), second(first.size());
  std::vector<int> cpu(first.size(), -1);
  threads.run([&](int r) {
    first[static_cast<std::size_t>(r)] = std::this_thread::get_id();
    cpu[static_cast<std::size_t>(r)] = sched_getcpu();
  });
  threads.run([&](int r) { second[static_cast<std::size_t>(r)] = std::this_thread::get_id(); });
  EXPECT_EQ(first, second);
  EXPECT_EQ(std::set<std::thread::id>(first.begin(), first.end()).size(), first.size());
  EXPECT_EQ(std::set<int>(cpu.begin(), cpu.end()).size(), cpu.size());  // one core each
}

TEST(RankThreads, MoreRanksThanCoresAreNotPinnedAndAllRun) {
  const int ranks = usable_cores() + 1;
  RankThreads threads(ranks);
  EXPECT_FALSE(threads.pinned());
  std::atomic<int> ran{0};
  threads.run([&](int) { ++ran; });
  EXPECT_EQ(ran.load(), ranks);  // run() returns only after every rank's job
}

}  // namespace
}  // namespace pipeflow::runtime
