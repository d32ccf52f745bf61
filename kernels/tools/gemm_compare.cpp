// GEMM library comparison behind kernels/README.md: built once per library
// (ctxpar_gemm_compare_blis, ctxpar_gemm_compare_openblas; `make` target, not built by default).
// Prints GFLOP/s of (1) a large square sgemm on 1 and on all threads and (2) the attention tile
// shapes (96x64x128 for S = Q K^T, 96x128x64 for O += P V) called one tile at a time from one
// thread, as the flash kernel would, next to ctxpar's own micro-kernels on pre-packed operands.
#include <omp.h>

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu/tile_ops.hpp"

#if defined(GEMM_COMPARE_BLIS)
#include <blis.h>
#define LIB_NAME "BLIS"
static void set_threads(int n) { bli_thread_set_num_threads(n); }
#else
#include <cblas.h>
#define LIB_NAME "OpenBLAS"
static void set_threads(int n) { openblas_set_num_threads(n); }
#endif

// Time as process CPU time divided by the threads used: on a shared machine (other jobs
// time-slicing the cores) this approximates the time the same work takes on idle cores, and it
// equals wall time on an idle machine. (Library threads that spin while waiting count too, so
// multi-thread rates are if anything underestimated.)
static int g_threads = 1;
static double now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double(t.tv_sec) + 1e-9 * double(t.tv_nsec)) / g_threads;
}

template <class F> static double best_gflops(double flop, int reps, F&& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    f();
    best = std::min(best, now() - t0);
  }
  return flop / best / 1e9;
}

int main(int argc, char** argv) {
  const int N = argc > 1 ? std::atoi(argv[1]) : 2048;
#if defined(GEMM_COMPARE_BLIS)
  std::printf("BLIS %s, arch %s\n", bli_info_get_version_str(), bli_arch_string(bli_arch_query_id()));
#else
  std::printf("%s, core %s\n", openblas_get_config(), openblas_get_corename());
#endif
  std::vector<float> A(size_t(N) * N, 0.5f), B(size_t(N) * N, 0.25f), C(size_t(N) * N);
  for (int threads : {1, omp_get_max_threads()}) {
    set_threads(threads);
    g_threads = threads;
    const double gf = best_gflops(2.0 * N * N * N, 3, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.f, A.data(), N, B.data(), N, 0.f,
                  C.data(), N);
    });
    std::printf("%-9s sgemm %dx%dx%d  %2d thread(s): %7.1f GFLOP/s\n", LIB_NAME, N, N, N, threads, gf);
  }
  // Tile shapes, one thread, many calls (per-call overhead and packing included).
  set_threads(1);
  g_threads = 1;
  const int Bq = 96, Bk = 64, D = 128, calls = 4000;
  std::vector<float> q(Bq * D, 0.01f), k(Bk * D, 0.01f), s(Bq * Bk), v(Bk * D, 0.01f), o(Bq * D);
  const double qk = best_gflops(2.0 * Bq * Bk * D * calls, 3, [&] {
    for (int c = 0; c < calls; ++c)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Bq, Bk, D, 1.f, q.data(), D, k.data(), D, 0.f,
                  s.data(), Bk);
  });
  const double pv = best_gflops(2.0 * Bq * Bk * D * calls, 3, [&] {
    for (int c = 0; c < calls; ++c)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Bq, D, Bk, 1.f, s.data(), Bk, v.data(), D, 1.f,
                  o.data(), D);
  });
  std::printf("%-9s tile S=QK^T 96x64x128: %6.1f GFLOP/s   tile O+=PV 96x128x64: %6.1f GFLOP/s\n", LIB_NAME, qk, pv);
  const ctxpar::cpu::TileOps& ops = ctxpar::cpu::tile_ops();
  std::vector<float> kpanel(Bk * D, 0.01f);
  const double qk_own = best_gflops(2.0 * Bq * Bk * D * calls, 3, [&] {
    for (int c = 0; c < calls; ++c)
      ops.gemm(Bq, Bk, D, q.data(), D, 1, kpanel.data(), 16, D * 16, s.data(), Bk, false);
  });
  const double pv_own = best_gflops(2.0 * Bq * Bk * D * calls, 3, [&] {
    for (int c = 0; c < calls; ++c) ops.gemm(Bq, D, Bk, s.data(), Bk, 1, v.data(), D, 16, o.data(), D, true);
  });
  std::printf("ctxpar-%s tile S=QK^T 96x64x128: %6.1f GFLOP/s   tile O+=PV 96x128x64: %6.1f GFLOP/s\n", ops.isa,
              qk_own, pv_own);
  return 0;
}
