#include "model/gdn_layer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "model/data.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"
#include "core/clock.hpp"

namespace ctxpar {

namespace {

constexpr float kL2Eps = 1e-6f;  // q, k L2 norm: x / sqrt(sum x^2 + eps), as flash-linear-attention

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
float silu(float x) { return x * sigmoid(x); }
float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

// Global document id of position p: the index of the document holding it (positions past the
// sequence, i.e. padding rows, get one id of their own).
int32_t doc_of(const std::vector<int64_t>& starts, int64_t p) {
  return int32_t(std::upper_bound(starts.begin(), starts.end(), p) - starts.begin()) - 1;
}

}  // namespace

GdnMixer::GdnMixer(const ModelDims& d, Comm& cp, GdnChain chain, const std::string& schedule, int64_t n_rows)
    : d_(d), comm_(cp), chain_(std::move(chain)), sched_(make_gdn_cp(schedule)), n_(n_rows) {
  CTXPAR_CHECK(sched_, "gdn_schedule = '" << schedule << "' is not a GDN schedule (scan, ring)");
  mine_ = chain_.positions_of(comm_.rank());
  CTXPAR_CHECK(!mine_.empty(), "GDN: this rank holds no piece of the chain");
  // The rows split into this rank's pieces in order (equal under a padded partition; a one-rank
  // zigzag of odd length splits them floor / ceil, which changes nothing: the pieces are adjacent).
  const int64_t J = int64_t(mine_.size());
  for (int64_t j = 0; j <= J; ++j) piece_begin_.push_back(n_ * j / J);
  int64_t shortest = n_;
  for (int64_t j = 0; j < J; ++j) shortest = std::min(shortest, piece_begin_[size_t(j + 1)] - piece_begin_[size_t(j)]);
  CTXPAR_CHECK(shortest >= d_.gdn_conv - 1, "GDN: pieces of " << shortest << " rows are shorter than the "
                                                                  << "convolution's halo of " << d_.gdn_conv - 1);
  C_ = d_.gdn_conv_width();
  const size_t n = size_t(n_), H = size_t(d_.gdn_H), qk = size_t(d_.gdn_qk_width()), v = size_t(d_.gdn_v_width());
  dproj_.resize(n * size_t(C_), false);
  dh_.resize(n * size_t(d_.dim), false);
  dq_.resize(n * qk, false);
  dk_.resize(n * qk, false);
  dv_.resize(n * v, false);
  dg_.resize(n * H, false);
  dbeta_.resize(n * H, false);
  dab_.resize(n * 2 * H, false);
  dy_.resize(n * v, false);
  do_.resize(n * v, false);
  dz_.resize(n * v, false);
  tmp_.resize(n * std::max<size_t>(size_t(C_), size_t(d_.dim)), false);
  doc_.resize(n);
  reset_.resize(mine_.size());
  halo_doc_.resize(mine_.size());
}

void GdnMixer::alloc(GdnActs& a) const {
  const size_t n = size_t(n_), H = size_t(d_.gdn_H), qk = size_t(d_.gdn_qk_width()), v = size_t(d_.gdn_v_width());
  a.h.resize(n * size_t(d_.dim), false);
  a.rstd.resize(n, false);
  a.proj.resize(n * size_t(C_), false);
  a.pre.resize(n * size_t(C_), false);
  a.q.resize(n * qk, false);
  a.k.resize(n * qk, false);
  a.v.resize(n * v, false);
  a.qinv.resize(n * H, false);
  a.kinv.resize(n * H, false);
  a.ab.resize(n * 2 * H, false);
  a.g.resize(n * H, false);
  a.beta.resize(n * H, false);
  a.o.resize(n * v, false);
  a.z.resize(n * v, false);
  a.on.resize(n * v, false);
  a.orstd.resize(n * H, false);
}

double GdnMixer::acts_bytes(const ModelDims& d, int64_t n) {
  const double H = d.gdn_H, qk = double(d.gdn_qk_width()), v = double(d.gdn_v_width()), C = double(d.gdn_conv_width());
  return 4.0 * double(n) * (double(d.dim) + 1 + 2 * C + 2 * qk + v + 2 * H + 2 * H + 2 * H + 3 * v + H);
}

double GdnMixer::scratch_bytes(const ModelDims& d, int64_t n) {
  const double H = d.gdn_H, qk = double(d.gdn_qk_width()), v = double(d.gdn_v_width()), C = double(d.gdn_conv_width());
  const double chunk_ws = (v + 2 * qk + 1) * H;  // the op's workspace per row (gdn_fwd_prepare)
  return 4.0 * double(n) * (C + double(d.dim) + 2 * qk + v + 2 * H + 2 * H + 3 * v + std::max(C, double(d.dim)) + chunk_ws);
}

std::vector<GdnParams> GdnMixer::pieces(const Batch& b, GdnActs& a, bool backward) {
  // Document ids of the rows and of each piece's halo, from the sequence's document lengths.
  std::vector<int64_t> starts{0};
  for (int64_t L : b.doc_lengths) starts.push_back(starts.back() + L);
  starts.pop_back();
  for (int64_t i = 0; i < n_; ++i) doc_[size_t(i)] = doc_of(starts, b.pos[size_t(i)]);
  std::vector<GdnParams> ps;
  const int64_t H = d_.gdn_H, Dk = d_.gdn_Dk, Dv = d_.gdn_Dv, K = d_.gdn_conv;
  for (size_t j = 0; j < mine_.size(); ++j) {
    const int64_t r0 = piece_begin_[j], p0 = b.pos[size_t(r0)];
    halo_doc_[j].assign(size_t(K - 1), -1);
    for (int64_t i = 0; i < K - 1; ++i)
      if (p0 - (K - 1) + i >= 0) halo_doc_[j][size_t(i)] = doc_of(starts, p0 - (K - 1) + i);
    reset_[j] = p0 > 0 && doc_of(starts, p0 - 1) != doc_[size_t(r0)];
    GdnParams p;
    p.T = piece_begin_[j + 1] - r0;
    p.H = int32_t(H), p.Dk = int32_t(Dk), p.Dv = int32_t(Dv), p.chunk = d_.gdn_chunk;
    p.q = a.q.data() + r0 * H * Dk, p.k = a.k.data() + r0 * H * Dk, p.v = a.v.data() + r0 * H * Dv;
    p.g = a.g.data() + r0 * H, p.beta = a.beta.data() + r0 * H;
    p.doc = doc_.data() + r0;
    p.reset_at_0 = reset_[j] != 0;
    p.o = a.o.data() + r0 * H * Dv;
    if (backward) {
      p.d_o = do_.data() + r0 * H * Dv;
      p.dq = dq_.data() + r0 * H * Dk, p.dk = dk_.data() + r0 * H * Dk, p.dv = dv_.data() + r0 * H * Dv;
      p.dg = dg_.data() + r0 * H, p.dbeta = dbeta_.data() + r0 * H;
    }
    ps.push_back(p);
  }
  return ps;
}

// pre[t, c] = sum_i w[i, c] in(t - K + 1 + i, c) over inputs of the row's own document; in() reads
// the piece's projections, or its halo before the piece's first row.
void GdnMixer::conv_fwd(const LayerView& w, const Batch& b, GdnActs& a) {
  (void)b;
  const int64_t K = d_.gdn_conv, C = C_;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n_; ++r) {
    const size_t j = piece_of(r);
    const int64_t t = r - piece_begin_[j];
    float* out = a.pre.data() + r * C;
    std::fill(out, out + C, 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      const int64_t src = t - (K - 1) + i;  // row within the piece; < 0: the halo
      const int32_t doc = src >= 0 ? doc_[size_t(r - t + src)] : halo_doc_[j][size_t(K - 1 + src)];
      if (doc != doc_[size_t(r)]) continue;
      gdn_conv_tap(d_, w, i, src >= 0 ? a.proj.data() + (r - t + src) * C : a.halo[j].data() + (K - 1 + src) * C, out);
    }
  }
}

