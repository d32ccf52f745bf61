// Backend-neutral op signatures. kernels/ref/ is the readable fp64 spec of each op;
// kernels/cpu/ is the fast path (OpenMP, SIMD, a measured GEMM library). Tests judge the fast
// path against the reference.
#pragma once
#include <cstdint>

#include "attn_params.hpp"

namespace ctxpar {

// O and LSE of softmax(scale * Q K^T + mask) V. Rows that see no key: O = 0, LSE = -inf.
// Tiles with no visible pair are skipped (work proportional to visible pairs).
void attn_fwd(const AttnParams& p);

// dQ += , dK += , dV += from dout, O and LSE (probabilities recomputed from LSE, as in
// FlashAttention-2). Under GQA dK/dV sum over the query heads of a group.
void attn_bwd(const AttnParams& p);

// Merges a partial result (o_b, lse_b) over a disjoint key set into (o, lse), in place:
//   lse = m + log(exp(lse - m) + exp(lse_b - m)),  o = exp(lse_a - lse) o + exp(lse_b - lse) o_b
// with m = max(lse, lse_b); exact for -inf rows (never NaN). o, o_b [rows, H, D]; lse [rows, H].
void lse_merge(float* o, float* lse, const float* o_b, const float* lse_b, int64_t rows, int32_t H,
               int32_t D);

// Row-major single-precision GEMM: C = alpha * op(A) op(B) + beta * C, op = transpose when
// trans_*; A is [M,K] (or [K,M]), B is [K,N] (or [N,K]); leading dimensions in elements.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Name and version of the GEMM library linked (for provenance).
const char* blas_name();

// FLOP convention (DESIGN.md §3), for every table and trace: attention forward counts
// 4 * H_q * D per visible (q, k) pair; backward counts 2.5x forward; matmul 2*m*n*k.
constexpr const char* kFlopConvention =
    "attn fwd = 4*H_q*D per visible (q,k) pair; attn bwd = 2.5 x fwd; matmul = 2*m*n*k";
// Number of visible (q, k) pairs of a call (the attention FLOP count's basis).
int64_t visible_pairs(const AttnParams& p);

}  // namespace ctxpar
