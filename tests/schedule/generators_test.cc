#include "pipeflow/schedule/generators.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "../support/error_of.h"
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

// The documented message for inputs a schedule rejects.
std::string rejection(const std::string& name, int p, int m) {
  if (name == "zbv" || name == "dualpipev") {
    return fmt::format("{} needs microbatches >= 2 * stages (got {} < {}): it holds 2 chunks per rank; raise "
                       "gradient_accumulation_steps or use zb-h1",
                       name, m, 2 * p);
  }
  if (name == "interleaved-1f1b") {
    return fmt::format("interleaved-1f1b needs microbatches >= stages (got {} < {}): Megatron-core's micro-batch "
                       "group lies in [stages, microbatches]; raise gradient_accumulation_steps or use looped-bfs",
                       m, p);
  }
  return fmt::format("{} needs microbatches >= stages (got {} < {}): raise gradient_accumulation_steps or use gpipe",
                     name, m, p);
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
          EXPECT_EQ(testing::error_of([&] { make_schedule(name, p, m, v); }), rejection(name, p, m));
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

namespace pipeflow {
namespace {

using testing::error_of;

// Time a rank is idle between its first start and its last end.
double gaps(const Execution& e, int r) {
  const auto& timed = e.ranks[static_cast<std::size_t>(r)];
  return timed.back().end - timed.front().start - busy_time(e, RankId(r));
}

TEST(ClosedForms, ZbH1IdlesPMinusOneOnEveryRank) {
  // (p - 1)(F + I - W) with F = I = W = 1.
  for (int p = 2; p <= 8; ++p) {
    const Execution e = dry_run(make_zb_h1(p, 2 * p));
    for (int r = 0; r < p; ++r) EXPECT_EQ(e.makespan - busy_time(e, RankId(r)), p - 1) << "p=" << p << " r=" << r;
  }
}

TEST(ClosedForms, ZbH2HasNoGapFromM2PMinus1) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 2 * p - 1; m <= 4 * p; ++m) {
      if (m < p) continue;
      const Execution e = dry_run(make_zb_h2(p, m));
      EXPECT_EQ(e.makespan, 3 * m + p - 1);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(gaps(e, r), 0) << "p=" << p << " m=" << m << " r=" << r;
        EXPECT_EQ(e.ranks[static_cast<std::size_t>(r)].front().start, r);
        EXPECT_EQ(e.ranks[static_cast<std::size_t>(r)].back().end, r + 3 * m);
      }
    }
  }
  // Below 2p - 1 the warm-up cannot fill: p = 4, m = 4 leaves gaps.
  EXPECT_GT(gaps(dry_run(make_zb_h2(4, 4)), 0), 0);
}

TEST(ClosedForms, ZbvHasNoGapOnAnyRank) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 2 * p; m <= 4 * p; ++m) {
      const Execution e = dry_run(make_zbv(p, m));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(gaps(e, r), 0) << "p=" << p << " m=" << m << " r=" << r;
        EXPECT_EQ(e.ranks[static_cast<std::size_t>(r)].front().start, r);
        EXPECT_EQ(e.ranks[static_cast<std::size_t>(r)].back().end, 6 * m + r);
      }
    }
  }
}

TEST(ClosedForms, DualPipeVStaysWithinItsReadmeBubble) {
  // README: bubble (PP/2 - 1)(F&B + B - 3W) with PP = 2p stages; the IR runs
  // the overlapped pair as F then B, so F&B = F + B.
  struct Costs {
    double f, i, w;
  };
  for (const Costs c : {Costs{1, 1, 1}, Costs{2, 1, 1}, Costs{1, 2, 1}, Costs{1, 1, 2}, Costs{3, 2, 1}}) {
    ExecutionCosts costs = unit_costs(CommMode::kOverlapped);
    costs.duration = [c](const Action& a, RankId) {
      switch (a.kind) {
        case ActionKind::kForward: return c.f;
        case ActionKind::kBackwardInput: return c.i;
        case ActionKind::kBackwardWeight: return c.w;
        default: return c.i + c.w;
      }
    };
    for (int p = 2; p <= 6; ++p) {
      const int m = 3 * p;
      const Execution e = execute(make_dualpipev(p, m), costs);
      const double b = c.i + c.w;
      const double readme = (p - 1) * ((c.f + b) + b - 3 * c.w);
      for (int r = 0; r < p; ++r) {
        const double idle = e.makespan - busy_time(e, RankId(r));
        EXPECT_LE(idle, readme) << "p=" << p << " r=" << r;
        if (c.f == 1 && c.i == 1 && c.w == 2) {
          EXPECT_EQ(idle, readme);
        }
        if (c.f == 1 && c.i == 1 && c.w == 1) {
          EXPECT_EQ(idle, p - 1);
        }
      }
    }
  }
}

