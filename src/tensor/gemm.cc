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

}  // namespace

template <>
void gemm<float>(Transpose transpose_a, Transpose transpose_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  use_one_blas_thread();
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