// From dpre (in tmp_): dproj (this rank's rows, overwritten), the halos' gradients (dhalo) and the
// weights' (accumulated; channel blocks in parallel, rows in order: no schedule-dependent sums).
// With `ex` (exact numerics) every border of the exact sums' blocks of rows is treated as a
// piece border, whether a piece starts there or not: a row's contributions to the previous
// block's last rows go to that border's own halo gradient, added to them once the loop is done
// (as chain_halo_bwd adds a received one), and the weights' gradients are summed in fp32 per block
// in row order, each block's sum added exactly. Pieces are whole blocks, so every mesh computes
// the same sums.
void GdnMixer::conv_bwd(const LayerView& w, LayerView& gw, const Batch& b, GdnActs& a, const ExactSums* ex) {
  (void)b;
  const int64_t K = d_.gdn_conv, C = C_, qk = d_.gdn_qk_width();
  const int64_t G = ex ? ex->block : 0;
  CTXPAR_CHECK(!ex || (n_ % G == 0 && G >= K - 1), "GDN: exact blocks of " << G << " rows over " << n_ << " rows");
  const float* dpre = tmp_.data();
  std::fill(dproj_.data(), dproj_.data() + n_ * C, 0.0f);
  std::vector<std::vector<float>> dhalo(mine_.size(), std::vector<float>(size_t((K - 1) * C), 0.0f));
  // exact: block b's halo gradient (rows [b G - K + 1, b G)), for blocks not starting a piece
  std::vector<float> bhalo(ex ? size_t(n_ / G * (K - 1) * C) : 0, 0.0f);
  auto wt = [&](int64_t c, int64_t i, bool grad) -> float* {
    const LayerView& v = grad ? gw : w;
    if (c < qk) return v.conv_q + i * qk + c;
    if (c < 2 * qk) return v.conv_k + i * qk + (c - qk);
    return v.conv_v + i * d_.gdn_v_width() + (c - 2 * qk);
  };
  constexpr int64_t kBlock = 16;
  int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    const int64_t c1 = std::min(C, c0 + kBlock);
    std::vector<float> part(ex ? size_t(K * kBlock) : 0, 0.0f);  // exact: this block's weight sums
    for (int64_t r = 0; r < n_; ++r) {
      const size_t j = piece_of(r);
      const int64_t t = r - piece_begin_[j];
      for (int64_t i = 0; i < K; ++i) {
        const int64_t src = t - (K - 1) + i;
        const int32_t doc = src >= 0 ? doc_[size_t(r - t + src)] : halo_doc_[j][size_t(K - 1 + src)];
        if (doc != doc_[size_t(r)]) continue;
        const float* in = src >= 0 ? a.proj.data() + (r - t + src) * C : a.halo[j].data() + (K - 1 + src) * C;
        float* din = src >= 0 ? dproj_.data() + (r - t + src) * C : dhalo[j].data() + (K - 1 + src) * C;
        if (ex && src >= 0 && (r - t + src) / G != r / G)  // across a block border inside the piece
          din = bhalo.data() + size_t(((r / G) * (K - 1) + (K - 1) - (r / G * G - (r - t + src))) * C);
        for (int64_t c = c0; c < c1; ++c) {
          const float dp = dpre[r * C + c];
          din[c] += *wt(c, i, false) * dp;
          (ex ? part[size_t(i * kBlock + c - c0)] : *wt(c, i, true)) += dp * in[c];
        }
      }
      if (ex && (r + 1) % G == 0) {  // the block's weight sums, added exactly
        for (int64_t i = 0; i < K; ++i)
          for (int64_t c = c0; c < c1; ++c) {
            float& x = part[size_t(i * kBlock + c - c0)];
            const int64_t off = ex->offset(wt(c, i, true));
            bad += exact_add(double(x), ex->hi + off, ex->lo + off);
            x = 0.0f;
          }
      }
    }
    if (ex)  // the borders inside pieces: each block's halo gradient onto the previous block's last rows
      for (int64_t blk = 1; blk < n_ / G; ++blk) {
        if (piece_begin_[piece_of(blk * G)] == blk * G) continue;  // a piece border: chain_halo_bwd's
        const float* g = bhalo.data() + size_t(blk * (K - 1) * C);
        float* dst = dproj_.data() + (blk * G - (K - 1)) * C;
        for (int64_t e = 0; e < K - 1; ++e)
          for (int64_t c = c0; c < c1; ++c) dst[e * C + c] += g[e * C + c];
      }
  }
  if (ex) *ex->bad += bad;
  std::vector<float*> dtail;
  for (size_t j = 0; j < mine_.size(); ++j) dtail.push_back(dproj_.data() + (piece_begin_[j + 1] - (K - 1)) * C);
  if (K > 1) chain_halo_bwd(comm_, chain_, dtail, K - 1, C, dhalo, nullptr);
}

