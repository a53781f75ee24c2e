#include "pipeflow/runtime/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "pipeflow/core/error.h"
#include "pipeflow/model/pipeline_layers.h"
#include "pipeflow/nn/random.h"
#include "pipeflow/nn/stage.h"
#include "pipeflow/runtime/in_process_transport.h"
#include "pipeflow/runtime/rank_threads.h"
#include "pipeflow/runtime/report.h"
#include "pipeflow/tensor/gemm.h"

namespace pipeflow::runtime {
namespace {

// Seconds on the steady clock: best_rate (tensor/core_peak.h) by wall time,
// for what several threads do (the hand-off) or what waits on memory.
double wall_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

double measure_gemm(double seconds, GemmPrecision precision) {
  constexpr int n = 512;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  const GemmPrecisionScope scope(precision);
  return best_rate(seconds, [&] {
    gemm<float>(Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    return 2.0 * n * n * n;
  }, wall_seconds);
}

// Each timed run repeats the GEMM up to about 1e8 FLOPs (a millisecond): a
// decode group's GEMM takes microseconds, and the best of thousands of
// microsecond-long timings picks the clock's jitter (width-128 GEMMs of 8
// rows read as 80-91% of the core's peak; timed over repeats, 38-41% in three
// runs). Repeated, the operands stay warm in cache, as a layer's weights do
// across a micro-batch's rows.
constexpr double kGemmFlopsPerTimedRun = 1e8;

std::vector<GemmRate> measure_gemm_rates(int width, const std::vector<int>& rows, double seconds) {
  std::vector<GemmRate> rates = model_gemm_shapes(width, rows);
  for (GemmRate& rate : rates) {
    std::vector<float> a(static_cast<std::size_t>(rate.m) * rate.k, 0.5f);
    std::vector<float> b(static_cast<std::size_t>(rate.k) * rate.n, 0.25f);
    std::vector<float> c(static_cast<std::size_t>(rate.m) * rate.n, 0.0f);
    const double flops = 2.0 * rate.m * rate.k * rate.n;
    const int repeats = static_cast<int>(std::ceil(kGemmFlopsPerTimedRun / flops));
    rate.flop_per_s = best_cpu_rate(seconds / static_cast<double>(rates.size()), [&] {
      for (int r = 0; r < repeats; ++r) {
        gemm<float>(Transpose::kNo, Transpose::kNo, rate.m, rate.n, rate.k, 1.0f, a.data(), rate.k, b.data(),
                    rate.n, 0.0f, c.data(), rate.n);
      }
      return flops * repeats;
    });
  }
  return rates;
}

double measure_triad(double seconds) {
  // Each array at least the last-level cache (sysconf may not know it: 0).
  const auto cache_bytes = static_cast<std::size_t>(std::max(0L, sysconf(_SC_LEVEL3_CACHE_SIZE)));
  const std::size_t n = std::max(std::size_t{64} << 20, cache_bytes) / sizeof(float);
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  const float scalar = 3.0f;
  return best_cpu_rate(seconds, [&] {
    for (std::size_t i = 0; i < n; ++i) a[i] = b[i] + scalar * c[i];
    return 3.0 * sizeof(float) * static_cast<double>(n);
  });
}

double measure_memcpy(double seconds) {
  const std::size_t bytes = std::size_t{64} << 20;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  return best_rate(seconds, [&] {
    std::memcpy(to.data(), from.data(), bytes);
    return static_cast<double>(bytes);
  }, wall_seconds);
}

}  // namespace

double measure_handoff_latency(std::chrono::nanoseconds spin, double seconds) {
  InProcessTransport transport({2, 2}, spin);
  constexpr int kRounds = 2000;
  const auto key = [](int from, int round) {
    return MessageKey{RankId(from), RankId(1 - from), StageId(from), MicrobatchId(round), Direction::kActivation};
  };
  const auto deadline = [] { return Clock::now() + std::chrono::seconds(10); };
  // On two RankThreads, pinned as the engine's ranks are when the cores suffice.
  RankThreads threads(2);
  const double round_trips = best_rate(seconds, [&] {
    threads.run([&](int rank) {
      Tensor message = rank == 0 ? Tensor{Shape{1}} : Tensor{};
      for (int round = 0; round < kRounds; ++round) {
        if (rank == 0) transport.send(key(0, round), std::move(message), deadline());
        transport.receive(key(1 - rank, round), {1}, {}, deadline(), message);
        if (rank == 1) transport.send(key(1, round), std::move(message), deadline());
      }
    });
    return static_cast<double>(kRounds);
  }, wall_seconds);
  return 1.0 / (2.0 * round_trips);  // two hand-offs per round trip
}

namespace {

double measure_model(double seconds) {
  const nn::ModelConfig config{.vocab_size = 256, .context = 64, .n_layer = 4, .n_head = 4, .n_embd = 128};
  constexpr int kBatch = 8;
  nn::Stage model(config, nn::all_layers(config), {.name = "calibration model"});
  model.init_parameters(1);
  IntTensor tokens({kBatch, config.context});
  nn::Rng rng(2);
  for (std::int64_t i = 0; i < tokens.numel(); ++i) tokens[i] = static_cast<std::int32_t>(rng.below(256));
  const ModelSpec spec = gpt_model("calibration", config.n_layer, config.n_embd, config.n_head, config.vocab_size,
                                   config.context);
  const double flops =
      sum_layers(pipeline_layers(spec, {.micro_batch = kBatch, .seq_length = config.context, .bytes_per_element = 4}))
          .model_flops();
  return best_rate(seconds, [&] {
    nn::MicrobatchState state;
    model.forward(state, {.tokens = tokens.clone(), .targets = tokens.clone()});
    model.backward_from_loss(state, 1.0);
    return flops;
  }, wall_seconds);
}

}  // namespace

std::vector<GemmRate> model_gemm_shapes(int width, const std::vector<int>& rows) {
  std::vector<GemmRate> shapes;
  for (const int m : rows) {
    shapes.push_back({.gemm = "qkv", .m = m, .k = width, .n = 3 * width});
    shapes.push_back({.gemm = "proj", .m = m, .k = width, .n = width});
    shapes.push_back({.gemm = "fc", .m = m, .k = width, .n = 4 * width});
    shapes.push_back({.gemm = "fc_proj", .m = m, .k = 4 * width, .n = width});
  }
  return shapes;
}

namespace {

void check_options(const CalibrationOptions& options) {
  const double seconds = options.seconds_per_measurement;
  if (!(seconds > 0 && seconds <= kMaxSecondsPerMeasurement)) {
    fail("--seconds {}: must be in (0, {:g}] (seconds for each of the seven measurements, which keep the best of "
         "repeated runs: the default 0.5 already repeats the slowest about ten times)",
         seconds, kMaxSecondsPerMeasurement);
  }
  if (options.gemm_width < kMinGemmWidth || options.gemm_width > kMaxGemmWidth) {
    fail("--gemm-width {}: must be in [{}, {}] (the model width C whose qkv, proj, fc and fc_proj GEMMs are "
         "timed; fc's weight is C × 4C floats): pass your model's n_embd",
         options.gemm_width, kMinGemmWidth, kMaxGemmWidth);
  }
  if (options.gemm_rows.empty()) {
    fail("--gemm-rows is empty: give at least one row count M (micro-batch × sequence length, or a decode group), "
         "e.g. --gemm-rows 512,8");
  }
  for (const int rows : options.gemm_rows) {
    if (rows < 1 || rows > kMaxGemmRows) {
      fail("--gemm-rows {}: each row count must be in [1, {}] (micro-batch × sequence length, or a decode "
           "group's rows): e.g. --gemm-rows 512,8",
           rows, kMaxGemmRows);
    }
  }
}

}  // namespace

Calibration calibrate(const CalibrationOptions& options) {
  check_options(options);
  const double seconds = options.seconds_per_measurement;
  Calibration c;
  c.core_peaks = measure_core_peaks(detect_cpu_features(), seconds);
  c.gemm_rates = measure_gemm_rates(options.gemm_width, options.gemm_rows, seconds);
  c.triad_bytes_per_s = measure_triad(seconds);
  c.sgemm_flop_per_s = measure_gemm(seconds, GemmPrecision::kFp32);
  c.bf16_gemm = resolve(Bf16Gemm::kAuto);
  c.bf16_gemm_flop_per_s =
      c.bf16_gemm == GemmPrecision::kBf16 ? measure_gemm(seconds, GemmPrecision::kBf16) : c.sgemm_flop_per_s;
  c.memcpy_bytes_per_s = measure_memcpy(seconds);
  // As the engine waits: spinning only where the two threads have a core each.
  c.handoff_latency_s =
      measure_handoff_latency(usable_cores() >= 2 ? kHandoffSpin : std::chrono::nanoseconds(0), seconds);
  c.model_flop_per_s = measure_model(seconds);
  c.cores = usable_cores();
  c.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  return c;
}

HardwareProfile calibrated_profile(const Calibration& c, std::string name) {
  HardwareProfile profile;
  profile.name = std::move(name);
  // A bf16/fp16 run's products: the bf16 matmul where this CPU has bf16
  // instructions (fp16 multiplies in fp32: a cost the profile leaves out).
  profile.peak_flop_per_s = c.bf16_gemm_flop_per_s > 0 ? c.bf16_gemm_flop_per_s : c.sgemm_flop_per_s;
  profile.peak_fp32_flop_per_s = c.sgemm_flop_per_s;
  profile.memory_bytes = c.memory_bytes;
  profile.memory_bandwidth_bytes_per_s = c.triad_bytes_per_s > 0 ? c.triad_bytes_per_s : c.memcpy_bytes_per_s;
  profile.devices_per_node = c.cores;
  profile.intra_node_bandwidth_bytes_per_s = c.memcpy_bytes_per_s;
  profile.intra_node_latency_s = c.handoff_latency_s;
  profile.inter_node_bandwidth_bytes_per_s = c.memcpy_bytes_per_s;
  profile.inter_node_latency_s = c.handoff_latency_s;
  profile.efficiency = std::clamp(c.model_flop_per_s / c.sgemm_flop_per_s, 0.01, 1.0);
  profile.estimated = {"inter_node_bandwidth_bytes_per_s", "inter_node_latency_s"};
  for (const CorePeak& peak : c.core_peaks) {
    (peak.precision == "fp32" ? profile.peak_fp32_flop_per_s_by_isa : profile.peak_bf16_flop_per_s_by_isa)[peak.isa] =
        peak.flop_per_s;
  }
  profile.gemm_flop_per_s_at_shapes = c.gemm_rates;
  profile.note = "measured by pipeflow calibrate: one core is one device; no network (inter-node = intra-node)";
  validate_hardware(profile);
  return profile;
}

}  // namespace pipeflow::runtime
