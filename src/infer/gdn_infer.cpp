#include "infer/gdn_infer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "core/error.hpp"
#include "dist/comm.hpp"
#include "model/flops.hpp"
#include "model/gdn_layer.hpp"
#include "ops.hpp"
#include "shard/partition.hpp"
#include "trace/trace.hpp"

namespace ctxpar::infer {

namespace {
constexpr int kTagState = 31000;  // the state between a sequence's home and its chain's ends
}  // namespace

GdnInfer::GdnInfer(const ModelDims& d, Comm& cp, int64_t batch)
    : d_(d), cp_(cp), B_(batch), G_(d.gdn_layers()), C_(d.gdn_conv_width()), sched_(make_gdn_cp(d.gdn_schedule)) {
  CTXPAR_CHECK(sched_, "gdn_schedule = '" << d.gdn_schedule << "' is not a GDN schedule (scan, ring)");
  const int64_t N = cp.size();
  Bq_ = (B_ + N - 1) / N;
  S_.resize(size_t(B_ * G_));
  tail_.resize(size_t(B_ * G_));
}

void GdnInfer::clear() {
  for (auto& s : S_) s.clear();
  for (auto& t : tail_) t.clear();
}

double GdnInfer::used_bytes() const {
  double b = 0;
  for (const auto& s : S_) b += double(s.size()) * sizeof(float);
  for (const auto& t : tail_) b += double(t.size()) * sizeof(float);
  return b;
}

void GdnInfer::ensure(int64_t n) {
  if (n <= cap_) return;
  const size_t r = size_t(n), H = size_t(d_.gdn_H), qk = size_t(d_.gdn_qk_width()), v = size_t(d_.gdn_v_width());
  h_.resize(r * size_t(d_.dim), false);
  rstd_.resize(r, false);
  proj_.resize(r * size_t(C_), false);
  pre_.resize(r * size_t(C_), false);
  q_.resize(r * qk, false);
  k_.resize(r * qk, false);
  v_.resize(r * v, false);
  qinv_.resize(r * H, false);
  kinv_.resize(r * H, false);
  ab_.resize(r * 2 * H, false);
  g_.resize(r * H, false);
  beta_.resize(r * H, false);
  o_.resize(r * v, false);
  z_.resize(r * v, false);
  on_.resize(r * v, false);
  orstd_.resize(r * H, false);
  y_.resize(r * v, false);
  cap_ = n;
}

void GdnInfer::move_state(int from, int to, const std::vector<float>& src, std::vector<float>& dst, int tag) {
  const int rank = cp_.rank();
  if (from == to) {
    if (rank == from) dst = src;
    return;
  }
  if (rank != from && rank != to) return;
  Request rq = rank == from ? cp_.send_recv_async(std::span<const float>(src), to, std::span<float>(), Comm::kNone, tag)
                            : cp_.send_recv_async(std::span<const float>(), Comm::kNone, std::span<float>(dst), from, tag);
  cp_.wait(rq);
}

void GdnInfer::prefill(const LayerRun& r, const LayerView& w, int64_t gl, int64_t b, int64_t cached,
                       const Partition& part, int64_t n, const float* x, float* x1) {
  const int N = cp_.size(), rank = cp_.rank(), home_rank = home(b);
  const int64_t dim = d_.dim, H = d_.gdn_H, Dk = d_.gdn_Dk, Dv = d_.gdn_Dv, K = d_.gdn_conv, R = K - 1, C = C_;
  const int64_t T = part.S(), cs = part.S_padded() / (2 * N), SS = H * Dv * Dk;
  CTXPAR_CHECK(n == 2 * cs, "GDN prefill: " << n << " rows are not two zigzag chunks of " << cs);
  ensure(n);
  const int32_t layer = int32_t(r.layer);
  {
    Tracer::Scope sc(r.tr, Phase::norm, layer, -1, 0, 0);
    rmsnorm_fwd(x, w.attn_norm, h_.data(), rstd_.data(), n, dim, d_.norm_eps);
  }
  gdn_in_proj(r, w, n, h_.data(), proj_.data(), ab_.data(), z_.data());
  const bool continues = cached > 0;
  std::vector<float>& S_home = state(b, gl);
  std::vector<float>& tail_home = tail(b, gl);
  const bool holds = rank == home_rank || d_.gdn_replicated;  // this rank keeps the sequence's context
  if (holds && continues) {
    CTXPAR_CHECK(int64_t(S_home.size()) == SS && int64_t(tail_home.size()) == R * C,
                 "GDN prefill: sequence " << b << " continues without a stored state");
  }
  // Every piece's last real rows (and the home's stored tail) to every rank: slot 0 the stored
  // tail, slots 1 and 2 this rank's pieces (chain positions rank and 2N-1-rank), right-aligned.
  auto real_of = [&](int64_t q) { return std::clamp<int64_t>(T - q * cs, 0, cs); };
  const int64_t slot = R * C, per_rank = 3 * slot;
  std::vector<float> all(static_cast<size_t>(per_rank * N), 0.0f);
  if (R > 0) {
    std::vector<float> mine(static_cast<size_t>(per_rank), 0.0f);
    if (rank == home_rank && continues) std::copy(tail_home.begin(), tail_home.end(), mine.begin());
    for (int j = 0; j < 2; ++j) {
      const int64_t q = j == 0 ? rank : 2 * N - 1 - rank, m = std::min(R, real_of(q));
      for (int64_t i = 0; i < m; ++i)
        std::memcpy(mine.data() + (1 + j) * slot + (R - m + i) * C, proj_.data() + (j * cs + real_of(q) - m + i) * C,
                    sizeof(float) * size_t(C));
    }
    Tracer::Scope sc(r.tr, Phase::all_gather, layer, -1, 0, double(per_rank) * 4);
    cp_.all_gather(std::span<const float>(mine), std::span<float>(all));
  }
  // The R real rows before chain position q (walking back over the pieces, then the stored tail).
  auto rows_before = [&](int64_t q, float* out) {
    std::fill(out, out + R * C, 0.0f);
    int64_t need = R;
    for (int64_t p = q - 1; p >= 0 && need > 0; --p) {
      const int64_t avail = std::min(R, real_of(p)), t = std::min(need, avail);
      const int64_t owner = p < N ? p : 2 * N - 1 - p, s = p < N ? 1 : 2;
      const float* blk = all.data() + owner * per_rank + s * slot;
      std::memcpy(out + (need - t) * C, blk + (R - t) * C, sizeof(float) * size_t(t * C));
      need -= t;
    }
    if (need > 0 && continues) {
      const float* blk = all.data() + home_rank * per_rank;  // the stored tail, slot 0
      std::memcpy(out, blk + (R - need) * C, sizeof(float) * size_t(need * C));
    }
  };
  // The short convolution of this rank's two pieces.
  {
    Tracer::Scope sc(r.tr, Phase::mlp, layer, -1, 0, 0);
    std::vector<float> halo(static_cast<size_t>(std::max<int64_t>(R, 1) * C));
    for (int j = 0; j < 2; ++j) {
      const int64_t q = j == 0 ? rank : 2 * N - 1 - rank;
      if (R > 0) rows_before(q, halo.data());
      for (int64_t t = 0; t < cs; ++t) {
        float* out = pre_.data() + (j * cs + t) * C;
        std::fill(out, out + C, 0.0f);
        for (int64_t i = 0; i < K; ++i) {
          const int64_t src = t - R + i;
          gdn_conv_tap(d_, w, i, src >= 0 ? proj_.data() + (j * cs + src) * C : halo.data() + (R + src) * C, out);
        }
      }
    }
    gdn_activate(d_, w, n, pre_.data(), ab_.data(), q_.data(), k_.data(), v_.data(), qinv_.data(), kinv_.data(),
                 g_.data(), beta_.data());
    // Padding rows (positions past the prompt) leave the state as it is: beta = 0, decay 1.
    for (int j = 0; j < 2; ++j) {
      const int64_t q = j == 0 ? rank : 2 * N - 1 - rank;
      for (int64_t t = real_of(q); t < cs; ++t)
        for (int64_t hh = 0; hh < H; ++hh) {
          beta_[size_t((j * cs + t) * H + hh)] = 0.0f;
          g_[size_t((j * cs + t) * H + hh)] = 0.0f;
        }
    }
  }
  // The recurrence: along the chain of pieces, or (exact numerics) as one call over the prompt
  if (r.num->exact()) whole_prompt(r, b, gl, cached, T, cs, n);
  else chain_prompt(r, b, gl, cached, cs, n);
  if (holds) {  // the tail after the last real token
    tail_home.assign(size_t(R * C), 0.0f);
    if (R > 0) rows_before(2 * N, tail_home.data());
  }
  gdn_out(r, w, n, o_.data(), z_.data(), on_.data(), orstd_.data(), y_.data(), x, x1);
}

void GdnInfer::chain_prompt(const LayerRun& r, int64_t b, int64_t gl, int64_t cached, int64_t cs, int64_t n) {
  const int N = cp_.size(), rank = cp_.rank(), home_rank = home(b);
  const int64_t H = d_.gdn_H, Dk = d_.gdn_Dk, Dv = d_.gdn_Dv, SS = H * Dv * Dk;
  const int32_t layer = int32_t(r.layer);
  std::vector<float>& S_home = state(b, gl);
  // The stored state to the chain's head (rank 0, position 0); the state after the last real
  // token from the chain's end (rank 0, position 2N-1) home.
  std::vector<float> s0(static_cast<size_t>(SS), 0.0f), s_end(static_cast<size_t>(SS), 0.0f);
  if (cached > 0 && !d_.gdn_replicated) move_state(home_rank, 0, S_home, s0, kTagState);
  if (cached > 0 && d_.gdn_replicated && rank == 0) s0 = S_home;
  const GdnChain chain = GdnChain::zigzag(N);
  std::vector<GdnParams> pieces(2);
  for (int j = 0; j < 2; ++j) {
    GdnParams& p = pieces[size_t(j)];
    const int64_t r0 = j * cs;
    p.T = cs, p.H = int32_t(H), p.Dk = int32_t(Dk), p.Dv = int32_t(Dv), p.chunk = d_.gdn_chunk;
    p.q = q_.data() + r0 * H * Dk, p.k = k_.data() + r0 * H * Dk, p.v = v_.data() + r0 * H * Dv;
    p.g = g_.data() + r0 * H, p.beta = beta_.data() + r0 * H, p.o = o_.data() + r0 * H * Dv;
  }
  if (rank == 0) {
    pieces[0].s0 = cached > 0 ? s0.data() : nullptr;  // position 0
    pieces[1].s_out = s_end.data();                    // position 2N-1
  }
  GdnCpContext ctx;
  {
    Tracer::Scope sc(r.tr, Phase::attn_fwd, layer, -1, gdn_fwd_flops(double(n), H, Dk, Dv, d_.gdn_chunk), 0);
    sched_->forward(cp_, chain, pieces, ctx, &r.st);
  }
  if (d_.gdn_replicated) {  // the state after the prompt to every rank
    cp_.broadcast(std::span<float>(s_end), 0);
    S_home = s_end;
  } else {
    if (rank == home_rank) S_home.resize(size_t(SS));
    move_state(0, home_rank, s_end, S_home, kTagState + 1);
  }
}

void GdnInfer::whole_prompt(const LayerRun& r, int64_t b, int64_t gl, int64_t cached, int64_t T, int64_t cs,
                            int64_t n) {
  const int N = cp_.size(), rank = cp_.rank(), home_rank = home(b);
  const int64_t H = d_.gdn_H, Dk = d_.gdn_Dk, Dv = d_.gdn_Dv, SS = H * Dv * Dk;
  // the prompt's T real rows of q, k, v, g and beta, in position order
  std::vector<float> q(size_t(T * H * Dk)), k(q.size()), v(size_t(T * H * Dv)), g(size_t(T * H)), beta(g.size()),
      o(v.size());
  struct Field {
    const float* rows;  // this rank's n rows
    float* prompt;      // the prompt's T rows
    int64_t w;          // floats per row
  };
  const Field fields[] = {{q_.data(), q.data(), H * Dk}, {k_.data(), k.data(), H * Dk}, {v_.data(), v.data(), H * Dv},
                          {g_.data(), g.data(), H}, {beta_.data(), beta.data(), H}};
  const int64_t W = H * (2 * Dk + Dv + 2);  // one row of every field
  // every rank's rows (its two pieces, padding included) to every rank
  std::vector<float> mine(static_cast<size_t>(n * W)), all(static_cast<size_t>(N * n * W));
  for (int64_t i = 0; i < n; ++i) {
    float* row = mine.data() + i * W;
    for (const Field& f : fields) row = std::copy_n(f.rows + i * f.w, f.w, row);
  }
  {
    Tracer::Scope sc(r.tr, Phase::all_gather, int32_t(r.layer), -1, 0, double(n * W) * 4 * (N - 1));
    cp_.all_gather(std::span<const float>(mine), std::span<float>(all));
  }
  // piece q (held by rank q or 2N-1-q, as its first or second) starts at position q * cs
  for (int64_t p = 0; p < T; ++p) {
    const int64_t piece = p / cs, owner = piece < N ? piece : 2 * N - 1 - piece, j = piece < N ? 0 : 1;
    const float* row = all.data() + (owner * n + j * cs + p % cs) * W;
    for (const Field& f : fields) {
      std::copy_n(row, f.w, f.prompt + p * f.w);
      row += f.w;
    }
  }
  // the stored state (on its home, or on every rank) to every rank
  std::vector<float>& S_home = state(b, gl);
  std::vector<float> s0(static_cast<size_t>(SS), 0.0f), s_end(static_cast<size_t>(SS), 0.0f);
  if (cached > 0) {
    if (rank == home_rank || d_.gdn_replicated) s0 = S_home;
    if (!d_.gdn_replicated) cp_.broadcast(std::span<float>(s0), home_rank);
  }
  GdnParams p;
  p.T = T, p.H = int32_t(H), p.Dk = int32_t(Dk), p.Dv = int32_t(Dv), p.chunk = d_.gdn_chunk;
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.g = g.data(), p.beta = beta.data(), p.o = o.data();
  p.s0 = cached > 0 ? s0.data() : nullptr;
  p.s_out = s_end.data();
  {
    Tracer::Scope sc(r.tr, Phase::attn_fwd, int32_t(r.layer), -1, gdn_fwd_flops(double(T), H, Dk, Dv, d_.gdn_chunk), 0);
    gdn_fwd(p);
  }
  // this rank's rows of the output (padding rows: zero), and the state after the prompt
  for (int j = 0; j < 2; ++j) {
    const int64_t piece = j == 0 ? rank : 2 * N - 1 - rank;
    for (int64_t t = 0; t < cs; ++t) {
      const int64_t pos = piece * cs + t;
      float* dst = o_.data() + (j * cs + t) * H * Dv;
      if (pos < T) std::copy_n(o.data() + pos * H * Dv, H * Dv, dst);
      else std::fill_n(dst, H * Dv, 0.0f);
    }
  }
  if (rank == home_rank || d_.gdn_replicated) S_home = s_end;
}

void GdnInfer::decode(const LayerRun& r, const LayerView& w, int64_t gl, const std::vector<int64_t>& seqs, int64_t n,
                      const float* x, float* x1) {
  if (d_.gdn_replicated) return decode_replicated(r, w, gl, n, x, x1);
  if (n == 0) return;  // no collective in a GDN decode
  const int64_t dim = d_.dim;
  ensure(n);
  const int32_t layer = int32_t(r.layer);
  {
    Tracer::Scope sc(r.tr, Phase::norm, layer, -1, 0, 0);
    rmsnorm_fwd(x, w.attn_norm, h_.data(), rstd_.data(), n, dim, d_.norm_eps);
  }
  gdn_in_proj(r, w, n, h_.data(), proj_.data(), ab_.data(), z_.data());
  {
    Tracer::Scope sc(r.tr, Phase::attn_fwd, layer, -1, 0, 0);
    step_rows(w, gl, seqs, n, proj_.data(), ab_.data(), o_.data());
  }
  gdn_out(r, w, n, o_.data(), z_.data(), on_.data(), orstd_.data(), y_.data(), x, x1);
}

void GdnInfer::step_rows(const LayerView& w, int64_t gl, const std::vector<int64_t>& seqs, int64_t n,
                         const float* proj, const float* ab, float* o) {
  const int64_t H = d_.gdn_H, Dk = d_.gdn_Dk, Dv = d_.gdn_Dv, K = d_.gdn_conv, R = K - 1, C = C_;
  const int64_t SS = H * Dv * Dk;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float>& tl = tail(seqs[size_t(i)], gl);
    if (tl.empty()) tl.assign(size_t(R * C), 0.0f);
    float* out = pre_.data() + i * C;
    const float* cur = proj + i * C;
    std::fill(out, out + C, 0.0f);
    for (int64_t t = 0; t < K; ++t) gdn_conv_tap(d_, w, t, t < R ? tl.data() + t * C : cur, out);
    if (R > 0) {  // the tail moves on by one token
      std::memmove(tl.data(), tl.data() + C, sizeof(float) * size_t((R - 1) * C));
      std::memcpy(tl.data() + (R - 1) * C, cur, sizeof(float) * size_t(C));
    }
  }
  gdn_activate(d_, w, n, pre_.data(), ab, q_.data(), k_.data(), v_.data(), qinv_.data(), kinv_.data(), g_.data(),
               beta_.data());
  const float scale = 1.0f / std::sqrt(float(Dk));
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float>& S = state(seqs[size_t(i)], gl);
    if (S.empty()) S.assign(size_t(SS), 0.0f);
#pragma omp parallel for schedule(static)
    for (int64_t hh = 0; hh < H; ++hh) {  // one step of the recurrence (kernels/ref/gdn_ref.hpp)
      float* Sh = S.data() + hh * Dv * Dk;
      const float* kt = k_.data() + (i * H + hh) * Dk;
      const float* qt = q_.data() + (i * H + hh) * Dk;
      const float* vt = v_.data() + (i * H + hh) * Dv;
      const float a = std::exp(g_[size_t(i * H + hh)]), bt = beta_[size_t(i * H + hh)];
      float* ot = o + (i * H + hh) * Dv;
      for (int64_t vv = 0; vv < Dv; ++vv) {
        float* row = Sh + vv * Dk;
        float sk = 0;
        for (int64_t e = 0; e < Dk; ++e) sk += row[e] * kt[e];
        const float u = vt[vv] - a * sk;
        float acc = 0;
        for (int64_t e = 0; e < Dk; ++e) {
          row[e] = a * row[e] + bt * u * kt[e];
          acc += row[e] * qt[e];
        }
        ot[vv] = scale * acc;
      }
    }
  }
}

