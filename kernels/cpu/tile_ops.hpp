// Tile-level building blocks of the CPU flash kernels, one implementation per instruction set
// (tile_ops_avx512.cpp, tile_ops_avx2.cpp, tile_ops_scalar.cpp), chosen once at run time by
// tile_ops() from what the CPU reports (__builtin_cpu_supports), so one binary runs on any
// x86-64 and at full speed on AVX-512 and AVX2+FMA machines with no environment variable;
// CTXPAR_ISA=scalar|avx2|avx512 forces one (kernel_isa(), kernels/ops.hpp) to test every path.
#pragma once
#include <cstdint>

namespace ctxpar::cpu {

struct TileOps {
  const char* isa;
  // C[M, N] (+)= A[M, K] B[K, N], N a multiple of 16.
  //   A(r, k) = A[r * a_rs + k * a_cs]   (covers A, and A^T with a_rs = 1)
  //   B(k, c) = B[k * b_rs + (c / 16) * b_cs16 + c % 16]   (row-major rows, or 16-wide panels)
  //   C(r, c) = C[r * c_rs + c]; accumulate: C += ..., else C = ...
  void (*gemm)(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
               const float* B, int64_t b_rs, int64_t b_cs16, float* C, int64_t c_rs,
               bool accumulate);
  // Online softmax step on a tile of raw scores S[rows, n] (row stride ld, n a multiple of 16;
  // masked entries are -inf), in base 2: x = c * S; m_new = max(m, max_j x_j);
  // S <- 2^(x - m_new) (the probabilities P); alpha = 2^(m - m_new); l <- alpha l + sum_j P;
  // m <- m_new. A row still without any visible key keeps m = -inf, gets P = 0 and alpha = 1.
  void (*softmax_tile)(float* S, int64_t rows, int64_t n, int64_t ld, float c, float* m, float* l,
                       float* alpha);
  // O[r, 0:n] *= alpha[r] for rows with alpha != 1 (n a multiple of 8).
  void (*scale_rows)(float* O, int64_t rows, int64_t n, int64_t ld, const float* alpha);
  // Backward tile: S <- P = 2^(c S - lse2[r]); dP <- dS = scale * P (dP - Di[r]).
  // lse2 = +inf for a row that sees no key (then P = 0).
  void (*bwd_p_ds)(float* S, float* dP, int64_t rows, int64_t n, int64_t ld, float c,
                   const float* lse2, const float* Di, float scale);
  // dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols.
  void (*transpose)(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst,
                    int64_t ld_dst);
};

const TileOps& tile_ops_scalar();
const TileOps& tile_ops_avx2();    // call only where avx2_supported()
const TileOps& tile_ops_avx512();  // call only where avx512_supported()
bool avx2_supported();    // AVX2 and FMA
bool avx512_supported();  // AVX-512 F, DQ, BW and VL
// The set of kernel_isa(): the fastest this CPU supports, or CTXPAR_ISA's (or the one forced below).
const TileOps& tile_ops();
// Tests only: make tile_ops() return `ops` (nullptr restores the automatic choice), so the
// scalar fallback can be run end to end on an AVX2 machine. Not thread-safe; call between ops.
void force_tile_ops(const TileOps* ops);

}  // namespace ctxpar::cpu
