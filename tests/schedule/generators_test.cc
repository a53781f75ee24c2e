#include "pipeflow/schedule/generators.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "pipeflow/core/error.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/schedule/passes.h"
#include "pipeflow/schedule/validate.h"

namespace pipeflow {
namespace {

// The documented bounds of every generator (see generators.h), for unit costs
// per chunk F = 1, B = 2, I = W = 1 and no transfer time. p ranks, m
// micro-batches, v chunks per rank, r the rank, g the interleaved group.
//
// | schedule         | makespan                          | peak in-flight (F run, B/I not)   | until W   |
// |------------------|-----------------------------------|-----------------------------------|-----------|
// | gpipe            | 3(m + p - 1)                      | m                                 | = peak    |
// | 1f1b             | 3(m + p - 1)                      | p - r                             | = peak    |
// | interleaved v=1  | 3(m + p - 1)                      | p - r                             | = peak    |
// | interleaved v>=2 | 3(v m + p - 1)                    | min(2(p - r - 1) + (v - 1) g + 1, v m) | = peak |
// | looped-bfs       | 3((v - 1) max(m, p) + m + p - 1)  | v m                               | = peak    |
// | zb-h1            | 3m + p - 1                        | p - r                             | p         |
// | zb-h2            | 3m + p - 1                        | min(2(p - r) - 1, m)              | min(2p - 1, m) |
// | zbv              | 6m + p - 1                        | 2p                                | 2p        |
// | dualpipev        | 6m + p - 1                        | 2p + 1                            | 2p + 1    |
struct Bounds {
  std::function<double(int p, int m, int v)> makespan;
  std::function<int(int p, int m, int v, int r)> peak;
  std::function<int(int p, int m, int v, int r)> peak_until_weight;
};

struct Case {
  std::string name;
  bool takes_virtual;
  // Whether the lowered schedule also runs in the unit-cost makespan under
  // rendezvous. Interleaved 1F1B and DualPipeV have messages whose producer
  // and consumer are never both between actions, so a synchronous send stalls
  // one side (the overlapped run is always exact).
  bool rendezvous_exact;
  std::function<bool(int p, int m)> accepts;
  Bounds bounds;
};

int group(int p, int m) { return interleaved_microbatch_group(p, m); }

const std::vector<Case>& cases() {
  static const std::vector<Case> kCases = {
      {"gpipe", false, true, [](int, int) { return true; },
       {[](int p, int m, int) { return 3.0 * (m + p - 1); }, [](int, int m, int, int) { return m; },
        [](int, int m, int, int) { return m; }}},
      {"1f1b", false, true, [](int p, int m) { return m >= p; },
       {[](int p, int m, int) { return 3.0 * (m + p - 1); }, [](int p, int, int, int r) { return p - r; },
        [](int p, int, int, int r) { return p - r; }}},
      {"interleaved-1f1b", true, false, [](int p, int m) { return m >= p; },
       {[](int p, int m, int v) { return 3.0 * (v * m + p - 1); },
        [](int p, int m, int v, int r) {
          return v == 1 ? p - r : std::min(2 * (p - r - 1) + (v - 1) * group(p, m) + 1, v * m);
        },
        [](int p, int m, int v, int r) {
          return v == 1 ? p - r : std::min(2 * (p - r - 1) + (v - 1) * group(p, m) + 1, v * m);
        }}},
      {"looped-bfs", true, true, [](int, int) { return true; },
       {[](int p, int m, int v) { return 3.0 * ((v - 1) * std::max(m, p) + m + p - 1); },
        [](int, int m, int v, int) { return v * m; }, [](int, int m, int v, int) { return v * m; }}},
      {"zb-h1", false, true, [](int p, int m) { return m >= p; },
       {[](int p, int m, int) { return 3.0 * m + p - 1; }, [](int p, int, int, int r) { return p - r; },
        [](int p, int, int, int) { return p; }}},
      {"zb-h2", false, true, [](int p, int m) { return m >= p; },
       {[](int p, int m, int) { return 3.0 * m + p - 1; },
        [](int p, int m, int, int r) { return std::min(2 * (p - r) - 1, m); },
        [](int p, int m, int, int) { return std::min(2 * p - 1, m); }}},
      {"zbv", false, true, [](int p, int m) { return m >= 2 * p; },
       {[](int p, int m, int) { return 6.0 * m + p - 1; }, [](int p, int, int, int) { return 2 * p; },
        [](int p, int, int, int) { return 2 * p; }}},
      {"dualpipev", false, false, [](int p, int m) { return m >= 2 * p; },
       {[](int p, int m, int) { return 6.0 * m + p - 1; }, [](int p, int, int, int) { return 2 * p + 1; },
        [](int p, int, int, int) { return 2 * p + 1; }}},
  };
  return kCases;
}

const Case& find_case(const std::string& name) {
  for (const Case& c : cases()) {
    if (c.name == name) return c;
  }
  throw std::runtime_error("no case " + name);
}

std::string violations_of(const Schedule& schedule, const ValidationReport& report) {
  return report.ok() ? std::string() : report.render(schedule);
}

// Every p in 1..8, m in 1..4p (and v in 1..4 where the schedule takes it):
// accepted inputs validate, both dry runs finish, peaks and makespan equal
// the documented bounds; rejected inputs raise the documented error.
void sweep(const std::string& name) {
  const Case& c = find_case(name);
  int accepted = 0;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 4 * p; ++m) {
      for (int v = 1; v <= (c.takes_virtual ? 4 : 1); ++v) {
        SCOPED_TRACE(fmt::format("{} p={} m={} v={}", name, p, m, v));
        if (!c.accepts(p, m)) {
          EXPECT_THROW(make_schedule(name, p, m, v), Error);
          continue;
        }
        ++accepted;
        const Schedule schedule = make_schedule(name, p, m, v);
        ASSERT_FALSE(schedule.has_communication());
        const ValidationReport report = validate(schedule);
        ASSERT_TRUE(report.ok()) << violations_of(schedule, report);
        ASSERT_TRUE(report.dry_run.has_value());
        EXPECT_EQ(report.dry_run->makespan, c.bounds.makespan(p, m, v));
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(report.peak_inflight[static_cast<std::size_t>(r)], c.bounds.peak(p, m, v, r)) << "rank " << r;
          EXPECT_EQ(report.peak_inflight_until_weight[static_cast<std::size_t>(r)],
                    c.bounds.peak_until_weight(p, m, v, r))
              << "rank " << r;
        }
        const Schedule lowered = insert_send_recv(schedule);
        EXPECT_EQ(lowered.has_communication(), p > 1);
        const ValidationReport lowered_report = validate(lowered);  // rendezvous dry run
        ASSERT_TRUE(lowered_report.ok()) << violations_of(lowered, lowered_report);
        if (c.rendezvous_exact) {
          EXPECT_EQ(lowered_report.dry_run->makespan, c.bounds.makespan(p, m, v));
        } else {
          EXPECT_GE(lowered_report.dry_run->makespan, c.bounds.makespan(p, m, v));
        }
        EXPECT_EQ(execute(lowered, unit_costs(CommMode::kOverlapped)).makespan, c.bounds.makespan(p, m, v));
      }
    }
  }
  EXPECT_GT(accepted, 0);
}

TEST(Generators, GpipeSweep) { sweep("gpipe"); }
TEST(Generators, OneFOneBSweep) { sweep("1f1b"); }
TEST(Generators, InterleavedSweep) { sweep("interleaved-1f1b"); }
TEST(Generators, LoopedBfsSweep) { sweep("looped-bfs"); }
TEST(Generators, ZbH1Sweep) { sweep("zb-h1"); }
TEST(Generators, ZbH2Sweep) { sweep("zb-h2"); }
TEST(Generators, ZbvSweep) { sweep("zbv"); }
TEST(Generators, DualPipeVSweep) { sweep("dualpipev"); }

}  // namespace
}  // namespace pipeflow
