// The GEMM libraries this machine has, at pipeflow's shapes, in one run:
// OpenBLAS (cblas_sgemm, and sgemv at one row, as pipeflow called it before
// it moved to oneDNN), BLIS (bli_sgemm, loaded with dlopen: it exports the
// same cblas_* and sgemm_ symbols as OpenBLAS, which a link beside OpenBLAS
// would clash on), oneDNN's BLAS-like dnnl_sgemm as pipeflow::gemm calls it,
// oneDNN's matmul primitive in fp32, and the same matmul on bf16 operands
// with an fp32 result (the CPU's bf16 instructions where it has them,
// emulated with AVX-512 F where it has not).
//
// Shapes: a GPT-2 block's four GEMMs (qkv C×3C, proj C×C, fc C×4C, fc_proj
// 4C×C) in the three layouts training calls (tensor/linear.cc): forward
// Y = X·W (beta 1: the bias is already in Y), dX = dY·Wᵀ (beta 0) and
// dW = Xᵀ·dY (beta 1: accumulated across micro-batches), at make run's model
// (width 128, a micro-batch of 8 × 64 = 512 rows) and the larger bench model
// (width 384, 4 × 256 = 1024 rows); then decode's forward at 1, 8, 16 and 32
// rows for both widths. Each shape's FLOPs 2·M·N·K.
//
// Each round measures the core's AVX-512 (or AVX2) fp32 peak (core_peak.h)
// and then every shape with every library in turn, so that load from other
// processes falls on all of them; a measurement is the best rate, by the
// thread's CPU time, of repeated runs that each repeat the GEMM up to about
// 1e8 FLOPs (as calibrate times its GEMMs). One thread everywhere: OpenBLAS's
// and OpenMP's (oneDNN, BLIS) counts set by pipeflow::gemm's first call.
// The bf16 matmul's operands are converted before timing (a training step
// would convert, or keep, them).
//
// Prints per shape the min/median/max over rounds of each library's GFLOP/s,
// then per group (training at each width, decode at each row count) the
// FLOP-weighted rate (all the group's FLOPs over all its time, per round) as
// GFLOP/s, as a share of the round's peak and as a ratio to OpenBLAS's,
// min/median/max over rounds. A first pass checks each library's results
// against OpenBLAS's (relative max difference).
//
//   bench_gemm_libraries [--rounds R] [--ms-per-measurement T]   defaults 5, 15
#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "flags.h"
#include "pipeflow/tensor/core_peak.h"
#include "pipeflow/tensor/gemm.h"
#include "pipeflow/tensor/half.h"

extern "C" char* openblas_get_corename();

namespace {

using pipeflow::Transpose;

constexpr double kFlopsPerTimedRun = 1e8;

struct Shape {
  std::string group;   // "train C=128 M=512", "decode C=128 M=8"
  std::string name;    // "qkv fwd", ...
  Transpose ta, tb;
  int m, n, k, lda, ldb, ldc;
  float beta;
  double flops() const { return 2.0 * m * n * k; }
};

// The GPT-2 linear layer y[rows, out] = x[rows, in] · w[in, out] (tensor/linear.cc).
void add_linear(std::vector<Shape>& shapes, const std::string& group, const std::string& gemm, int rows, int in,
                int out, bool training) {
  shapes.push_back({group, gemm + " fwd", Transpose::kNo, Transpose::kNo, rows, out, in, in, out, out, 1.0f});
  if (!training) return;
  shapes.push_back({group, gemm + " dX", Transpose::kNo, Transpose::kYes, rows, in, out, out, out, in, 0.0f});
  shapes.push_back({group, gemm + " dW", Transpose::kYes, Transpose::kNo, in, out, rows, in, out, out, 1.0f});
}

void add_block(std::vector<Shape>& shapes, const std::string& group, int width, int rows, bool training) {
  add_linear(shapes, group, "qkv", rows, width, 3 * width, training);
  add_linear(shapes, group, "proj", rows, width, width, training);
  add_linear(shapes, group, "fc", rows, width, 4 * width, training);
  add_linear(shapes, group, "fc_proj", rows, 4 * width, width, training);
}

std::vector<Shape> pipeflow_shapes() {
  std::vector<Shape> shapes;
  add_block(shapes, "train C=128 M=512", 128, 512, true);
  add_block(shapes, "train C=384 M=1024", 384, 1024, true);
  for (const int width : {128, 384}) {
    for (const int rows : {1, 8, 16, 32}) {
      add_block(shapes, "decode C=" + std::to_string(width) + " M=" + std::to_string(rows), width, rows, false);
    }
  }
  return shapes;
}

// A shape's operands: op(A) is [m, k], op(B) is [k, n], stored as gemm.h says.
struct Operands {
  std::vector<float> a, b, c;
  std::vector<std::uint16_t> a_bf16, b_bf16;
  explicit Operands(const Shape& s) {
    const std::size_t a_rows = s.ta == Transpose::kNo ? s.m : s.k;
    const std::size_t b_rows = s.tb == Transpose::kNo ? s.k : s.n;
    a.resize(a_rows * s.lda);
    b.resize(b_rows * s.ldb);
    c.resize(static_cast<std::size_t>(s.m) * s.ldc);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7919) % 2001) / 1000.0f - 1.0f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 104729) % 1999) / 1000.0f - 1.0f;
    a_bf16.resize(a.size());
    b_bf16.resize(b.size());
    for (std::size_t i = 0; i < a.size(); ++i) a_bf16[i] = pipeflow::bf16_bits(a[i]);
    for (std::size_t i = 0; i < b.size(); ++i) b_bf16[i] = pipeflow::bf16_bits(b[i]);
  }
};

