// AVX-512 tile operations (F, DQ, BW, VL). As in tile_ops_avx2.cpp, every function here carries
// the target through the pragma below and is only reached through tile_ops() after
// __builtin_cpu_supports said yes; no std:: templates are instantiated after the pragma.
//
// The tile GEMM's B operand comes in 16-column panels (tile_ops.hpp), one zmm register per row
// of a panel. The micro-kernel holds a 12 x 32 block of C (two panels) in 24 zmm accumulators;
// per k it loads two B vectors and broadcasts 12 elements of A: 24 FMAs per 14 loads, which keeps
// two 512-bit FMA pipes busy on cores that load two vectors per cycle. An odd last panel runs a
// 12 x 16 kernel. The online softmax and the backward's P/dS step use the same base-2 exp as the
// AVX2 set (its polynomial, exact 0 below 2^-126), 16 lanes at a time.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "cpu/tile_ops.hpp"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_ps() as the unused merge source of min, max
// and friends, which its middle end then reports as "may be used uninitialized" (fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace ctxpar::cpu {

namespace {

constexpr int kMR = 12;  // rows of the micro-kernel (query tiles are multiples of 12: 96, 48)

// C[MR, 16 NP] (+)= A[MR, K] B[K, 16 NP] on NP consecutive panels of B (b_cs16 apart).
template <int NP, int MR>
void ukr(int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B, int64_t b_rs, int64_t b_cs16,
         float* C, int64_t c_rs, bool accumulate) {
  __m512 c[MR][NP];
  if (accumulate) {
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p) c[r][p] = _mm512_loadu_ps(C + r * c_rs + 16 * p);
  } else {
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p) c[r][p] = _mm512_setzero_ps();
  }
  const float* a_row[MR];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) a_row[r] = A + r * a_rs;
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NP];
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) b[p] = _mm512_loadu_ps(B + p * b_cs16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(a_row[r][k * a_cs]);
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p) c[r][p] = _mm512_fmadd_ps(a, b[p], c[r][p]);
    }
    B += b_rs;
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) _mm512_storeu_ps(C + r * c_rs + 16 * p, c[r][p]);
}

using Ukr = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t, bool);

// Micro-kernels by row count 1..12 (index 0 unused), for one and two panels.
const Ukr kUkr1[kMR + 1] = {nullptr,     ukr<1, 1>, ukr<1, 2>, ukr<1, 3>,  ukr<1, 4>,  ukr<1, 5>, ukr<1, 6>,
                            ukr<1, 7>,   ukr<1, 8>, ukr<1, 9>, ukr<1, 10>, ukr<1, 11>, ukr<1, 12>};
const Ukr kUkr2[kMR + 1] = {nullptr,     ukr<2, 1>, ukr<2, 2>, ukr<2, 3>,  ukr<2, 4>,  ukr<2, 5>, ukr<2, 6>,
                            ukr<2, 7>,   ukr<2, 8>, ukr<2, 9>, ukr<2, 10>, ukr<2, 11>, ukr<2, 12>};

void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B, int64_t b_rs,
          int64_t b_cs16, float* C, int64_t c_rs, bool accumulate) {
  const int64_t n_panels = N / 16;
  // Column blocks outer (two panels = a K x 32 slice of B stays in L1 while A's rows stream past).
  for (int64_t cb = 0; cb < n_panels; cb += 2) {
    const Ukr* k = cb + 2 <= n_panels ? kUkr2 : kUkr1;
    const float* b = B + cb * b_cs16;
    float* c = C + cb * 16;
    for (int64_t r = 0; r < M; r += kMR) {
      const int64_t rows = M - r < kMR ? M - r : kMR;
      k[rows](K, A + r * a_rs, a_rs, a_cs, b, b_rs, b_cs16, c + r * c_rs, c_rs, accumulate);
    }
  }
}

