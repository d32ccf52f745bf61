// GEMM library comparison behind docs/measurements.md (the GEMM library entries) and kernels/README.md "GEMM library choice".
// Built once per library, each binary linking exactly one (not built by default):
//   cmake --build BUILD --target ctxpar_gemm_compare_blis ctxpar_gemm_compare_openblas ctxpar_gemm_compare_dnnl
// and run as  BUILD/kernels/ctxpar_gemm_compare_LIB [tokens-per-rank = 4096] [threads...]
// (kernels/tools/gemm_compare.sh runs all of them and joins the rows into one table;
// GEMM_COMPARE_OWN=0 leaves out the own kernel's rows).
//
// Shapes: every GEMM of one training step of the bench-train model (inputs/bench-train.toml:
// dim 1024, 8 query heads and 2 KV heads of 128, SwiGLU 3584, vocab 8192; its LM head runs in
// chunks of 1024 rows) at `tokens` rows per rank, forward (C = X W), data gradient (dX = dY W^T)
// and weight gradient (dW = X^T dY), exactly as src/model calls sgemm, plus the 2048^3 square of
// `bench peak`. Each is run by the library and by ctxpar's own micro-kernel (cpu/tile_ops_*: the
// attention tiles' kernel) behind a small cache-blocked driver (own_sgemm below), so that "our
// kernel" vs "a library" is measured on the model's shapes, not only on the attention tiles.
//
// Output: one CSV row per (library, shape, threads): GFLOP/s median and best of 7 timed calls
// after 2 warm-ups (wall clock; run on an idle machine), and `ok` = every one of 64 sampled
// entries of C within 4 K eps sum_k |a||b| of an fp64 dot product (a failed check prints 0).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/tile_ops.hpp"
#include "ops.hpp"

#if defined(GEMM_COMPARE_BLIS)
#include <blis.h>
static std::string lib_label() {
  bli_init();
  return std::string("blis-") + bli_arch_string(bli_arch_query_id());  // which kernels BLIS runs
}
static std::string lib_version() {
  bli_init();
  return std::string("BLIS ") + bli_info_get_version_str() + " (" + bli_arch_string(bli_arch_query_id()) + ")";
}
static void lib_sgemm(int threads, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  rntm_t rntm = BLIS_RNTM_INITIALIZER;
  bli_rntm_set_num_threads(threads, &rntm);
  float one = 1.f;
  bli_sgemm_ex(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, M, N, K, &one,
               const_cast<float*>(A), lda, 1, const_cast<float*>(B), ldb, 1, &beta, C, ldc, 1, nullptr, &rntm);
}
#elif defined(GEMM_COMPARE_OPENBLAS)
#include <cblas.h>
static std::string lib_label() { return "openblas"; }
static std::string lib_version() {
  return std::string("OpenBLAS ") + openblas_get_config() + " (core " + openblas_get_corename() + ")";
}
static void lib_sgemm(int threads, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  openblas_set_num_threads(threads);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              1.f, A, int(lda), B, int(ldb), beta, C, int(ldc));
}
#elif defined(GEMM_COMPARE_DNNL)
#include <dnnl.h>
static std::string lib_label() { return "onednn"; }
static std::string lib_version() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " (cpu runtime " + (v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other") + ")";
}
static void lib_sgemm(int threads, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  omp_set_num_threads(threads);  // oneDNN's OpenMP runtime takes the caller's thread count
  dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc);
}
#else
#error "build with GEMM_COMPARE_BLIS, GEMM_COMPARE_OPENBLAS or GEMM_COMPARE_DNNL"
#endif

namespace {

// ---- the own micro-kernel behind a cache-blocked driver (GotoBLAS-style) ----
// B is packed per K block into 16-column panels (kc x 16, shared by the threads, in L2/L3);
// each thread packs an mc x kc block of A (row-major, in its L2) and runs the tile kernel over
// it, which keeps a kc x 32 slice of B in L1 while the rows of A stream past (cpu/tile_ops_*).
// Needs N % 16 == 0 (every model dimension here is a multiple of 16).
constexpr int64_t kKc = 256, kMc = 192;

void own_sgemm(int threads, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc, std::vector<float>& bp) {
  const ctxpar::cpu::TileOps& ops = ctxpar::cpu::tile_ops();
  const int64_t n_panels = N / 16, n_mb = (M + kMc - 1) / kMc;
  bp.resize(size_t(kKc * N));
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> ap(size_t(kMc * kKc));
    if (beta != 1.f) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < M; ++r)
        for (int64_t c = 0; c < N; ++c) C[r * ldc + c] = beta == 0.f ? 0.f : beta * C[r * ldc + c];
    }
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t kc = std::min(kKc, K - k0);
#pragma omp for schedule(static)
      for (int64_t pn = 0; pn < n_panels; ++pn)
        for (int64_t k = 0; k < kc; ++k)
          for (int64_t j = 0; j < 16; ++j) {
            const int64_t c = pn * 16 + j;
            bp[size_t((pn * kc + k) * 16 + j)] = tb ? B[c * ldb + k0 + k] : B[(k0 + k) * ldb + c];
          }
#pragma omp for schedule(dynamic, 1)
      for (int64_t mb = 0; mb < n_mb; ++mb) {
        const int64_t r0 = mb * kMc, mc = std::min(kMc, M - r0);
        for (int64_t r = 0; r < mc; ++r)
          for (int64_t k = 0; k < kc; ++k) ap[size_t(r * kc + k)] = ta ? A[(k0 + k) * lda + r0 + r] : A[(r0 + r) * lda + k0 + k];
        ops.gemm(mc, N, kc, ap.data(), kc, 1, bp.data(), 16, kc * 16, C + r0 * ldc, ldc, true);
      }  // implicit barrier: bp is rewritten for the next K block
    }
  }
}

