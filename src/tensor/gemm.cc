#include "pipeflow/tensor/gemm.h"

#include <cblas.h>
#include <malloc.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "pipeflow/core/error.h"
#include "pipeflow/core/sanitizers.h"
#include "pipeflow/tensor/half.h"

// oneDNN runs its GEMMs on OpenMP here (Debian's build: GNU OpenMP). Declared
// rather than taken from <omp.h>, which clang does not find in GCC's
// directory; the build links libgomp itself.
#if DNNL_CPU_RUNTIME != DNNL_RUNTIME_OMP
#error "pipeflow sets oneDNN's threads through OpenMP: this oneDNN is built for another runtime"
#endif
extern "C" void omp_set_num_threads(int threads);
extern "C" int omp_get_max_threads();

namespace pipeflow {
namespace {

CBLAS_TRANSPOSE to_cblas(Transpose transpose) { return transpose == Transpose::kYes ? CblasTrans : CblasNoTrans; }
char to_dnnl(Transpose transpose) { return transpose == Transpose::kYes ? 'T' : 'N'; }

// oneDNN's sgemm takes its packing buffers from malloc on every call (a
// 74 KB block, at times also one of 230-560 KB, at the bench models'
// shapes: ~1,700-3,300 calls a step on a pipeline rank). glibc serves them
// from the calling thread's arena, and the first steps left its free space
// cut up differently from the steady state: the arena of a small 2-stage
// run's rank 0 grew 2 MiB over steps 1 to 3, into pages never touched (the
// process's page faults: 104 in step 1, 14 in steps 2 and 3; 1.1 ms of rank
// 0's step 1 on this VM). So glibc keeps freed memory (M_TRIM_THRESHOLD) and
// serves blocks below 32 MiB, its own dynamic ceiling, from the arenas
// (M_MMAP_THRESHOLD: setting either option ends the dynamic thresholds),
// unless the user has set glibc's malloc options; and each thread's first
// GEMM touches kWarmHeapBytes of its arena and frees them, for the churn of
// every later step to reuse without a fault: 8 MiB, four times the growth
// measured, at most 2,048 faults once a thread. (The buffer pools map their
// large blocks apart, buffer_pool.cc, so that the first step does not take
// this memory for good.)
constexpr std::size_t kWarmHeapBytes = std::size_t{8} << 20;

#if defined(__GLIBC__)
bool user_set_malloc_options() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::string_view(tunables).find("glibc.malloc.") != std::string_view::npos) return true;
  for (const char* name : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}
#endif

void warm_thread_heap() {
  // (The sanitizers' allocators are their own, and their memset of 8 MiB
  // took a ThreadSanitizer rank's first step past a test's 300 ms timeout.)
  if constexpr (kAddressSanitizer || kThreadSanitizer) return;
#if defined(__GLIBC__)
  static std::once_flag keep_freed_memory;
  std::call_once(keep_freed_memory, [] {
    if (user_set_malloc_options()) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  });
#endif
  void* block = std::malloc(kWarmHeapBytes);
  if (block == nullptr) return;  // nothing to warm; the GEMMs fault their pages in as before
  // (Not zeros: GCC turns malloc and a zeroing memset into calloc, which
  // skips fresh pages; and the address escapes, or it drops all three.)
  std::memset(block, 1, kWarmHeapBytes);
  asm volatile("" : : "r"(block) : "memory");
  std::free(block);
}

// OpenBLAS's thread count is process-wide, OpenMP's (oneDNN's) is each
// thread's own: the first call of a thread sets both to 1 for it, and warms
// its heap.
void use_one_gemm_thread() {
  static const bool kOpenblasSet = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)kOpenblasSet;
  thread_local const bool kThreadSet = [] {
    omp_set_num_threads(1);
    warm_thread_heap();
    return true;
  }();
  (void)kThreadSet;
}

thread_local GemmPrecision t_precision = GemmPrecision::kFp32;
thread_local GemmCallTimes* t_call_times = nullptr;

