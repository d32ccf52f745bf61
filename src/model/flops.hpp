// The FLOP convention, stated once for every table, trace, bench, the cost model and the engine:
//   attention forward  4 * H_q * D per visible (q, k) pair (two matmuls of 2 FLOPs per MAC);
//   attention backward 2.5 x forward (dS, dP, dV, dQ, dK: five products of the forward's two);
//   matmul             2 * m * n * k.
// Visible pairs come from the one counter, visible_pairs() (kernels/ops.hpp), or, for a whole
// causal sequence, from its closed forms below (tested against the counter). MFU counts model
// FLOPs: recompute is not counted. The primitives are header-only (no dependencies), so every
// module states FLOPs through them.
#pragma once
#include <cstdint>
#include <vector>

namespace ctxpar {

constexpr const char* kFlopConvention =
    "attn fwd = 4*H_q*D per visible (q,k) pair (MLA: 2*H*(Dqk+Dv)); attn bwd = 2.5 x fwd; matmul = 2*m*n*k; "
    "GDN fwd = chunked-form GEMMs, bwd = 2 x fwd";
constexpr double kAttnBwdFactor = 2.5;

inline double attn_fwd_flops(double pairs, double H_q, double D) { return 4.0 * pairs * H_q * D; }
inline double attn_bwd_flops(double pairs, double H_q, double D) { return kAttnBwdFactor * attn_fwd_flops(pairs, H_q, D); }
// Forward + backward of one attention: (1 + 2.5) x forward.
inline double attn_train_flops(double pairs, double H_q, double D) { return (1.0 + kAttnBwdFactor) * attn_fwd_flops(pairs, H_q, D); }
inline double matmul_flops(double m, double n, double k) { return 2.0 * m * n * k; }
// Gated DeltaNet forward (kernels/ops.hpp gdn_fwd), the GEMMs of its chunked form per token and head
// with chunk C: K K^T and Q K^T (2 C Dk each), the triangular solve (C (Dk + Dv)), Pb Wk (2 C Dk),
// Pb Uv (2 C Dv) and the state pass (3 x 2 Dk Dv). The backward counts 2 x the forward. No chunk
// is longer than the call (C = min(chunk, T)); where documents or CP pieces cut chunks shorter
// still, this is an upper bound.
inline double gdn_fwd_flops(double T, double H, double Dk, double Dv, double C) {
  const double c = C < T ? C : T;
  return T * H * (c * (7 * Dk + 3 * Dv) + 6 * Dk * Dv);
}

// Closed forms of the visible-pair count of causal attention on contiguous positions:
//   packed documents of lengths L_i: sum_i L_i (L_i + 1) / 2;
//   T new tokens after `cached` ones (a partial prefill): T * cached + T (T + 1) / 2.
double causal_visible_pairs(const std::vector<int64_t>& doc_lengths);
double partial_prefill_pairs(int64_t T, int64_t cached);
// The same under a sliding window of W tokens (a query sees min(its position + 1, W) keys of its
// document): sum_i f(L_i), f(n) = n (n + 1) / 2 for n <= W, W (W + 1) / 2 + (n - W) W above;
// a prefill: f(cached + T) - f(cached).
double window_visible_pairs(const std::vector<int64_t>& doc_lengths, int64_t W);
double window_prefill_pairs(int64_t T, int64_t cached, int64_t W);

struct ModelDims;
class Comm;

// Model FLOPs of the Llama-style decoder (model/model.hpp), every tp slice together:
// forward+backward of the projections, MLP and LM head of S tokens (3 x forward: dX and dW);
// of the attention: `causal_pairs` visible pairs in every global attention layer, `window_pairs`
// in every local (sliding-window) one.
double train_matmul_flops(const ModelDims& d, int64_t S);
double train_attn_flops(const ModelDims& d, double causal_pairs, double window_pairs);
// The token mixers of the GDN layers of a hybrid model (model/gdn_layer.hpp), forward+backward of
// S tokens: the recurrence (3 x gdn_fwd_flops) and the short convolutions (3 x 2 conv C per token);
// their projections are in train_matmul_flops.
double train_gdn_flops(const ModelDims& d, int64_t S);
// Inference: a prefill of T new tokens after `cached` ones, for one sequence (the projections and
// MLP of T tokens, the attention of partial_prefill_pairs(T, cached) pairs (a local layer's
// window_prefill_pairs), one LM-head row; a GDN
// layer's projections, recurrence (gdn_fwd_flops) and convolution instead of the attention); a
// decode token at context length `ctx` (before it) is prefill_flops(d, 1, ctx).
double prefill_flops(const ModelDims& d, int64_t T, int64_t cached);

// Peak FLOP/s one rank reaches on large sgemm calls while every rank of `world` runs the same
// measurement (so ranks sharing cores see their share): after a warm-up of 0.1 s, the best
// 1024^3 product over at least 0.2 s (4 calls at least), the largest over ranks (conservative for
// MFU). Collective.
double measure_sgemm_peak_flops(Comm& world);

// The nominal peak FLOP/s of one core, fixed for a machine rather than a run: the FMA-loop rate of
// the widest instruction set (as `bench peak`), measured by world rank 0 while the other ranks
// sleep (so no rank of the job shares its core), best of 6 loops, sent to every rank. MFU's
// denominator on the CPU is this times a rank's threads. Collective.
double measure_core_peak_flops(Comm& world);

}  // namespace ctxpar
