// `pipeflow plan` on the large case: a 1T-parameter GPT (Narayanan
// et al. 2021's 1008B: 128 blocks, width 25600, 160 heads) on 3072 A100
// 80GB devices, global batch 3072 × 2048 tokens, one thread, searched twice:
// with DeepSpeed's partition method (`--partition parameters`) and with both
// parameters and balanced (`pipeflow plan`'s default). Reports each bounded
// search's seconds and candidates per second against a baseline measured in
// the same run: the exhaustive search, which simulates every candidate that
// passes the memory bound (the same answer, planner_test). `--no-baseline`
// skips the exhaustive searches (about 3 × longer than the rest).
// Times are the process's CPU seconds (the search runs on one thread), so
// that other work on a shared machine does not count; wall seconds beside.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "flags.h"
#include "pipeflow/model/hardware.h"
#include "pipeflow/model/model_spec.h"
#include "pipeflow/plan/planner.h"

namespace {

using Clock = std::chrono::steady_clock;

double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

struct Timing {
  double cpu_s = 0;
  double wall_s = 0;
};

template <typename Search>
Timing time_of(Search search, pipeflow::PlanResult& result) {
  const double cpu = cpu_seconds();
  const auto wall = Clock::now();
  result = search();
  return {cpu_seconds() - cpu, std::chrono::duration<double>(Clock::now() - wall).count()};
}

// One search, bounded and (with a baseline) exhaustive; false when the two disagree.
bool measure(const char* name, const pipeflow::PlanRequest& request, bool baseline) {
  pipeflow::PlanResult bounded, exhaustive;
  const Timing fast = time_of([&] { return pipeflow::plan_layouts(request); }, bounded);
  std::printf("%s: %lld candidates\n", name, static_cast<long long>(bounded.candidates));
  std::printf("  bounded search:    %.2f s CPU (%.2f s wall), %lld simulated, %.0f candidates per CPU second\n",
              fast.cpu_s, fast.wall_s, static_cast<long long>(bounded.simulated),
              static_cast<double>(bounded.candidates) / fast.cpu_s);
  if (!baseline) {
    std::printf("  best: %.2f s step\n", bounded.best.front().step_time_s);
    return true;
  }
  const Timing slow = time_of([&] { return pipeflow::plan_layouts_exhaustively(request); }, exhaustive);
  const bool same = bounded.best.front().step_time_s == exhaustive.best.front().step_time_s;
  std::printf("  exhaustive search: %.2f s CPU (%.2f s wall), %lld simulated (baseline)\n", slow.cpu_s, slow.wall_s,
              static_cast<long long>(exhaustive.simulated));
  std::printf("  bounded / exhaustive CPU time: %.2f, same best: %s (%.2f s step)\n", fast.cpu_s / slow.cpu_s,
              same ? "yes" : "NO", bounded.best.front().step_time_s);
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  bool no_baseline = false;
  pipeflow::bench::parse_flags(argc, argv, {{"--no-baseline", &no_baseline}});
  const bool baseline = !no_baseline;
  pipeflow::PlanRequest request;
  request.model = pipeflow::gpt_model("megatron-1t", 128, 25600, 160, 51200, 2048);
  request.model.dropout = true;
  request.hardware = pipeflow::hardware_preset("a100-80g");
  request.devices = 3072;
  request.global_batch = 3072;
  request.seq_length = 2048;
  request.partitions = {pipeflow::parse_partition_method("parameters")};
  bool same = measure("1T on 3072 x a100-80g, B 3072 x 2048, partition parameters", request, baseline);
  request.partitions.push_back(pipeflow::parse_partition_method("balanced"));  // the default
  same = measure("1T on 3072 x a100-80g, B 3072 x 2048, partition parameters,balanced", request, baseline) && same;
  return same ? 0 : 1;
}
