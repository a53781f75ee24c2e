#pragma once

namespace pipeflow {

enum class Transpose { kNo, kYes };

// C[m, n] = alpha · op(A) · op(B) + beta · C, row-major, with leading
// dimensions lda, ldb, ldc (row strides in elements), through OpenBLAS
// (cblas_sgemm for float, cblas_dgemm for double). op(A) is [m, k], op(B) is
// [k, n]. Strided leading dimensions let a kernel multiply one attention head
// inside a [B, T, 3C] tensor without copying it out.
//
// Threading: pipeflow runs each BLAS call on the calling thread; parallelism
// comes from pipeline workers, one per core. OpenBLAS's thread count is
// process-wide, so the first gemm call sets it to 1 (blas_threads() reports
// it). Calls from different threads on different data may run concurrently.
template <class T>
void gemm(Transpose transpose_a, Transpose transpose_b, int m, int n, int k, T alpha, const T* a, int lda,
          const T* b, int ldb, T beta, T* c, int ldc);

// OpenBLAS's current process-wide thread count.
int blas_threads();

}  // namespace pipeflow
