// sgemm() for the model's large GEMMs: the BLAS library chosen at configure time
// (CTXPAR_BLAS, see kernels/README.md for the measurement), on every OpenMP thread of the rank.
// The thread count is set explicitly on each call, so full speed needs no environment variable
// (BLIS alone would run single-threaded when BLIS_NUM_THREADS/OMP_NUM_THREADS are unset).
#include <omp.h>

#include <cpuid.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
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

#if defined(CTXPAR_BLAS_BLIS)
// BLIS picks its kernels ("sub-configuration") once, at its initialization, from CPUID tables of
// the CPUs known at its release; Intel CPUs are matched by features, AMD ones by family. BLIS
// before 2.0 (Debian 12 ships 0.9.0) knows AMD families up to 0x19 (Zen 3 / Zen 4) and falls
// back to its portable C kernels ('generic') on Zen 5 (family 0x1A) and later: measured on a
// Zen 5 core, generic reached 70 GFLOP/s against 337-383 for the skx (AVX-512) kernels, of a
// 455 GFLOP/s FMA peak. When the user has not chosen (BLIS_ARCH_TYPE unset), such a CPU gets
// the kernels of its ISA: skx with AVX-512 F/DQ/BW/VL, else zen3 with AVX2 + FMA. BLIS reads
// BLIS_ARCH_TYPE (an index into its own list of configurations, looked up here by name) when it
// initializes, so this runs before the first BLIS call. blas_name() says what BLIS chose.
bool cpu_is_amd_family_at_least(unsigned family) {
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  const bool amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;  // "AuthenticAMD"
  if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return false;
  unsigned fam = (a >> 8) & 0xf;
  if (fam == 0xf) fam += (a >> 20) & 0xff;
  return fam >= family;
}

// "" when BLIS chose by itself, else who chose: "BLIS_ARCH_TYPE" (the user) or "ctxpar".
const char* blis_config_chooser = "";

void choose_blis_config_once() {
  static const bool done = [] {
    if (std::getenv("BLIS_ARCH_TYPE")) {  // the user's choice
      blis_config_chooser = "BLIS_ARCH_TYPE";
      return true;
    }
    const std::string version = bli_info_get_version_str();
    if (version.empty() || version[0] >= '2' || !cpu_is_amd_family_at_least(0x1a)) return true;
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const char* want = avx512 ? "skx" : avx2 ? "zen3" : nullptr;
    if (!want) return true;
    for (int id = 0; id < int(BLIS_NUM_ARCHS); ++id)
      if (std::strcmp(bli_arch_string(arch_t(id)), want) == 0) {
        setenv("BLIS_ARCH_TYPE", std::to_string(id).c_str(), 0);
        blis_config_chooser = "ctxpar: CPU unknown to this BLIS";
        break;
      }
    return true;
  }();
  (void)done;
}
#endif
}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
#if defined(CTXPAR_BLAS_BLIS)
  choose_blis_config_once();
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
    choose_blis_config_once();
    bli_init();
    const char* config = bli_arch_string(bli_arch_query_id());
    return std::string("BLIS ") + bli_info_get_version_str() + " (OpenMP; " + config + " kernels" +
           (*blis_config_chooser ? std::string(" chosen by ") + blis_config_chooser : std::string()) + ")";
#else
    return std::string("OpenBLAS ") + openblas_get_config();
#endif
  }();
  return name.c_str();
}

}  // namespace ctxpar
