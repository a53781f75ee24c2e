// One training step (forward + backward + AdamW) of a GPT-2 or a Llama on one
// thread, timed, with the single-thread ceiling of its GEMMs measured in
// the same run: sgemm, or oneDNN's bf16 matmul where the step's GEMMs are
// bf16 (a bf16 step set against sgemm could pass 100% of its "ceiling").
// bench/train_step.sh runs it beside the same step in PyTorch, and a Llama
// beside a GPT-2 of the same size.
//
// Each step is timed twice: wall clock and the process's CPU time. On a
// shared machine the scheduler slices other processes in, which inflates wall
// time but not CPU time, so CPU time is the steadier measure (and CPU time
// close to wall time shows the step ran on one thread).
//
//   bench_train_step [--layers L --heads H --width C --context T --batch B --steps N]
//                    [--arch llama --kv-heads KV --intermediate F] [--format bf16|fp16]
//                    [--gemm-shapes]
//
// --gemm-shapes: after the timed steps, as many again with every GEMM call
// timed by shape (GemmCallTimes), then each shape's call repeated on dense
// operands of its own (the best of kRepeats; under bf16 both operands lent
// as bits, as a step lends nearly all of its; beta 1): the GEMMs' share of
// the step and each shape's rate in the step beside its rate repeated. The
// gap is what the step's operands cost the product: where they come from
// (a repeated call finds them in cache, where they fit) and how they lie
// (the step's attention heads interleave in one tensor, which oneDNN runs
// through another matmul than dense ones).
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
#include "pipeflow/tensor/half.h"

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

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Options {
  int layers = 4, heads = 4, width = 128, context = 64, batch = 16, steps = 10, vocab = 256;
  bool llama = false, gemm_shapes = false;
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
                                {"--vocab", &o.vocab},
                                {"--gemm-shapes", &o.gemm_shapes}});
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

// Calls of one shape repeated for --gemm-shapes.
constexpr int kRepeats = 20;

// How a repeated call is timed: by wall clock, as GemmCallTimes times the
// step's calls it is set beside, or by the process's CPU time, as the step.
enum class Timing { kWall, kCpu };

