#include "pipeflow/tensor/gemm.h"

#include <cblas.h>

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>

#include "pipeflow/core/error.h"

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

// OpenBLAS's thread count is process-wide, OpenMP's (oneDNN's) is each
// thread's own: the first call of a thread sets both to 1 for it.
void use_one_gemm_thread() {
  static const bool kOpenblasSet = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)kOpenblasSet;
  thread_local const bool kOpenmpSet = [] {
    omp_set_num_threads(1);
    return true;
  }();
  (void)kOpenmpSet;
}

}  // namespace

template <>
void gemm<float>(Transpose transpose_a, Transpose transpose_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  use_one_gemm_thread();
  const dnnl_status_t status = dnnl_sgemm(to_dnnl(transpose_a), to_dnnl(transpose_b), m, n, k, alpha, a, lda, b, ldb,
                                          beta, c, ldc);
  if (status != dnnl_success) {
    fail("gemm: dnnl_sgemm returned status {} for m {}, n {}, k {}, lda {}, ldb {}, ldc {}: the sizes must be "
         "non-negative and each leading dimension at least its matrix's row length",
         static_cast<int>(status), m, n, k, lda, ldb, ldc);
  }
}

template <>
void gemm<double>(Transpose transpose_a, Transpose transpose_b, int m, int n, int k, double alpha, const double* a,
                  int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  use_one_gemm_thread();
  cblas_dgemm(CblasRowMajor, to_cblas(transpose_a), to_cblas(transpose_b), m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

int blas_threads() { return std::max(openblas_get_num_threads(), omp_get_max_threads()); }

}  // namespace pipeflow
