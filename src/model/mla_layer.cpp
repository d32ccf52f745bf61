#include "model/mla_layer.hpp"

#include <algorithm>
#include <cstring>

#include "core/clock.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

namespace {

// RoPE on the last `rope` dims of each head of x [S, H, D] (in place), through a packed copy.
void rope_tail(const ModelDims& d, float* x, int64_t S, float* buf, const float* cos_t, const float* sin_t,
               bool inverse) {
  const int64_t H = d.H_q_loc(), D = d.D, R = d.rope, nope = d.nope;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < S * H; ++i) std::memcpy(buf + i * R, x + i * D + nope, size_t(R) * sizeof(float));
  rope_apply(buf, S, int32_t(H), int32_t(R), cos_t, sin_t, inverse);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < S * H; ++i) std::memcpy(x + i * D + nope, buf + i * R, size_t(R) * sizeof(float));
}

// o_v [S, H*v_dim]: the first v_dim columns of each head of the attention output o [S, H*D]
// (the rest is the padding of V), packed into the scratch.
const float* value_columns(const ModelDims& d, const float* o, int64_t S, MlaScratch& s) {
  const int64_t H = d.H_q_loc(), D = d.D, V = d.v_dim;
  float* ov = s.ov.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < S * H; ++i) std::memcpy(ov + i * V, o + i * D, size_t(V) * sizeof(float));
  return ov;
}

// x1 = x + o_v Wo from the value columns o_v [S, H*v_dim] (summed over tp: each rank's heads).
void out_projection(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* ov, float* x1) {
  const int64_t dim = r.d.dim, ow = r.d.o_width();
  layer_tp_sum(r, S, dim, {{ov, ow, w.wo, dim, false, ow}}, x1);  // exact numerics: in fixed parts
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < S * dim; ++i) x1[i] += x[i];
}

}  // namespace

void mla_alloc(const ModelDims& d, int64_t S, MlaActs& a) {
  const size_t n = size_t(S);
  if (d.q_lora > 0) {
    a.cq_raw.resize(n * size_t(d.q_lora), false);
    a.cq_rstd.resize(n, false);
    a.cq.resize(n * size_t(d.q_lora), false);
  }
  a.c_raw.resize(n * size_t(d.kv_lora), false);
  a.c_rstd.resize(n, false);
  a.lat.resize(n * size_t(d.kv_lora + d.rope), false);
}

double mla_acts_bytes(const ModelDims& d, int64_t S) {
  return 4.0 * double(S) * (2.0 * d.q_lora + (d.q_lora > 0 ? 1 : 0) + 2.0 * d.kv_lora + d.rope + 1);
}

void mla_alloc(const ModelDims& d, int64_t S, MlaScratch& s) {
  const size_t n = size_t(S), H = size_t(d.H_q_loc()), W = size_t(d.kv_lora + d.rope);
  s.kpe.resize(n * size_t(d.rope), false);
  s.rope.resize(n * H * size_t(d.rope), false);
  s.ov.resize(n * H * size_t(d.v_dim), false);
  s.dov.resize(n * H * size_t(d.v_dim), false);
  s.dlat.resize(n * W, false);
  s.dc.resize(n * size_t(d.kv_lora), false);
  s.dc_raw.resize(n * size_t(d.kv_lora), false);
  s.dkpe.resize(n * size_t(d.rope), false);
  if (d.q_lora > 0) {
    s.dcq.resize(n * size_t(d.q_lora), false);
    s.dcq_raw.resize(n * size_t(d.q_lora), false);
  }
}

// With the expander's [S, H (nope + v)] for the own rows (a strategy's visiting blocks are its own).
double mla_scratch_bytes(const ModelDims& d, int64_t S) {
  const double H = d.H_q_loc(), W = d.kv_lora + d.rope;
  return 4.0 * double(S) *
         (2.0 * d.rope + H * d.rope + 2.0 * H * d.v_dim + W + 2.0 * d.kv_lora + 2.0 * d.q_lora + H * (d.nope + d.v_dim));
}