// OpenBLAS as pipeflow::gemm called it before oneDNN: one row of C as a gemv
// (c = op(B)ᵀ·op(A)ᵀ, reading B in place), more rows as cblas_sgemm.
void openblas_gemm(const Shape& s, Operands& o) {
  const auto cblas = [](Transpose t) { return t == Transpose::kYes ? CblasTrans : CblasNoTrans; };
  if (s.m == 1) {
    const int stride_a = s.ta == Transpose::kYes ? s.lda : 1;
    if (s.tb == Transpose::kYes) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, s.n, s.k, 1.0f, o.b.data(), s.ldb, o.a.data(), stride_a, s.beta,
                  o.c.data(), 1);
    } else {
      cblas_sgemv(CblasRowMajor, CblasTrans, s.k, s.n, 1.0f, o.b.data(), s.ldb, o.a.data(), stride_a, s.beta,
                  o.c.data(), 1);
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, cblas(s.ta), cblas(s.tb), s.m, s.n, s.k, 1.0f, o.a.data(), s.lda, o.b.data(), s.ldb,
              s.beta, o.c.data(), s.ldc);
}

// BLIS through dlopen, its typed API declared here from its blis.h (dim_t
// and inc_t are 64-bit, trans_t an enum whose 0 is BLIS_NO_TRANSPOSE):
// bli_sgemm takes row and column strides, so row-major is rows stride ld,
// columns stride 1, and a transpose swaps them.
using BlisDim = std::int64_t;
struct Blis {
  using Sgemm = void (*)(int transa, int transb, BlisDim m, BlisDim n, BlisDim k, float* alpha, float* a, BlisDim rsa,
                         BlisDim csa, float* b, BlisDim rsb, BlisDim csb, float* beta, float* c, BlisDim rsc,
                         BlisDim csc);
  static constexpr int kNoTranspose = 0;
  Sgemm sgemm = nullptr;
  std::string version, arch;
  Blis() {
    void* library = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      std::printf("BLIS: not loaded (%s): install libblis-dev for its column\n", dlerror());
      return;
    }
    sgemm = reinterpret_cast<Sgemm>(dlsym(library, "bli_sgemm"));
    const auto set_threads = reinterpret_cast<void (*)(BlisDim)>(dlsym(library, "bli_thread_set_num_threads"));
    const auto version_str = reinterpret_cast<char* (*)()>(dlsym(library, "bli_info_get_version_str"));
    const auto arch_id = reinterpret_cast<int (*)()>(dlsym(library, "bli_arch_query_id"));
    const auto arch_string = reinterpret_cast<char* (*)(int)>(dlsym(library, "bli_arch_string"));
    if (sgemm == nullptr || set_threads == nullptr || version_str == nullptr || arch_id == nullptr ||
        arch_string == nullptr) {
      std::printf("BLIS: libblis.so.4 lacks bli_sgemm or its helpers: no BLIS column\n");
      sgemm = nullptr;
      return;
    }
    set_threads(1);
    version = version_str();
    arch = arch_string(arch_id());
  }
  void run(const Shape& s, Operands& o) const {
    float alpha = 1.0f, beta = s.beta;
    const auto strides = [](Transpose t, int ld) {
      return t == Transpose::kNo ? std::pair<BlisDim, BlisDim>{ld, 1} : std::pair<BlisDim, BlisDim>{1, ld};
    };
    const auto [rsa, csa] = strides(s.ta, s.lda);
    const auto [rsb, csb] = strides(s.tb, s.ldb);
    sgemm(kNoTranspose, kNoTranspose, s.m, s.n, s.k, &alpha, o.a.data(), rsa, csa, o.b.data(), rsb, csb,
          &beta, o.c.data(), s.ldc, 1);
  }
};