// Every rank keeps every sequence's context: the owners' new projections to every rank (one
// all-gather of ceil(B/N) rows of C + 2H floats per rank), every rank steps every sequence, the
// owners finish their rows.
void GdnInfer::decode_replicated(const LayerRun& r, const LayerView& w, int64_t gl, int64_t n, const float* x,
                                 float* x1) {
  const int N = cp_.size(), rank = cp_.rank();
  const int64_t dim = d_.dim, H = d_.gdn_H, C = C_, width = C + 2 * H;
  ensure(std::max<int64_t>(B_, 1));
  std::vector<float> mine(static_cast<size_t>(Bq_ * width), 0.0f), all(static_cast<size_t>(Bq_ * width * N));
  if (n > 0) {
    {
      Tracer::Scope sc(r.tr, Phase::norm, int32_t(r.layer), -1, 0, 0);
      rmsnorm_fwd(x, w.attn_norm, h_.data(), rstd_.data(), n, dim, d_.norm_eps);
    }
    gdn_in_proj(r, w, n, h_.data(), proj_.data(), ab_.data(), z_.data());
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(mine.data() + i * width, proj_.data() + i * C, sizeof(float) * size_t(C));
      std::memcpy(mine.data() + i * width + C, ab_.data() + i * 2 * H, sizeof(float) * size_t(2 * H));
    }
  }
  {
    Tracer::Scope sc(r.tr, Phase::all_gather, int32_t(r.layer), -1, 0, double(mine.size()) * 4);
    cp_.all_gather(std::span<const float>(mine), std::span<float>(all));
  }
  std::vector<float> P(static_cast<size_t>(B_ * C)), AB(static_cast<size_t>(B_ * 2 * H)),
      O(static_cast<size_t>(B_ * d_.gdn_v_width()));
  std::vector<int64_t> every(static_cast<size_t>(B_));
  for (int64_t b = 0; b < B_; ++b) {  // sequence b is row b % Bq of rank b / Bq's block
    every[size_t(b)] = b;
    std::memcpy(P.data() + b * C, all.data() + b * width, sizeof(float) * size_t(C));
    std::memcpy(AB.data() + b * 2 * H, all.data() + b * width + C, sizeof(float) * size_t(2 * H));
  }
  {
    Tracer::Scope sc(r.tr, Phase::attn_fwd, int32_t(r.layer), -1, 0, 0);
    step_rows(w, gl, every, B_, P.data(), AB.data(), O.data());
  }
  if (n > 0)
    gdn_out(r, w, n, O.data() + rank * Bq_ * d_.gdn_v_width(), z_.data(), on_.data(), orstd_.data(), y_.data(), x, x1);
}

}  // namespace ctxpar::infer