void MlaExpander::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                       int64_t ldb, float beta, float* C, int64_t ldc) const {
  if (run_) return layer_gemm(*run_, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
  const double t0 = now_s();
  {
    Tracer::Scope sc(tr_, Phase::gemm, int32_t(layer_), -1, matmul_flops(double(M), double(N), double(K)), 0);
    sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  }
  if (times_) times_->gemm_s += now_s() - t0;
}

void MlaExpander::expand(const float* lat, int64_t rows, float* k, float* v) {
  const int64_t H = d_.H_q_loc(), D = d_.D, kl = d_.kv_lora, R = d_.rope, W = kl + R;
  const int64_t nope = d_.nope, V = d_.v_dim, kvb = H * (nope + V);
  if (kvb_.size() < size_t(rows * kvb)) kvb_.resize(size_t(rows * kvb), false);
  gemm(false, false, rows, kvb, kl, lat, W, w_->wkv_b, kvb, 0, kvb_.data(), kvb);  // [k_nope | v] = c Wkv_b
  const float* kv = kvb_.data();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t hh = 0; hh < H; ++hh) {
      const float* src = kv + (t * H + hh) * (nope + V);
      float* kr = k + (t * H + hh) * D;
      float* vr = v + (t * H + hh) * D;
      std::memcpy(kr, src, size_t(nope) * sizeof(float));
      std::memcpy(kr + nope, lat + t * W + kl, size_t(R) * sizeof(float));
      std::memcpy(vr, src + nope, size_t(V) * sizeof(float));
      std::fill(vr + V, vr + D, 0.0f);
    }
}

void MlaExpander::backward(const float* lat, int64_t rows, const float* dk, const float* dv, float* dlat) {
  const int64_t H = d_.H_q_loc(), D = d_.D, kl = d_.kv_lora, R = d_.rope, W = kl + R;
  const int64_t nope = d_.nope, V = d_.v_dim, kvb = H * (nope + V);
  if (kvb_.size() < size_t(rows * kvb)) kvb_.resize(size_t(rows * kvb), false);
  float* dkv = kvb_.data();
  const bool exact = run_ && run_->num->exact();
  // [dk_nope | dv] per head; the shared rope key's gradient sums over the heads (exact numerics:
  // in exact_dlat).
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    float* kp = dlat + t * W + kl;
    for (int64_t hh = 0; hh < H; ++hh) {
      const float* kr = dk + (t * H + hh) * D;
      float* dst = dkv + (t * H + hh) * (nope + V);
      std::memcpy(dst, kr, size_t(nope) * sizeof(float));
      std::memcpy(dst + nope, dv + (t * H + hh) * D, size_t(V) * sizeof(float));
      if (!exact)
        for (int64_t j = 0; j < R; ++j) kp[j] += kr[nope + j];
    }
  }
  gemm(true, false, kl, kvb, rows, lat, W, dkv, kvb, 1, gw_->wkv_b, kvb);  // dWkv_b += c^T dkv
  if (exact) return exact_dlat(rows, dk, dv, dlat);
  gemm(false, true, rows, kl, kvb, dkv, kvb, w_->wkv_b, kvb, 1, dlat, W);  // dc += dkv Wkv_b^T
}

void MlaExpander::exact_dlat(int64_t rows, const float* dk, const float* dv, float* dlat) {
  const int64_t H = d_.H_q_loc(), D = d_.D, kl = d_.kv_lora, R = d_.rope, W = kl + R;
  const int64_t nope = d_.nope, V = d_.v_dim, E = nope + V + R, kvb = H * (nope + V);
  // A [rows, H E]: per head [dk_nope | dv | dk_rope]; B [H E, W]: per head Wkv_b_h^T beside zeros,
  // then [0 | I_R]; dlat = A B, a sum over the heads that layer_tp_sum splits into fixed parts.
  Buffer<float> a(size_t(rows * H * E), false), b(size_t(H * E * W), true);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t hh = 0; hh < H; ++hh) {
      const float* kr = dk + (t * H + hh) * D;
      float* dst = a.data() + (t * H + hh) * E;
      std::memcpy(dst, kr, size_t(nope) * sizeof(float));
      std::memcpy(dst + nope, dv + (t * H + hh) * D, size_t(V) * sizeof(float));
      std::memcpy(dst + nope + V, kr + nope, size_t(R) * sizeof(float));
    }
  for (int64_t hh = 0; hh < H; ++hh) {
    float* bh = b.data() + hh * E * W;
    for (int64_t j = 0; j < nope + V; ++j)
      for (int64_t c = 0; c < kl; ++c) bh[j * W + c] = w_->wkv_b[c * kvb + hh * (nope + V) + j];
    for (int64_t i = 0; i < R; ++i) bh[(nope + V + i) * W + kl + i] = 1.0f;
  }
  layer_tp_sum(*run_, rows, W, {{a.data(), H * E, b.data(), W, false, H * E}}, dlat);
}

void mla_in_fwd(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* cos_t,
                const float* sin_t, float* h, float* rstd, MlaActs& a, MlaScratch& s, MlaExpander& ex, float* q,
                float* k, float* v) {
  mla_q_latent(r, w, S, x, cos_t, sin_t, h, rstd, a, s, q);
  ex.time_into(&r.times);
  ex.expand(a.lat.data(), S, k, v);
  ex.time_into(nullptr);
}

