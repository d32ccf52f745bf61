// AVX2 + FMA tile operations. Every function here carries the avx2/fma target through the
// pragma below, and is only reached through tile_ops() after __builtin_cpu_supports said yes,
// so the rest of the binary stays baseline x86-64. No std:: templates are instantiated after the
// pragma (an inline template compiled for AVX2 could be picked by the linker for baseline code).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "cpu/tile_ops.hpp"

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace ctxpar::cpu {

namespace {

// Micro-kernel: a MR x 16 block of C in 2*MR ymm accumulators; per k one row of B (two vectors)
// and MR broadcasts of A. MR = 6 uses 12 + 2 + 1 of the 16 registers (the classic AVX2 shape);
// 12 FMAs per 8 loads keeps both FMA pipes of Zen3/Haswell busy.
template <int MR>
inline void ukr(int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                int64_t b_rs, float* C, int64_t c_rs, bool accumulate) {
  __m256 c0[MR], c1[MR];
  if (accumulate) {
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      c0[r] = _mm256_loadu_ps(C + r * c_rs);
      c1[r] = _mm256_loadu_ps(C + r * c_rs + 8);
    }
  } else {
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
  }
  const float* a_row[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) a_row[r] = A + r * a_rs;
#pragma GCC unroll 2
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(B), b1 = _mm256_loadu_ps(B + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(a_row[r] + k * a_cs);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
    B += b_rs;
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(C + r * c_rs, c0[r]);
    _mm256_storeu_ps(C + r * c_rs + 8, c1[r]);
  }
}

void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
          const float* B, int64_t b_rs, int64_t b_cs16, float* C, int64_t c_rs, bool accumulate) {
  constexpr int MR = 6;
  // Column blocks outer: one K x 16 slice of B stays in L1 while the rows of A stream past it.
  for (int64_t cb = 0; cb < N / 16; ++cb) {
    const float* b = B + cb * b_cs16;
    float* c = C + cb * 16;
    int64_t r = 0;
    for (; r + MR <= M; r += MR) ukr<MR>(K, A + r * a_rs, a_rs, a_cs, b, b_rs, c + r * c_rs, c_rs, accumulate);
    switch (M - r) {
      case 5: ukr<5>(K, A + r * a_rs, a_rs, a_cs, b, b_rs, c + r * c_rs, c_rs, accumulate); break;
      case 4: ukr<4>(K, A + r * a_rs, a_rs, a_cs, b, b_rs, c + r * c_rs, c_rs, accumulate); break;
      case 3: ukr<3>(K, A + r * a_rs, a_rs, a_cs, b, b_rs, c + r * c_rs, c_rs, accumulate); break;
      case 2: ukr<2>(K, A + r * a_rs, a_rs, a_cs, b, b_rs, c + r * c_rs, c_rs, accumulate); break;
      case 1: ukr<1>(K, A + r * a_rs, a_rs, a_cs, b, b_rs, c + r * c_rs, c_rs, accumulate); break;
      default: break;
    }
  }
}

// 2^x for x <= 128, exactly 0 below -126 (so a masked -inf score gives probability 0 and a
// weight below the smallest normal float is dropped, a relative change under 1e-38).
// x = n + f with n = round(x), |f| <= 1/2; 2^f by its degree-7 Taylor polynomial in f ln 2
// (truncation (ln2/2)^8 / 8! < 3e-9, below float rounding); 2^n built in the exponent field.
inline __m256 exp2_ps(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-126.f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(127.f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.5252733804059840e-05f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381606e-04f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284770e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-02f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

inline float hmax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

void softmax_tile(float* S, int64_t rows, int64_t n, int64_t ld, float c, float* m, float* l,
                  float* alpha) {
  const __m256 vc = _mm256_set1_ps(c);
  for (int64_t r = 0; r < rows; ++r) {
    float* s = S + r * ld;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 8) {
      const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), vc);
      _mm256_storeu_ps(s + j, x);
      vmax = _mm256_max_ps(vmax, x);
    }
    const float mx = hmax(vmax);
    const float m_new = mx > m[r] ? mx : m[r];
    if (m_new == -INFINITY) {  // nothing visible yet: P = 0, keep O and l
      for (int64_t j = 0; j < n; j += 8) _mm256_storeu_ps(s + j, _mm256_setzero_ps());
      alpha[r] = 1.f;
      continue;
    }
    const __m256 vm = _mm256_set1_ps(m_new);
    __m256 vsum0 = _mm256_setzero_ps(), vsum1 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      const __m256 p0 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
      const __m256 p1 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), vm));
      _mm256_storeu_ps(s + j, p0);
      _mm256_storeu_ps(s + j + 8, p1);
      vsum0 = _mm256_add_ps(vsum0, p0);
      vsum1 = _mm256_add_ps(vsum1, p1);
    }
    for (; j < n; j += 8) {
      const __m256 p0 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
      _mm256_storeu_ps(s + j, p0);
      vsum0 = _mm256_add_ps(vsum0, p0);
    }
    alpha[r] = m[r] == -INFINITY ? 0.f : std::exp2(m[r] - m_new);
    l[r] = l[r] * alpha[r] + hsum(_mm256_add_ps(vsum0, vsum1));
    m[r] = m_new;
  }
}