double now(Timing timing) {
  if (timing == Timing::kCpu) return cpu_seconds();
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// The best time of kRepeats calls of `shape` on dense operands of
// bf16-exact values (A, B and C each a contiguous grid of products; under
// kBf16 A and B lent as bits), beta 1 (a step's forward products start
// from 0 instead: a little less work than this).
double repeated_seconds(const pipeflow::GemmCallShape& shape, pipeflow::GemmPrecision precision, Timing timing) {
  using namespace pipeflow;
  const long a_size = static_cast<long>(shape.m) * shape.k, b_size = static_cast<long>(shape.k) * shape.n;
  const long c_size = static_cast<long>(shape.m) * shape.n;
  std::vector<float> a(a_size * shape.products), b(b_size * shape.products), c(c_size * shape.products, 0.0f);
  nn::Rng rng(11);
  for (float& x : a) x = round_to_bf16(static_cast<float>(rng.below(255)) / 128.0f - 1.0f);
  for (float& x : b) x = round_to_bf16(static_cast<float>(rng.below(255)) / 128.0f - 1.0f);
  std::vector<std::uint16_t> a_bits(a.size()), b_bits(b.size());
  to_half_bits(ComputeFormat::kBf16, a.data(), a_bits.data(), static_cast<std::int64_t>(a.size()));
  to_half_bits(ComputeFormat::kBf16, b.data(), b_bits.data(), static_cast<std::int64_t>(b.size()));
  const GemmPrecisionScope scope(precision);
  Bf16Operands lent;
  if (precision == GemmPrecision::kBf16) {
    lent.add(a.data(), a_bits);
    lent.add(b.data(), b_bits);
  }
  const Transpose ta = shape.transpose_a ? Transpose::kYes : Transpose::kNo;
  const Transpose tb = shape.transpose_b ? Transpose::kYes : Transpose::kNo;
  const GemmBatch grid{{shape.products, 1, 1}, {a_size, 0, 0}, {b_size, 0, 0}, {c_size, 0, 0}};
  // (at least 1: a leading dimension of 0 is refused even for an empty matrix)
  const int lda = std::max(1, shape.transpose_a ? shape.m : shape.k);
  const int ldb = std::max(1, shape.transpose_b ? shape.k : shape.n);
  double best = 1e30;
  for (int i = 0; i < kRepeats; ++i) {
    const double start = now(timing);
    gemm_batched<float>(grid, ta, tb, shape.m, shape.n, shape.k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, c.data(),
                        std::max(1, shape.n));
    best = std::min(best, now(timing) - start);
  }
  return best;
}

// The GEMM library's single-thread rate in `precision` (the step's ceiling:
// sgemm in fp32, oneDNN's bf16 matmul in bf16), GFLOP/s: the best of
// kRepeats 1024³ products by CPU time, as the step is timed (a wall-clock
// ceiling fell under a busy neighbour on the core, and the step read 153% of
// it). A reference, not a bound: a step's smaller shapes, in cache, may run
// faster (--gemm-shapes).
double gemm_ceiling(pipeflow::GemmPrecision precision) {
  const pipeflow::GemmCallShape cube{.m = 1024, .n = 1024, .k = 1024};
  return cube.flops() / repeated_seconds(cube, precision, Timing::kCpu) / 1e9;
}

// --gemm-shapes: `steps` more steps with their GEMMs timed by shape, printed
// beside each shape's rate repeated on dense operands.
template <class Step>
void print_gemm_shapes(Step& step, int steps, pipeflow::GemmPrecision precision) {
  using namespace pipeflow;
  std::vector<GemmCallTimes::Entry> entries;
  double step_seconds = 0;
  {
    GemmCallTimes times;
    for (int i = 0; i < steps; ++i) {
      const auto start = Clock::now();
      step();
      step_seconds += seconds_since(start);
    }
    entries = times.by_time();
  }
  double gemm_seconds = 0, gemm_flops = 0, repeated_total = 0;
  std::printf("GEMM calls by shape over %d steps (%s): m n k, transposed A/B, products a call | calls/step, "
              "ms/step, GFLOP/s in the step | GFLOP/s repeated (dense operands, best of %d)\n",
              steps, to_string(precision), kRepeats);
  for (const GemmCallTimes::Entry& e : entries) {
    const double repeated = repeated_seconds(e.shape, precision, Timing::kWall);
    const double flops = e.shape.flops() * static_cast<double>(e.calls);
    gemm_seconds += e.seconds;
    gemm_flops += flops;
    repeated_total += repeated * static_cast<double>(e.calls);
    std::printf("  %5d %5d %5d  %c%c  x%-3d | %6.1f %8.3f %7.1f | %7.1f\n", e.shape.m, e.shape.n, e.shape.k,
                e.shape.transpose_a ? 'T' : 'N', e.shape.transpose_b ? 'T' : 'N', e.shape.products,
                static_cast<double>(e.calls) / steps, e.seconds / steps * 1e3, flops / e.seconds / 1e9,
                e.shape.flops() / repeated / 1e9);
  }
  std::printf("GEMMs: %.2f of the step's %.2f ms (%.0f%%), %.1f GFLOP/s in the step; the same calls repeated on "
              "dense operands: %.2f ms, %.1f GFLOP/s\n",
              gemm_seconds / steps * 1e3, step_seconds / steps * 1e3, 100 * gemm_seconds / step_seconds,
              gemm_flops / gemm_seconds / 1e9, repeated_total / steps * 1e3, gemm_flops / repeated_total / 1e9);
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
  const double ceiling = gemm_ceiling(model.gemm_precision());
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
  std::printf("%s: %.2f ms/step (median of %d, min %.2f, max %.2f), cpu %.2f ms/step, %.1f GFLOP/s = %.0f%% of %s "
              "%.1f GFLOP/s, %.3f GFLOP/step, %lld parameters, loss %.4f, blas threads %d, peak activations %.1f MiB, "
              "GEMMs in %s, weights fnv1a %016llx\n",
              name.c_str(), wall_median * 1e3, o.steps, *std::min_element(wall.begin(), wall.end()) * 1e3,
              *std::max_element(wall.begin(), wall.end()) * 1e3, cpu_median * 1e3,
              flops / cpu_median / 1e9, 100 * flops / cpu_median / 1e9 / ceiling,
              model.gemm_precision() == GemmPrecision::kBf16 ? "bf16 GEMM" : "sgemm", ceiling, flops / 1e9,
              static_cast<long long>(config.parameter_count()), loss, blas_threads(), static_cast<double>(model.activation_memory().peak_bytes()) / (1024.0 * 1024.0),
              to_string(model.gemm_precision()), static_cast<unsigned long long>(weights_digest(model)));
  if (o.gemm_shapes) print_gemm_shapes(step, o.steps, model.gemm_precision());
  return 0;
}
