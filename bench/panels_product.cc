// The product decode runs (tensor/panels.h) against pipeflow::gemm (oneDNN's
// sgemm) in the same run: y[n, 2048] += x[n, 512] · w for n = 4 … 256 rows, over 12
// matrices (50 MB, more than the caches hold: decode streams its weights)
// and over 4 (16 MB, within the L3 cache). Three ways per size: sgemm on the
// row-major matrices (pipeflow::gemm), the panels in 4 KiB pages
// (std::aligned_alloc, no advice), and the panels in a pipeflow Tensor
// (2 MiB-aligned, transparent huge pages asked for: tensor.cc). Each time is
// the median and the minimum of 9 passes over all matrices, one thread.
// Usage: bench_panels_product [--passes 9]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flags.h"
#include "pipeflow/nn/random.h"
#include "pipeflow/tensor/gemm.h"
#include "pipeflow/tensor/panels.h"
#include "pipeflow/tensor/tensor.h"

namespace {

using namespace pipeflow;
using Clock = std::chrono::steady_clock;

constexpr int kIn = 512;
constexpr int kOut = 2048;
constexpr std::size_t kElements = std::size_t{kIn} * kOut;

struct Times {
  double median_ms = 0;
  double min_ms = 0;
};

template <class Pass>
Times time_passes(int passes, const Pass& pass) {
  std::vector<double> ms;
  for (int i = 0; i < passes; ++i) {
    const auto from = Clock::now();
    pass();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - from).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

void fill(float* values, std::size_t count, std::uint64_t seed) {
  nn::Rng rng(seed);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>(rng.normal() * 0.02);
}

void compare(int matrices, int passes) {
  std::vector<std::vector<float>> rows(static_cast<std::size_t>(matrices), std::vector<float>(kElements));
  std::vector<float*> small_pages;
  std::vector<Tensor> huge_pages;
  for (int l = 0; l < matrices; ++l) {
    auto& w = rows[static_cast<std::size_t>(l)];
    fill(w.data(), kElements, 1 + static_cast<std::uint64_t>(l));
    auto* plain = static_cast<float*>(std::aligned_alloc(64, kElements * sizeof(float)));
    std::memcpy(plain, w.data(), kElements * sizeof(float));
    pack_panels(plain, kIn, kOut);
    small_pages.push_back(plain);
    Tensor tensor = Tensor::uninitialized(Shape{kIn, kOut});
    std::memcpy(tensor.data(), plain, kElements * sizeof(float));
    huge_pages.push_back(std::move(tensor));
  }
  std::printf("%d matrices of %d x %d (%.0f MB)\n", matrices, kIn, kOut, matrices * kElements * 4 / 1e6);
  std::printf("  rows  sgemm ms (min)    panels, 4 KiB pages   panels, huge pages   sgemm / panels  4 KiB / huge\n");
  for (const int n : {4, 8, 16, 32, 256}) {
    std::vector<float> x(static_cast<std::size_t>(n) * kIn), y(static_cast<std::size_t>(n) * kOut);
    fill(x.data(), x.size(), 99);
    const Times sgemm = time_passes(passes, [&] {
      for (const auto& w : rows) {
        gemm<float>(Transpose::kNo, Transpose::kNo, n, kOut, kIn, 1.0f, x.data(), kIn, w.data(), kOut, 1.0f,
                    y.data(), kOut);
      }
    });
    const Times small = time_passes(passes, [&] {
      for (const float* w : small_pages) panels_multiply_add(y.data(), x.data(), w, n, kIn, kOut);
    });
    const Times huge = time_passes(passes, [&] {
      for (const Tensor& w : huge_pages) panels_multiply_add(y.data(), x.data(), w.data(), n, kIn, kOut);
    });
    std::printf("  %4d  %6.2f (%6.2f)    %6.2f (%6.2f)       %6.2f (%6.2f)      %5.2fx          %5.2fx\n", n,
                sgemm.median_ms, sgemm.min_ms, small.median_ms, small.min_ms, huge.median_ms, huge.min_ms,
                sgemm.median_ms / huge.median_ms, small.median_ms / huge.median_ms);
  }
  for (float* w : small_pages) std::free(w);
}

}  // namespace

int main(int argc, char** argv) {
  int passes = 9;
  pipeflow::bench::parse_flags(argc, argv, {{"--passes", &passes}});
  passes = std::max(1, passes);
  compare(12, passes);
  compare(4, passes);
  return 0;
}
