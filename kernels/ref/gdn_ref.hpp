// The readable reference of the Gated DeltaNet op of kernels/ops.hpp (gdn_fwd, gdn_bwd): the plain
// recurrence, one token at a time, templated on the arithmetic type (double is the spec; float is
// the naive fp32 implementation whose error sets the tolerance of the chunked kernel,
// tests/README.md). Per head, with the state S [Dv, Dk] (S_0 = s0, or 0):
//   u_t = v_t - a_t S_{t-1} k_t,    S_t = a_t S_{t-1} + b_t u_t k_t^T,    o_t = scale S_t q_t
// which is S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T with a_t = exp(g_t), b_t = beta_t.
// Layouts as GdnParams: q, k [T, H, Dk]; v, o [T, H, Dv]; g, beta [T, H]; states [H, Dv, Dk].
#pragma once
#include <cstdint>

namespace ctxpar::ref {

// s0 may be null (zero state), s_out may be null. doc [T] (may be null: one document): where the id
// changes, the state restarts from zero (packed documents).
template <class T>
void gdn_fwd(int64_t Tn, int32_t H, int32_t Dk, int32_t Dv, T scale, const T* q, const T* k, const T* v,
             const T* g, const T* beta, const int32_t* doc, const T* s0, T* o, T* s_out);

// Gradients of L = sum(d_o * o) + sum(ds_out * s_out) (ds_out may be null: 0). dq, dk, dv, dg,
// dbeta are OVERWRITTEN; ds0 (may be null) receives dL/ds0. Recomputes the states forward.
template <class T>
void gdn_bwd(int64_t Tn, int32_t H, int32_t Dk, int32_t Dv, T scale, const T* q, const T* k, const T* v,
             const T* g, const T* beta, const int32_t* doc, const T* s0, const T* d_o, const T* ds_out, T* dq, T* dk,
             T* dv, T* dg,
             T* dbeta, T* ds0);

}  // namespace ctxpar::ref
