#include "model/mla_layer.hpp"

#include <algorithm>
#include <cstring>

#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

namespace {

// RoPE on the last `rope` dims of each head of x [S, H, D] (in place), through a packed copy.
void rope_tail(const ModelDims& d, float* x, int64_t S, float* buf, const float* cos_t, const float* sin_t,
               bool inverse) {
  const int64_t H = d.H_q, D = d.D, R = d.rope, nope = d.nope;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < S * H; ++i) std::memcpy(buf + i * R, x + i * D + nope, size_t(R) * sizeof(float));
  rope_apply(buf, S, int32_t(H), int32_t(R), cos_t, sin_t, inverse);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < S * H; ++i) std::memcpy(x + i * D + nope, buf + i * R, size_t(R) * sizeof(float));
}

// o_v [S, H*v_dim]: the first v_dim columns of each head of the attention output o [S, H*D]
// (the rest is the padding of V), packed into the scratch.
const float* value_columns(const ModelDims& d, const float* o, int64_t S, MlaScratch& s) {
  const int64_t H = d.H_q, D = d.D, V = d.v_dim;
  float* ov = s.ov.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < S * H; ++i) std::memcpy(ov + i * V, o + i * D, size_t(V) * sizeof(float));
  return ov;
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
  a.c.resize(n * size_t(d.kv_lora), false);
}

double mla_acts_bytes(const ModelDims& d, int64_t S) {
  return 4.0 * double(S) * (2.0 * d.q_lora + (d.q_lora > 0 ? 1 : 0) + 2.0 * d.kv_lora + 1);
}

void mla_alloc(const ModelDims& d, int64_t S, MlaScratch& s) {
  const size_t n = size_t(S), H = size_t(d.H_q), kvb = H * size_t(d.nope + d.v_dim);
  s.kvb.resize(n * kvb, false);
  s.kpe.resize(n * size_t(d.rope), false);
  s.rope.resize(n * H * size_t(d.rope), false);
  s.ov.resize(n * H * size_t(d.v_dim), false);
  s.dkv.resize(n * kvb, false);
  s.dc.resize(n * size_t(d.kv_lora), false);
  s.dc_raw.resize(n * size_t(d.kv_lora), false);
  s.dkpe.resize(n * size_t(d.rope), false);
  if (d.q_lora > 0) {
    s.dcq.resize(n * size_t(d.q_lora), false);
    s.dcq_raw.resize(n * size_t(d.q_lora), false);
  }
}

double mla_scratch_bytes(const ModelDims& d, int64_t S) {
  const double H = d.H_q, kvb = H * (d.nope + d.v_dim);
  return 4.0 * double(S) * (2 * kvb + 2.0 * d.rope + H * d.rope + H * d.v_dim + 2.0 * d.kv_lora + 2.0 * d.q_lora);
}

void mla_in_fwd(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* cos_t,
                const float* sin_t, float* h, float* rstd, MlaActs& a, MlaScratch& s, float* q, float* k, float* v) {
  const ModelDims& d = r.d;
  const int64_t dim = d.dim, H = d.H_q, D = d.D, qw = H * D, kl = d.kv_lora, R = d.rope, kva = kl + R;
  const int64_t nope = d.nope, V = d.v_dim, kvb = H * (nope + V);
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
  // The K/V latent and the shared rope key: two column blocks of Wkv_a.
  layer_gemm(r, false, false, S, kl, dim, h, dim, w.wkv_a, kva, 0, a.c_raw.data(), kl);
  layer_gemm(r, false, false, S, R, dim, h, dim, w.wkv_a + kl, kva, 0, s.kpe.data(), R);
  {
    Tracer::Scope sc(r.tr, Phase::norm, int32_t(r.layer), -1, 0, 0);
    rmsnorm_fwd(a.c_raw.data(), w.kv_norm, a.c.data(), a.c_rstd.data(), S, kl, d.norm_eps);
  }
  layer_gemm(r, false, false, S, kvb, kl, a.c.data(), kl, w.wkv_b, kvb, 0, s.kvb.data(), kvb);
  Tracer::Scope sc(r.tr, Phase::rope, int32_t(r.layer), -1, 0, 0);
  rope_apply(s.kpe.data(), S, 1, int32_t(R), cos_t, sin_t, false);
  rope_tail(d, q, S, s.rope.data(), cos_t, sin_t, false);
  const float* kv = s.kvb.data();
  const float* kpe = s.kpe.data();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < S; ++t)
    for (int64_t hh = 0; hh < H; ++hh) {
      const float* src = kv + (t * H + hh) * (nope + V);
      float* kr = k + (t * H + hh) * D;
      float* vr = v + (t * H + hh) * D;
      std::memcpy(kr, src, size_t(nope) * sizeof(float));
      std::memcpy(kr + nope, kpe + t * R, size_t(R) * sizeof(float));
      std::memcpy(vr, src + nope, size_t(V) * sizeof(float));
      std::fill(vr + V, vr + D, 0.0f);
    }
}

void mla_out_fwd(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* o, MlaScratch& s,
                 float* x1) {
  const ModelDims& d = r.d;
  const int64_t dim = d.dim, H = d.H_q, V = d.v_dim, ow = H * V;
  const float* ov = value_columns(d, o, S, s);
  layer_gemm(r, false, false, S, dim, ow, ov, ow, w.wo, dim, 0, x1, dim);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < S * dim; ++i) x1[i] += x[i];
}