// 2^x as in tile_ops_avx2.cpp (same polynomial, same rounding of n): 2^n applied by scalef.
inline __m512 exp2_ps(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-126.f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(127.f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5252733804059840e-05f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381606e-04f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284770e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

inline float hmax(__m512 v) {
  __m256 y = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

inline float hsum(__m512 v) {
  __m256 y = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

void softmax_tile(float* S, int64_t rows, int64_t n, int64_t ld, float c, float* m, float* l, float* alpha) {
  const __m512 vc = _mm512_set1_ps(c);
  for (int64_t r = 0; r < rows; ++r) {
    float* s = S + r * ld;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s + j), vc);
      _mm512_storeu_ps(s + j, x);
      vmax = _mm512_max_ps(vmax, x);
    }
    const float mx = hmax(vmax);
    const float m_new = mx > m[r] ? mx : m[r];
    if (m_new == -INFINITY) {  // nothing visible yet: P = 0, keep O and l
      for (int64_t j = 0; j < n; j += 16) _mm512_storeu_ps(s + j, _mm512_setzero_ps());
      alpha[r] = 1.f;
      continue;
    }
    const __m512 vm = _mm512_set1_ps(m_new);
    __m512 vsum0 = _mm512_setzero_ps(), vsum1 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
      const __m512 p0 = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
      const __m512 p1 = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), vm));
      _mm512_storeu_ps(s + j, p0);
      _mm512_storeu_ps(s + j + 16, p1);
      vsum0 = _mm512_add_ps(vsum0, p0);
      vsum1 = _mm512_add_ps(vsum1, p1);
    }
    for (; j < n; j += 16) {
      const __m512 p0 = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
      _mm512_storeu_ps(s + j, p0);
      vsum0 = _mm512_add_ps(vsum0, p0);
    }
    alpha[r] = m[r] == -INFINITY ? 0.f : std::exp2(m[r] - m_new);
    l[r] = l[r] * alpha[r] + hsum(_mm512_add_ps(vsum0, vsum1));
    m[r] = m_new;
  }
}

// n a multiple of 8: 16 lanes, then an 8-lane masked step.
void scale_rows(float* O, int64_t rows, int64_t n, int64_t ld, const float* alpha) {
  for (int64_t r = 0; r < rows; ++r) {
    if (alpha[r] == 1.f) continue;
    const __m512 a = _mm512_set1_ps(alpha[r]);
    float* o = O + r * ld;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(o + j, _mm512_mul_ps(_mm512_loadu_ps(o + j), a));
    if (j < n) _mm512_mask_storeu_ps(o + j, 0x00ff, _mm512_mul_ps(_mm512_maskz_loadu_ps(0x00ff, o + j), a));
  }
}

void bwd_p_ds(float* S, float* dP, int64_t rows, int64_t n, int64_t ld, float c, const float* lse2, const float* Di,
              float scale) {
  const __m512 vc = _mm512_set1_ps(c), vscale = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 vl = _mm512_set1_ps(lse2[r]), vd = _mm512_set1_ps(Di[r]);
    float* s = S + r * ld;
    float* dp = dP + r * ld;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = n - j >= 16 ? __mmask16(0xffff) : __mmask16(0x00ff);  // n is a multiple of 8
      const __m512 p = exp2_ps(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, s + j), vc, vl));
      _mm512_mask_storeu_ps(s + j, k, p);
      const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(p, vscale), _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + j), vd));
      _mm512_mask_storeu_ps(dp + j, k, ds);
    }
  }
}

}  // namespace

const TileOps& tile_ops_avx512() {
  // The transposes are memory-bound packing steps: the AVX2 set's 8 x 8 register transpose.
  static const TileOps ops{"avx512", gemm, softmax_tile, scale_rows, bwd_p_ds, tile_ops_avx2().transpose};
  return ops;
}

}  // namespace ctxpar::cpu

#pragma GCC diagnostic pop
#pragma GCC pop_options