TEST(ClosedForms, InterleavedUsesMegatronsMicrobatchGroup) {
  EXPECT_EQ(interleaved_microbatch_group(4, 8), 4);  // Megatron-core's default g = p
  EXPECT_EQ(interleaved_microbatch_group(4, 6), 6);  // 6 % 4 = 2 < 4, 6 % 5 = 1 < 4
  EXPECT_EQ(interleaved_microbatch_group(4, 9), 5);  // 9 % 5 = 4 >= 4
  EXPECT_EQ(interleaved_microbatch_group(4, 13), 7);
  EXPECT_EQ(dry_run(make_interleaved_1f1b(4, 6, 2)).makespan, 3 * (12 + 3));
  EXPECT_EQ(dry_run(make_interleaved_1f1b(4, 8, 2, 8)).makespan, 3 * (16 + 3));
  // The interleaved bubble is 1/v of 1F1B's: (p - 1)/(v m + p - 1).
  EXPECT_DOUBLE_EQ(bubble_fraction(dry_run(make_interleaved_1f1b(4, 16, 2))), 3.0 / 35.0);
}

TEST(Constraints, ViolationsRaiseTheDocumentedMessages) {
  EXPECT_EQ(error_of([] { make_1f1b(4, 3); }),
            "1f1b needs microbatches >= stages (got 3 < 4): raise gradient_accumulation_steps or use gpipe");
  EXPECT_EQ(error_of([] { make_zb_h1(4, 3); }),
            "zb-h1 needs microbatches >= stages (got 3 < 4): raise gradient_accumulation_steps or use gpipe");
  EXPECT_EQ(error_of([] { make_zb_h2(5, 2); }),
            "zb-h2 needs microbatches >= stages (got 2 < 5): raise gradient_accumulation_steps or use gpipe");
  EXPECT_EQ(error_of([] { make_zbv(4, 7); }),
            "zbv needs microbatches >= 2 * stages (got 7 < 8): it holds 2 chunks per rank; raise "
            "gradient_accumulation_steps or use zb-h1");
  EXPECT_EQ(error_of([] { make_dualpipev(3, 5); }),
            "dualpipev needs microbatches >= 2 * stages (got 5 < 6): it holds 2 chunks per rank; raise "
            "gradient_accumulation_steps or use zb-h1");
  EXPECT_EQ(error_of([] { make_interleaved_1f1b(4, 3, 2); }),
            "interleaved-1f1b needs microbatches >= stages (got 3 < 4): Megatron-core's micro-batch group lies in "
            "[stages, microbatches]; raise gradient_accumulation_steps or use looped-bfs");
  EXPECT_EQ(error_of([] { make_interleaved_1f1b(4, 10, 2, 4); }),
            "interleaved-1f1b micro-batch group 4 is invalid for 4 stages and 10 microbatches: Megatron-core needs "
            "stages <= group <= microbatches and microbatches % group == 0 or >= stages; use 5");
  EXPECT_EQ(error_of([] { make_interleaved_1f1b(2, 4, 0); }),
            "interleaved-1f1b needs virtual stages per rank >= 1 (got 0)");
  EXPECT_EQ(error_of([] { make_looped_bfs(2, 4, 0); }), "looped-bfs needs virtual stages per rank >= 1 (got 0)");
  EXPECT_EQ(error_of([] { make_gpipe(0, 4); }), "gpipe needs stages >= 1 (got 0): stages counts pipeline ranks");
  EXPECT_EQ(error_of([] { make_gpipe(2, 0); }), "gpipe needs microbatches >= 1 (got 0)");
}

TEST(Constraints, ASizeBeyondTheTableLimitFailsAtOnce) {
  // 2^22 (stage, micro-batch) pairs are accepted, more are not.
  EXPECT_EQ(Schedule("edge", 2, 4, 1 << 20, Placement::kLoop).num_microbatches(), 1 << 20);
  EXPECT_EQ(error_of([] { make_looped_bfs(2, 1 << 20, 3); }),
            "schedule looped-bfs is too large: 6 stages x 1048576 microbatches = 6291456 (stage, micro-batch) pairs, "
            "more than the limit of 4194304: use fewer stages or microbatches");
  EXPECT_EQ(error_of([] { make_1f1b(99999999, 99999999); }),
            "schedule 1f1b is too large: 99999999 stages x 99999999 microbatches = 9999999800000001 (stage, "
            "micro-batch) pairs, more than the limit of 4194304: use fewer stages or microbatches");
}

