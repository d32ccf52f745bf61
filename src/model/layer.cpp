#include "model/layer.hpp"

#include <chrono>
#include <span>

#include "dist/topology.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"
#include "core/clock.hpp"
#include "core/error.hpp"

namespace ctxpar {

namespace {
int32_t layer_of(const LayerRun& r) { return int32_t(r.layer); }

// A GEMM operand in bf16 on the GPU: the weights' copy, or the fp32 activation rounded into
// `scratch` (stream-ordered, freed by the caller). `rows` x `cols` with leading dimension ld.
const uint16_t* bf16_operand(const LayerRun& r, const float* x, int64_t rows, int64_t cols, int64_t ld,
                             uint16_t** scratch) {
  if (r.weights)
    if (const uint16_t* w = r.weights->of(x)) return w;
  const int64_t n = rows == 0 ? 0 : (rows - 1) * ld + cols;
  *scratch = static_cast<uint16_t*>(device_alloc(size_t(n) * sizeof(uint16_t), r.dev, r.stream));
  f32_to_bf16(x, *scratch, n, r.dev, r.stream);
  return *scratch;
}
}  // namespace

void layer_add_residual(const LayerRun& r, float* y, const float* x, int64_t n) { add_f32(y, x, n, r.dev, r.stream); }

void layer_rmsnorm_bwd(const LayerRun& r, const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                       float* dw, int64_t rows, int64_t dim) {
  if (!r.exact) return rmsnorm_bwd(dy, x, w, rstd, dx, dw, rows, dim, r.dev, r.stream);
  const int64_t off = r.exact->offset(dw);
  *r.exact->bad += rmsnorm_bwd_exact(dy, x, w, rstd, dx, r.exact->hi + off, r.exact->lo + off, rows, dim);
}

int64_t ExactGrads::offset(const float* g) const {
  CTXPAR_CHECK(g >= grads && g < grads + n, "deterministic: a weight gradient outside the gradient buffer");
  return g - grads;
}

namespace {
// deterministic=true: the GEMM in blocks of e.block rows (layer.hpp ExactGrads).
void exact_gemm(const ExactGrads& e, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t G = e.block;
  if (!ta) {  // rows of C are rows of A: a path whose rows do not depend on M, or G rows per call
    if (sgemm_rows_fixed(false, tb, M, N, K, A, lda, B, ldb, beta, C, ldc)) return;
    CTXPAR_CHECK(M % G == 0, "deterministic: a GEMM of " << M << " rows, not whole blocks of " << G);
    for (int64_t i = 0; i < M; i += G) sgemm(false, tb, G, N, K, 1.0f, A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc);
    return;
  }
  // a weight gradient C += A^T B summed over K token rows: each block's product, added exactly
  CTXPAR_CHECK(!tb && beta == 1.0f && K % G == 0,
               "deterministic: a weight gradient of " << M << " x " << N << " over " << K << " rows (block " << G
                                                       << ", beta " << beta << ")");
  const int64_t off = e.offset(C);
  *e.bad += gemm_tn_exact(M, N, K, G, A, lda, B, ldb, e.hi + off, e.lo + off, ldc);
}
}  // namespace

void layer_gemm(const LayerRun& r, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const double t0 = now_s();
  {
    Tracer::Scope sc(r.tr, Phase::gemm, layer_of(r), -1, matmul_flops(double(M), double(N), double(K)), 0);
    if (r.exact) {
      exact_gemm(*r.exact, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    } else if (r.dev == Device::cpu) {
      sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    } else {
      uint16_t *sa = nullptr, *sb = nullptr;
      const uint16_t* a = bf16_operand(r, A, ta ? K : M, ta ? M : K, lda, &sa);
      const uint16_t* b = bf16_operand(r, B, tb ? N : K, tb ? K : N, ldb, &sb);
      gemm(ta, tb, M, N, K, 1.0f, a, DType::bf16, lda, b, DType::bf16, ldb, beta, C, DType::f32, ldc, r.dev, r.stream);
      device_free(sa, r.dev, r.stream);
      device_free(sb, r.dev, r.stream);
    }
  }
  r.times.gemm_s += now_s() - t0;
}

void layer_tp_all_reduce(const LayerRun& r, float* x, int64_t n) {
  if (r.d.tp == 1) return;
  const double t0 = now_s();
  {
    Tracer::Scope sc(r.tr, Phase::all_reduce, layer_of(r), -1, 0, double(n) * 4);
    r.topo.axis(Axis::tp).all_reduce(buf_at(x, size_t(n), r.dev));
  }
  const double dt = now_s() - t0;
  r.times.tp_comm_s += dt;
  r.st.exposed_comm_s += dt;  // a blocking collective: nothing overlaps it
}

void layer_tp_sum(const LayerRun& r, int64_t n, int64_t N, std::initializer_list<TpTerm> terms, float* out) {
  if (!r.exact || r.exact->units == 1) {  // one part (tp = 1): its exact sum is the product itself
    bool first = true;
    for (const TpTerm& t : terms) {
      layer_gemm(r, false, t.tb, n, N, t.K, t.A, t.lda, t.B, t.ldb, first ? 0.f : 1.f, out, N);
      first = false;
    }
    return layer_tp_all_reduce(r, out, n * N);
  }
  const ExactGrads& e = *r.exact;
  CTXPAR_CHECK(e.units % r.d.tp == 0 && e.sum_hi && e.sum_lo && e.part,
               "deterministic: tp:" << r.d.tp << " does not divide the " << e.units << " parts of the tp sums");
  const int64_t parts = e.units / r.d.tp, elems = n * N;
  CTXPAR_CHECK(elems <= e.sum_cap, "deterministic: a tp sum of " << n << " x " << N << " beyond its scratch of " << e.sum_cap);
  for (const TpTerm& t : terms)
    CTXPAR_CHECK(t.kv || t.K % parts == 0, "deterministic: a tp share of " << t.K << " in " << parts << " parts");
  // A K/V term's heads go whole to the part that holds their group's first query head: this
  // rank's K/V heads [a, b) (local) in global part `gp`, none (a == b) on the other copies of a
  // replicated head and in the parts after a group's first.
  const int64_t G = r.d.H_q / r.d.H_kv, per = r.d.H_q / e.units;  // query heads of a group, of a part
  auto kv_heads_in = [&](int64_t gp) {
    int64_t a = 0, b = 0;
    for (int64_t i = 0; i < r.d.H_kv_loc(); ++i)
      if ((r.d.kv_head0() + i) * G / per == gp) {
        if (a == b) a = i;
        b = i + 1;
      }
    return std::pair<int64_t, int64_t>(a, b);
  };
  std::fill_n(e.sum_hi, size_t(elems + 1), int64_t(0));
  std::fill_n(e.sum_lo, size_t(elems + 1), int64_t(0));
  int64_t bad = 0;
  for (int64_t u = 0; u < parts; ++u) {
    bool first = true;
    for (const TpTerm& t : terms) {
      int64_t k0 = u * (t.K / parts), Kc = t.K / parts;
      if (t.kv) {
        const auto [a, b] = kv_heads_in(r.d.tp_rank * parts + u);
        k0 = a * r.d.D;
        Kc = (b - a) * r.d.D;
        if (Kc == 0) continue;
      }
      const float* B = t.tb ? t.B + k0 : t.B + k0 * t.ldb;
      layer_gemm(r, false, t.tb, n, N, Kc, t.A + k0, t.lda, B, t.ldb, first ? 0.f : 1.f, e.part, N);
      first = false;
    }
    bad += exact_add(e.part, n, N, N, e.sum_hi, e.sum_lo, N);
  }
  e.sum_hi[elems] = bad;  // summed over tp with the rest: every tp rank sees every part's range
  if (r.d.tp > 1) {
    const double t0 = now_s();
    {
      Tracer::Scope sc(r.tr, Phase::all_reduce, layer_of(r), -1, 0, double(elems) * 16);
      r.topo.axis(Axis::tp).all_reduce(std::span<int64_t>(e.sum_hi, size_t(elems + 1)));
      r.topo.axis(Axis::tp).all_reduce(std::span<int64_t>(e.sum_lo, size_t(elems)));
    }
    const double dt = now_s() - t0;
    r.times.tp_comm_s += dt;
    r.st.exposed_comm_s += dt;
  }
  *e.bad += e.sum_hi[elems];
  exact_to_float(e.sum_hi, e.sum_lo, out, elems);
}

void attn_in_fwd(const LayerRun& r, const LayerView& w, int64_t n, const float* x, const float* cos_t,
                 const float* sin_t, float* h, float* rstd, float* q, float* k, float* v) {
  const ModelDims& d = r.d;
  const int64_t dim = d.dim, qw = d.q_width(), kw = d.kv_width();
  {
    Tracer::Scope sc(r.tr, Phase::norm, layer_of(r), -1, 0, 0);
    rmsnorm_fwd(x, w.attn_norm, h, rstd, n, dim, d.norm_eps, r.dev, r.stream);
  }
  layer_gemm(r, false, false, n, qw, dim, h, dim, w.wq, qw, 0, q, qw);
  layer_gemm(r, false, false, n, kw, dim, h, dim, w.wk, kw, 0, k, kw);
  layer_gemm(r, false, false, n, kw, dim, h, dim, w.wv, kw, 0, v, kw);
  Tracer::Scope sc(r.tr, Phase::rope, layer_of(r), -1, 0, 0);
  rope_apply(q, n, d.H_q_loc(), d.D, cos_t, sin_t, false, r.dev, r.stream);
  rope_apply(k, n, d.H_kv_loc(), d.D, cos_t, sin_t, false, r.dev, r.stream);
}

void attn_out_fwd(const LayerRun& r, const LayerView& w, int64_t n, const float* x, const float* o, float* x1) {
  const int64_t dim = r.d.dim, qw = r.d.q_width();
  layer_tp_sum(r, n, dim, {{o, qw, w.wo, dim, false, qw}}, x1);
  layer_add_residual(r, x1, x, n * dim);
}

void mlp_fwd(const LayerRun& r, const LayerView& w, int64_t n, const float* x1, float* h2, float* rstd2, float* g,
             float* u, float* m, float* x_out) {
  const int64_t dim = r.d.dim, F = r.d.ffn_loc();
  {
    Tracer::Scope sc(r.tr, Phase::norm, layer_of(r), -1, 0, 0);
    rmsnorm_fwd(x1, w.mlp_norm, h2, rstd2, n, dim, r.d.norm_eps, r.dev, r.stream);
  }
  layer_gemm(r, false, false, n, F, dim, h2, dim, w.w1, F, 0, g, F);
  layer_gemm(r, false, false, n, F, dim, h2, dim, w.w3, F, 0, u, F);
  {
    Tracer::Scope sc(r.tr, Phase::mlp, layer_of(r), -1, 0, 0);
    swiglu_fwd(g, u, m, n * F, r.dev, r.stream);
  }
  if (!x_out) return;
  layer_tp_sum(r, n, dim, {{m, F, w.w2, dim, false, F}}, x_out);
  layer_add_residual(r, x_out, x1, n * dim);
}

}  // namespace ctxpar