// oneDNN's matmul primitive for one shape and operand type, created once:
// strided plain layouts say the transposes; beta 1 is a sum post-op.
struct Matmul {
  dnnl::matmul primitive;
  dnnl::memory::desc a_desc, b_desc, c_desc;
  dnnl::memory a_memory, b_memory, c_memory;
  std::string implementation;
  Matmul(const dnnl::engine& engine, const Shape& s, dnnl::memory::data_type operand_type, void* a, void* b,
         float* c) {
    using dims = dnnl::memory::dims;
    const auto strides = [](Transpose t, int ld) { return t == Transpose::kNo ? dims{ld, 1} : dims{1, ld}; };
    a_desc = dnnl::memory::desc({s.m, s.k}, operand_type, strides(s.ta, s.lda));
    b_desc = dnnl::memory::desc({s.k, s.n}, operand_type, strides(s.tb, s.ldb));
    c_desc = dnnl::memory::desc({s.m, s.n}, dnnl::memory::data_type::f32, dims{s.ldc, 1});
    dnnl::primitive_attr attr;
    if (s.beta != 0.0f) {
      dnnl::post_ops sum;
      sum.append_sum(s.beta);
      attr.set_post_ops(sum);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_desc, b_desc, c_desc), attr, engine);
    implementation = pd.impl_info_str();
    primitive = dnnl::matmul(pd);
    a_memory = dnnl::memory(a_desc, engine, a);
    b_memory = dnnl::memory(b_desc, engine, b);
    c_memory = dnnl::memory(c_desc, engine, c);
  }
  void run(dnnl::stream& stream) const {
    primitive.execute(stream, {{DNNL_ARG_SRC, a_memory}, {DNNL_ARG_WEIGHTS, b_memory}, {DNNL_ARG_DST, c_memory}});
    stream.wait();
  }
};

