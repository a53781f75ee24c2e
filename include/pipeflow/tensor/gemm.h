#pragma once

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

// The threads a GEMM called from this thread runs on now: the larger of
// OpenMP's count for this thread (oneDNN) and OpenBLAS's process-wide one.
int blas_threads();

}  // namespace pipeflow
