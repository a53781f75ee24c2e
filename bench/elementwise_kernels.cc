// The elementwise and row kernels between the GEMMs, alone, against a copy of
// the same bytes in the same run: GELU forward and backward, LayerNorm's
// forward and input gradient, the causal attention forward (its softmax rows)
// and backward, their GEMMs in fp32 and (where oneDNN has one) bf16, at the
// small bench model's shapes. Each twice: hot, the same arrays call
// after call (in cache where they fit), and cold, each call on its own copy
// of the arrays, taken in turn from enough copies (128 MiB in all) that a
// copy's last use is out of every cache by its next: what a training step
// meets, whose passes read activations stored long before. Each: min /
// median / max over --repeats calls in µs (the min the least disturbed by
// other processes, the max what a disturbed call costs), and its bytes read
// and written over the min as a share of memcpy's rate (its min, hot or cold)
// on the same arrays.
//
//   bench_elementwise_kernels [--rows 1024 --width 128 --repeats 200]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "flags.h"
#include "pipeflow/tensor/attention.h"
#include "pipeflow/tensor/gelu.h"
#include "pipeflow/tensor/gemm.h"
#include "pipeflow/tensor/layernorm.h"

namespace {

struct Spread {
  double min, median, max;  // µs
};

// f(copy) `repeats` times: hot on copy 0 each time, cold on copies 0, 1, ...
// `copies` - 1 in turn; after(copy), untimed, after each call (a kernel
// that works in place restores its copy there, while that copy is still
// the one in cache).
struct HotAndCold {
  Spread hot, cold;
};

template <class F, class After>
HotAndCold time_us(int repeats, int copies, F f, After after) {
  const auto timed = [&](int copy) {
    const auto start = std::chrono::steady_clock::now();
    f(copy);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    after(copy);
    return us;
  };
  const auto spread = [](std::vector<double>& us) {
    std::sort(us.begin(), us.end());
    return Spread{us.front(), us[us.size() / 2], us.back()};
  };
  std::vector<double> hot, cold;
  for (int r = 0; r < repeats; ++r) cold.push_back(timed(r % copies));
  for (int r = 0; r < repeats; ++r) hot.push_back(timed(0));
  return {spread(hot), spread(cold)};
}

template <class F>
HotAndCold time_us(int repeats, int copies, F f) {
  return time_us(repeats, copies, f, [](int) {});
}

// Enough copies of `bytes` a call that they fill 128 MiB, past this CPU's
// caches (32 MiB L3 a core complex on AMD EPYC): at least 2.
int copies_for(double bytes) { return std::max(2, static_cast<int>(128.0 * (1 << 20) / bytes)); }

}  // namespace

