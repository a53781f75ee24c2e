#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace pipeflow {

enum class Transpose { kNo, kYes };

// C[m, n] = alpha · op(A) · op(B) + beta · C, row-major, with leading
// dimensions lda, ldb, ldc (row strides in elements). op(A) is [m, k], op(B)
// is [k, n]. Strided leading dimensions let a kernel multiply one attention
// head inside a [B, T, 3C] tensor without copying it out.
//
// float goes through oneDNN's dnnl_sgemm, double through OpenBLAS's
// cblas_dgemm (oneDNN has no double GEMM; pipeflow's float64 runs are the
// tests' references). oneDNN picks its kernels by CPUID at run time (AVX2,
// AVX-512, ...), never by the build machine. At pipeflow's shapes it ran
// 1.8-2.0x OpenBLAS's sgemm at training micro-batches and 2.4-3.9x at decode
// groups of 8-32 rows (bench/gemm_libraries.sh, docs/PERFORMANCE.md). Its
// results depend only on the operands and the shape: the same call gives the
// same bits.
//
// Threading: pipeflow runs each GEMM on the calling thread; parallelism
// comes from pipeline workers, one per core. A thread's first gemm call sets
// its OpenMP thread count (oneDNN's) and OpenBLAS's process-wide count to 1.
// Calls from different threads on different data may run concurrently.
template <class T>
void gemm(Transpose transpose_a, Transpose transpose_b, int m, int n, int k, T alpha, const T* a, int lda,
          const T* b, int ldb, T beta, T* c, int ldc);

// C[m, n] = A[m, k] · B[k, n] + bias[n] on every row (neither transposed; C
// overwritten). Under kBf16 one oneDNN matmul that adds the bias itself (the
// same to float rounding as the bias written first and the product added
// onto it; the same bits seen on AMD Zen 5); otherwise C is filled with the bias
// and gemm adds onto it (beta 1).
void gemm_bias(int m, int n, int k, const float* a, int lda, const float* b, int ldb, const float* bias, float* c,
               int ldc);

// Many products of one shape on a grid of up to three dimensions (say
// sequences × key/value heads × the query heads that share one): product
// (i, j, l) is gemm's on A at a + i·a_stride[0] + j·a_stride[1] +
// l·a_stride[2], B and C alike (strides in elements). A stride of 0 in A or
// B reads the same matrix along that dimension; every product writes its own
// C (C's strides keep them apart: beta adds to C's earlier values, never to
// another product's). The results are the gemm calls', in the grid's order:
// a float batch under kFp32 and a double one are exactly those calls; under
// kBf16 the whole batch is one oneDNN matmul (one call where there were
// count products of attention's small shapes: 1.6x the per-head calls at the
// bench model's, docs/PERFORMANCE.md), with the operands rounded once each.
struct GemmBatch {
  std::array<int, 3> count = {1, 1, 1};
  std::array<long, 3> a_stride = {0, 0, 0};
  std::array<long, 3> b_stride = {0, 0, 0};
  std::array<long, 3> c_stride = {0, 0, 0};
};

template <class T>
void gemm_batched(const GemmBatch& batch, Transpose transpose_a, Transpose transpose_b, int m, int n, int k, T alpha,
                  const T* a, int lda, const T* b, int ldb, T beta, T* c, int ldc);

// The shape of a gemm, gemm_bias or gemm_batched call: op(A) [m, k] times op(B) [k, n],
// `products` of them (a batch's grid; 1 for gemm and gemm_bias).
struct GemmCallShape {
  int m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  int products = 1;
  auto operator<=>(const GemmCallShape&) const = default;
  double flops() const { return 2.0 * m * n * k * products; }
};

// This thread's GEMM calls by shape, with their wall time, while the object
// is alive (bench_train_step --gemm-shapes: where a step's multiplications
// spend their time, and at what rate). A gemm_batched call counts once, its
// products inside it. Objects nest, the innermost recording.
class GemmCallTimes {
 public:
  struct Entry {
    GemmCallShape shape;
    long calls = 0;
    double seconds = 0;
  };
  GemmCallTimes();
  ~GemmCallTimes();
  GemmCallTimes(const GemmCallTimes&) = delete;
  GemmCallTimes& operator=(const GemmCallTimes&) = delete;

  void add(const GemmCallShape& shape, double seconds);
  // Every shape called, the most time first.
  std::vector<Entry> by_time() const;

 private:
  GemmCallTimes* previous_;
  std::vector<Entry> entries_;
};

