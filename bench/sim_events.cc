// Simulated events per second on a large pipeline: interleaved 1F1B with
// p = 64 ranks, m = 1024 micro-batches, v = 2 chunks (issue 3), against a
// baseline measured in the same run: one plain pass over the same actions
// that writes a TimedAction per action (the size of the simulator's
// answer). An event is one executed action. Prints the best of 5 runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include "flags.h"
#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_spec.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/passes.h"
#include "pipeflow/sim/prediction.h"
#include "pipeflow/sim/simulation.h"

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

// Unequal stages and real message costs, so that no path is trivial.
pipeflow::SimulationCosts bench_costs(const pipeflow::Schedule& schedule, pipeflow::CommMode mode) {
  pipeflow::SimulationCosts costs;
  for (int s = 0; s < schedule.num_stages(); ++s) {
    pipeflow::StageCosts stage;
    stage.forward_s = 1e-3 * (1 + 0.01 * (s % 7));
    stage.backward_s = 2 * stage.forward_s;
    stage.output_bytes = 1 << 20;
    stage.activation_bytes = 1 << 24;
    costs.stages.push_back(stage);
  }
  costs.links = pipeflow::LinkTable(pipeflow::LinkCost{5e-6, 25e9});
  costs.comm_mode = mode;
  return costs;
}

}  // namespace

int main(int argc, char** argv) {
  pipeflow::bench::parse_flags(argc, argv, {});
  using namespace pipeflow;
  const int p = 64;
  const int m = 1024;
  const int v = 2;
  const Schedule schedule = make_interleaved_1f1b(p, m, v);
  const Schedule lowered = insert_send_recv(schedule);
  const double compute_events = static_cast<double>(schedule.total_actions());
  const double lowered_events = static_cast<double>(lowered.total_actions());

  const auto baseline_pass = [](const Schedule& s) {
    std::vector<std::vector<TimedAction>> out(static_cast<std::size_t>(s.num_ranks()));
    for (int r = 0; r < s.num_ranks(); ++r) {
      double t = 0;
      for (const Action& a : s.actions(RankId(r))) {
        out[static_cast<std::size_t>(r)].push_back({a, t, t + 1, 0});
        t += 1;
      }
    }
    sink = out.back().back().end;
  };
  const double baseline = best_seconds([&] { baseline_pass(lowered); }) / lowered_events;

  // llama3-405b has 126 blocks: 128 pipeline layers, one per stage of 64 × 2.
  Layout layout;
  layout.model = model_preset("llama3-405b");
  layout.hardware = hardware_preset("h100");
  layout.tensor_parallel = 8;
  layout.pipeline_ranks = p;
  layout.devices = 8 * p;
  layout.global_batch = m;
  layout.seq_length = 8192;
  layout.schedule = "interleaved-1f1b";
  layout.chunks = v;
  layout.recompute = Recompute::kSelective;
  layout.sequence_parallel = true;

  struct Row {
    const char* what;
    double seconds;
    double events;
  };
  const SimulationCosts overlapped = bench_costs(schedule, CommMode::kOverlapped);
  const SimulationCosts blocking = bench_costs(schedule, CommMode::kBlocking);
  const Row rows[] = {
      {"simulate compute-only (overlapped)",
       best_seconds([&] { sink = simulate(schedule, overlapped).step_time_s; }), compute_events},
      {"simulate compute-only + steady state",
       best_seconds([&] { sink = simulate(schedule, overlapped, {.steady_state = true}).steady_state->step_time_s; }),
       compute_events},
      {"simulate lowered (overlapped)", best_seconds([&] { sink = simulate(lowered, overlapped).step_time_s; }),
       lowered_events},
      {"simulate lowered (blocking)", best_seconds([&] { sink = simulate(lowered, blocking).step_time_s; }),
       lowered_events},
      {"predict llama3-405b (cost model+sim+steady)",
       best_seconds([&] { sink = predict(layout).result.step_time_s; }), compute_events},
  };
  std::printf("simulator, interleaved-1f1b p=%d m=%d v=%d: %.0f compute actions, %.0f lowered actions\n", p, m, v,
              compute_events, lowered_events);
  std::printf("baseline (one pass writing a TimedAction per lowered action): %.1f ns/event, %.1f M events/s\n",
              baseline * 1e9, 1e-6 / baseline);
  for (const Row& row : rows) {
    const double per_event = row.seconds / row.events;
    std::printf("%-44s %8.2f ms  %6.2f M events/s  %5.1fx baseline per event\n", row.what, row.seconds * 1e3,
                1e-6 / per_event, per_event / baseline);
  }
  return 0;
}
