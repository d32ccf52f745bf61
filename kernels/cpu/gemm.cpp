// sgemm() for the model's large GEMMs: the GEMM library chosen at configure time (CTXPAR_BLAS:
// BLIS by default, oneDNN or OpenBLAS; docs/measurements.md has the measurements), on every OpenMP
// thread of the rank. The thread count is set explicitly on each call, so full speed needs no
// environment variable (BLIS alone would run single-threaded when BLIS_NUM_THREADS and
// OMP_NUM_THREADS are unset).
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
#if defined(CTXPAR_BLAS_ONEDNN)
#include <dnnl.h>

#include <stdexcept>
#elif defined(CTXPAR_BLAS_BLIS)
#include <blis.h>
#elif defined(CTXPAR_BLAS_OPENBLAS)
#include <cblas.h>
#else
#error "ctxpar_kernels needs CTXPAR_BLAS_ONEDNN, CTXPAR_BLAS_BLIS or CTXPAR_BLAS_OPENBLAS (target ctxpar_blas)"
#endif
#pragma GCC diagnostic pop

namespace ctxpar {

namespace {
// Inside a parallel region (e.g. a caller's own loop) the library must not spawn more threads.
int gemm_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

#if defined(CTXPAR_BLAS_BLIS)
// BLIS picks its kernels ("sub-configuration") once, at its initialization, from CPUID tables of
// the CPUs known at its release; Intel CPUs are matched by features and a guess of their FMA
// units, AMD ones by family. Two cases get the wrong kernels from BLIS before 2.0 (Debian 12
// ships 0.9.0):
//  - AMD families after 0x19 (Zen 5 is 0x1A) run its portable C kernels ('generic'): measured on
//    a Zen 5 core, generic 70 GFLOP/s against 337-383 for skx (AVX-512) of a 455 GFLOP/s peak;
//  - Intel AVX-512 CPUs whose brand string BLIS cannot read its FMA-unit count from (virtual
//    machines report "Intel(R) Xeon(R) Processor") run the AVX2 kernels ('haswell'): measured on
//    such a 2-core VM with two 512-bit FMA pipes, haswell 95-141 GFLOP/s against 197-219 for skx,
//    of a 330 GFLOP/s peak (docs/measurements.md).
// When the user has not chosen (BLIS_ARCH_TYPE unset), such a CPU gets the kernels of its ISA:
// skx with AVX-512 F/DQ/BW/VL, else zen3 with AVX2 + FMA. The rule reads CPUID only, never a
// timing (an earlier rule timed 512- against 256-bit FMAs, and under load two ranks of one job
// chose different kernels: bits that changed with the load; on an Intel part with one 512-bit
// unit skx has the same FMA peak per cycle as haswell). CTXPAR_ISA (kernel_isa_forced()) chooses
// generic, haswell or skx, so that each kernel family can be tested on one machine. BLIS reads
// BLIS_ARCH_TYPE (an index into its own list of configurations, looked up here by name) when it
// initializes, so this runs before the first BLIS call. blas_name() says what BLIS chose.
bool cpu_vendor_is(const char* vendor12) {
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  char v[13];
  std::memcpy(v, &b, 4);
  std::memcpy(v + 4, &d, 4);
  std::memcpy(v + 8, &c, 4);
  v[12] = 0;
  return std::strcmp(v, vendor12) == 0;
}

bool cpu_is_amd_family_at_least(unsigned family) {
  unsigned a, b, c, d;
  if (!cpu_vendor_is("AuthenticAMD") || !__get_cpuid(1, &a, &b, &c, &d)) return false;
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
    const KernelIsa widest = kernel_isa_widest();
    const char* want = nullptr;
    if (kernel_isa_forced()) {
      const KernelIsa isa = kernel_isa();
      want = isa == KernelIsa::avx512 ? "skx" : isa == KernelIsa::avx2 ? "haswell" : "generic";
      blis_config_chooser = "CTXPAR_ISA";
    } else if (version.empty() || version[0] >= '2') {
      return true;  // BLIS 2 knows Zen 5 and reads no FMA-unit guess
    } else if (cpu_is_amd_family_at_least(0x1a)) {
      want = widest == KernelIsa::avx512 ? "skx" : widest == KernelIsa::avx2 ? "zen3" : nullptr;
      blis_config_chooser = "ctxpar: CPU unknown to this BLIS";
    } else if (cpu_vendor_is("GenuineIntel") && widest == KernelIsa::avx512) {
      want = "skx";
      blis_config_chooser = "ctxpar: Intel AVX-512";
    }
    if (!want) {
      blis_config_chooser = "";
      return true;
    }
    for (int id = 0; id < int(BLIS_NUM_ARCHS); ++id)
      if (std::strcmp(bli_arch_string(arch_t(id)), want) == 0) {
        setenv("BLIS_ARCH_TYPE", std::to_string(id).c_str(), 0);
        return true;
      }
    blis_config_chooser = "";
    return true;
  }();
  (void)done;
}
#endif
}  // namespace

