// Portable tile operations (any x86-64, or any CPU): the fallback when AVX2+FMA is absent, and
// the semantics the vector versions must match. Written so the compiler can vectorize the
// inner loops with the baseline instruction set.
#include <cmath>

#include "cpu/tile_ops.hpp"
#include "ops.hpp"

namespace ctxpar::cpu {

namespace {

void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
          const float* B, int64_t b_rs, int64_t b_cs16, float* C, int64_t c_rs, bool accumulate) {
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t cb = 0; cb < N / 16; ++cb) {
      float acc[16];
      float* c = C + r * c_rs + cb * 16;
      for (int t = 0; t < 16; ++t) acc[t] = accumulate ? c[t] : 0.f;
      const float* b = B + cb * b_cs16;
      for (int64_t k = 0; k < K; ++k) {
        const float a = A[r * a_rs + k * a_cs];
        for (int t = 0; t < 16; ++t) acc[t] += a * b[k * b_rs + t];
      }
      for (int t = 0; t < 16; ++t) c[t] = acc[t];
    }
  }
}

void softmax_tile(float* S, int64_t rows, int64_t n, int64_t ld, float c, float* m, float* l,
                  float* alpha) {
  for (int64_t r = 0; r < rows; ++r) {
    float* s = S + r * ld;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      s[j] *= c;
      mx = s[j] > mx ? s[j] : mx;
    }
    const float m_new = mx > m[r] ? mx : m[r];
    if (m_new == -INFINITY) {  // nothing visible yet: P = 0, keep O and l
      for (int64_t j = 0; j < n; ++j) s[j] = 0.f;
      alpha[r] = 1.f;
      continue;
    }
    float sum = 0.f;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp2(s[j] - m_new);
      sum += s[j];
    }
    alpha[r] = std::exp2(m[r] - m_new);
    l[r] = l[r] * alpha[r] + sum;
    m[r] = m_new;
  }
}

void scale_rows(float* O, int64_t rows, int64_t n, int64_t ld, const float* alpha) {
  for (int64_t r = 0; r < rows; ++r) {
    if (alpha[r] == 1.f) continue;
    for (int64_t j = 0; j < n; ++j) O[r * ld + j] *= alpha[r];
  }
}

void bwd_p_ds(float* S, float* dP, int64_t rows, int64_t n, int64_t ld, float c, const float* lse2,
              const float* Di, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      const float p = std::exp2(c * S[r * ld + j] - lse2[r]);
      S[r * ld + j] = p;
      dP[r * ld + j] = scale * p * (dP[r * ld + j] - Di[r]);
    }
  }
}

void transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst,
               int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
}

}  // namespace

const TileOps& tile_ops_scalar() {
  static const TileOps ops{"scalar", gemm, softmax_tile, scale_rows, bwd_p_ds, transpose};
  return ops;
}

namespace {
const TileOps* g_forced = nullptr;
}  // namespace

bool avx2_supported() { return int(kernel_isa_widest()) >= int(KernelIsa::avx2); }

bool avx512_supported() { return kernel_isa_widest() == KernelIsa::avx512; }

const TileOps& tile_ops() {
  static const TileOps& chosen = []() -> const TileOps& {
    switch (kernel_isa()) {  // CTXPAR_ISA, else the widest this CPU runs
      case KernelIsa::avx512: return tile_ops_avx512();
      case KernelIsa::avx2: return tile_ops_avx2();
      case KernelIsa::scalar: break;
    }
    return tile_ops_scalar();
  }();
  return g_forced ? *g_forced : chosen;
}

void force_tile_ops(const TileOps* ops) { g_forced = ops; }

}  // namespace ctxpar::cpu