int main(int argc, char** argv) {
  int rows = 1024, width = 128, repeats = 200;
  pipeflow::bench::parse_flags(argc, argv, {{"--rows", &rows}, {"--width", &width}, {"--repeats", &repeats}});
  if (rows < 1 || width < 1 || repeats < 1) {
    std::fprintf(stderr, "--rows %d, --width %d, --repeats %d: each must be at least 1\n", rows, width, repeats);
    return 2;
  }
  const long f = 4L * width, n = rows * f;
  const int gelu_copies = copies_for(8.0 * static_cast<double>(n));
  std::vector<float> x(n * gelu_copies), y(x.size()), g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % n % 1000) / 100.0f - 5.0f;
  const auto slice = [n](std::vector<float>& v, int copy) { return v.data() + copy * n; };
  const HotAndCold memcpy_us = time_us(repeats, gelu_copies, [&](int k) {
    std::memcpy(slice(y, k), slice(x, k), sizeof(float) * n);
  });
  // bytes per µs, read + write
  const double hot_rate = 2.0 * sizeof(float) * n / memcpy_us.hot.min;
  const double cold_rate = 2.0 * sizeof(float) * n / memcpy_us.cold.min;
  const auto line = [&](const char* name, HotAndCold us, double bytes) {
    std::printf("%-26s hot %8.1f / %8.1f / %8.1f us %5.1f%%;  cold %8.1f / %8.1f / %8.1f us %5.1f%%\n", name,
                us.hot.min, us.hot.median, us.hot.max, 100.0 * bytes / us.hot.min / hot_rate, us.cold.min,
                us.cold.median, us.cold.max, 100.0 * bytes / us.cold.min / cold_rate);
  };
  std::printf("%d rows x %d (MLP width %ld), min / median / max of %d calls, and the bytes over the min as a share of "
              "memcpy's rate; memcpy of %ld floats hot %.1f / %.1f / %.1f us, cold %.1f / %.1f / %.1f us\n",
              rows, width, f, repeats, n, memcpy_us.hot.min, memcpy_us.hot.median, memcpy_us.hot.max,
              memcpy_us.cold.min, memcpy_us.cold.median, memcpy_us.cold.max);
  line("gelu forward", time_us(repeats, gelu_copies, [&](int k) {
         pipeflow::gelu_forward(slice(y, k), slice(x, k), static_cast<int>(n));
       }),
       8.0 * static_cast<double>(n));
  // In place on the gradient: each call's copy is set back to ones after it
  // (untimed), or repeated slopes would drive it into subnormals.
  std::fill(g.begin(), g.end(), 1.0f);
  line("gelu backward", time_us(repeats, gelu_copies,
                                [&](int k) { pipeflow::gelu_backward(slice(g, k), slice(x, k), static_cast<int>(n)); },
                                [&](int k) { std::fill(slice(g, k), slice(g, k) + n, 1.0f); }),
       12.0 * static_cast<double>(n));

  const long c = width, ln_n = rows * c;
  const int ln_copies = copies_for(12.0 * static_cast<double>(ln_n));
  std::vector<float> lx(ln_n * ln_copies), ly(lx.size()), dx(lx.size()), mean(rows), rstd(rows), w(c, 1.1f), b(c, 0.1f);
  for (std::size_t i = 0; i < lx.size(); ++i) lx[i] = static_cast<float>(i % ln_n % 77) / 10.0f;
  const auto ln_slice = [ln_n](std::vector<float>& v, int copy) { return v.data() + copy * ln_n; };
  const double ln_bytes = 4.0 * static_cast<double>(ln_n);
  line("layernorm forward", time_us(repeats, ln_copies, [&](int k) {
         pipeflow::layernorm_forward(ln_slice(ly, k), mean.data(), rstd.data(), ln_slice(lx, k), w.data(), b.data(),
                                     rows, width);
       }),
       2 * ln_bytes);
  line("layernorm input gradient", time_us(repeats, ln_copies, [&](int k) {
         pipeflow::layernorm_backward_input(ln_slice(dx, k), static_cast<const float*>(nullptr), ln_slice(ly, k),
                                            ln_slice(lx, k), mean.data(), rstd.data(), w.data(), rows, width);
       }),
       3 * ln_bytes);

  const int t = 64, heads = 4, sequences = std::max(1, rows / t);
  const long qkv_n = static_cast<long>(sequences) * t * 3 * c, out_n = static_cast<long>(sequences) * t * c,
             probs_n = static_cast<long>(sequences) * heads * t * t;
  const double attention_bytes = 4.0 * static_cast<double>(qkv_n + out_n + probs_n);
  const int attention_copies = copies_for(attention_bytes);
  std::vector<float> qkv(qkv_n * attention_copies), out(out_n * attention_copies), probs(probs_n * attention_copies);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i % qkv_n % 13) / 13.0f;
  std::vector<float> dy(out.size()), dqkv(qkv.size());
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(i % out_n % 7) / 7.0f - 0.5f;
  const double backward_bytes = 4.0 * static_cast<double>(2 * qkv_n + out_n + probs_n);
  // Its GEMMs in fp32, then (where oneDNN has a bf16 matmul) in bf16, batched.
  for (const pipeflow::GemmPrecision precision : {pipeflow::GemmPrecision::kFp32, pipeflow::GemmPrecision::kBf16}) {
    if (precision == pipeflow::GemmPrecision::kBf16 && !pipeflow::bf16_matmul_available()) break;
    const pipeflow::GemmPrecisionScope scope(precision);
    const bool bf16 = precision == pipeflow::GemmPrecision::kBf16;
    line(bf16 ? "causal attention fwd bf16" : "causal attention forward",
         time_us(repeats, attention_copies, [&](int k) {
           pipeflow::attention_forward(out.data() + k * out_n, probs.data() + k * probs_n, qkv.data() + k * qkv_n,
                                       sequences, t, width, heads, heads, true);
         }),
         attention_bytes);
    std::vector<float> scratch(pipeflow::attention_backward_scratch(sequences, t, heads));
    line(bf16 ? "causal attention bwd bf16" : "causal attention backward",
         time_us(repeats, attention_copies, [&](int k) {
           pipeflow::attention_backward(dqkv.data() + k * qkv_n, scratch.data(), static_cast<long>(scratch.size()),
                                        dy.data() + k * out_n, probs.data() + k * probs_n, qkv.data() + k * qkv_n,
                                        sequences, t, width, heads, heads, true);
         }),
         backward_bytes);
  }
  return 0;
}
