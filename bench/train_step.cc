// One training step (forward + backward + AdamW) of a GPT-2 or a Llama on one
// thread, timed, with the single-thread sgemm ceiling measured in the same
// run. bench/train_step.sh runs it beside the same step in PyTorch, and a
// Llama beside a GPT-2 of the same size.
//
// Each step is timed twice: wall clock and the process's CPU time. On a
// shared machine the scheduler slices other processes in, which inflates wall
// time but not CPU time, so CPU time is the steadier measure (and CPU time
// close to wall time shows the step ran on one thread).
//
//   bench_train_step [--layers L --heads H --width C --context T --batch B --steps N]
//                    [--arch llama --kv-heads KV --intermediate F] [--format bf16|fp16]
//
// FLOPs per step are the model FLOPs of Narayanan et al. 2021 (eq. 3 without
// recompute; docs/PERFORMANCE.md): 72·B·L·T·C²·(1 + T/(6C) + V/(12·C·L)),
// i.e. 3× the forward matmul FLOPs with the full T×T attention counted. For a
// Llama the same count over its matrices: 3·B·T·(L·(2·(2C² + 2C·KV·hs + 3C·F)
// + 4TC) + 2CV).
//
// The last field, the 64-bit FNV-1a of the trained weights' bytes, tells
// whether two builds train to the same bits (same flags: same digest).

#include <cblas.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flags.h"
#include "pipeflow/nn/adamw.h"
#include "pipeflow/nn/random.h"
#include "pipeflow/nn/stage.h"
#include "pipeflow/tensor/gemm.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// Best of ten 1024³ sgemms by CPU time, GFLOP/s.
double sgemm_ceiling() {
  const int n = 1024;
  std::vector<float> a(n * n, 0.001f), b(n * n, 0.002f), c(n * n);
  double best = 0;
  for (int round = 0; round < 10; ++round) {
    const double start = cpu_seconds();
    pipeflow::gemm<float>(pipeflow::Transpose::kNo, pipeflow::Transpose::kNo, n, n, n, 1.0f, a.data(), n, b.data(), n,
                          0.0f, c.data(), n);
    best = std::max(best, 2.0 * n * n * n / (cpu_seconds() - start) / 1e9);
  }
  return best;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Options {
  int layers = 4, heads = 4, width = 128, context = 64, batch = 16, steps = 10, vocab = 256;
  bool llama = false;
  pipeflow::ComputeFormat format = pipeflow::ComputeFormat::kFp32;
  int kv_heads = 0, intermediate = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  std::string arch = "gpt2", format = "fp32";
  pipeflow::bench::parse_flags(argc, argv,
                               {{"--arch", &arch},
                                {"--format", &format},
                                {"--layers", &o.layers},
                                {"--kv-heads", &o.kv_heads},
                                {"--intermediate", &o.intermediate},
                                {"--heads", &o.heads},
                                {"--width", &o.width},
                                {"--context", &o.context},
                                {"--batch", &o.batch},
                                {"--steps", &o.steps},
                                {"--vocab", &o.vocab}});
  if ((arch != "gpt2" && arch != "llama") || (format != "fp32" && format != "bf16" && format != "fp16")) {
    std::fprintf(stderr, "--arch %s --format %s: the architecture is gpt2 or llama, the format fp32, bf16 or fp16\n",
                 arch.c_str(), format.c_str());
    std::exit(2);
  }
  o.llama = arch == "llama";
  o.format = format == "bf16"   ? pipeflow::ComputeFormat::kBf16
             : format == "fp16" ? pipeflow::ComputeFormat::kFp16
                                : pipeflow::ComputeFormat::kFp32;
  return o;
}

// The 64-bit FNV-1a of the master weights' bytes.
std::uint64_t weights_digest(const pipeflow::nn::Stage& model) {
  const std::span<const float> weights = model.parameters();
  return pipeflow::nn::hash_name({reinterpret_cast<const char*>(weights.data()), weights.size_bytes()});
}

}  // namespace

int main(int argc, char** argv) {
  using namespace pipeflow;
  const Options o = parse(argc, argv);
  const nn::ModelConfig config{.family = o.llama ? nn::Family::kLlama : nn::Family::kGpt2,
                               .vocab_size = o.vocab,
                               .context = o.context,
                               .n_layer = o.layers,
                               .n_head = o.heads,
                               .n_embd = o.width,
                               .n_kv_head = o.kv_heads,
                               .intermediate = o.intermediate};
  nn::Stage model(config, nn::all_layers(config), {.format = o.format});
  model.init_parameters(1);
  nn::AdamW optimizer(model, {.lr = 1e-4, .weight_decay = 0.1});
  IntTensor tokens({o.batch, o.context});
  IntTensor targets({o.batch, o.context});
  nn::Rng rng(7);
  for (std::int64_t i = 0; i < tokens.numel(); ++i) {
    tokens[i] = static_cast<std::int32_t>(rng.below(o.vocab));
    targets[i] = static_cast<std::int32_t>(rng.below(o.vocab));
  }
  auto step = [&] {
    model.zero_gradients();
    nn::MicrobatchState state;
    model.forward(state, {.tokens = tokens.clone(), .targets = targets.clone()});
    model.backward_from_loss(state, 1.0);
    optimizer.step(1e-4);
    return state.loss();
  };
  const double ceiling = sgemm_ceiling();
  step();  // warm the pool and the caches
  std::vector<double> wall;
  std::vector<double> cpu;
  double loss = 0;
  for (int i = 0; i < o.steps; ++i) {
    const auto start = Clock::now();
    const double cpu_start = cpu_seconds();
    loss = step();
    cpu.push_back(cpu_seconds() - cpu_start);
    wall.push_back(seconds_since(start));
  }
  const double wall_median = median(wall);
  const double cpu_median = median(cpu);
  const double b = o.batch, l = o.layers, t = o.context, c = o.width, v = o.vocab;
  const double kv = static_cast<double>(config.kv_heads()) * config.head_size(), f = config.ffn();
  const double flops = o.llama ? 3 * b * t * (l * (2 * (2 * c * c + 2 * c * kv + 3 * c * f) + 4 * t * c) + 2 * c * v)
                               : 72 * b * l * t * c * c * (1 + t / (6 * c) + v / (12 * c * l));
  const std::string name = std::string(o.llama ? "pipeflow-llama" : "pipeflow") +
                           (o.format == ComputeFormat::kFp32 ? "" : std::string("-") + to_string(o.format));
  std::printf("%s: %.2f ms/step (median of %d, min %.2f, max %.2f), cpu %.2f ms/step, %.1f GFLOP/s = %.0f%% of sgemm "
              "%.1f GFLOP/s, %.3f GFLOP/step, %lld parameters, loss %.4f, blas threads %d, peak activations %.1f MiB, "
              "GEMMs in %s, weights fnv1a %016llx\n",
              name.c_str(), wall_median * 1e3, o.steps, *std::min_element(wall.begin(), wall.end()) * 1e3,
              *std::max_element(wall.begin(), wall.end()) * 1e3, cpu_median * 1e3,
              flops / cpu_median / 1e9, 100 * flops / cpu_median / 1e9 / ceiling, ceiling, flops / 1e9,
              static_cast<long long>(config.parameter_count()), loss, blas_threads(), static_cast<double>(model.activation_memory().peak_bytes()) / (1024.0 * 1024.0),
              to_string(model.gemm_precision()), static_cast<unsigned long long>(weights_digest(model)));
  return 0;
}