struct Shape {
  const char* name;
  bool ta, tb;
  int64_t M, N, K;
  float beta;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

float val(uint64_t i, uint64_t salt) {  // seeded values in [-1, 1)
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ salt;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return float(double(x >> 40) / double(1ull << 23) - 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 4096;
  std::vector<int> thread_list;
  for (int i = 2; i < argc; ++i) thread_list.push_back(std::atoi(argv[i]));
  if (thread_list.empty()) thread_list = {1, omp_get_max_threads()};
  const int64_t dim = 1024, F = 3584, qw = 1024, kw = 256, V = 8192, lm = std::min<int64_t>(n, 1024);
  const std::vector<Shape> shapes = {
      {"square 2048", false, false, 2048, 2048, 2048, 0.f},
      {"fwd wq (wo)", false, false, n, qw, dim, 0.f},
      {"fwd wk/wv", false, false, n, kw, dim, 0.f},
      {"fwd w1/w3", false, false, n, F, dim, 0.f},
      {"fwd w2", false, false, n, dim, F, 0.f},
      {"fwd lm head", false, false, lm, V, dim, 0.f},
      {"dX w1/w3", false, true, n, dim, F, 1.f},
      {"dX w2", false, true, n, F, dim, 0.f},
      {"dX wq (wo)", false, true, n, dim, qw, 0.f},
      {"dX wk/wv", false, true, n, dim, kw, 1.f},
      {"dX lm head", false, true, lm, dim, V, 0.f},
      {"dW w1/w3", true, false, dim, F, n, 1.f},
      {"dW w2", true, false, F, dim, n, 1.f},
      {"dW wq (wo)", true, false, dim, qw, n, 1.f},
      {"dW wk/wv", true, false, dim, kw, n, 1.f},
      {"dW lm head", true, false, dim, V, lm, 1.f},
  };
  const ctxpar::FmaPeak pk = ctxpar::fma_peak(omp_get_max_threads());
  std::printf("# %s; own micro-kernel: %s; FMA peak %.1f GFLOP/s on %d threads (%s)\n", lib_version().c_str(),
              ctxpar::cpu::tile_ops().isa, pk.gflops, omp_get_max_threads(), pk.isa_name);
  std::printf("lib,shape,op,M,N,K,threads,gflops_median,gflops_best,ok\n");
  std::vector<float> bp;
  const char* own_env = std::getenv("GEMM_COMPARE_OWN");  // 0: the library only
  const bool with_own = !own_env || std::strcmp(own_env, "0") != 0;
  for (const Shape& s : shapes) {
    const int64_t a_rows = s.ta ? s.K : s.M, a_cols = s.ta ? s.M : s.K;
    const int64_t b_rows = s.tb ? s.N : s.K, b_cols = s.tb ? s.K : s.N;
    std::vector<float> A(size_t(a_rows * a_cols)), B(size_t(b_rows * b_cols)), C0(size_t(s.M * s.N)), C(C0.size());
    for (size_t i = 0; i < A.size(); ++i) A[i] = val(i, 1);
    for (size_t i = 0; i < B.size(); ++i) B[i] = val(i, 2);
    for (size_t i = 0; i < C0.size(); ++i) C0[i] = val(i, 3);
    const char* op = s.ta ? "TN" : s.tb ? "NT" : "NN";
    for (int who = 0; who < (with_own ? 2 : 1); ++who) {
      for (int threads : thread_list) {
        auto run = [&] {
          if (who == 0) lib_sgemm(threads, s.ta, s.tb, s.M, s.N, s.K, A.data(), a_cols, B.data(), b_cols, s.beta, C.data(), s.N);
          else own_sgemm(threads, s.ta, s.tb, s.M, s.N, s.K, A.data(), a_cols, B.data(), b_cols, s.beta, C.data(), s.N, bp);
        };
        std::vector<double> t;
        for (int rep = 0; rep < 9; ++rep) {
          std::memcpy(C.data(), C0.data(), C.size() * sizeof(float));
          const double t0 = now_s();
          run();
          if (rep >= 2) t.push_back(now_s() - t0);
        }
        // check the last result: 64 sampled entries against fp64
        int ok = 1;
        for (int e = 0; e < 64; ++e) {
          const int64_t r = (e * 7919) % s.M, c = (e * 104729) % s.N;
          double ref = double(s.beta) * C0[size_t(r * s.N + c)], mag = std::abs(ref);
          for (int64_t k = 0; k < s.K; ++k) {
            const double a = s.ta ? A[size_t(k * a_cols + r)] : A[size_t(r * a_cols + k)];
            const double b = s.tb ? B[size_t(c * b_cols + k)] : B[size_t(k * b_cols + c)];
            ref += a * b;
            mag += std::abs(a * b);
          }
          if (!(std::abs(C[size_t(r * s.N + c)] - ref) <= 4.0 * double(s.K) * 6e-8 * mag)) ok = 0;
        }
        std::sort(t.begin(), t.end());
        const double flop = 2.0 * double(s.M) * double(s.N) * double(s.K);
        std::printf("%s,%s,%s,%lld,%lld,%lld,%d,%.1f,%.1f,%d\n", who == 0 ? lib_label().c_str() : "own", s.name, op,
                    (long long)s.M, (long long)s.N, (long long)s.K, threads, flop / t[t.size() / 2] / 1e9,
                    flop / t.front() / 1e9, ok);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