void scale_rows(float* O, int64_t rows, int64_t n, int64_t ld, const float* alpha) {
  for (int64_t r = 0; r < rows; ++r) {
    if (alpha[r] == 1.f) continue;
    const __m256 a = _mm256_set1_ps(alpha[r]);
    float* o = O + r * ld;
    for (int64_t j = 0; j < n; j += 8) _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_loadu_ps(o + j), a));
  }
}

void bwd_p_ds(float* S, float* dP, int64_t rows, int64_t n, int64_t ld, float c, const float* lse2,
              const float* Di, float scale) {
  const __m256 vc = _mm256_set1_ps(c), vscale = _mm256_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r) {
    const __m256 vl = _mm256_set1_ps(lse2[r]), vd = _mm256_set1_ps(Di[r]);
    float* s = S + r * ld;
    float* dp = dP + r * ld;
    for (int64_t j = 0; j < n; j += 8) {
      const __m256 p = exp2_ps(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), vc, vl));
      _mm256_storeu_ps(s + j, p);
      const __m256 ds = _mm256_mul_ps(_mm256_mul_ps(p, vscale), _mm256_sub_ps(_mm256_loadu_ps(dp + j), vd));
      _mm256_storeu_ps(dp + j, ds);
    }
  }
}

// 8 x 8 blocks transposed in registers (unpack, shuffle, 128-bit lane permute); edges scalar.
void transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst,
               int64_t ld_dst) {
  int64_t r0 = 0;
  for (; r0 + 8 <= rows; r0 += 8) {
    int64_t c0 = 0;
    for (; c0 + 8 <= cols; c0 += 8) {
      const float* s = src + r0 * ld_src + c0;
      const __m256 a0 = _mm256_loadu_ps(s), a1 = _mm256_loadu_ps(s + ld_src),
                   a2 = _mm256_loadu_ps(s + 2 * ld_src), a3 = _mm256_loadu_ps(s + 3 * ld_src),
                   a4 = _mm256_loadu_ps(s + 4 * ld_src), a5 = _mm256_loadu_ps(s + 5 * ld_src),
                   a6 = _mm256_loadu_ps(s + 6 * ld_src), a7 = _mm256_loadu_ps(s + 7 * ld_src);
      const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1),
                   t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3),
                   t4 = _mm256_unpacklo_ps(a4, a5), t5 = _mm256_unpackhi_ps(a4, a5),
                   t6 = _mm256_unpacklo_ps(a6, a7), t7 = _mm256_unpackhi_ps(a6, a7);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                   u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                   u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                   u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* d = dst + c0 * ld_dst + r0;
      _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_storeu_ps(d + ld_dst, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_storeu_ps(d + 2 * ld_dst, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_storeu_ps(d + 3 * ld_dst, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_storeu_ps(d + 4 * ld_dst, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_storeu_ps(d + 5 * ld_dst, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_storeu_ps(d + 6 * ld_dst, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_storeu_ps(d + 7 * ld_dst, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
    for (int64_t r = r0; r < r0 + 8; ++r)
      for (int64_t c = c0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
  }
  for (int64_t r = r0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
}

}  // namespace

const TileOps& tile_ops_avx2() {
  static const TileOps ops{"avx2+fma", gemm, softmax_tile, scale_rows, bwd_p_ds, transpose};
  return ops;
}

}  // namespace ctxpar::cpu

#pragma GCC pop_options