void mla_q_latent(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* cos_t,
                  const float* sin_t, float* h, float* rstd, MlaActs& a, MlaScratch& s, float* q) {
  const ModelDims& d = r.d;
  const int64_t dim = d.dim, H = d.H_q_loc(), D = d.D, qw = H * D, kl = d.kv_lora, R = d.rope, kva = kl + R;
  {
    Tracer::Scope sc(r.tr, Phase::norm, int32_t(r.layer), -1, 0, 0);
    rmsnorm_fwd(x, w.attn_norm, h, rstd, S, dim, d.norm_eps);
  }
  if (d.q_lora > 0) {
    const int64_t ql = d.q_lora;
    layer_gemm(r, false, false, S, ql, dim, h, dim, w.wq_a, ql, 0, a.cq_raw.data(), ql);
    {
      Tracer::Scope sc(r.tr, Phase::norm, int32_t(r.layer), -1, 0, 0);
      rmsnorm_fwd(a.cq_raw.data(), w.q_norm, a.cq.data(), a.cq_rstd.data(), S, ql, d.norm_eps);
    }
    layer_gemm(r, false, false, S, qw, ql, a.cq.data(), ql, w.wq_b, qw, 0, q, qw);
  } else {
    layer_gemm(r, false, false, S, qw, dim, h, dim, w.wq, qw, 0, q, qw);
  }
  // The K/V latent and the shared rope key: two column blocks of Wkv_a, into lat = [c | k_pe].
  layer_gemm(r, false, false, S, kl, dim, h, dim, w.wkv_a, kva, 0, a.c_raw.data(), kl);
  layer_gemm(r, false, false, S, R, dim, h, dim, w.wkv_a + kl, kva, 0, s.kpe.data(), R);
  float* c = s.dc.data();  // the normed latent, packed (dc is the backward's)
  {
    Tracer::Scope sc(r.tr, Phase::norm, int32_t(r.layer), -1, 0, 0);
    rmsnorm_fwd(a.c_raw.data(), w.kv_norm, c, a.c_rstd.data(), S, kl, d.norm_eps);
  }
  {
    Tracer::Scope sc(r.tr, Phase::rope, int32_t(r.layer), -1, 0, 0);
    rope_apply(s.kpe.data(), S, 1, int32_t(R), cos_t, sin_t, false);
    rope_tail(d, q, S, s.rope.data(), cos_t, sin_t, false);
  }
  float* lat = a.lat.data();
  const float* kpe = s.kpe.data();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < S; ++t) {
    std::memcpy(lat + t * kva, c + t * kl, size_t(kl) * sizeof(float));
    std::memcpy(lat + t * kva + kl, kpe + t * R, size_t(R) * sizeof(float));
  }
}

void mla_absorb_queries(const LayerRun& r, const LayerView& w, int64_t S, const float* q, float* qa) {
  const ModelDims& d = r.d;
  const int64_t H = d.H_q_loc(), D = d.D, kl = d.kv_lora, R = d.rope, W = kl + R, nope = d.nope, V = d.v_dim;
  const int64_t kvb = H * (nope + V);
  for (int64_t hh = 0; hh < H; ++hh)  // qa_h[:, :kl] = q_nope_h Wuk_h^T
    layer_gemm(r, false, true, S, kl, nope, q + hh * D, H * D, w.wkv_b + hh * (nope + V), kvb, 0, qa + hh * W, H * W);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < S * H; ++i) std::memcpy(qa + i * W + kl, q + i * D + nope, size_t(R) * sizeof(float));
}

void mla_absorbed_out(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* o, MlaScratch& s,
                      float* x1) {
  const ModelDims& d = r.d;
  const int64_t H = d.H_q_loc(), kl = d.kv_lora, W = kl + d.rope, nope = d.nope, V = d.v_dim;
  const int64_t kvb = H * (nope + V), ow = H * V;
  float* ov = s.ov.data();
  for (int64_t hh = 0; hh < H; ++hh)  // o_v_h = o_lat_h Wuv_h
    layer_gemm(r, false, false, S, V, kl, o + hh * W, H * W, w.wkv_b + hh * (nope + V) + nope, kvb, 0, ov + hh * V, ow);
  out_projection(r, w, S, x, ov, x1);
}

void mla_out_fwd(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* o, MlaScratch& s,
                 float* x1) {
  out_projection(r, w, S, x, value_columns(r.d, o, S, s), x1);
}