// Times one gemm / gemm_bias / gemm_batched call for this thread's GemmCallTimes, if
// any; while it runs, the GEMMs it calls in turn are its own (not recorded).
class CallTimer {
 public:
  explicit CallTimer(const GemmCallShape& shape) : times_(t_call_times), shape_(shape) {
    if (times_ == nullptr) return;
    t_call_times = nullptr;
    start_ = std::chrono::steady_clock::now();
  }
  ~CallTimer() {
    if (times_ == nullptr) return;
    times_->add(shape_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    t_call_times = times_;
  }
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;

 private:
  GemmCallTimes* times_;
  GemmCallShape shape_;
  std::chrono::steady_clock::time_point start_;
};

// Ranges of floats that stand for bf16 bits (Bf16Operands), each with the
// object that added it.
struct Bf16Range {
  std::uintptr_t begin, end;  // the stand-in floats' bytes
  const std::uint16_t* bits;
  const Bf16Operands* owner;
};
thread_local std::vector<Bf16Range> t_bf16_ranges;

// One bf16 matmul: a grid of count[0] x count[1] x count[2] products (1s
// where there is no grid), op(A) [m, k] and op(B) [k, n] bf16 with row
// strides lda and ldb as stored (the transposes as strides) and their
// matrices a_stride / b_stride apart along the grid (0: one matrix for the
// whole dimension), C fp32 with row stride ldc, c_stride apart; alpha an
// output scale, beta a sum post-op; with `bias`, an fp32 row of n added to
// every product's every row.
struct MatmulShape {
  int m, n, k, lda, ldb, ldc;
  bool transpose_a, transpose_b, bias;
  float alpha, beta;
  std::array<int, 3> count;
  std::array<long, 3> a_stride, b_stride, c_stride;
  bool operator==(const MatmulShape&) const = default;
};

struct MatmulShapeHash {
  std::size_t operator()(const MatmulShape& s) const {
    std::size_t h = 0;
    const auto mix = [&h](std::size_t v) { h = h * 1000003u ^ v; };
    for (const int v : {s.m, s.n, s.k, s.lda, s.ldb, s.ldc}) mix(static_cast<std::size_t>(v));
    mix(static_cast<std::size_t>(s.transpose_a) * 4 + static_cast<std::size_t>(s.transpose_b) * 2 +
        static_cast<std::size_t>(s.bias));
    mix(std::hash<float>()(s.alpha));
    mix(std::hash<float>()(s.beta));
    for (int i = 0; i < 3; ++i) {
      mix(static_cast<std::size_t>(s.count[i]));
      mix(static_cast<std::size_t>(s.a_stride[i]));
      mix(static_cast<std::size_t>(s.b_stride[i]));
      mix(static_cast<std::size_t>(s.c_stride[i]));
    }
    return h;
  }
};

struct Bf16Matmul {
  dnnl::matmul primitive;
  dnnl::memory a, b, c, bias;
};

// A thread's engine, stream, primitives by shape and operand buffers.
struct Bf16Matmuls {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<MatmulShape, Bf16Matmul, MatmulShapeHash> by_shape;
  std::vector<std::uint16_t> a_bits, b_bits;

