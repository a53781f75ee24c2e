// The elementwise and row kernels between the GEMMs, alone, against a copy of
// the same bytes in the same run: GELU forward and backward, LayerNorm's
// forward and input gradient, the causal attention forward (its softmax rows)
// at the small bench model's shapes. Each: min / median / max over --repeats
// calls in µs (the min the least disturbed by other processes, the max what
// a disturbed call costs), and its bytes read and written over the min as a
// share of memcpy's rate (its min) on the same arrays.
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
#include "pipeflow/tensor/layernorm.h"

namespace {

struct Spread {
  double min, median, max;  // µs
};

template <class F>
Spread time_us(int repeats, F f) {
  std::vector<double> us(static_cast<std::size_t>(repeats));
  for (double& t : us) {
    const auto start = std::chrono::steady_clock::now();
    f();
    t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  std::sort(us.begin(), us.end());
  return {us.front(), us[us.size() / 2], us.back()};
}

}  // namespace

int main(int argc, char** argv) {
  int rows = 1024, width = 128, repeats = 200;
  pipeflow::bench::parse_flags(argc, argv, {{"--rows", &rows}, {"--width", &width}, {"--repeats", &repeats}});
  if (rows < 1 || width < 1 || repeats < 1) {
    std::fprintf(stderr, "--rows %d, --width %d, --repeats %d: each must be at least 1\n", rows, width, repeats);
    return 2;
  }
  const int f = 4 * width, n = rows * f;
  std::vector<float> x(n), y(n), g(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000) / 100.0f - 5.0f;
  const Spread copy = time_us(repeats, [&] { std::memcpy(y.data(), x.data(), sizeof(float) * n); });
  const double copy_rate = 2.0 * sizeof(float) * n / copy.min;  // bytes per µs, read + write
  const auto line = [&](const char* name, Spread us, double bytes) {
    std::printf("%-28s %9.1f / %9.1f / %9.1f us  %5.1f%% of memcpy's rate\n", name, us.min, us.median, us.max,
                100.0 * bytes / us.min / copy_rate);
  };
  std::printf("%d rows x %d (MLP width %d), min / median / max of %d calls; memcpy of %d floats %.1f / %.1f / %.1f us\n",
              rows, width, f, repeats, n, copy.min, copy.median, copy.max);
  line("gelu forward", time_us(repeats, [&] { pipeflow::gelu_forward(y.data(), x.data(), n); }), 8.0 * n);
  // In place on the gradient: each call starts from ones again (a copy of
  // the same size, whose least time is taken out of each figure), or
  // repeated slopes would drive it into subnormals.
  const std::vector<float> ones(n, 1.0f);
  Spread backward = time_us(repeats, [&] {
    std::memcpy(g.data(), ones.data(), sizeof(float) * n);
    pipeflow::gelu_backward(g.data(), x.data(), n);
  });
  backward = {backward.min - copy.min, backward.median - copy.min, backward.max - copy.min};
  line("gelu backward", backward, 12.0 * n);

  const int c = width;
  std::vector<float> lx(static_cast<long>(rows) * c), ly(lx.size()), dx(lx.size()), mean(rows), rstd(rows),
      w(c, 1.1f), b(c, 0.1f);
  for (std::size_t i = 0; i < lx.size(); ++i) lx[i] = static_cast<float>(i % 77) / 10.0f;
  const double ln_bytes = 4.0 * static_cast<double>(lx.size());
  line("layernorm forward",
       time_us(repeats, [&] { pipeflow::layernorm_forward(ly.data(), mean.data(), rstd.data(), lx.data(), w.data(),
                                                          b.data(), rows, c); }),
       2 * ln_bytes);
  line("layernorm input gradient", time_us(repeats, [&] {
         pipeflow::layernorm_backward_input(dx.data(), static_cast<const float*>(nullptr), ly.data(), lx.data(),
                                            mean.data(), rstd.data(), w.data(), rows, c);
       }),
       3 * ln_bytes);

  const int t = 64, heads = 4, sequences = std::max(1, rows / t);
  std::vector<float> qkv(static_cast<long>(sequences) * t * 3 * c), out(static_cast<long>(sequences) * t * c),
      probs(static_cast<long>(sequences) * heads * t * t);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i % 13) / 13.0f;
  line("causal attention forward", time_us(repeats, [&] {
         pipeflow::attention_forward(out.data(), probs.data(), qkv.data(), sequences, t, c, heads, heads, true);
       }),
       4.0 * static_cast<double>(qkv.size() + out.size() + probs.size()));
  return 0;
}