void mla_out_bwd(const LayerRun& r, const LayerView& w, LayerView& gw, int64_t S, const float* o, const float* dx1,
                 MlaScratch& s, float* dO) {
  const ModelDims& d = r.d;
  const int64_t dim = d.dim, H = d.H_q, D = d.D, V = d.v_dim, ow = H * V;
  const float* ov = value_columns(d, o, S, s);
  layer_gemm(r, true, false, ow, dim, S, ov, ow, dx1, dim, 1, gw.wo, dim);  // dWo += o_v^T dx1
  float* dov = s.dkv.data();  // [S, H*V] fits in the dkv scratch ([S, H*(nope+V)])
  layer_gemm(r, false, true, S, ow, dim, dx1, dim, w.wo, dim, 0, dov, ow);  // dO_v = dx1 Wo^T
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < S * H; ++i) {
    std::memcpy(dO + i * D, dov + i * V, size_t(V) * sizeof(float));
    std::fill(dO + i * D + V, dO + (i + 1) * D, 0.0f);
  }
}

void mla_in_bwd(const LayerRun& r, const LayerView& w, LayerView& gw, int64_t S, const float* h, const MlaActs& a,
                MlaScratch& s, const float* cos_t, const float* sin_t, float* dq, const float* dk, const float* dv,
                float* dh) {
  const ModelDims& d = r.d;
  const int64_t dim = d.dim, H = d.H_q, D = d.D, qw = H * D, kl = d.kv_lora, R = d.rope, kva = kl + R;
  const int64_t nope = d.nope, V = d.v_dim, kvb = H * (nope + V);
  float *dkv = s.dkv.data(), *dkpe = s.dkpe.data(), *dc = s.dc.data(), *dc_raw = s.dc_raw.data();
  {
    Tracer::Scope sc(r.tr, Phase::rope, int32_t(r.layer), -1, 0, 0);
    // [dk_nope | dv] per head; the shared rope key's gradient sums over the heads.
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < S; ++t) {
      float* kp = dkpe + t * R;
      std::fill(kp, kp + R, 0.0f);
      for (int64_t hh = 0; hh < H; ++hh) {
        const float* kr = dk + (t * H + hh) * D;
        float* dst = dkv + (t * H + hh) * (nope + V);
        std::memcpy(dst, kr, size_t(nope) * sizeof(float));
        std::memcpy(dst + nope, dv + (t * H + hh) * D, size_t(V) * sizeof(float));
        for (int64_t j = 0; j < R; ++j) kp[j] += kr[nope + j];
      }
    }
    rope_apply(dkpe, S, 1, int32_t(R), cos_t, sin_t, true);
    rope_tail(d, dq, S, s.rope.data(), cos_t, sin_t, true);
  }
  // K/V: Wkv_b, the latent's norm, Wkv_a's two column blocks.
  layer_gemm(r, true, false, kl, kvb, S, a.c.data(), kl, dkv, kvb, 1, gw.wkv_b, kvb);  // dWkv_b += c^T dkv
  layer_gemm(r, false, true, S, kl, kvb, dkv, kvb, w.wkv_b, kvb, 0, dc, kl);          // dc = dkv Wkv_b^T
  std::memset(dc_raw, 0, size_t(S * kl) * sizeof(float));
  {
    Tracer::Scope sc(r.tr, Phase::norm, int32_t(r.layer), -1, 0, 0);
    rmsnorm_bwd(dc, a.c_raw.data(), w.kv_norm, a.c_rstd.data(), dc_raw, gw.kv_norm, S, kl);
  }
  layer_gemm(r, true, false, dim, kl, S, h, dim, dc_raw, kl, 1, gw.wkv_a, kva);
  layer_gemm(r, true, false, dim, R, S, h, dim, dkpe, R, 1, gw.wkv_a + kl, kva);
  layer_gemm(r, false, true, S, dim, kl, dc_raw, kl, w.wkv_a, kva, 0, dh, dim);
  layer_gemm(r, false, true, S, dim, R, dkpe, R, w.wkv_a + kl, kva, 1, dh, dim);
  // Queries.
  if (d.q_lora > 0) {
    const int64_t ql = d.q_lora;
    float *dcq = s.dcq.data(), *dcq_raw = s.dcq_raw.data();
    layer_gemm(r, true, false, ql, qw, S, a.cq.data(), ql, dq, qw, 1, gw.wq_b, qw);  // dWq_b += cq^T dq
    layer_gemm(r, false, true, S, ql, qw, dq, qw, w.wq_b, qw, 0, dcq, ql);          // dcq = dq Wq_b^T
    std::memset(dcq_raw, 0, size_t(S * ql) * sizeof(float));
    {
      Tracer::Scope sc(r.tr, Phase::norm, int32_t(r.layer), -1, 0, 0);
      rmsnorm_bwd(dcq, a.cq_raw.data(), w.q_norm, a.cq_rstd.data(), dcq_raw, gw.q_norm, S, ql);
    }
    layer_gemm(r, true, false, dim, ql, S, h, dim, dcq_raw, ql, 1, gw.wq_a, ql);
    layer_gemm(r, false, true, S, dim, ql, dcq_raw, ql, w.wq_a, ql, 1, dh, dim);
  } else {
    layer_gemm(r, true, false, dim, qw, S, h, dim, dq, qw, 1, gw.wq, qw);
    layer_gemm(r, false, true, S, dim, qw, dq, qw, w.wq, qw, 1, dh, dim);
  }
}

}  // namespace ctxpar