  Bf16Matmul& get(const MatmulShape& s) {
    const auto found = by_shape.find(s);
    if (found != by_shape.end()) return found->second;
    using dims = dnnl::memory::dims;
    using dt = dnnl::memory::data_type;
    // The grid's dimensions of more than one product lead; an operand
    // repeated along one has extent 1 there (oneDNN broadcasts it), with a
    // stride of 1: a stride of 0 sends oneDNN 2.6 to its reference matmul,
    // two orders of magnitude slower.
    const auto operand = [&s](int rows, int columns, bool transposed, int ld, const std::array<long, 3>& stride,
                              dt type) {
      dims extents, strides;
      for (int i = 0; i < 3; ++i) {
        if (s.count[i] == 1) continue;
        extents.push_back(stride[i] == 0 ? 1 : s.count[i]);
        strides.push_back(stride[i] == 0 ? 1 : stride[i]);
      }
      extents.insert(extents.end(), {rows, columns});
      strides.insert(strides.end(), {transposed ? 1 : ld, transposed ? ld : 1});
      return dnnl::memory::desc(extents, type, strides);
    };
    const dnnl::memory::desc a_desc = operand(s.m, s.k, s.transpose_a, s.lda, s.a_stride, dt::bf16);
    const dnnl::memory::desc b_desc = operand(s.k, s.n, s.transpose_b, s.ldb, s.b_stride, dt::bf16);
    const dnnl::memory::desc c_desc = operand(s.m, s.n, false, s.ldc, s.c_stride, dt::f32);
    dnnl::primitive_attr attr;
    if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});
    if (s.beta != 0.0f) {
      dnnl::post_ops sum;
      sum.append_sum(s.beta);
      attr.set_post_ops(sum);
    }
    const std::array<long, 3> no_grid{};
    const dnnl::memory::desc bias_desc =
        s.bias ? operand(1, s.n, false, s.n, no_grid, dt::f32) : dnnl::memory::desc();
    const dnnl::matmul::primitive_desc pd(
        s.bias ? dnnl::matmul::desc(a_desc, b_desc, bias_desc, c_desc) : dnnl::matmul::desc(a_desc, b_desc, c_desc),
        attr, engine);
    Bf16Matmul made{dnnl::matmul(pd), dnnl::memory(a_desc, engine, nullptr), dnnl::memory(b_desc, engine, nullptr),
                    dnnl::memory(c_desc, engine, nullptr),
                    s.bias ? dnnl::memory(bias_desc, engine, nullptr) : dnnl::memory()};
    return by_shape.emplace(s, std::move(made)).first->second;
  }
};

// A product's place in a grid, and an operand's offset there (elements).
using GridIndex = std::array<long, 3>;
long offset(const GridIndex& at, const std::array<long, 3>& stride) {
  return at[0] * stride[0] + at[1] * stride[1] + at[2] * stride[2];
}

// Calls f(at) for each product of a grid of `count`, the last dimension
// fastest.
template <class F>
void for_each_product(const std::array<int, 3>& count, F&& f) {
  for (long i = 0; i < count[0]; ++i) {
    for (long j = 0; j < count[1]; ++j) {
      for (long l = 0; l < count[2]; ++l) f(GridIndex{i, j, l});
    }
  }
}

// An operand as the matmul reads it: bf16 bits at row stride ld, its
// matrices `stride` apart along the grid.
struct Bf16Source {
  const std::uint16_t* bits;
  int ld;
  std::array<long, 3> stride;
};

// The grid's rows x columns float matrices at x (row stride ld, `stride`
// apart, 0 for one matrix along a dimension) in bf16: the bits they stand
// for where one Bf16Operands range holds them all, else rounded into
// `scratch`, dense.
Bf16Source bf16_source(const float* x, int rows, int columns, int ld, const std::array<int, 3>& count,
                       const std::array<long, 3>& stride, std::vector<std::uint16_t>& scratch) {
  long span = static_cast<long>(rows - 1) * ld + columns;
  for (int i = 0; i < 3; ++i) span += static_cast<long>(count[i] - 1) * stride[i];
  const auto first = reinterpret_cast<std::uintptr_t>(x);
  const auto last = reinterpret_cast<std::uintptr_t>(x + span);
  for (const Bf16Range& range : t_bf16_ranges) {
    if (first >= range.begin && last <= range.end) {
      return {range.bits + (first - range.begin) / sizeof(float), ld, stride};
    }
    // Partly inside: the floats there were never written.
    if (first < range.end && last > range.begin) {
      fail("internal: a bf16 GEMM operand ({} x {} at row stride {}, a grid of {} x {} x {} strided {}, {}, {}: {} "
           "floats from first to last) lies partly in a Bf16Operands range: add the whole tensor it belongs to as "
           "one range",
           rows, columns, ld, count[0], count[1], count[2], stride[0], stride[1], stride[2], span);
    }
  }
  // Dense, last dimension fastest; a repeated matrix is rounded once.
  std::array<long, 3> dense{};
  std::array<int, 3> extent{};
  long size = static_cast<long>(rows) * columns;
  for (int i = 2; i >= 0; --i) {
    extent[i] = stride[i] == 0 ? 1 : count[i];
    dense[i] = stride[i] == 0 ? 0 : size;
    size *= extent[i];
  }
  scratch.resize(static_cast<std::size_t>(size));
  std::uint16_t* out = scratch.data();
  for_each_product(extent, [&](const GridIndex& at) {
    const float* matrix = x + offset(at, stride);
    for (int row = 0; row < rows; ++row, out += columns) {
      to_half_bits(ComputeFormat::kBf16, matrix + static_cast<long>(row) * ld, out, columns);
    }
  });
  return {scratch.data(), columns, dense};
}

