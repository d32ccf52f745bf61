// The readable reference of the model ops of kernels/ops.hpp ("model ops (training)"): plain
// loops, one row at a time, templated on the arithmetic type so tests run it in double (the
// reference) and in float (the naive fp32 implementation whose error sets the tolerance,
// tests/README.md). Semantics (accumulate vs overwrite) are exactly those of ops.hpp.
#pragma once
#include <cstdint>

namespace ctxpar::ref {

template <class T>
void rmsnorm_fwd(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t dim, T eps);
template <class T>
void rmsnorm_bwd(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t rows, int64_t dim);

// Angles pos * inv_freq (inv_freq from ctxpar::rope_inv_freq), applied directly (no table).
template <class T>
void rope_apply(T* x, int64_t rows, int32_t H, int32_t D, const int64_t* pos, const double* inv_freq, bool inverse);

template <class T> void swiglu_fwd(const T* g, const T* u, T* h, int64_t n);
template <class T> void swiglu_bwd(const T* dh, const T* g, const T* u, T* dg, T* du, int64_t n);

template <class T>
double cross_entropy_fwd_bwd(const T* logits, const int32_t* labels, int64_t rows, int64_t V, T grad_scale, T* dlogits);

template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, double lr, double beta1, double beta2, double eps,
                  double weight_decay, double grad_scale, int64_t step);

}  // namespace ctxpar::ref
