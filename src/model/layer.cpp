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
  r.num->rmsnorm_bwd(r, dy, x, w, rstd, dx, dw, rows, dim);
}

void layer_gemm(const LayerRun& r, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const double t0 = now_s();
  {
    Tracer::Scope sc(r.tr, Phase::gemm, layer_of(r), -1, matmul_flops(double(M), double(N), double(K)), 0);
    if (r.dev == Device::cpu) {
      r.num->gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
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
  r.num->tp_sum(r, n, N, terms, out);
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