// An operand's strides as a matmul's key holds them: none along a dimension
// of one product, which the matmul leaves out (one primitive for every such
// call).
std::array<long, 3> grid_strides(const GemmBatch& batch, const std::array<long, 3>& stride) {
  std::array<long, 3> kept{};
  for (int i = 0; i < 3; ++i) kept[i] = batch.count[i] == 1 ? 0 : stride[i];
  return kept;
}

void bf16_gemm(const GemmBatch& batch, Transpose transpose_a, Transpose transpose_b, int m, int n, int k, float alpha,
               const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc,
               const float* bias = nullptr) {
  thread_local Bf16Matmuls matmuls;
  const bool ta = transpose_a == Transpose::kYes;
  const bool tb = transpose_b == Transpose::kYes;
  // As stored: A is [m, k] (or [k, m] transposed), B [k, n] (or [n, k]).
  const Bf16Source a_bf16 = bf16_source(a, ta ? k : m, ta ? m : k, lda, batch.count, batch.a_stride, matmuls.a_bits);
  const Bf16Source b_bf16 = bf16_source(b, tb ? n : k, tb ? k : n, ldb, batch.count, batch.b_stride, matmuls.b_bits);
  try {
    Bf16Matmul& matmul = matmuls.get({m,
                                      n,
                                      k,
                                      a_bf16.ld,
                                      b_bf16.ld,
                                      ldc,
                                      ta,
                                      tb,
                                      bias != nullptr,
                                      alpha,
                                      beta,
                                      batch.count,
                                      grid_strides(batch, a_bf16.stride),
                                      grid_strides(batch, b_bf16.stride),
                                      grid_strides(batch, batch.c_stride)});
    // (oneDNN takes a mutable handle; the matmul only reads its sources)
    matmul.a.set_data_handle(const_cast<std::uint16_t*>(a_bf16.bits));
    matmul.b.set_data_handle(const_cast<std::uint16_t*>(b_bf16.bits));
    matmul.c.set_data_handle(c);
    std::unordered_map<int, dnnl::memory> arguments{
        {DNNL_ARG_SRC, matmul.a}, {DNNL_ARG_WEIGHTS, matmul.b}, {DNNL_ARG_DST, matmul.c}};
    if (bias != nullptr) {
      matmul.bias.set_data_handle(const_cast<float*>(bias));
      arguments.emplace(DNNL_ARG_BIAS, matmul.bias);
    }
    matmul.primitive.execute(matmuls.stream, arguments);
    matmuls.stream.wait();
  } catch (const dnnl::error& e) {
    fail("gemm: oneDNN's bf16 matmul failed ({}) for m {}, n {}, k {}, ldc {}, a grid of {} x {} x {}: {}", e.what(),
         m, n, k, ldc, batch.count[0], batch.count[1], batch.count[2],
         bf16_matmul_available() ? "oneDNN refused this layout (internal: report it with these figures)"
                                 : "this CPU or oneDNN has no bf16 matmul; set PIPEFLOW_BF16_GEMM=fp32");
  }
}

void check_batch(const GemmBatch& batch) {
  for (int i = 0; i < 3; ++i) {
    if (batch.count[i] < 1 || batch.a_stride[i] < 0 || batch.b_stride[i] < 0 || batch.c_stride[i] < 0 ||
        (batch.count[i] > 1 && batch.c_stride[i] == 0)) {
      fail("internal: gemm_batched's dimension {} has {} products and strides A {}, B {}, C {}: counts at least 1, "
           "strides not negative, C's apart",
           i, batch.count[i], batch.a_stride[i], batch.b_stride[i], batch.c_stride[i]);
    }
  }
}

}  // namespace

GemmCallTimes::GemmCallTimes() : previous_(t_call_times) { t_call_times = this; }
GemmCallTimes::~GemmCallTimes() { t_call_times = previous_; }