void mla_out_bwd(const LayerRun& r, const LayerView& w, LayerView& gw, int64_t S, const float* o, const float* dx1,
                 MlaScratch& s, float* dO) {
  const ModelDims& d = r.d;
  const int64_t dim = d.dim, H = d.H_q_loc(), D = d.D, V = d.v_dim, ow = H * V;
  const float* ov = value_columns(d, o, S, s);
  layer_gemm(r, true, false, ow, dim, S, ov, ow, dx1, dim, 1, gw.wo, dim);  // dWo += o_v^T dx1
  float* dov = s.dov.data();
  layer_gemm(r, false, true, S, ow, dim, dx1, dim, w.wo, dim, 0, dov, ow);  // dO_v = dx1 Wo^T
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < S * H; ++i) {
    std::memcpy(dO + i * D, dov + i * V, size_t(V) * sizeof(float));
    std::fill(dO + i * D + V, dO + (i + 1) * D, 0.0f);
  }
}

void mla_in_bwd(const LayerRun& r, const LayerView& w, LayerView& gw, int64_t S, const float* h, const MlaActs& a,
                MlaScratch& s, const float* cos_t, const float* sin_t, float* dq, float* dlat, float* dh) {
  const ModelDims& d = r.d;
  const int64_t dim = d.dim, H = d.H_q_loc(), D = d.D, qw = H * D, kl = d.kv_lora, R = d.rope, kva = kl + R;
  float *dkpe = s.dkpe.data(), *dc = s.dc.data(), *dc_raw = s.dc_raw.data();
  // Under tp each rank's latent gradient is its heads' part; the sum makes everything below the
  // latent (replicated weights and their gradients) the same on every tp rank (exact numerics:
  // MlaExpander::exact_dlat summed it already, exactly).
  if (!r.num->exact()) layer_tp_all_reduce(r, dlat, S * kva);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < S; ++t) {
    std::memcpy(dc + t * kl, dlat + t * kva, size_t(kl) * sizeof(float));
    std::memcpy(dkpe + t * R, dlat + t * kva + kl, size_t(R) * sizeof(float));
  }
  {
    Tracer::Scope sc(r.tr, Phase::rope, int32_t(r.layer), -1, 0, 0);
    rope_apply(dkpe, S, 1, int32_t(R), cos_t, sin_t, true);
    rope_tail(d, dq, S, s.rope.data(), cos_t, sin_t, true);
  }
  // K/V: the latent's norm, Wkv_a's two column blocks (Wkv_b's gradient came with dlat).
  std::memset(dc_raw, 0, size_t(S * kl) * sizeof(float));
  {
    Tracer::Scope sc(r.tr, Phase::norm, int32_t(r.layer), -1, 0, 0);
    layer_rmsnorm_bwd(r, dc, a.c_raw.data(), w.kv_norm, a.c_rstd.data(), dc_raw, gw.kv_norm, S, kl);
  }
  layer_gemm(r, true, false, dim, kl, S, h, dim, dc_raw, kl, 1, gw.wkv_a, kva);
  layer_gemm(r, true, false, dim, R, S, h, dim, dkpe, R, 1, gw.wkv_a + kl, kva);
  // Queries first: without the query latent, dh's query part comes from this rank's heads only
  // and is summed over tp before the (complete) K/V part is added.
  if (d.q_lora == 0) {
    layer_gemm(r, true, false, dim, qw, S, h, dim, dq, qw, 1, gw.wq, qw);
    layer_tp_sum(r, S, dim, {{dq, qw, w.wq, qw, true, qw}}, dh);  // dh = dq Wq^T over the tp group
  }
  layer_gemm(r, false, true, S, dim, kl, dc_raw, kl, w.wkv_a, kva, d.q_lora == 0 ? 1 : 0, dh, dim);
  layer_gemm(r, false, true, S, dim, R, dkpe, R, w.wkv_a + kl, kva, 1, dh, dim);
  // Queries.
  if (d.q_lora > 0) {
    const int64_t ql = d.q_lora;
    float *dcq = s.dcq.data(), *dcq_raw = s.dcq_raw.data();
    layer_gemm(r, true, false, ql, qw, S, a.cq.data(), ql, dq, qw, 1, gw.wq_b, qw);  // dWq_b += cq^T dq
    // dcq = dq Wq_b^T: this rank's heads' part, summed over tp as the latent's above
    layer_tp_sum(r, S, ql, {{dq, qw, w.wq_b, qw, true, qw}}, dcq);
    std::memset(dcq_raw, 0, size_t(S * ql) * sizeof(float));
    {
      Tracer::Scope sc(r.tr, Phase::norm, int32_t(r.layer), -1, 0, 0);
      layer_rmsnorm_bwd(r, dcq, a.cq_raw.data(), w.q_norm, a.cq_rstd.data(), dcq_raw, gw.q_norm, S, ql);
    }
    layer_gemm(r, true, false, dim, ql, S, h, dim, dcq_raw, ql, 1, gw.wq_a, ql);
    layer_gemm(r, false, true, S, dim, ql, dcq_raw, ql, w.wq_a, ql, 1, dh, dim);
  }
}

}  // namespace ctxpar
