#include "model/layer.hpp"

#include <chrono>
#include <span>

#include "dist/topology.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"
#include "core/clock.hpp"

namespace ctxpar {

namespace {
int32_t layer_of(const LayerRun& r) { return int32_t(r.layer); }
// The residual connection: y += x over n elements.
void add_residual(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
}  // namespace

void layer_gemm(const LayerRun& r, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const double t0 = now_s();
  {
    Tracer::Scope sc(r.tr, Phase::gemm, layer_of(r), -1, matmul_flops(double(M), double(N), double(K)), 0);
    sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  }
  r.times.gemm_s += now_s() - t0;
}

void layer_tp_all_reduce(const LayerRun& r, float* x, int64_t n) {
  if (r.d.tp == 1) return;
  const double t0 = now_s();
  {
    Tracer::Scope sc(r.tr, Phase::all_reduce, layer_of(r), -1, 0, double(n) * 4);
    r.topo.axis(Axis::tp).all_reduce(std::span<float>(x, size_t(n)));
  }
  const double dt = now_s() - t0;
  r.times.tp_comm_s += dt;
  r.st.exposed_comm_s += dt;  // a blocking collective: nothing overlaps it
}

void attn_in_fwd(const LayerRun& r, const LayerView& w, int64_t n, const float* x, const float* cos_t,
                 const float* sin_t, float* h, float* rstd, float* q, float* k, float* v) {
  const ModelDims& d = r.d;
  const int64_t dim = d.dim, qw = d.q_width(), kw = d.kv_width();
  {
    Tracer::Scope sc(r.tr, Phase::norm, layer_of(r), -1, 0, 0);
    rmsnorm_fwd(x, w.attn_norm, h, rstd, n, dim, d.norm_eps);
  }
  layer_gemm(r, false, false, n, qw, dim, h, dim, w.wq, qw, 0, q, qw);
  layer_gemm(r, false, false, n, kw, dim, h, dim, w.wk, kw, 0, k, kw);
  layer_gemm(r, false, false, n, kw, dim, h, dim, w.wv, kw, 0, v, kw);
  Tracer::Scope sc(r.tr, Phase::rope, layer_of(r), -1, 0, 0);
  rope_apply(q, n, d.H_q_loc(), d.D, cos_t, sin_t, false);
  rope_apply(k, n, d.H_kv_loc(), d.D, cos_t, sin_t, false);
}

void attn_out_fwd(const LayerRun& r, const LayerView& w, int64_t n, const float* x, const float* o, float* x1) {
  const int64_t dim = r.d.dim, qw = r.d.q_width();
  layer_gemm(r, false, false, n, dim, qw, o, qw, w.wo, dim, 0, x1, dim);
  layer_tp_all_reduce(r, x1, n * dim);
  add_residual(x1, x, n * dim);
}

void mlp_fwd(const LayerRun& r, const LayerView& w, int64_t n, const float* x1, float* h2, float* rstd2, float* g,
             float* u, float* m, float* x_out) {
  const int64_t dim = r.d.dim, F = r.d.ffn_loc();
  {
    Tracer::Scope sc(r.tr, Phase::norm, layer_of(r), -1, 0, 0);
    rmsnorm_fwd(x1, w.mlp_norm, h2, rstd2, n, dim, r.d.norm_eps);
  }
  layer_gemm(r, false, false, n, F, dim, h2, dim, w.w1, F, 0, g, F);
  layer_gemm(r, false, false, n, F, dim, h2, dim, w.w3, F, 0, u, F);
  {
    Tracer::Scope sc(r.tr, Phase::mlp, layer_of(r), -1, 0, 0);
    swiglu_fwd(g, u, m, n * F);
  }
  if (!x_out) return;
  layer_gemm(r, false, false, n, dim, F, m, F, w.w2, dim, 0, x_out, dim);
  layer_tp_all_reduce(r, x_out, n * dim);
  add_residual(x_out, x1, n * dim);
}

}  // namespace ctxpar