bool sgemm_rows_fixed(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
#if defined(CTXPAR_BLAS_BLIS)
  if (M <= 0 || N <= 0) return true;
  choose_blis_config_once();
  rntm_t rntm = BLIS_RNTM_INITIALIZER;
  bli_rntm_set_num_threads(gemm_threads(), &rntm);
  bli_rntm_disable_l3_sup(&rntm);
  float a = 1.0f, b = beta;
  bli_sgemm_ex(trans_a ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, trans_b ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, M, N, K, &a,
               const_cast<float*>(A), lda, 1, const_cast<float*>(B), ldb, 1, &b, C, ldc, 1, nullptr, &rntm);
  return true;
#else
  (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)beta, (void)C,
      (void)ldc;
  return false;
#endif
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
#if defined(CTXPAR_BLAS_ONEDNN)
  // oneDNN's OpenMP runtime runs a GEMM on the caller's omp_get_max_threads(): all of the rank's
  // threads outside a parallel region; inside one, this thread alone.
  omp_set_num_threads(gemm_threads());  // a no-op outside a parallel region
  static const bool isa_set = [] {  // CTXPAR_ISA caps oneDNN's kernels before its first call
    if (kernel_isa_forced())
      dnnl_set_max_cpu_isa(kernel_isa() == KernelIsa::avx512 ? dnnl_cpu_isa_avx512_core
                           : kernel_isa() == KernelIsa::avx2 ? dnnl_cpu_isa_avx2
                                                             : dnnl_cpu_isa_sse41);
    return true;
  }();
  (void)isa_set;
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                      beta, C, ldc);
  if (st != dnnl_success)
    throw std::runtime_error("sgemm: oneDNN dnnl_sgemm failed with status " + std::to_string(int(st)) + " (M=" +
                             std::to_string(M) + ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")");
#elif defined(CTXPAR_BLAS_BLIS)
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
#if defined(CTXPAR_BLAS_ONEDNN)
    const dnnl_version_t* v = dnnl_version();
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    const char* isa_name = isa == dnnl_cpu_isa_avx512_core_amx    ? "avx512_core_amx"
                           : isa == dnnl_cpu_isa_avx512_core_bf16 ? "avx512_core_bf16"
                           : isa == dnnl_cpu_isa_avx512_core_vnni ? "avx512_core_vnni"
                           : isa == dnnl_cpu_isa_avx512_core      ? "avx512_core"
                           : isa == dnnl_cpu_isa_avx2_vnni        ? "avx2_vnni"
                           : isa == dnnl_cpu_isa_avx2             ? "avx2"
                           : isa == dnnl_cpu_isa_avx              ? "avx"
                           : isa == dnnl_cpu_isa_sse41            ? "sse41"
                                                                  : "other";
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
           " (OpenMP; " + isa_name + " kernels)";
#elif defined(CTXPAR_BLAS_BLIS)
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