void GdnMixer::forward(const LayerRun& r, const LayerView& w, const Batch& b, const float* x, GdnActs& a, float* x1) {
  const int64_t n = n_, dim = d_.dim, H = d_.gdn_H, Dk = d_.gdn_Dk, Dv = d_.gdn_Dv, K = d_.gdn_conv;
  const int64_t C = C_;
  const int32_t layer = int32_t(r.layer);
  {
    Tracer::Scope sc(r.tr, Phase::norm, layer, -1, 0, 0);
    rmsnorm_fwd(x, w.attn_norm, a.h.data(), a.rstd.data(), n, dim, d_.norm_eps);
  }
  gdn_in_proj(r, w, n, a.h.data(), a.proj.data(), a.ab.data(), a.z.data());
  const std::vector<GdnParams> ps = pieces(b, a, false);
  const double t0 = now_s();
  {
    Tracer::Scope sc(r.tr, Phase::shard, layer, -1, 0, double(mine_.size()) * double((K - 1) * C) * 4);
    std::vector<const float*> tail;
    for (size_t j = 0; j < mine_.size(); ++j) tail.push_back(a.proj.data() + (piece_begin_[j + 1] - (K - 1)) * C);
    if (K > 1) chain_halo_fwd(comm_, chain_, tail, K - 1, C, a.halo, &r.st);
    else a.halo.assign(mine_.size(), {});
  }
  {
    Tracer::Scope sc(r.tr, Phase::mlp, layer, -1, 0, 0);
    conv_fwd(w, b, a);
    gdn_activate(d_, w, n, a.pre.data(), a.ab.data(), a.q.data(), a.k.data(), a.v.data(), a.qinv.data(), a.kinv.data(),
                 a.g.data(), a.beta.data());
  }
  {
    Tracer::Scope sc(r.tr, Phase::attn_fwd, layer, -1, gdn_fwd_flops(double(n), H, Dk, Dv, d_.gdn_chunk), 0);
    sched_->forward(comm_, chain_, ps, a.cp, &r.st);
  }
  r.times.attn_s += now_s() - t0;
  gdn_out(r, w, n, a.o.data(), a.z.data(), a.on.data(), a.orstd.data(), tmp_.data(), x, x1);
}

