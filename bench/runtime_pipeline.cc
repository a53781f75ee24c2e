// The pipeline runtime against its own baseline, in one run: the same global
// batch trained by 1 stage on 1 core and by P stages on P cores (one
// persistent worker thread per rank), the two engines stepping alternately so
// that load from other processes hits both alike. For every step after the
// first (step 0 fills the buffer pools), the throughput ratio of that step
// pair (1-stage time / P-stage time, the same tokens) as a fraction of the
// ideal P × (1 − predicted bubble); printed as minimum / median / maximum,
// with the measured bubble beside the one predicted from the run's own
// per-action medians (steps 1–3) and the runtime's overhead.
//
//   bench_runtime_pipeline [--schedule 1f1b --stages 2 --microbatches 8 --micro-batch 8
//                           --layers 4 --heads 4 --width 128 --context 64
//                           --partition balanced --steps 20]
//
// First, the in-process hand-off (calibrate's ping-pong) for several lengths
// of the transport's spin before a wait sleeps (kHandoffSpin is the engine's).
//
// Overhead: on the 1-stage run, everything in the step that is neither
// layer compute (F/B/I/W) nor the optimizer (hand-offs, bookkeeping,
// tracing, the norm); on the pipelined run, per rank, the time in the
// pipeline part that is neither compute nor waiting for a peer.
//
// Unequal cores (P = 2): the 1-stage run steps twice, on the first usable
// core and on the second (the cores the 2 pipelined ranks are pinned to),
// both alternating with the pipelined run. On a virtual machine either core
// can run the same work 10-30% slower than the other for minutes at a time
// (the host's other guests; no steal time is reported), and against the
// faster core's time no runtime reaches 2 x (1 - bubble). So the fraction
// of ideal is printed against each core and against the two cores'
// combined rate: 1 / T_2 over (1 / T_core0 + 1 / T_core1) x (1 - bubble),
// the plain 2 x (1 - bubble) ratio when the cores are equal. The bubble,
// predicted from the pipelined run's own action times, already holds the
// stages' imbalance that unequal cores make; what remains is second order:
// a perfect runtime reaches 4 s0 s1 / (s0 + s1)^2 of this ideal (cores of
// speeds s0, s1, the model cut in halves): 99% for cores 1.22x apart. Compute per step
// (the sum of the F/B/I/W actions) says where the difference went: the
// 1-stage run's on each core, the pipelined run's per stage.
//
// Off core: per step, the compute time the 1-stage run's thread and the
// pipelined run's worst rank spent off their cores (RankFigures::off_core_s:
// another process or thread held the core), and the fraction of ideal with
// that time taken out of both runs' steps -- an estimate of what the step
// would have been on cores of its own (a rank's lost time delays the step
// by at most that much). Wake: per step, the pipelined run's worst rank's
// RankFigures::wake_s, the time its blocked receives went on after the
// peer's SEND had ended (hand-offs and wake-ups).
//
// Waiting for a core: per step, the time this process's threads were
// runnable but not running (/proc/self/task/TID/schedstat's second field,
// read before and after each step): what other tasks took from the ranks,
// as a wake-up delayed or a computation preempted. The fraction of ideal is
// printed again over the steps in which neither run waited more than
// kQuietWaitS (the 1-stage steps it is measured against included). Then the
// worst step's figures per rank beside a middle step's, with what other
// tasks ran around it (every visible process's threads, /proc/*/task/*/
// schedstat, read just before and just after the step: the readings take
// about a millisecond each, so the window is longer than the step, and a
// thread that ended meanwhile is missed): where its time went. On the VM
// this was written on, the kernel's kdamond (its memory-access monitor,
// every half second for 1-6 ms) ran in the worst steps.
//
// Page faults: per step, the process's (getrusage: minor and major) during
// the 1-stage step and during the pipelined one, step 0 beside: a step that
// maps memory anew pays for each (about 10 us on the VM this was tuned on).

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sched.h>
#include <sys/resource.h>
#include <string>
#include <unistd.h>
#include <vector>

#include "flags.h"
#include "pipeflow/model/hardware.h"
#include "pipeflow/nn/byte_dataset.h"
#include "pipeflow/runtime/calibrate.h"
#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/in_process_transport.h"
#include "pipeflow/runtime/measurement.h"
#include "pipeflow/runtime/rank_threads.h"
#include "pipeflow/runtime/report.h"
#include "pipeflow/runtime/stage_partition.h"
#include "pipeflow/schedule/generators.h"