void GemmCallTimes::add(const GemmCallShape& shape, double seconds) {
  auto entry = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.shape == shape; });
  if (entry == entries_.end()) entry = entries_.insert(entries_.end(), Entry{shape});
  ++entry->calls;
  entry->seconds += seconds;
}

std::vector<GemmCallTimes::Entry> GemmCallTimes::by_time() const {
  std::vector<Entry> sorted = entries_;
  std::stable_sort(sorted.begin(), sorted.end(), [](const Entry& a, const Entry& b) { return a.seconds > b.seconds; });
  return sorted;
}

GemmPrecisionScope::GemmPrecisionScope(GemmPrecision precision) : previous_(t_precision) { t_precision = precision; }
GemmPrecisionScope::~GemmPrecisionScope() { t_precision = previous_; }

GemmPrecision current_gemm_precision() { return t_precision; }

Bf16Operands::~Bf16Operands() {
  std::erase_if(t_bf16_ranges, [this](const Bf16Range& range) { return range.owner == this; });
}

Bf16Operands::Bf16Operands(Bf16Operands&& other) noexcept {
  for (Bf16Range& range : t_bf16_ranges) {
    if (range.owner == &other) range.owner = this;
  }
}

Bf16Operands& Bf16Operands::operator=(Bf16Operands&& other) noexcept {
  if (this == &other) return *this;
  std::erase_if(t_bf16_ranges, [this](const Bf16Range& range) { return range.owner == this; });
  for (Bf16Range& range : t_bf16_ranges) {
    if (range.owner == &other) range.owner = this;
  }
  return *this;
}

void Bf16Operands::add(const float* stand_in, std::span<const std::uint16_t> bits) {
  const auto begin = reinterpret_cast<std::uintptr_t>(stand_in);
  const std::uintptr_t end = begin + bits.size() * sizeof(float);
  for (const Bf16Range& range : t_bf16_ranges) {
    // Floats standing for two sets of bits at once: one range outlived the
    // floats it was added for, which a new tensor now holds.
    if (begin < range.end && end > range.begin) {
      fail("internal: a Bf16Operands range of {} floats overlaps one still registered: a range must end before "
           "its floats are freed",
           bits.size());
    }
  }
  t_bf16_ranges.push_back({begin, end, bits.data(), this});
}

void round_for_gemms(const float* x, int rows, int columns, int ld, Bf16Scratch& scratch, Bf16Operands& operands) {
  if (t_precision != GemmPrecision::kBf16 || rows <= 0 || columns <= 0) return;
  const std::size_t size =
      static_cast<std::size_t>(rows - 1) * static_cast<std::size_t>(ld) + static_cast<std::size_t>(columns);
  if (scratch.capacity < size) {
    scratch.bits = std::make_unique_for_overwrite<std::uint16_t[]>(size);
    scratch.capacity = size;
  }
  std::uint16_t* bits = scratch.bits.get();
  for (int row = 0; row < rows; ++row) {
    const long offset = static_cast<long>(row) * ld;
    to_half_bits(ComputeFormat::kBf16, x + offset, bits + offset, columns);
  }
  operands.add(x, {bits, size});
}

