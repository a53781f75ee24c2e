// The pipeline runtime against its own baseline, in one run: the same global
// batch trained by 1 stage on 1 core and by P stages on P cores (one worker
// thread each), rounds alternating so that load from other processes hits
// both. Prints per configuration the step time (median and fastest), the
// measured bubble beside the one predicted from the run's own per-action
// medians, and the runtime's overhead; then the throughput ratio against the
// ideal P × (1 − predicted bubble).
//
//   bench_runtime_pipeline [--schedule 1f1b --stages 2 --microbatches 8 --micro-batch 8
//                           --layers 4 --heads 4 --width 128 --context 64
//                           --partition balanced --steps 12 --rounds 3]
//
// Overhead: on the 1-stage run, everything in the step that is neither
// layer compute (F/B/I/W) nor the optimizer (thread start and join, hand-offs,
// bookkeeping, tracing, the norm); on the pipelined run, per rank, the time
// in the pipeline part that is neither compute nor waiting for a peer
// (hand-offs, bookkeeping between actions, thread start).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "pipeflow/model/hardware.h"
#include "pipeflow/nn/byte_dataset.h"
#include "pipeflow/runtime/engine.h"
#include "pipeflow/runtime/measurement.h"
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
  nn::GptConfig model{.vocab_size = 256, .context = 64, .n_layer = 4, .n_head = 4, .n_embd = 128};
  std::string partition = "balanced";
  int steps = 12;
  int rounds = 3;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--schedule") o.schedule = value;
    else if (flag == "--stages") o.stages = std::atoi(value);
    else if (flag == "--microbatches") o.microbatches = std::atoi(value);
    else if (flag == "--micro-batch") o.micro_batch = std::atoi(value);
    else if (flag == "--layers") o.model.n_layer = std::atoi(value);
    else if (flag == "--heads") o.model.n_head = std::atoi(value);
    else if (flag == "--width") o.model.n_embd = std::atoi(value);
    else if (flag == "--context") o.model.context = std::atoi(value);
    else if (flag == "--partition") o.partition = value;
    else if (flag == "--steps") o.steps = std::atoi(value);
    else if (flag == "--rounds") o.rounds = std::atoi(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Measured {
  std::vector<double> step_s;         // every step after the first
  std::vector<double> bubble;
  std::vector<double> overhead;       // share of the step (see the header)
  double predicted_bubble = 0;
};

Measured run(const Options& o, const std::string& schedule_name, int stages, const nn::ByteDataset& data) {
  const Schedule schedule = make_schedule(schedule_name, stages, o.microbatches);
  EngineOptions options;
  options.micro_batch = o.micro_batch;
  options.optimizer = {.lr = 1e-3};
  options.lr_schedule = nn::LrSchedule::constant(1e-3);
  options.gradient_clipping = 1.0;
  const auto boundaries = partition_model(o.model, schedule.num_stages(), parse_partition_method(o.partition),
                                          o.micro_batch, o.model.context, hardware_preset("cpu"));
  PipelineEngine engine(o.model, schedule, boundaries, options);
  engine.init_gpt2(1);
  const DatasetSource source(data, nn::Split::kTrain);
  CostProfile costs(schedule.num_stages());
  Measured m;
  for (int step = 0; step < o.steps; ++step) {
    const StepResult result = engine.step(step, source);
    if (step == 0) continue;  // warm-up: pools fill
    if (step <= 3) costs.add(result);
    const StepFigures f = step_figures(result, stages);
    m.step_s.push_back(f.wall_s);
    m.bubble.push_back(f.bubble);
    double overhead = 0;
    for (const RankFigures& r : f.ranks) {
      overhead = std::max(overhead, stages == 1 ? f.wall_s - r.compute_s - r.optimizer_s - r.wait_s
                                                : r.comm_s + r.other_s);
    }
    m.overhead.push_back(overhead / f.wall_s);
  }
  m.predicted_bubble = predict_step(engine, costs).pipeline_bubble_ratio;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const nn::ByteDataset data(nn::ByteDataset::default_corpus(), {.sequence_length = o.model.context, .seed = 1});
  std::printf("model: %d layers, width %d, %d heads, context %d; %s, %d micro-batches of %d; %d steps per run, %u cores\n",
              o.model.n_layer, o.model.n_embd, o.model.n_head, o.model.context, o.schedule.c_str(), o.microbatches,
              o.micro_batch, o.steps, std::thread::hardware_concurrency());
  std::vector<double> single_best, pipe_best, single_median, pipe_median, predicted, measured, single_overhead,
      pipe_overhead;
  for (int round = 0; round < o.rounds; ++round) {
    // One stage: 1F1B is plain gradient accumulation (F0 B0 F1 B1 ...), each
    // micro-batch's activations used while still in cache; GPipe's order
    // (all F, then all B) would hold all m and make the baseline slower.
    const Measured one = run(o, "1f1b", 1, data);
    const Measured many = run(o, o.schedule, o.stages, data);
    single_best.push_back(*std::min_element(one.step_s.begin(), one.step_s.end()));
    pipe_best.push_back(*std::min_element(many.step_s.begin(), many.step_s.end()));
    single_median.push_back(median(one.step_s));
    pipe_median.push_back(median(many.step_s));
    predicted.push_back(many.predicted_bubble);
    measured.push_back(median(many.bubble));
    single_overhead.push_back(median(one.overhead));
    pipe_overhead.push_back(median(many.overhead));
    std::printf("round %d: 1 stage %.1f ms (fastest %.1f), overhead %.2f%% | %d stages %.1f ms (fastest %.1f), bubble "
                "%.1f%% measured / %.1f%% predicted, overhead %.2f%%\n",
                round + 1, 1e3 * single_median.back(), 1e3 * single_best.back(), 100 * single_overhead.back(),
                o.stages, 1e3 * pipe_median.back(), 1e3 * pipe_best.back(), 100 * measured.back(),
                100 * predicted.back(), 100 * pipe_overhead.back());
  }
  const double bubble = median(predicted);
  const double ideal = o.stages * (1 - bubble);
  const double ratio_median = median(single_median) / median(pipe_median);
  const double ratio_best = *std::min_element(single_best.begin(), single_best.end()) /
                            *std::min_element(pipe_best.begin(), pipe_best.end());
  std::printf("summary (medians over %d rounds):\n", o.rounds);
  std::printf("  throughput %d stages / 1 stage: %.3f (median steps), %.3f (fastest steps); ideal %d x (1 - %.1f%%) = "
              "%.3f: %.1f%% / %.1f%% of ideal\n",
              o.stages, ratio_median, ratio_best, o.stages, 100 * bubble, ideal, 100 * ratio_median / ideal,
              100 * ratio_best / ideal);
  std::printf("  bubble %d stages: measured %.1f%%, predicted %.1f%%, difference %+.1f pp\n", o.stages,
              100 * median(measured), 100 * bubble, 100 * (median(measured) - bubble));
  std::printf("  runtime overhead: 1 stage %.2f%% of the step, %d stages %.2f%% (worst rank)\n",
              100 * median(single_overhead), o.stages, 100 * median(pipe_overhead));
  return 0;
}
