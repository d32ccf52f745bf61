// Measured FMA peak: a register-only loop of independent fused multiply-adds on every thread,
// of the widest vectors the CPU has (AVX-512F, else AVX2+FMA, else SSE2 multiply + add), chosen
// at run time: what the FMA units deliver at the clock the cores actually run (turbo, thermal and
// co-tenants included), the number MFU and the GEMM efficiency are judged against.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "ops.hpp"

namespace ctxpar {

namespace {

// 12 independent chains of 16-wide FMAs (AVX-512F): enough for 2 pipes x 4-5 cycles latency.
// 384 FLOP per iteration. On CPUs that split a 512-bit FMA into two 256-bit halves (Zen 4) it
// measures the same peak as the AVX2 loop; with full-width units (Intel server cores, Zen 5) twice.
__attribute__((target("avx512f"))) float fma_loop_avx512(int64_t iters, float seed) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(seed + 0.01f * float(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];
}

// 12 independent chains of 8-wide FMAs: more than latency (4-5 cycles) x throughput (2 per
// cycle) chains, so the loop is throughput bound. 192 FLOP per iteration.
__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iters, float seed) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(seed + 0.01f * float(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

// Baseline x86-64 (SSE2, no FMA): 12 chains of 4-wide multiply + add, 96 FLOP per iteration.
float mul_add_loop_sse(int64_t iters, float seed) {
  __m128 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm_set1_ps(seed + 0.01f * float(i));
  const __m128 a = _mm_set1_ps(0.999999f), b = _mm_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], a), b);
  }
  __m128 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm_add_ps(s, acc[i]);
  return _mm_cvtss_f32(s);
}

}  // namespace

FmaIsa fma_isa_available() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return FmaIsa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return FmaIsa::avx2;
  return FmaIsa::sse2;
}

const char* fma_isa_name(FmaIsa isa) {
  switch (isa) {
    case FmaIsa::avx512: return "avx512f";
    case FmaIsa::avx2: return "avx2+fma";
    case FmaIsa::sse2: return "sse2 (mul+add)";
  }
  return "?";
}

int fma_isa_bits(FmaIsa isa) { return isa == FmaIsa::avx512 ? 512 : isa == FmaIsa::avx2 ? 256 : 128; }

FmaPeak fma_peak(int threads, FmaIsa isa) {
  if (int(isa) > int(fma_isa_available()))
    throw std::invalid_argument(std::string("fma_peak: this CPU has no ") + fma_isa_name(isa) + " (widest: " +
                                fma_isa_name(fma_isa_available()) + ")");
  const double flop_per_iter = isa == FmaIsa::avx512 ? 384.0 : isa == FmaIsa::avx2 ? 192.0 : 96.0;
  // ~0.1 s per thread at 3 GHz with 2 pipes of the loop's width
  const int64_t iters = isa == FmaIsa::avx512 ? 10'000'000 : 20'000'000;
  if (threads <= 0) threads = omp_get_max_threads();
  double best = 0;
  // Best of 6: the first repetition brings the cores to clock, and on a shared machine a thread
  // descheduled for part of one repetition would understate the peak (and inflate gemm/peak).
  for (int rep = 0; rep < 6; ++rep) {
    double slowest_s = 0;
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(max : slowest_s) reduction(+ : sink)
    {
      const auto t0 = std::chrono::steady_clock::now();
      const float seed = float(omp_get_thread_num());
      sink += isa == FmaIsa::avx512 ? fma_loop_avx512(iters, seed)
              : isa == FmaIsa::avx2 ? fma_loop_avx2(iters, seed)
                                    : mul_add_loop_sse(iters, 1.f);
      slowest_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    best = std::max(best, flop_per_iter * double(iters) * threads / slowest_s / 1e9 + 0 * sink);
  }
  return FmaPeak{best, isa, fma_isa_name(isa), fma_isa_bits(isa)};
}

FmaPeak fma_peak(int threads) { return fma_peak(threads, fma_isa_available()); }

double fma_peak_gflops(int threads) { return fma_peak(threads).gflops; }

}  // namespace ctxpar