void GdnMixer::output(const LayerRun& r, const LayerView& w, const float* x, GdnActs& a, float* x1) {
  gdn_out_proj(r, w, n_, a.on.data(), a.z.data(), tmp_.data(), x, x1);
}

void gdn_conv_tap(const ModelDims& d, const LayerView& w, int64_t tap, const float* in, float* out) {
  const int64_t qk = d.gdn_qk_width(), vw = d.gdn_v_width();
  const float* wq = w.conv_q + tap * qk;
  const float* wk = w.conv_k + tap * qk;
  const float* wv = w.conv_v + tap * vw;
#pragma omp simd
  for (int64_t c = 0; c < qk; ++c) out[c] += wq[c] * in[c];
#pragma omp simd
  for (int64_t c = 0; c < qk; ++c) out[qk + c] += wk[c] * in[qk + c];
#pragma omp simd
  for (int64_t c = 0; c < vw; ++c) out[2 * qk + c] += wv[c] * in[2 * qk + c];
}

void gdn_in_proj(const LayerRun& r, const LayerView& w, int64_t n, const float* h, float* proj, float* ab, float* z) {
  const ModelDims& d = r.d;
  const int64_t dim = d.dim, H = d.gdn_H, qk = d.gdn_qk_width(), vw = d.gdn_v_width(), C = d.gdn_conv_width();
  layer_gemm(r, false, false, n, qk, dim, h, dim, w.wq, qk, 0, proj, C);
  layer_gemm(r, false, false, n, qk, dim, h, dim, w.wk, qk, 0, proj + qk, C);
  layer_gemm(r, false, false, n, vw, dim, h, dim, w.wv, vw, 0, proj + 2 * qk, C);
  layer_gemm(r, false, false, n, H, dim, h, dim, w.wa, H, 0, ab, 2 * H);
  layer_gemm(r, false, false, n, H, dim, h, dim, w.wb, H, 0, ab + H, 2 * H);
  layer_gemm(r, false, false, n, vw, dim, h, dim, w.wg, vw, 0, z, vw);
}

