#include "pipeflow/tensor/gemm.h"

#include <cblas.h>

namespace pipeflow {
namespace {

CBLAS_TRANSPOSE to_cblas(Transpose transpose) { return transpose == Transpose::kYes ? CblasTrans : CblasNoTrans; }

void use_one_blas_thread() {
  static const bool kSet = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)kSet;
}

// One row of C (a decode step's single query or token): c = alpha · op(B)ᵀ ·
// op(A)ᵀ + beta · c as a gemv, which reads B in place where sgemm would first
// pack it (a cached key matrix of the whole context, for one query).
void row_times_matrix(Transpose transpose_a, Transpose transpose_b, int n, int k, float alpha, const float* a,
                      int lda, const float* b, int ldb, float beta, float* c) {
  const int stride_a = transpose_a == Transpose::kYes ? lda : 1;
  if (transpose_b == Transpose::kYes) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, alpha, b, ldb, a, stride_a, beta, c, 1);
  } else {
    cblas_sgemv(CblasRowMajor, CblasTrans, k, n, alpha, b, ldb, a, stride_a, beta, c, 1);
  }
}

}  // namespace

template <>
void gemm<float>(Transpose transpose_a, Transpose transpose_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  use_one_blas_thread();
  if (m == 1) {
    row_times_matrix(transpose_a, transpose_b, n, k, alpha, a, lda, b, ldb, beta, c);
    return;
  }
  cblas_sgemm(CblasRowMajor, to_cblas(transpose_a), to_cblas(transpose_b), m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

template <>
void gemm<double>(Transpose transpose_a, Transpose transpose_b, int m, int n, int k, double alpha, const double* a,
                  int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  use_one_blas_thread();
  cblas_dgemm(CblasRowMajor, to_cblas(transpose_a), to_cblas(transpose_b), m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

int blas_threads() { return openblas_get_num_threads(); }

}  // namespace pipeflow