namespace {

using namespace pipeflow;
using namespace pipeflow::runtime;

struct Options {
  std::string schedule = "1f1b";
  int stages = 2;
  int microbatches = 8;
  int micro_batch = 8;
  nn::ModelConfig model{.vocab_size = 256, .context = 64, .n_layer = 4, .n_head = 4, .n_embd = 128};
  std::string partition = "balanced";
  int steps = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  bench::parse_flags(argc, argv,
                     {{"--schedule", &o.schedule},
                      {"--stages", &o.stages},
                      {"--microbatches", &o.microbatches},
                      {"--micro-batch", &o.micro_batch},
                      {"--layers", &o.model.n_layer},
                      {"--heads", &o.model.n_head},
                      {"--width", &o.model.n_embd},
                      {"--context", &o.model.context},
                      {"--partition", &o.partition},
                      {"--steps", &o.steps}});
  if (o.steps < 2) {
    std::fprintf(stderr, "--steps %d: must be at least 2 (step 0 warms the pools up; the figures are of the steps after it)\n",
                 o.steps);
    std::exit(2);
  }
  return o;
}

struct Spread {
  double min = 0, median = 0, max = 0;
};

Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return {v.front(), n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.back()};
}

std::unique_ptr<PipelineEngine> make_engine(const Options& o, const std::string& schedule_name, int stages) {
  const Schedule schedule = make_schedule(schedule_name, stages, o.microbatches);
  EngineOptions options;
  options.micro_batch = o.micro_batch;
  options.seq_length = o.model.context;
  options.optimizer = {.lr = 1e-3};
  options.lr_schedule = nn::LrSchedule::constant(1e-3);
  options.gradient_clipping = 1.0;
  const auto boundaries = partition_model(o.model, schedule.num_stages(), parse_partition_method(o.partition),
                                          o.micro_batch, o.model.context, hardware_preset("cpu"));
  auto engine = std::make_unique<PipelineEngine>(o.model, schedule, boundaries, options);
  engine->init_parameters(1);
  return engine;
}

// Share of the step that is runtime overhead (see the header).
double overhead(const StepFigures& f, int stages) {
  double worst = 0;
  for (const RankFigures& r : f.ranks) {
    worst = std::max(worst, stages == 1 ? f.wall_s - r.compute_s - r.optimizer_s - r.wait_s : r.comm_s + r.other_s);
  }
  return worst / f.wall_s;
}

// Runs step 0 with the calling thread's affinity narrowed to `cpu`:
// the engine's rank thread, started there, pins itself to the first core of
// that affinity (RankThreads) and keeps it after the affinity is restored.
StepResult first_step_on(PipelineEngine& engine, int cpu, const DatasetSource& source) {
  cpu_set_t all, one;
  sched_getaffinity(0, sizeof all, &all);
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  sched_setaffinity(0, sizeof one, &one);
  StepResult result = engine.step(0, source);
  sched_setaffinity(0, sizeof all, &all);
  return result;
}

double median(std::vector<double> v) { return spread(std::move(v)).median; }

// The process's page faults so far, minor and major.
long page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt + usage.ru_majflt;
}

// Every other process's threads on this machine: their CPU time so far
// (/proc/PID/task/TID/schedstat's first field, ns) by thread id, with the
// thread's name. Read between steps; a step's difference is the time other
// tasks held a core while it ran (an upper bound on what they took from the
// ranks: time on a core its rank was not using costs nothing). Empty where
// no thread's schedstat can be read (a kernel without CONFIG_SCHED_INFO).
struct ThreadTime {
  std::string name;
  double seconds = 0;
};
using OtherTasks = std::map<long, ThreadTime>;