bool bf16_matmul_available() {
  static const bool available = [] {
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      using dt = dnnl::memory::data_type;
      using tag = dnnl::memory::format_tag;
      const dnnl::memory::desc bf16({1, 1}, dt::bf16, tag::ab);
      const dnnl::memory::desc f32({1, 1}, dt::f32, tag::ab);
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(bf16, bf16, f32), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

bool native_bf16_gemm() {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  return (isa & bf16) == bf16;  // AMX's ISA includes AVX-512 BF16's bits
}

namespace {

GemmPrecision bf16_where_available(std::string_view asked_by) {
  if (!bf16_matmul_available()) {
    fail("{}: oneDNN has no bf16 matmul on this CPU (it needs AVX-512): multiply in fp32 (PIPEFLOW_BF16_GEMM=fp32, "
         "or unset it to let the CPU decide)",
         asked_by);
  }
  return GemmPrecision::kBf16;
}

}  // namespace

GemmPrecision resolve(Bf16Gemm choice) {
  switch (choice) {
    case Bf16Gemm::kFp32: return GemmPrecision::kFp32;
    case Bf16Gemm::kBf16: return bf16_where_available("bf16 GEMMs asked for");
    case Bf16Gemm::kAuto: break;
  }
  if (const char* set = std::getenv("PIPEFLOW_BF16_GEMM")) {
    const std::string_view value = set;
    if (value == "fp32") return GemmPrecision::kFp32;
    if (value == "bf16") return bf16_where_available("PIPEFLOW_BF16_GEMM = 'bf16'");
    fail("PIPEFLOW_BF16_GEMM = '{}': must be fp32 or bf16 (how a bf16 run multiplies): unset it to let the CPU "
         "decide",
         value);
  }
  return native_bf16_gemm() ? GemmPrecision::kBf16 : GemmPrecision::kFp32;
}

const char* to_string(GemmPrecision precision) { return precision == GemmPrecision::kBf16 ? "bf16" : "fp32"; }

template <>
void gemm<float>(Transpose transpose_a, Transpose transpose_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  const CallTimer timer({m, n, k, transpose_a == Transpose::kYes, transpose_b == Transpose::kYes});
  use_one_gemm_thread();
  if (t_precision == GemmPrecision::kBf16 && m > 0 && n > 0 && k > 0) {
    bf16_gemm(GemmBatch{}, transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const dnnl_status_t status = dnnl_sgemm(to_dnnl(transpose_a), to_dnnl(transpose_b), m, n, k, alpha, a, lda, b, ldb,
                                          beta, c, ldc);
  if (status != dnnl_success) {
    fail("gemm: dnnl_sgemm returned status {} for m {}, n {}, k {}, lda {}, ldb {}, ldc {}: the sizes must be "
         "non-negative and each leading dimension at least its matrix's row length",
         static_cast<int>(status), m, n, k, lda, ldb, ldc);
  }
}

void gemm_bias(int m, int n, int k, const float* a, int lda, const float* b, int ldb, const float* bias, float* c,
               int ldc) {
  if (t_precision == GemmPrecision::kBf16 && m > 0 && n > 0 && k > 0) {
    const CallTimer timer({m, n, k, false, false});
    use_one_gemm_thread();
    bf16_gemm(GemmBatch{}, Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc, bias);
    return;
  }
  for (int row = 0; row < m; ++row) std::memcpy(c + static_cast<long>(row) * ldc, bias, sizeof(float) * n);
  gemm<float>(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc);
}

template <>
void gemm<double>(Transpose transpose_a, Transpose transpose_b, int m, int n, int k, double alpha, const double* a,
                  int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  const CallTimer timer({m, n, k, transpose_a == Transpose::kYes, transpose_b == Transpose::kYes});
  use_one_gemm_thread();
  cblas_dgemm(CblasRowMajor, to_cblas(transpose_a), to_cblas(transpose_b), m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

template <class T>
void gemm_batched(const GemmBatch& batch, Transpose transpose_a, Transpose transpose_b, int m, int n, int k, T alpha,
                  const T* a, int lda, const T* b, int ldb, T beta, T* c, int ldc) {
  check_batch(batch);
  const CallTimer timer({m, n, k, transpose_a == Transpose::kYes, transpose_b == Transpose::kYes,
                         batch.count[0] * batch.count[1] * batch.count[2]});
  if constexpr (std::is_same_v<T, float>) {
    if (t_precision == GemmPrecision::kBf16 && m > 0 && n > 0 && k > 0) {
      use_one_gemm_thread();
      bf16_gemm(batch, transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
  }
  for_each_product(batch.count, [&](const GridIndex& at) {
    gemm<T>(transpose_a, transpose_b, m, n, k, alpha, a + offset(at, batch.a_stride), lda,
            b + offset(at, batch.b_stride), ldb, beta, c + offset(at, batch.c_stride), ldc);
  });
}

template void gemm_batched<float>(const GemmBatch&, Transpose, Transpose, int, int, int, float, const float*, int,
                                  const float*, int, float, float*, int);
template void gemm_batched<double>(const GemmBatch&, Transpose, Transpose, int, int, int, double, const double*, int,
                                   const double*, int, double, double*, int);

int blas_threads() { return std::max(openblas_get_num_threads(), omp_get_max_threads()); }

}  // namespace pipeflow
