#include "pipeflow/runtime/rank_threads.h"

#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "pipeflow/runtime/report.h"

namespace pipeflow::runtime {
namespace {

// The cores counted are the CPUs listed: this thread's affinity, narrowed
// here to one CPU and then restored.
TEST(RankThreads, TheUsableCoresAreTheAffinitysCpus) {
  const std::vector<int> cpus = usable_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
  EXPECT_EQ(usable_cores(), static_cast<int>(cpus.size()));
  cpu_set_t all, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  CPU_ZERO(&one);
  CPU_SET(cpus.back(), &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  EXPECT_EQ(usable_cpus(), std::vector<int>{cpus.back()});
  EXPECT_EQ(usable_cores(), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(usable_cpus(), cpus);
}

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