OtherTasks other_tasks() {
  namespace fs = std::filesystem;
  OtherTasks tasks;
  const std::string self = std::to_string(getpid());
  std::error_code error;
  for (const fs::directory_entry& process : fs::directory_iterator("/proc", error)) {
    const std::string pid = process.path().filename().string();
    if (pid == self || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    for (const fs::directory_entry& thread : fs::directory_iterator(process.path() / "task", error)) {
      std::ifstream schedstat(thread.path() / "schedstat"), comm(thread.path() / "comm");
      long long ns = 0;
      ThreadTime t;
      if (!(schedstat >> ns) || !std::getline(comm, t.name)) continue;  // ended meanwhile
      t.seconds = 1e-9 * static_cast<double>(ns);
      tasks[std::stol(thread.path().filename().string())] = t;
    }
  }
  return tasks;
}

// A step whose threads waited for a core less than this is counted as left
// alone by other tasks.
constexpr double kQuietWaitS = 0.2e-3;

// This process's threads' time runnable but not running so far, summed;
// nullopt where no thread's schedstat can be read.
std::optional<double> run_queue_wait_s() {
  namespace fs = std::filesystem;
  std::error_code error;
  double seconds = 0;
  bool read = false;
  for (const fs::directory_entry& thread : fs::directory_iterator("/proc/self/task", error)) {
    std::ifstream schedstat(thread.path() / "schedstat");
    long long running_ns = 0, waiting_ns = 0;
    if (!(schedstat >> running_ns >> waiting_ns)) continue;  // ended meanwhile
    seconds += 1e-9 * static_cast<double>(waiting_ns);
    read = true;
  }
  if (!read) return std::nullopt;
  return seconds;
}

// The wait over one step: after - before (nullopt where either is).
std::optional<double> waited(std::optional<double> before, std::optional<double> after) {
  if (!before || !after) return std::nullopt;
  return std::max(0.0, *after - *before);
}

// What other tasks ran between two readings: the total, the thread that
// ran longest (a thread started meanwhile counts all its time; a thread id
// reused meanwhile counts nothing), and the window from the start of the
// first reading to the end of the second.
struct OtherTime {
  double seconds = 0;
  std::string top;
  double top_seconds = 0;
  double window_s = 0;
};

OtherTime other_time(const OtherTasks& before, const OtherTasks& after) {
  OtherTime t;
  for (const auto& [tid, now] : after) {
    const auto then = before.find(tid);
    const double ran = std::max(0.0, now.seconds - (then == before.end() ? 0 : then->second.seconds));
    t.seconds += ran;
    if (ran > t.top_seconds) {
      t.top = now.name;
      t.top_seconds = ran;
    }
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const nn::ByteDataset data(nn::ByteDataset::default_corpus(), {.seq_length = o.model.context, .seed = 1});
  const DatasetSource source(data, nn::Split::kTrain);
  std::printf("model: %d layers, width %d, %d heads, context %d; %s, %d micro-batches of %d; %d steps, %d usable cores\n",
              o.model.n_layer, o.model.n_embd, o.model.n_head, o.model.context, o.schedule.c_str(), o.microbatches,
              o.micro_batch, o.steps, usable_cores());
  std::printf("hand-off by spin before sleeping (best of 0.3 s of ping-pong):");
  for (const int spin_us : {0, 50, 200, 1000, 5000}) {
    const double latency = measure_handoff_latency(std::chrono::microseconds(spin_us), 0.3);
    std::printf(" %d us: %.1f us%s", spin_us, 1e6 * latency,
                std::chrono::microseconds(spin_us) == kHandoffSpin ? " (engine's)" : "");
  }
  std::printf("\n");
  const auto one = make_engine(o, "1f1b", 1);  // p = 1 1F1B: plain gradient accumulation
  const auto many = make_engine(o, o.schedule, o.stages);
  // The 1-stage run again on the second core, when 2 ranks have a core each.
  const std::vector<int> cpus = usable_cpus();
  const bool two_cores = o.stages == 2 && cpus.size() >= 2;
  const auto one_on_second = two_cores ? make_engine(o, "1f1b", 1) : nullptr;
  CostProfile costs(many->num_stages());
  std::vector<double> single_s, second_s, pipelined_s, bubble, single_overhead, pipelined_overhead, single_off,
      pipelined_off, wake;
  std::vector<double> single_compute, second_compute;
  std::vector<long> single_faults, pipelined_faults;
  long first_single_faults = 0, first_pipelined_faults = 0;
  std::vector<std::vector<double>> stage_compute(static_cast<std::size_t>(o.stages));
  // The pipelined steps' figures for the worst and middle steps' lines: the
  // pipeline's makespan, and per rank (step by step) its figures and its
  // first action's start.
  std::vector<double> pipeline_s, first_action_s;
  std::vector<RankFigures> rank_figures;
  std::vector<OtherTime> pipelined_others;
  // Per step, the 1-stage run's, the second core's and the pipelined run's.
  std::vector<std::array<std::optional<double>, 3>> core_waits;
  // What is kept of every step is in storage reserved before the first (the
  // cost profile keeps steps 1-3 besides). A step's records are made on the
  // rank threads and freed on this one, whose malloc cache then serves it
  // those blocks, in the ranks' heaps, for what it keeps: kept growing one
  // by one, they raised the last rank's heap by a GEMM buffer a step (131
  // fresh-page faults in each pipelined step of make run's model from step
  // 7 on, 0.5 MB of memory a step).
  const auto steps = static_cast<std::size_t>(o.steps);
  for (std::vector<double>* v : {&single_s, &second_s, &pipelined_s, &bubble, &single_overhead, &pipelined_overhead,
                                 &single_off, &pipelined_off, &wake, &single_compute, &second_compute, &pipeline_s}) {
    v->reserve(steps);
  }
  for (std::vector<double>& v : stage_compute) v.reserve(steps);
  single_faults.reserve(steps);
  pipelined_faults.reserve(steps);
  rank_figures.reserve(steps * static_cast<std::size_t>(o.stages));
  first_action_s.reserve(steps * static_cast<std::size_t>(o.stages));
  pipelined_others.reserve(steps);
  core_waits.reserve(steps);
  bool others_known = false;  // some scan read a thread's schedstat
  for (int step = 0; step < o.steps; ++step) {
    long faults = page_faults();
    std::optional<double> wait_mark = run_queue_wait_s();
    std::array<std::optional<double>, 3> step_waits;
    const auto mark_wait = [&](std::optional<double>& into) {
      const std::optional<double> now = run_queue_wait_s();
      into = waited(wait_mark, now);
      wait_mark = now;
    };
    const StepResult a = one->step(step, source);
    const long single_step_faults = page_faults() - faults;
    mark_wait(step_waits[0]);
    StepResult c;
    if (two_cores) c = step == 0 ? first_step_on(*one_on_second, cpus[1], source) : one_on_second->step(step, source);
    mark_wait(step_waits[1]);
    const auto others_start = std::chrono::steady_clock::now();
    const OtherTasks others_before = other_tasks();
    others_known = others_known || !others_before.empty();
    wait_mark = run_queue_wait_s();
    faults = page_faults();
    const StepResult b = many->step(step, source);
    const long pipelined_step_faults = page_faults() - faults;
    mark_wait(step_waits[2]);
    OtherTime others = other_time(others_before, other_tasks());
    others.window_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - others_start).count();
    if (step == 0) {  // warm-up: pools fill
      first_single_faults = single_step_faults;
      first_pipelined_faults = pipelined_step_faults;
      continue;
    }
    single_faults.push_back(single_step_faults);
    pipelined_faults.push_back(pipelined_step_faults);
    if (two_cores) {
      const StepFigures fc = step_figures(c, 1);
      second_s.push_back(fc.wall_s);
      second_compute.push_back(fc.ranks[0].compute_s);
    }
    if (step <= 3) costs.add(b);
    const StepFigures fa = step_figures(a, 1);
    const StepFigures fb = step_figures(b, o.stages);
    single_s.push_back(fa.wall_s);
    pipelined_s.push_back(fb.wall_s);
    pipeline_s.push_back(fb.pipeline_s);
    for (std::size_t r = 0; r < static_cast<std::size_t>(o.stages); ++r) {
      rank_figures.push_back(fb.ranks[r]);
      first_action_s.push_back(b.ranks[r].actions.empty() ? 0 : b.ranks[r].actions.front().start_s);
    }
    pipelined_others.push_back(others);
    core_waits.push_back(step_waits);
    bubble.push_back(fb.bubble);
    single_overhead.push_back(overhead(fa, 1));
    pipelined_overhead.push_back(overhead(fb, o.stages));
    single_off.push_back(fa.ranks[0].off_core_s);
    double worst_off = 0;
    for (const RankFigures& r : fb.ranks) worst_off = std::max(worst_off, r.off_core_s);
    pipelined_off.push_back(worst_off);
    double worst_wake = 0;
    for (const RankFigures& r : fb.ranks) worst_wake = std::max(worst_wake, r.wake_s);
    wake.push_back(worst_wake);
    single_compute.push_back(fa.ranks[0].compute_s);
    for (int r = 0; r < o.stages; ++r) stage_compute[static_cast<std::size_t>(r)].push_back(fb.ranks[static_cast<std::size_t>(r)].compute_s);
  }
  const double predicted = predict_step(*many, costs).pipeline_bubble_ratio;
  const double ideal = o.stages * (1 - predicted);
  std::vector<double> fraction, on_core_fraction, second_fraction, both_fraction;
  for (std::size_t i = 0; i < single_s.size(); ++i) {
    fraction.push_back(single_s[i] / pipelined_s[i] / ideal);
    on_core_fraction.push_back((single_s[i] - single_off[i]) / (pipelined_s[i] - pipelined_off[i]) / ideal);
    if (two_cores) {
      second_fraction.push_back(second_s[i] / pipelined_s[i] / ideal);
      const double rate = 1 / single_s[i] + 1 / second_s[i];  // the 2 cores' combined
      both_fraction.push_back(1 / pipelined_s[i] / (rate * (1 - predicted)));
    }
  }
  std::printf("per step (1-stage / %d-stage, %% of ideal):", o.stages);
  for (const double f : fraction) std::printf(" %.0f", 100 * f);
  if (two_cores) {
    std::printf("\nper step (against the 2 cores' combined rate, %% of ideal):");
    for (const double f : both_fraction) std::printf(" %.0f", 100 * f);
  }
  std::printf("\noff core per step, ms (1 stage / %d stages' worst rank):", o.stages);
  for (std::size_t i = 0; i < single_off.size(); ++i) std::printf(" %.1f/%.1f", 1e3 * single_off[i], 1e3 * pipelined_off[i]);
  std::printf("\nwake per step, ms (%d stages' worst rank: blocked receives after their SEND ended):", o.stages);
  for (const double w : wake) std::printf(" %.2f", 1e3 * w);
  const bool waits_known = !core_waits.empty() && core_waits.front()[2].has_value();
  std::printf("\nwaiting for a core per step, ms (this process's threads runnable, not running; 1 stage%s / %d stages):",
              two_cores ? " / 1 stage on the second core" : "", o.stages);
  if (waits_known) {
    for (const auto& w : core_waits) {
      std::printf(" %.2f/", 1e3 * w[0].value_or(0));
      if (two_cores) std::printf("%.2f/", 1e3 * w[1].value_or(0));
      std::printf("%.2f", 1e3 * w[2].value_or(0));
    }
  } else {
    std::printf(" not known here (no /proc/self/task/TID/schedstat can be read)");
  }
  std::printf("\npage faults per step (the process's, 1 stage / %d stages; step 0: %ld / %ld):", o.stages,
              first_single_faults, first_pipelined_faults);
  for (std::size_t i = 0; i < single_faults.size(); ++i) std::printf(" %ld/%ld", single_faults[i], pipelined_faults[i]);
  std::printf("\n");
  const Spread f = spread(fraction), t1 = spread(single_s), tp = spread(pipelined_s), bb = spread(bubble);
  std::printf("steps 1-%d: 1 stage %.1f / %.1f / %.1f ms, %d stages %.1f / %.1f / %.1f ms (min / median / max)\n",
              o.steps - 1, 1e3 * t1.min, 1e3 * t1.median, 1e3 * t1.max, o.stages, 1e3 * tp.min, 1e3 * tp.median,
              1e3 * tp.max);
  std::printf("fraction of ideal %d x (1 - %.1f%%) = %.3f: min %.1f%%, median %.1f%%, max %.1f%%\n", o.stages,
              100 * predicted, ideal, 100 * f.min, 100 * f.median, 100 * f.max);
  if (two_cores) {
    const Spread t2 = spread(second_s), f2 = spread(second_fraction), fb2 = spread(both_fraction);
    std::printf("1 stage on the second core (cpu %d): %.1f / %.1f / %.1f ms; fraction of ideal against it: min %.1f%%, median %.1f%%, max %.1f%%\n",
                cpus[1], 1e3 * t2.min, 1e3 * t2.median, 1e3 * t2.max, 100 * f2.min, 100 * f2.median, 100 * f2.max);
    std::printf("fraction of ideal against the cores' combined rate (1/T_first + 1/T_second) x (1 - bubble): min %.1f%%, median %.1f%%, max %.1f%%\n",
                100 * fb2.min, 100 * fb2.median, 100 * fb2.max);
  }
  std::printf("compute per step (median, ms): 1 stage %.2f on the first core", 1e3 * median(single_compute));
  if (two_cores) std::printf(", %.2f on the second", 1e3 * median(second_compute));
  double stages_sum = 0;
  std::printf("; %d stages", o.stages);
  for (int r = 0; r < o.stages; ++r) {
    const double c = median(stage_compute[static_cast<std::size_t>(r)]);
    stages_sum += c;
    std::printf(" %s%.2f", r ? "+ " : "", 1e3 * c);
  }
  std::printf(" = %.2f (%.2fx the first core's 1 stage)\n", 1e3 * stages_sum, stages_sum / median(single_compute));
  const Spread on = spread(on_core_fraction);
  std::printf("the same with each step's off-core time taken out (at most; a rank off the critical path loses less): min %.1f%%, median %.1f%%, max %.1f%%\n",
              100 * on.min, 100 * on.median, 100 * on.max);
  std::printf("bubble %d stages: measured %.1f / %.1f / %.1f%% (min / median / max), predicted %.1f%%\n", o.stages,
              100 * bb.min, 100 * bb.median, 100 * bb.max, 100 * predicted);
  std::printf("runtime overhead (median): 1 stage %.2f%% of the step, %d stages %.2f%% (worst rank)\n",
              100 * spread(single_overhead).median, o.stages, 100 * spread(pipelined_overhead).median);
  // The steps other tasks left alone: no run of the step waited for a core
  // kQuietWaitS or more.
  std::vector<double> quiet, quiet_both;
  for (std::size_t i = 0; i < fraction.size() && waits_known; ++i) {
    const auto& w = core_waits[i];
    const bool quiet_step = w[0].value_or(0) < kQuietWaitS && w[2].value_or(0) < kQuietWaitS &&
                            (!two_cores || w[1].value_or(0) < kQuietWaitS);
    if (!quiet_step) continue;
    quiet.push_back(fraction[i]);
    if (two_cores) quiet_both.push_back(both_fraction[i]);
  }
  std::printf("steps in which no run waited %.1f ms or more for a core: ", 1e3 * kQuietWaitS);
  if (waits_known) {
    std::printf("%zu of %zu", quiet.size(), fraction.size());
  } else {
    std::printf("not known");
  }
  if (!quiet.empty()) {
    const Spread q = spread(quiet);
    std::printf("; fraction of ideal min %.1f%%, median %.1f%%, max %.1f%%", 100 * q.min, 100 * q.median, 100 * q.max);
    if (two_cores) {
      const Spread qb = spread(quiet_both);
      std::printf(" (against the combined rate: %.1f%%, %.1f%%, %.1f%%)", 100 * qb.min, 100 * qb.median,
                  100 * qb.max);
    }
  }
  std::printf("\n");
  // Where the worst step went: its ranks' figures beside a middle step's
  // (the lower middle one of an even count).
  std::vector<std::size_t> order(fraction.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return fraction[x] < fraction[y]; });
  const auto describe = [&](const char* name, std::size_t i) {
    const OtherTime& others = pipelined_others[i];
    std::printf("%s step (%zu, %.1f%% of ideal): 1 stage %.2f ms, %d stages %.2f ms (pipeline %.2f; waited for a core ",
                name, i + 1, 100 * fraction[i], 1e3 * single_s[i], o.stages, 1e3 * pipelined_s[i], 1e3 * pipeline_s[i]);
    if (const std::optional<double> w = core_waits[i][2]) {
      std::printf("%.2f; other tasks ", 1e3 * *w);
    } else {
      std::printf("not known; other tasks ");
    }
    if (others_known) {
      std::printf("%.2f in the %.2f ms around it", 1e3 * others.seconds, 1e3 * others.window_s);
    } else {
      std::printf("not known");
    }
    if (others.top_seconds > 0) std::printf(", most %s %.2f", others.top.c_str(), 1e3 * others.top_seconds);
    std::printf("):");
    for (std::size_t r = 0; r < static_cast<std::size_t>(o.stages); ++r) {
      const std::size_t at = i * static_cast<std::size_t>(o.stages) + r;
      const RankFigures& k = rank_figures[at];
      const double start = first_action_s[at];
      std::printf("%s rank %zu compute %.2f (off core %.2f), wait %.2f (wake %.2f), comm %.2f, other %.2f (first "
                  "action at %.2f), flush %.2f",
                  r ? ";" : "", r, 1e3 * k.compute_s, 1e3 * k.off_core_s, 1e3 * k.wait_s, 1e3 * k.wake_s, 1e3 * k.comm_s,
                  1e3 * k.other_s, 1e3 * start, 1e3 * k.flush_s);
    }
    std::printf("\n");
  };
  describe("worst", order.front());
  describe("middle", order[(order.size() - 1) / 2]);
  return 0;
}