TEST(Registry, ListsEveryGeneratorAndDispatches) {
  std::vector<std::string> names;
  for (const ScheduleInfo& info : list_schedules()) {
    names.push_back(info.name);
    EXPECT_FALSE(info.description.empty());
    EXPECT_FALSE(info.constraints.empty());
    EXPECT_FALSE(info.source.empty());
    const Schedule schedule = make_schedule(info.name, 2, 8, info.takes_virtual ? 2 : 1);
    EXPECT_EQ(schedule.name(), info.name);
    EXPECT_EQ(schedule.placement(), info.placement) << info.name;
    EXPECT_EQ(find_schedule(info.name), &info);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2",
                                              "zbv", "dualpipev", "inference"}));
  EXPECT_EQ(make_schedule("ZBV", 2, 4, 2).num_stages(), 4);
  EXPECT_EQ(error_of([] { make_schedule("pipedream", 2, 4, 1); }),
            "unknown schedule \"pipedream\": known schedules are gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb-h1, "
            "zb-h2, zbv, dualpipev, inference");
  EXPECT_EQ(error_of([] { make_schedule("gpipe", 2, 4, 2); }),
            "gpipe holds one stage per rank (got virtual 2): use interleaved-1f1b or looped-bfs for several chunks "
            "per rank");
  EXPECT_EQ(error_of([] { make_schedule("zbv", 2, 4, 3); }),
            "zbv always holds 2 chunks per rank (got virtual 3): leave virtual at 1 or 2");
}

// An entry's `require` is the rule its generator applies: both refuse the
// same sizes with the same message.
TEST(Registry, EachEntrysRequirementIsItsGeneratorsConstraint) {
  for (const ScheduleInfo& info : list_schedules()) {
    const int v = info.placement == Placement::kV ? 2 : 1;
    for (int p = 0; p <= 4; ++p) {
      for (int m = 0; m <= 9; ++m) {
        const std::string generated = error_of([&] { info.generate(p, m, v); });
        EXPECT_EQ(error_of([&] { info.require(info.name, p, m, v); }), generated) << info.name << " " << p << " " << m;
        EXPECT_EQ(error_of([&] { info.check(p, m, v); }), generated) << info.name << " " << p << " " << m;
      }
    }
  }
}

TEST(Registry, LookupIgnoresCaseAndNamesEveryScheduleInOrder) {
  EXPECT_EQ(find_schedule("DualPipeV"), find_schedule("dualpipev"));
  EXPECT_NE(find_schedule("dualpipev"), nullptr);
  EXPECT_EQ(find_schedule("pipedream"), nullptr);
  EXPECT_EQ(known_schedule_names(),
            "gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb-h1, zb-h2, zbv, dualpipev, inference");
}

// DeepSpeed's InferenceSchedule: m + p - 1 steps of F = 1, bubble
// (p - 1)/(m + p - 1), stage r forwarding micro-batch k at step k + r.
TEST(Inference, ForwardOnlyInMPlusPMinusOneSteps) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 4 * p; ++m) {
      const Schedule schedule = make_schedule("inference", p, m);
      EXPECT_TRUE(schedule.is_inference());
      EXPECT_EQ(schedule.total_actions(), static_cast<std::size_t>(p * m));
      const ValidationReport report = validate(schedule);
      ASSERT_TRUE(report.ok()) << report.render(schedule);
      EXPECT_EQ(report.dry_run->makespan, m + p - 1) << p << " " << m;
      EXPECT_NEAR(bubble_fraction(*report.dry_run), static_cast<double>(p - 1) / (m + p - 1), 1e-12);
      for (int r = 0; r < p; ++r) {
        const auto& timed = report.dry_run->ranks[static_cast<std::size_t>(r)];
        for (int k = 0; k < m; ++k) {
          EXPECT_EQ(timed[static_cast<std::size_t>(k)].action, (Action{StageId(r), ActionKind::kForward, MicrobatchId(k)}));
          EXPECT_EQ(timed[static_cast<std::size_t>(k)].start, k + r);
        }
      }
      const Schedule lowered = insert_send_recv(schedule);
      EXPECT_TRUE(lowered.is_inference());
      const ValidationReport lowered_report = validate(lowered);
      ASSERT_TRUE(lowered_report.ok()) << lowered_report.render(lowered);
      EXPECT_EQ(lowered_report.dry_run->makespan, m + p - 1);
    }
  }
  EXPECT_EQ(error_of([] { make_schedule("inference", 2, 4, 2); }),
            "inference holds one stage per rank (got virtual 2): use interleaved-1f1b or looped-bfs for several "
            "chunks per rank");
}

TEST(Inference, TrainingRefusesIt) {
  EXPECT_EQ(error_of([] { require_training_schedule(*find_schedule("inference")); }),
            "inference is a forward-only inference schedule, with no backward to train with: use a training "
            "schedule (gpipe, 1f1b, ...), or pipeflow generate for inference");
  require_training_schedule(*find_schedule("1f1b"));
}

}  // namespace
}  // namespace pipeflow
