// sgemm() for the model's large GEMMs: the BLAS library chosen at configure time
// (CTXPAR_BLAS, see kernels/README.md for the measurement), on every OpenMP thread of the rank.
// The thread count is set explicitly on each call, so full speed needs no environment variable
// (BLIS alone would run single-threaded when BLIS_NUM_THREADS/OMP_NUM_THREADS are unset).
#include <omp.h>

#include <cstdio>
#include <string>

#include "ops.hpp"

// blis.h trips -Wtype-limits in its own inline code; silence it for the include only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtype-limits"
#if defined(CTXPAR_BLAS_BLIS)
#include <blis.h>
#elif defined(CTXPAR_BLAS_OPENBLAS)
#include <cblas.h>
#else
#error "ctxpar_kernels needs CTXPAR_BLAS_BLIS or CTXPAR_BLAS_OPENBLAS (target ctxpar_blas)"
#endif
#pragma GCC diagnostic pop

namespace ctxpar {

namespace {
// Inside a parallel region (e.g. a caller's own loop) the library must not spawn more threads.
int gemm_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }
}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
#if defined(CTXPAR_BLAS_BLIS)
  // The object-free typed API with a per-call runtime object: thread count local to this call.
  rntm_t rntm = BLIS_RNTM_INITIALIZER;
  bli_rntm_set_num_threads(gemm_threads(), &rntm);
  float a = alpha, b = beta;
  // Row-major C = op(A) op(B): strides (row stride = ld, column stride = 1).
  bli_sgemm_ex(trans_a ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
               trans_b ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, M, N, K, &a, const_cast<float*>(A),
               lda, 1, const_cast<float*>(B), ldb, 1, &b, C, ldc, 1, nullptr, &rntm);
#else
  openblas_set_num_threads(gemm_threads());
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
#endif
}

const char* blas_name() {
  static const std::string name = [] {
#if defined(CTXPAR_BLAS_BLIS)
    return std::string("BLIS ") + bli_info_get_version_str() + " (OpenMP)";
#else
    return std::string("OpenBLAS ") + openblas_get_config();
#endif
  }();
  return name.c_str();
}

}  // namespace ctxpar
