// The readable reference of every attention op: the spec the fast paths are judged against.
// Plain loops, one query row at a time, templated on the arithmetic type so that tests can run
// it in double (the reference) and in float (the "naive fp32 implementation" whose error sets
// the tolerance, see tests/README.md). Shapes, masks and the scale come from AttnParams; the
// tensors are passed separately in type T (AttnParams' own pointers are ignored).
#pragma once
#include <cstdint>

#include "attn_params.hpp"

namespace ctxpar::ref {

// o [S_q, H_q, D], lse [S_q, H_q] overwritten. Row with no visible key: o = 0, lse = -inf.
template <class T>
void attn_fwd(const AttnParams& p, const T* q, const T* k, const T* v, T* o, T* lse);

// dq, dk, dv ACCUMULATED (+=) from dout, o, lse (probabilities recomputed from lse).
template <class T>
void attn_bwd(const AttnParams& p, const T* q, const T* k, const T* v, const T* o, const T* lse,
              const T* dout, T* dq, T* dk, T* dv);

// (o, lse) <- merge of (o, lse) and (o_b, lse_b), see kernels/ops.hpp.
template <class T>
void lse_merge(T* o, T* lse, const T* o_b, const T* lse_b, int64_t rows, int32_t H, int32_t D);

}  // namespace ctxpar::ref