struct Library {
  std::string name;
  std::function<void(const Shape&, Operands&, std::size_t shape_index)> run;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::string min_median_max(const std::vector<double>& values, const char* format) {
  char out[128];
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  const std::string f = std::string(format) + "/" + format + "/" + format;
  std::snprintf(out, sizeof out, f.c_str(), *lo, median(values), *hi);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5, ms_per_measurement = 15;
  pipeflow::bench::parse_flags(argc, argv, {{"--rounds", &rounds}, {"--ms-per-measurement", &ms_per_measurement}});
  if (rounds < 1 || ms_per_measurement < 1) {
    std::fprintf(stderr, "--rounds and --ms-per-measurement must be at least 1\n");
    return 2;
  }
  const std::vector<Shape> shapes = pipeflow_shapes();
  float one = 1.0f, product = 0.0f;  // a first pipeflow::gemm sets this thread's GEMM threads to 1
  pipeflow::gemm<float>(Transpose::kNo, Transpose::kNo, 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &product, 1);

  const Blis blis;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::vector<Operands> operands;
  for (const Shape& s : shapes) operands.emplace_back(s);
  std::vector<std::unique_ptr<Matmul>> matmul_f32, matmul_bf16;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    Operands& o = operands[i];
    matmul_f32.push_back(
        std::make_unique<Matmul>(engine, shapes[i], dnnl::memory::data_type::f32, o.a.data(), o.b.data(), o.c.data()));
  }
  try {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      Operands& o = operands[i];
      matmul_bf16.push_back(std::make_unique<Matmul>(engine, shapes[i], dnnl::memory::data_type::bf16,
                                                     o.a_bf16.data(), o.b_bf16.data(), o.c.data()));
    }
  } catch (const dnnl::error& e) {  // oneDNN 2.6 has bf16 matmul from AVX-512 (core) up only
    std::printf("oneDNN bf16 matmul: none on this CPU (%s): no dnnl_bf16 column\n", e.what());
    matmul_bf16.clear();
  }
  const dnnl_version_t* version = dnnl_version();
  static const std::map<dnnl_cpu_isa_t, const char*> kIsaNames = {
      {dnnl_cpu_isa_avx2, "avx2"},
      {dnnl_cpu_isa_avx512_core, "avx512_core"},
      {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
      {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
      {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"}};
  const auto isa = kIsaNames.find(dnnl_get_effective_cpu_isa());
  std::printf("OpenBLAS core %s; BLIS %s (%s); oneDNN %d.%d.%d (ISA %s); GEMM threads %d\n",
              openblas_get_corename(), blis.sgemm ? blis.version.c_str() : "-", blis.sgemm ? blis.arch.c_str() : "-",
              version->major, version->minor, version->patch, isa == kIsaNames.end() ? "other" : isa->second,
              pipeflow::blas_threads());

  std::vector<Library> libraries;
  libraries.push_back({"openblas", [](const Shape& s, Operands& o, std::size_t) { openblas_gemm(s, o); }});
  if (blis.sgemm != nullptr) {
    libraries.push_back({"blis", [&](const Shape& s, Operands& o, std::size_t) { blis.run(s, o); }});
  }
  libraries.push_back({"dnnl_sgemm", [](const Shape& s, Operands& o, std::size_t) {
                         pipeflow::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a.data(), s.lda, o.b.data(), s.ldb,
                                               s.beta, o.c.data(), s.ldc);
                       }});
  libraries.push_back({"dnnl_matmul", [&](const Shape&, Operands&, std::size_t i) {
                         matmul_f32[i]->run(stream);
                       }});
  if (!matmul_bf16.empty()) {
    libraries.push_back({"dnnl_bf16", [&](const Shape&, Operands&, std::size_t i) { matmul_bf16[i]->run(stream); }});
  }

  // Correctness: each library's C (from zero, so beta does not compound)
  // against OpenBLAS's, as max |difference| / max |OpenBLAS's|.
  std::printf("\nresults against OpenBLAS's (max |difference| / max |value| over all shapes):");
  std::vector<std::vector<float>> reference(shapes.size());
  for (std::size_t l = 0; l < libraries.size(); ++l) {
    double worst = 0;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      std::fill(operands[i].c.begin(), operands[i].c.end(), 0.0f);
      libraries[l].run(shapes[i], operands[i], i);
      if (l == 0) {
        reference[i] = operands[i].c;
        continue;
      }
      double diff = 0, scale = 0;
      for (std::size_t e = 0; e < reference[i].size(); ++e) {
        diff = std::max(diff, std::abs(static_cast<double>(operands[i].c[e]) - reference[i][e]));
        scale = std::max(scale, std::abs(static_cast<double>(reference[i][e])));
      }
      worst = std::max(worst, diff / scale);
    }
    if (l > 0) std::printf(" %s %.1e;", libraries[l].name.c_str(), worst);
  }
  std::printf("\n");
  std::printf("first matmul implementations (oneDNN's choice): f32 %s, bf16 %s\n",
              matmul_f32.front()->implementation.c_str(),
              matmul_bf16.empty() ? "-" : matmul_bf16.front()->implementation.c_str());

  // rate[library][shape][round], peak[round]
  std::vector<std::vector<std::vector<double>>> rate(
      libraries.size(), std::vector<std::vector<double>>(shapes.size(), std::vector<double>(rounds)));
  std::vector<double> peak(rounds), bf16_peak(rounds, 0.0);
  std::string peak_isa;
  const double seconds = ms_per_measurement / 1000.0;
  for (int r = 0; r < rounds; ++r) {
    const std::vector<pipeflow::CorePeak> peaks = pipeflow::measure_core_peaks(pipeflow::detect_cpu_features(), 0.3);
    const pipeflow::CorePeak* best = pipeflow::best_fp32_peak_entry(peaks);
    if (best == nullptr) {
      std::printf("no fp32 peak kernel runs on this CPU (neither AVX2+FMA nor AVX-512)\n");
      return 1;
    }
    peak[r] = best->flop_per_s;
    peak_isa = best->isa;
    for (const pipeflow::CorePeak& p : peaks) {
      if (p.precision == "bf16") bf16_peak[r] = p.flop_per_s;
    }
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const int repeats = static_cast<int>(std::ceil(kFlopsPerTimedRun / shapes[i].flops()));
      for (std::size_t l = 0; l < libraries.size(); ++l) {
        rate[l][i][r] = pipeflow::best_cpu_rate(seconds, [&] {
          for (int k = 0; k < repeats; ++k) libraries[l].run(shapes[i], operands[i], i);
          return shapes[i].flops() * repeats;
        });
      }
    }
    std::fprintf(stderr, "round %d of %d done\n", r + 1, rounds);
  }

  std::printf("\ncore fp32 peak (%s), GFLOP/s over %d rounds, min/median/max: %s\n", peak_isa.c_str(), rounds,
              min_median_max([&] {
                std::vector<double> g;
                for (double p : peak) g.push_back(p / 1e9);
                return g;
              }(), "%.1f").c_str());
  if (bf16_peak[0] > 0) {
    std::vector<double> g;
    for (double p : bf16_peak) g.push_back(p / 1e9);
    std::printf("core bf16 peak (avx512_bf16), GFLOP/s, min/median/max: %s\n", min_median_max(g, "%.1f").c_str());
  }
  std::printf("\nper shape, GFLOP/s min/median/max over rounds:\n%-20s %-14s %5s %5s %5s", "group", "gemm", "M", "N",
              "K");
  for (const Library& library : libraries) std::printf("  %-17s", library.name.c_str());
  std::printf("\n");
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    std::printf("%-20s %-14s %5d %5d %5d", s.group.c_str(), s.name.c_str(), s.m, s.n, s.k);
    for (std::size_t l = 0; l < libraries.size(); ++l) {
      std::vector<double> g;
      for (double v : rate[l][i]) g.push_back(v / 1e9);
      std::printf("  %-17s", min_median_max(g, "%.1f").c_str());
    }
    std::printf("\n");
  }

  // Per group: all its FLOPs over all its time, per round.
  std::vector<std::string> groups;
  for (const Shape& s : shapes) {
    if (std::find(groups.begin(), groups.end(), s.group) == groups.end()) groups.push_back(s.group);
  }
  std::printf("\nper group (FLOP-weighted), min/median/max over rounds: GFLOP/s | share of the round's fp32 peak | "
              "ratio to OpenBLAS [| dnnl_bf16: share of the round's bf16 peak]\n");
  for (const std::string& group : groups) {
    std::vector<std::vector<double>> group_rate(libraries.size(), std::vector<double>(rounds));
    for (std::size_t l = 0; l < libraries.size(); ++l) {
      for (int r = 0; r < rounds; ++r) {
        double flops = 0, time = 0;
        for (std::size_t i = 0; i < shapes.size(); ++i) {
          if (shapes[i].group != group) continue;
          flops += shapes[i].flops();
          time += shapes[i].flops() / rate[l][i][r];
        }
        group_rate[l][r] = flops / time;
      }
    }
    for (std::size_t l = 0; l < libraries.size(); ++l) {
      std::vector<double> g, share, ratio, bf16_share;
      for (int r = 0; r < rounds; ++r) {
        g.push_back(group_rate[l][r] / 1e9);
        share.push_back(100 * group_rate[l][r] / peak[r]);
        ratio.push_back(group_rate[l][r] / group_rate[0][r]);
        bf16_share.push_back(100 * group_rate[l][r] / bf16_peak[r]);
      }
      const bool bf16 = libraries[l].name == "dnnl_bf16" && bf16_peak[0] > 0;
      std::printf("%-20s %-12s %18s GFLOP/s | %15s%% | %s%s%s\n", group.c_str(), libraries[l].name.c_str(),
                  min_median_max(g, "%.1f").c_str(), min_median_max(share, "%.0f").c_str(),
                  min_median_max(ratio, "%.2f").c_str(), bf16 ? " | " : "",
                  bf16 ? (min_median_max(bf16_share, "%.0f") + "%").c_str() : "");
    }
  }
  return 0;
}