void gdn_activate(const ModelDims& d, const LayerView& w, int64_t n, const float* pre, const float* ab, float* q,
                  float* k, float* v, float* qinv, float* kinv, float* g, float* beta) {
  const int64_t H = d.gdn_H, Dk = d.gdn_Dk, qk = d.gdn_qk_width(), vw = d.gdn_v_width(), C = d.gdn_conv_width();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* pr = pre + t * C;
    for (int m = 0; m < 2; ++m) {
      float* dst = (m == 0 ? q : k) + t * qk;
      float* inv = (m == 0 ? qinv : kinv) + t * H;
      for (int64_t hh = 0; hh < H; ++hh) {
        double ss = 0;
        for (int64_t e = 0; e < Dk; ++e) {
          const float s = silu(pr[m * qk + hh * Dk + e]);
          dst[hh * Dk + e] = s;
          ss += double(s) * s;
        }
        const float ri = 1.0f / std::sqrt(float(ss) + kL2Eps);
        inv[hh] = ri;
        for (int64_t e = 0; e < Dk; ++e) dst[hh * Dk + e] *= ri;
      }
    }
    for (int64_t e = 0; e < vw; ++e) v[t * vw + e] = silu(pr[2 * qk + e]);
    for (int64_t hh = 0; hh < H; ++hh) {
      beta[t * H + hh] = sigmoid(ab[t * 2 * H + H + hh]);
      g[t * H + hh] = -std::exp(w.a_log[hh]) * softplus(ab[t * 2 * H + hh] + w.dt_bias[hh]);
    }
  }
}

void gdn_out(const LayerRun& r, const LayerView& w, int64_t n, const float* o, const float* z, float* on, float* orstd,
             float* y, const float* x, float* x1) {
  {
    Tracer::Scope sc(r.tr, Phase::norm, int32_t(r.layer), -1, 0, 0);
    rmsnorm_fwd(o, w.o_norm, on, orstd, n * r.d.gdn_H, r.d.gdn_Dv, r.d.norm_eps);
  }
  gdn_out_proj(r, w, n, on, z, y, x, x1);
}