// What the float GEMMs of a thread compute in. kFp32: dnnl_sgemm on the
// operands as given. kBf16: both operands rounded to bf16 (to nearest, ties
// to even; exact for values a bf16 stage already holds rounded; an operand
// in a Bf16Operands range is taken in its bits instead) and
// multiplied by oneDNN's bf16 matmul, accumulating in fp32 into the fp32 C
// (alpha and beta as above): what torch.autocast(dtype=bfloat16) does to a
// matmul. Its results depend only on the operands, the shape and the CPU's
// ISA: the same call gives the same bits on one machine. Each thread keeps
// the matmul primitives it made, by shape (creating one costs far more than
// running a small one).
enum class GemmPrecision { kFp32, kBf16 };

// While a scope is alive, the float GEMMs this thread calls compute in
// `precision`; scopes nest, the innermost deciding. double GEMMs stay double.
class GemmPrecisionScope {
 public:
  explicit GemmPrecisionScope(GemmPrecision precision);
  ~GemmPrecisionScope();
  GemmPrecisionScope(const GemmPrecisionScope&) = delete;
  GemmPrecisionScope& operator=(const GemmPrecisionScope&) = delete;

 private:
  GemmPrecision previous_;
};

// This thread's precision now, as the innermost live scope set it.
GemmPrecision current_gemm_precision();

// The bf16 values of float operands, for this thread's kBf16 GEMMs: each
// add(stand_in, bits) says that the floats at [stand_in, stand_in +
// bits.size()) stand for the bf16 values `bits`, laid out alike. While the
// object is alive, a kBf16 float GEMM of this thread whose A or B lies
// inside such a range hands the matmul those bits as they are (at the
// operand's offset and leading dimension: neither copied nor rounded) and
// never reads the floats, which need not hold anything: a bf16 stage points
// its layers' weight matrices into such a range and passes its 16-bit
// weight copy (nn/stage.h), and its W pass passes the saved activations'
// and gradients' 16-bit stash (nn/half_stash.h). The products are the same,
// bit for bit, as with the bits widened into the floats. kFp32 GEMMs read
// the floats. The ranges' floats must stay allocated while a GEMM may read
// them (freed memory given to a new tensor would still stand for the old
// bits). Use it on the thread that made it; it moves (taking its ranges
// along) but does not copy.
class Bf16Operands {
 public:
  Bf16Operands() = default;
  ~Bf16Operands();
  Bf16Operands(Bf16Operands&& other) noexcept;
  Bf16Operands& operator=(Bf16Operands&& other) noexcept;
  Bf16Operands(const Bf16Operands&) = delete;
  Bf16Operands& operator=(const Bf16Operands&) = delete;

  void add(const float* stand_in, std::span<const std::uint16_t> bits);
};

// Bits round_for_gemms writes: grown where too small, never zeroed (the
// GEMMs read only the elements it writes). Growing frees the bits before,
// and so does destroying the scratch: the Bf16Operands they were added to
// must have ended first (declare the scratch before it).
struct Bf16Scratch {
  std::unique_ptr<std::uint16_t[]> bits;
  std::size_t capacity = 0;
};

// For floats several of this thread's kBf16 GEMMs read (each would round
// them itself): rounds the `rows` rows of `columns` floats at x (row stride
// ld) to bf16 once, into `scratch` (laid out alike), and adds them to
// `operands`, whose lifetime the floats must outlive unchanged. Under
// kFp32, nothing.
void round_for_gemms(const float* x, int rows, int columns, int ld, Bf16Scratch& scratch, Bf16Operands& operands);

// Whether this CPU has bf16 dot products (AVX-512 BF16, or AMX): oneDNN's
// effective ISA, which ONEDNN_MAX_CPU_ISA lowers. Without them, on AVX-512,
// oneDNN emulates the bf16 matmul at 0.34-0.39x its fp32 sgemm
// (docs/PERFORMANCE.md): kBf16 only costs there.
bool native_bf16_gemm();
// Whether oneDNN has a bf16 matmul here at all, native or emulated (oneDNN
// 2.6: from AVX-512; an AVX2-only CPU has none). Asked once, by making one.
bool bf16_matmul_available();

// How a bf16 stage multiplies. kAuto: the environment's
// PIPEFLOW_BF16_GEMM (fp32 or bf16) when it is set, else kBf16 where
// native_bf16_gemm() and kFp32 elsewhere. kFp32 / kBf16: that one. bf16
// (asked for, or by the environment) where !bf16_matmul_available() is an
// Error that says to multiply in fp32.
enum class Bf16Gemm { kAuto, kFp32, kBf16 };
GemmPrecision resolve(Bf16Gemm choice);
const char* to_string(GemmPrecision precision);

// The threads a GEMM called from this thread runs on now: the larger of
// OpenMP's count for this thread (oneDNN) and OpenBLAS's process-wide one.
int blas_threads();

}  // namespace pipeflow
