// Times the schedule engine on a large pipeline (p = 64 ranks, m = 1024
// micro-batches, v = 2 chunks: interleaved 1F1B, as the simulator benchmark
// runs it) against a baseline measured in the same run: writing one
// TimedAction per action into per-rank lists (the size of execute()'s answer).
// Prints the best of 5 runs of each, and the ratio to the baseline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include "flags.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/passes.h"
#include "pipeflow/schedule/validate.h"

namespace {

using Clock = std::chrono::steady_clock;

double best_seconds(const std::function<void()>& run) {
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

volatile double sink = 0;

}  // namespace

int main(int argc, char** argv) {
  pipeflow::bench::parse_flags(argc, argv, {});
  using namespace pipeflow;
  const int p = 64;
  const int m = 1024;
  const int v = 2;
  const Schedule schedule = make_interleaved_1f1b(p, m, v);
  const Schedule lowered = insert_send_recv(schedule);
  const double actions = static_cast<double>(lowered.total_actions());

  const double baseline = best_seconds([&] {
    std::vector<std::vector<TimedAction>> out(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
      double t = 0;
      for (const Action& a : lowered.actions(RankId(r))) {
        out[static_cast<std::size_t>(r)].push_back({a, t, t + 1, 0});
        t += 1;
      }
    }
    sink = out.back().back().end;
  });
  struct Row {
    const char* what;
    double seconds;
    double per;  // actions processed
  };
  const Row rows[] = {
      {"execute compute-only (overlapped)", best_seconds([&] {
         sink = execute(schedule, unit_costs(CommMode::kOverlapped)).makespan;
       }),
       static_cast<double>(schedule.total_actions())},
      {"execute lowered (overlapped)", best_seconds([&] {
         sink = execute(lowered, unit_costs(CommMode::kOverlapped)).makespan;
       }),
       actions},
      {"execute lowered (rendezvous)", best_seconds([&] {
         sink = execute(lowered, unit_costs(CommMode::kBlocking)).makespan;
       }),
       actions},
      {"insert_send_recv", best_seconds([&] { sink = static_cast<double>(insert_send_recv(schedule).total_actions()); }),
       actions},
      {"validate lowered (with dry run)", best_seconds([&] { sink = validate(lowered).ok() ? 1 : 0; }), actions},
  };
  std::printf("schedule engine, interleaved-1f1b p=%d m=%d v=%d: %zu compute actions, %.0f lowered actions\n", p, m,
              v, schedule.total_actions(), actions);
  std::printf("baseline (write one TimedAction per lowered action): %.2f ms, %.1f ns/action\n", baseline * 1e3,
              baseline / actions * 1e9);
  for (const Row& row : rows) {
    const double per_action = row.seconds / row.per;
    std::printf("%-34s %8.2f ms  %6.1f ns/action  %5.1fx baseline per action\n", row.what, row.seconds * 1e3,
                per_action * 1e9, per_action / (baseline / actions));
  }
  return 0;
}