void gdn_out_proj(const LayerRun& r, const LayerView& w, int64_t n, const float* on, const float* z, float* y,
                  const float* x, float* x1) {
  const int64_t dim = r.d.dim, vw = r.d.gdn_v_width();
#pragma omp parallel for simd schedule(static)
  for (int64_t e = 0; e < n * vw; ++e) y[e] = on[e] * silu(z[e]);
  layer_gemm(r, false, false, n, dim, vw, y, vw, w.wo, dim, 0, x1, dim);
#pragma omp parallel for simd schedule(static)
  for (int64_t e = 0; e < n * dim; ++e) x1[e] += x[e];
}

void GdnMixer::backward(const LayerRun& r, const LayerView& w, LayerView& gw, const Batch& b, const float* x,
                        GdnActs& a, float* dx) {
  const int64_t n = n_, dim = d_.dim, H = d_.gdn_H, Dk = d_.gdn_Dk, Dv = d_.gdn_Dv;
  const int64_t qk = d_.gdn_qk_width(), vw = d_.gdn_v_width(), C = C_;
  const int32_t layer = int32_t(r.layer);
  const float* h = a.h.data();
  // x1 = x + y Wo, y = on * silu(z)
  float* y = tmp_.data();
#pragma omp parallel for simd schedule(static)
  for (int64_t e = 0; e < n * vw; ++e) y[e] = a.on[size_t(e)] * silu(a.z[size_t(e)]);
  layer_gemm(r, false, true, n, vw, dim, dx, dim, w.wo, dim, 0, dy_.data(), vw);
  layer_gemm(r, true, false, vw, dim, n, y, vw, dx, dim, 1, gw.wo, dim);
  {
    Tracer::Scope sc(r.tr, Phase::norm, layer, -1, 0, 0);
#pragma omp parallel for simd schedule(static)
    for (int64_t e = 0; e < n * vw; ++e) {
      const float z = a.z[size_t(e)], dyv = dy_[size_t(e)];
      dz_[size_t(e)] = dyv * a.on[size_t(e)] * silu_grad(z);
      dy_[size_t(e)] = dyv * silu(z);  // d(on)
    }
    std::fill(do_.data(), do_.data() + n * vw, 0.0f);
    layer_rmsnorm_bwd(r, dy_.data(), a.o.data(), w.o_norm, a.orstd.data(), do_.data(), gw.o_norm, n * H, Dv);
  }
  float* dh = dh_.data();
  layer_gemm(r, false, true, n, dim, vw, dz_.data(), vw, w.wg, vw, 0, dh, dim);
  layer_gemm(r, true, false, dim, vw, n, h, dim, dz_.data(), vw, 1, gw.wg, vw);
  const std::vector<GdnParams> ps = pieces(b, a, true);
  const double t0 = now_s();
  {
    Tracer::Scope sc(r.tr, Phase::attn_bwd, layer, -1, 2 * gdn_fwd_flops(double(n), H, Dk, Dv, d_.gdn_chunk), 0);
    sched_->backward(comm_, chain_, ps, a.cp, &r.st);
  }
  r.times.attn_s += now_s() - t0;
  // the gates: g = -exp(a_log) softplus(u), u = h Wa + dt_bias; beta = sigmoid(h Wb).
  // exact: each row's term of a_log's and dt_bias's gradients added exactly
  {
    Tracer::Scope sc(r.tr, Phase::mlp, layer, -1, 0, 0);
    const ExactSums* ex = r.num->exact();
    int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (int64_t hh = 0; hh < H; ++hh) {
      const float A = std::exp(w.a_log[hh]);
      double sa = 0, sd = 0;
      int64_t *ha = nullptr, *la = nullptr, *hd = nullptr, *ld = nullptr;
      if (ex) {
        const int64_t oa = ex->offset(gw.a_log + hh), od = ex->offset(gw.dt_bias + hh);
        ha = ex->hi + oa, la = ex->lo + oa, hd = ex->hi + od, ld = ex->lo + od;
      }
      for (int64_t t = 0; t < n; ++t) {
        const float dg = dg_[size_t(t * H + hh)], u = a.ab[size_t(t * 2 * H + hh)] + w.dt_bias[hh];
        const float du = -dg * A * sigmoid(u);
        const double ta = double(dg) * a.g[size_t(t * H + hh)];  // exact in double
        if (ex) {
          bad += exact_add(ta, ha, la) + exact_add(double(du), hd, ld);
        } else {
          sa += ta;
          sd += du;
        }
        dab_[size_t(t * 2 * H + hh)] = du;
        const float be = a.beta[size_t(t * H + hh)];
        dab_[size_t(t * 2 * H + H + hh)] = dbeta_[size_t(t * H + hh)] * be * (1.0f - be);
      }
      if (!ex) {
        gw.a_log[hh] += float(sa);
        gw.dt_bias[hh] += float(sd);
      }
    }
    if (ex) *ex->bad += bad;
  }
  layer_gemm(r, false, true, n, dim, H, dab_.data(), 2 * H, w.wa, H, 1, dh, dim);
  layer_gemm(r, false, true, n, dim, H, dab_.data() + H, 2 * H, w.wb, H, 1, dh, dim);
  layer_gemm(r, true, false, dim, H, n, h, dim, dab_.data(), 2 * H, 1, gw.wa, H);
  layer_gemm(r, true, false, dim, H, n, h, dim, dab_.data() + H, 2 * H, 1, gw.wb, H);
  // L2 norm and silu: dpre (into tmp_) from dq, dk, dv
  float* dpre = tmp_.data();
  {
    Tracer::Scope sc(r.tr, Phase::mlp, layer, -1, 0, 0);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* pr = a.pre.data() + t * C;
      float* dp = dpre + t * C;
      for (int m = 0; m < 2; ++m) {
        const float* yv = (m == 0 ? a.q.data() : a.k.data()) + t * qk;
        const float* dyv = (m == 0 ? dq_.data() : dk_.data()) + t * qk;
        const float* inv = (m == 0 ? a.qinv.data() : a.kinv.data()) + t * H;
        for (int64_t hh = 0; hh < H; ++hh) {
          double dot = 0;
          for (int64_t e = 0; e < Dk; ++e) dot += double(yv[hh * Dk + e]) * dyv[hh * Dk + e];
          for (int64_t e = 0; e < Dk; ++e) {
            const int64_t c = m * qk + hh * Dk + e;
            dp[c] = inv[hh] * (dyv[hh * Dk + e] - yv[hh * Dk + e] * float(dot)) * silu_grad(pr[c]);
          }
        }
      }
      for (int64_t e = 0; e < vw; ++e) dp[2 * qk + e] = dv_[size_t(t * vw + e)] * silu_grad(pr[2 * qk + e]);
    }
  }
  {
    Tracer::Scope sc(r.tr, Phase::mlp, layer, -1, 0, 0);
    conv_bwd(w, gw, b, a, r.num->exact());
  }
  layer_gemm(r, false, true, n, dim, qk, dproj_.data(), C, w.wq, qk, 1, dh, dim);
  layer_gemm(r, false, true, n, dim, qk, dproj_.data() + qk, C, w.wk, qk, 1, dh, dim);
  layer_gemm(r, false, true, n, dim, vw, dproj_.data() + 2 * qk, C, w.wv, vw, 1, dh, dim);
  layer_gemm(r, true, false, dim, qk, n, h, dim, dproj_.data(), C, 1, gw.wq, qk);
  layer_gemm(r, true, false, dim, qk, n, h, dim, dproj_.data() + qk, C, 1, gw.wk, qk);
  layer_gemm(r, true, false, dim, vw, n, h, dim, dproj_.data() + 2 * qk, C, 1, gw.wv, vw);
  {
    Tracer::Scope sc(r.tr, Phase::norm, layer, -1, 0, 0);
    layer_rmsnorm_bwd(r, dh, x, w.attn_norm, a.rstd.data(), dx, gw.attn_norm, n, dim);  // dx += the mixer's part
  }
}

}  // namespace ctxpar
