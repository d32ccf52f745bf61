#include "infer/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>

#include "core/error.hpp"
#include "cp/common.hpp"
#include "cp/ring_core.hpp"
#include "dist/topology.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "shard/partition.hpp"
#include "trace/trace.hpp"

namespace ctxpar::infer {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kTagQ = 201;  // pass-Q / decode query blocks (distinct from the ring's K/V tag)
// Row chunks of a block's compute while a transfer is in flight (see cp::progress_chunk_rows).
constexpr int kProgressParts = 8;

size_t align64(size_t x) { return (x + 63) & ~size_t(63); }

// One circulating query block: q [n, H_q, D] (decode also k, v [n, H_kv, D]), positions [n],
// sequence ids [n] (decode; -1 = padding row), packed in one byte buffer (one message per hop).
struct QLayout {
  int64_t n = 0;
  size_t q_off = 0, k_off = 0, v_off = 0, pos_off = 0, seq_off = 0, bytes = 0;
};
QLayout q_layout(int64_t n, int32_t H_q, int32_t H_kv, int32_t D, bool with_kv) {
  QLayout L;
  L.n = n;
  const size_t qb = align64(size_t(n) * H_q * D * sizeof(float));
  const size_t kb = with_kv ? align64(size_t(n) * H_kv * D * sizeof(float)) : 0;
  L.q_off = 0;
  L.k_off = qb;
  L.v_off = qb + kb;
  L.pos_off = qb + 2 * kb;
  L.seq_off = L.pos_off + align64(size_t(n) * sizeof(int64_t));
  L.bytes = L.seq_off + (with_kv ? align64(size_t(n) * sizeof(int64_t)) : 0);
  return L;
}
template <class T> T* at(std::byte* base, size_t off) { return reinterpret_cast<T*>(base + off); }

// Partial results of one block: [o (n H_q D) | lse (n H_q)] floats.
size_t partial_elems(int64_t n, int32_t H_q, int32_t D) { return size_t(n) * H_q * (size_t(D) + 1); }

}  // namespace

const char* decode_algo_name(DecodeAlgo a) { return a == DecodeAlgo::pass_q ? "pass_q" : "allgather"; }

int32_t greedy(const float* logits, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

Engine::Engine(const ParamLayout& layout, const float* params, Topology& topo, int64_t batch, int64_t capacity_tokens,
               const std::string& full_strategy)
    : layout_(layout), d_(layout.dims()), w_(layout.view(const_cast<float*>(params))), topo_(topo), cp_(topo.cp()),
      cache_(batch, layout.dims().layers, layout.dims().H_kv, layout.dims().D, topo.cp().size(), topo.cp().rank(),
             capacity_tokens) {
  CTXPAR_CHECK(d_.tp == 1, "inference runs with tp = 1");
  full_strategy_ = make_strategy(full_strategy, topo);
  CTXPAR_CHECK(full_strategy_ != nullptr, "unknown CP strategy " << full_strategy);
  inv_freq_.resize(size_t(d_.D / 2));
  rope_inv_freq(d_.D, d_.rope_theta, d_.rope_factor, d_.rope_low, d_.rope_high, d_.rope_orig_max, inv_freq_.data());
}

Engine::~Engine() = default;

int Engine::N() const { return cp_.size(); }

double Engine::prefill_flops(int64_t T, int64_t P) const { return ctxpar::prefill_flops(d_, T, P); }

double Engine::decode_flops(int64_t ctx) const { return ctxpar::prefill_flops(d_, 1, ctx); }

void Engine::ensure_rows(int64_t n) {
  if (n <= rows_cap_) return;
  const size_t r = size_t(n), dim = size_t(d_.dim), qw = size_t(d_.q_width()), kw = size_t(d_.kv_width()),
               F = size_t(d_.ffn);
  x_.resize(r * dim, false); h_.resize(r * dim, false); x1_.resize(r * dim, false);
  q_.resize(r * qw, false); o_.resize(r * qw, false); lse_.resize(r * size_t(d_.H_q), false);
  k_.resize(r * kw, false); v_.resize(r * kw, false);
  g_.resize(r * F, false); u_.resize(r * F, false); m_.resize(r * F, false);
  cos_.resize(r * size_t(d_.D / 2), false); sin_.resize(r * size_t(d_.D / 2), false);
  rows_cap_ = n;
}

void Engine::gemm(int64_t M, int64_t Nc, int64_t K, const float* A, const float* B, float* C, int64_t l) {
  const double t0 = now_s();
  {
    Tracer::Scope sc(tr_, Phase::gemm, int32_t(l), -1, 2.0 * double(M) * double(Nc) * double(K), 0);
    sgemm(false, false, M, Nc, K, 1.0f, A, K, B, Nc, 0.0f, C, Nc);
  }
  st_->gemm_s += now_s() - t0;
}

void Engine::forward(int64_t n, const int32_t* tokens, const int64_t* pos, const AttnFn& attn,
                     const std::vector<int64_t>& logit_rows, float* logits) {
  ensure_rows(std::max<int64_t>(n, 1));
  const int64_t dim = d_.dim, qw = d_.q_width(), kw = d_.kv_width(), F = d_.ffn;
  float *x = x_.data(), *h = h_.data(), *x1 = x1_.data();
  if (n > 0) {
    Tracer::Scope sc(tr_, Phase::embed, -1, -1, 0, 0);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(x + i * dim, w_.emb + int64_t(tokens[i]) * dim, size_t(dim) * sizeof(float));
    rope_table(pos, n, d_.D, inv_freq_.data(), cos_.data(), sin_.data());
  }
  for (int64_t l = 0; l < d_.layers; ++l) {
    const LayerView& w = w_.layers[size_t(l)];
    if (n > 0) {
      {
        Tracer::Scope sc(tr_, Phase::norm, int32_t(l), -1, 0, 0);
        rmsnorm_fwd(x, w.attn_norm, h, lse_.data(), n, dim, d_.norm_eps);  // rstd scratch: lse_
      }
      gemm(n, qw, dim, h, w.wq, q_.data(), l);
      gemm(n, kw, dim, h, w.wk, k_.data(), l);
      gemm(n, kw, dim, h, w.wv, v_.data(), l);
      Tracer::Scope sc(tr_, Phase::rope, int32_t(l), -1, 0, 0);
      rope_apply(q_.data(), n, d_.H_q, d_.D, cos_.data(), sin_.data(), false);
      rope_apply(k_.data(), n, d_.H_kv, d_.D, cos_.data(), sin_.data(), false);
    }
    const double t0 = now_s();
    attn(l, q_.data(), k_.data(), v_.data(), o_.data(), lse_.data());
    st_->attn_s += now_s() - t0;
    if (n == 0) continue;
    gemm(n, dim, qw, o_.data(), w.wo, x1, l);
    for (int64_t i = 0; i < n * dim; ++i) x1[i] += x[i];
    {
      Tracer::Scope sc(tr_, Phase::norm, int32_t(l), -1, 0, 0);
      rmsnorm_fwd(x1, w.mlp_norm, h, lse_.data(), n, dim, d_.norm_eps);
    }
    gemm(n, F, dim, h, w.w1, g_.data(), l);
    gemm(n, F, dim, h, w.w3, u_.data(), l);
    {
      Tracer::Scope sc(tr_, Phase::mlp, int32_t(l), -1, 0, 0);
      swiglu_fwd(g_.data(), u_.data(), m_.data(), n * F);
    }
    gemm(n, dim, F, m_.data(), w.w2, x, l);
    for (int64_t i = 0; i < n * dim; ++i) x[i] += x1[i];
  }
  if (logit_rows.empty()) return;
  // Final norm and LM head of the requested rows only (the next token needs one row).
  const int64_t k = int64_t(logit_rows.size());
  for (int64_t i = 0; i < k; ++i)
    std::memcpy(x1 + i * dim, x + logit_rows[size_t(i)] * dim, size_t(dim) * sizeof(float));
  rmsnorm_fwd(x1, w_.final_norm, h, lse_.data(), k, dim, d_.norm_eps);
  gemm(k, d_.vocab, dim, h, w_.lm_head, logits, -1);
}

void Engine::pass_q(int64_t n, const float* q, const int64_t* q_pos, const float* k, const float* v,
                    const int64_t* k_pos, int64_t S_k, float* o, float* lse, int64_t l) {
  const int N = cp_.size(), r = cp_.rank(), next = (r + 1) % N, prev = (r + N - 1) % N;
  const int32_t Hq = d_.H_q, D = d_.D;
  const QLayout L = q_layout(n, Hq, d_.H_kv, D, false);
  Buffer<std::byte> blk[2] = {Buffer<std::byte>(L.bytes, false), Buffer<std::byte>(L.bytes, false)};
  std::memcpy(at<float>(blk[0].data(), L.q_off), q, size_t(n) * Hq * D * sizeof(float));
  std::memcpy(at<int64_t>(blk[0].data(), L.pos_off), q_pos, size_t(n) * sizeof(int64_t));
  const size_t pe = partial_elems(n, Hq, D);
  Buffer<float> part(pe * size_t(N), false), back(pe * size_t(N), false);
  const int64_t chunk = cp::progress_chunk_rows(n, kProgressParts);
  CpStats& st = st_->cp;
  for (int s = 0; s < N; ++s) {
    const int cur = s % 2, origin = (r - s + N) % N;
    if (tr_) tr_->progress(Phase::attn_fwd, int32_t(l));
    Request req;
    if (s < N - 1) {
      req = cp_.send_recv_async(blk[cur].span(), next, blk[1 - cur].span(), prev, kTagQ);
      st.messages += 1;
      st.bytes_sent += double(L.bytes);
    }
    AttnParams p;
    p.q = at<float>(blk[cur].data(), L.q_off);
    p.q_pos = at<int64_t>(blk[cur].data(), L.pos_off);
    p.k = k; p.v = v; p.k_pos = k_pos;
    p.S_q = n; p.S_k = S_k; p.H_q = Hq; p.H_kv = d_.H_kv; p.D = D;
    p.o = part.data() + size_t(origin) * pe;
    p.lse = p.o + size_t(n) * Hq * D;
    const double flops = attn_fwd_flops(double(visible_pairs(p)), Hq, D);
    const double t0 = tr_ ? tr_->now_us() : 0;
    cp::fwd_chunked(p, chunk, false, nullptr, nullptr, [&] {
      if (req.pending()) cp_.test(req);
    });
    st.attn_flops += flops;
    if (tr_) tr_->add_span(Phase::attn_fwd, int32_t(l), s, t0, tr_->now_us(), flops, 0);
    cp::timed_wait(cp_, req, st, tr_, s, double(L.bytes));
  }
  // Block j of `part` holds rank j's queries against this rank's keys: one all-to-all sends each
  // home; `back` then holds, block by block, every rank's partial for this rank's queries.
  const double a2a_bytes = double(pe) * sizeof(float) * (N - 1);
  if (N > 1) {
    cp::timed_collective(cp_, st, tr_, Phase::all_to_all, a2a_bytes, [&] { cp_.all_to_all(part.span(), back.span()); });
  } else {
    std::memcpy(back.data(), part.data(), pe * sizeof(float));
  }
  // Merge in rank order (a fixed order: the result does not depend on arrival times).
  Tracer::Scope sc(tr_, Phase::attn_fwd, int32_t(l), N, 0, 0);
  std::memcpy(o, back.data(), size_t(n) * Hq * D * sizeof(float));
  std::memcpy(lse, back.data() + size_t(n) * Hq * D, size_t(n) * Hq * sizeof(float));
  for (int j = 1; j < N; ++j) {
    const float* bo = back.data() + size_t(j) * pe;
    lse_merge(o, lse, bo, bo + size_t(n) * Hq * D, n, Hq, D);
  }
}

StepOutput Engine::prefill(const std::vector<std::vector<int32_t>>& tokens, CpAlgo algo, Tracer* tr, CallStats& st,
                           bool want_logits, bool want_all_logits) {
  tr_ = tr;
  st_ = &st;
  const double t_start = now_s();
  const int N = cp_.size(), r = cp_.rank();
  const int64_t B = cache_.batch(), V = d_.vocab;
  CTXPAR_CHECK(int64_t(tokens.size()) == B, "prefill needs tokens of " << B << " sequences");
  StepOutput out;
  out.next_tokens.resize(size_t(B));
  if (want_logits) out.logits.resize(size_t(B * V));
  if (want_all_logits) out.all_logits.resize(size_t(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t T = int64_t(tokens[size_t(b)].size()), P = cache_.seq_len(b);
    const Partition part(PartitionKind::zigzag, T, N);
    const std::vector<int64_t> idx = part.positions(r);
    const int64_t n = int64_t(idx.size());
    std::vector<int64_t> pos(static_cast<size_t>(n));
    std::vector<int32_t> tok(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      pos[size_t(i)] = P + idx[size_t(i)];
      tok[size_t(i)] = tokens[size_t(b)][size_t(idx[size_t(i)])];
    }
    const int64_t first = cache_.reserve(b, n, pos.data());
    // Padded block of pass-KV: every rank's block has the longest rank's rows.
    int64_t S_k_max = 0;
    for (int rr = 0; rr < N; ++rr) S_k_max = std::max(S_k_max, cache_.len(b, rr) + part.local_size(rr));
    const int64_t S_k_local = cache_.len(b) + n;
    const int64_t kw = cache_.row_elems();
    AttnFn attn = [&](int64_t l, float* q, float* k, float* v, float* o, float* lse) {
      std::memcpy(cache_.k(b, l) + first * kw, k, size_t(n * kw) * sizeof(float));
      std::memcpy(cache_.v(b, l) + first * kw, v, size_t(n * kw) * sizeof(float));
      if (algo == CpAlgo::pass_q) {
        pass_q(n, q, pos.data(), cache_.k(b, l), cache_.v(b, l), cache_.pos(b), S_k_local, o, lse, l);
      } else if (P == 0) {
        // Full prefill: the configured CP strategy on the new tokens alone.
        AttnParams t = attn_problem(n, d_.H_q, d_.H_kv, d_.D, MaskKind::causal, 0);
        t.q_pos = t.k_pos = pos.data();
        t.q = q; t.k = k; t.v = v; t.o = o; t.lse = lse;
        full_strategy_->forward(t, tr_, st_->cp);
      } else {
        AttnParams a = attn_problem(n, d_.H_q, d_.H_kv, d_.D, MaskKind::causal, 0);
        a.S_k = S_k_max;
        a.q = q;
        a.q_pos = pos.data();
        a.k = cache_.k(b, l);
        a.v = cache_.v(b, l);
        a.k_pos = cache_.pos(b);
        a.o = o;
        a.lse = lse;
        cp::ring_fwd(&cp_, a, tr_, st_->cp);
      }
    };
    // Logits: the last prompt token's row (owner rank) or every local row (tests).
    const int owner = part.owner(T - 1);
    std::vector<int64_t> rows;
    if (want_all_logits) {
      for (int64_t i = 0; i < n; ++i) rows.push_back(i);
    } else if (r == owner) {
      rows.push_back(part.local_index(T - 1));
    }
    Buffer<float> lg(size_t(std::max<int64_t>(int64_t(rows.size()), 1) * V), false);
    forward(n, tok.data(), pos.data(), attn, rows, lg.data());
    std::vector<int64_t> added(static_cast<size_t>(N));
    for (int rr = 0; rr < N; ++rr) added[size_t(rr)] = part.local_size(rr);
    cache_.commit(b, added, false);
    Buffer<float> last(size_t(V), false);
    if (r == owner) {
      const int64_t row = want_all_logits ? part.local_index(T - 1) : 0;
      std::memcpy(last.data(), lg.data() + row * V, size_t(V) * sizeof(float));
    }
    cp_.broadcast(last.span(), owner);
    out.next_tokens[size_t(b)] = greedy(last.data(), V);
    if (want_logits) std::memcpy(out.logits.data() + b * V, last.data(), size_t(V) * sizeof(float));
    if (want_all_logits) {
      std::vector<float> all(static_cast<size_t>(n * V * N));
      cp_.all_gather(std::span<const float>(lg.data(), size_t(n * V)), std::span<float>(all));
      std::vector<float>& g = out.all_logits[size_t(b)];
      g.resize(size_t(T * V));
      for (int rr = 0; rr < N; ++rr)
        part.gather_rows(std::span<const float>(all.data() + size_t(rr) * n * V, size_t(n * V)), V, rr,
                         std::span<float>(g));
    }
  }
  st.total_s += now_s() - t_start;
  return out;
}

StepOutput Engine::decode(const std::vector<int32_t>& tokens, DecodeAlgo algo, Tracer* tr, CallStats& st,
                          bool want_logits) {
  tr_ = tr;
  st_ = &st;
  const double t_start = now_s();
  const int N = cp_.size(), r = cp_.rank(), next = (r + 1) % N, prev = (r + N - 1) % N;
  const int64_t B = cache_.batch(), V = d_.vocab;
  const int32_t Hq = d_.H_q, Hkv = d_.H_kv, D = d_.D;
  CTXPAR_CHECK(int64_t(tokens.size()) == B, "decode needs one token for each of " << B << " sequences");
  // Rows of this rank: sequences r*Bq .. r*Bq + Bq - 1 (those < B); blocks padded to Bq rows.
  const int64_t Bq = (B + N - 1) / N, b0 = r * Bq, n = std::max<int64_t>(0, std::min(Bq, B - b0));
  std::vector<int64_t> seq_pos(static_cast<size_t>(B)), slot(size_t(B), -1);
  for (int64_t b = 0; b < B; ++b) {
    seq_pos[size_t(b)] = cache_.seq_len(b);
    if (cache_.decode_target(b) == r) slot[size_t(b)] = cache_.reserve(b, 1, &seq_pos[size_t(b)]);
  }
  std::vector<int32_t> tok(size_t(std::max<int64_t>(n, 1)));
  std::vector<int64_t> pos(size_t(std::max<int64_t>(n, 1)));
  for (int64_t i = 0; i < n; ++i) {
    tok[size_t(i)] = tokens[size_t(b0 + i)];
    pos[size_t(i)] = seq_pos[size_t(b0 + i)];
  }
  const QLayout L = q_layout(Bq, Hq, Hkv, D, true);
  const size_t pe = partial_elems(Bq, Hq, D);
  const int64_t kw = int64_t(Hkv) * D, qw = int64_t(Hq) * D;
  AttnFn attn = [&](int64_t l, float* q, float* k, float* v, float* o, float* lse) {
    CpStats& cs = st_->cp;
    // This rank's query block: q, k, v, positions, sequence ids (padding rows: id -1).
    const int nblk = algo == DecodeAlgo::allgather ? N : 2;
    Buffer<std::byte> blk(L.bytes * size_t(nblk), true);
    std::byte* mine = blk.data();
    std::memcpy(at<float>(mine, L.q_off), q, size_t(n * qw) * sizeof(float));
    std::memcpy(at<float>(mine, L.k_off), k, size_t(n * kw) * sizeof(float));
    std::memcpy(at<float>(mine, L.v_off), v, size_t(n * kw) * sizeof(float));
    for (int64_t i = 0; i < Bq; ++i) {
      at<int64_t>(mine, L.pos_off)[i] = i < n ? pos[size_t(i)] : -1;
      at<int64_t>(mine, L.seq_off)[i] = i < n ? b0 + i : -1;
    }
    Buffer<float> part(pe * size_t(N), false), back(pe * size_t(N), false);
    // Partials of block `origin` (at `base`) against this rank's cache; the round-robin target of
    // a sequence first appends the token's K/V, so the token also sees itself.
    auto visit = [&](std::byte* base, int origin) {
      float* po = part.data() + size_t(origin) * pe;
      float* pl = po + size_t(Bq) * qw;
      double flops = 0;
      const double t0 = tr_ ? tr_->now_us() : 0;
      for (int64_t i = 0; i < Bq; ++i) {
        const int64_t b = at<int64_t>(base, L.seq_off)[i];
        const int64_t S_k = b < 0 ? 0 : cache_.len(b) + (slot[size_t(b)] >= 0 ? 1 : 0);
        if (b >= 0 && slot[size_t(b)] >= 0) {
          std::memcpy(cache_.k(b, l) + slot[size_t(b)] * kw, at<float>(base, L.k_off) + i * kw, size_t(kw) * sizeof(float));
          std::memcpy(cache_.v(b, l) + slot[size_t(b)] * kw, at<float>(base, L.v_off) + i * kw, size_t(kw) * sizeof(float));
        }
        if (S_k == 0) {  // nothing of this sequence here (or a padding row): o = 0, lse = -inf
          std::fill_n(po + i * qw, qw, 0.f);
          std::fill_n(pl + i * Hq, Hq, kNegInf);
          continue;
        }
        AttnParams p;
        p.q = at<float>(base, L.q_off) + i * qw;
        p.q_pos = at<int64_t>(base, L.pos_off) + i;
        p.k = cache_.k(b, l); p.v = cache_.v(b, l); p.k_pos = cache_.pos(b);
        p.S_q = 1; p.S_k = S_k; p.H_q = Hq; p.H_kv = Hkv; p.D = D;
        p.o = po + i * qw;
        p.lse = pl + i * Hq;
        attn_fwd(p);
        flops += attn_fwd_flops(double(S_k), Hq, D);  // a decode query sees every cached key
      }
      cs.attn_flops += flops;
      if (tr_) tr_->add_span(Phase::attn_fwd, int32_t(l), origin, t0, tr_->now_us(), flops, 0);
    };
    if (algo == DecodeAlgo::allgather) {
      if (N > 1) {
        Buffer<std::byte> mine_copy(L.bytes, false);
        std::memcpy(mine_copy.data(), mine, L.bytes);
        cp::timed_collective(cp_, cs, tr_, Phase::all_gather, double(L.bytes) * (N - 1),
                             [&] { cp_.all_gather(mine_copy.span(), blk.span()); });
      }
      for (int j = 0; j < N; ++j) visit(blk.data() + size_t(j) * L.bytes, j);
    } else {
      for (int s = 0; s < N; ++s) {
        const int cur = s % 2;
        std::byte* here = blk.data() + size_t(cur) * L.bytes;
        Request req;
        if (s < N - 1) {
          req = cp_.send_recv_async(std::span<std::byte>(here, L.bytes), next,
                                    std::span<std::byte>(blk.data() + size_t(1 - cur) * L.bytes, L.bytes), prev, kTagQ);
          cs.messages += 1;
          cs.bytes_sent += double(L.bytes);
        }
        visit(here, (r - s + N) % N);
        cp::timed_wait(cp_, req, cs, tr_, s, double(L.bytes));
      }
    }
    if (N > 1) {
      cp::timed_collective(cp_, cs, tr_, Phase::all_to_all, double(pe) * sizeof(float) * (N - 1),
                           [&] { cp_.all_to_all(part.span(), back.span()); });
    } else {
      std::memcpy(back.data(), part.data(), pe * sizeof(float));
    }
    if (n == 0) return;
    Tracer::Scope sc(tr_, Phase::attn_fwd, int32_t(l), N, 0, 0);
    // Rows [0, n) of each returned block belong to this rank's sequences; merge in rank order.
    std::memcpy(o, back.data(), size_t(n * qw) * sizeof(float));
    std::memcpy(lse, back.data() + size_t(Bq) * qw, size_t(n) * Hq * sizeof(float));
    for (int j = 1; j < N; ++j) {
      const float* bo = back.data() + size_t(j) * pe;
      lse_merge(o, lse, bo, bo + size_t(Bq) * qw, n, Hq, D);
    }
  };
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = i;
  Buffer<float> lg(size_t(Bq * V), true);
  forward(n, tok.data(), pos.data(), attn, rows, lg.data());
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> added(size_t(N), 0);
    added[size_t(cache_.decode_target(b))] = 1;
    cache_.commit(b, added, true);
  }
  StepOutput out;
  std::vector<int32_t> mine(size_t(Bq), -1), all(size_t(Bq * N));
  for (int64_t i = 0; i < n; ++i) mine[size_t(i)] = greedy(lg.data() + i * V, V);
  cp_.all_gather(std::span<const int32_t>(mine), std::span<int32_t>(all));
  out.next_tokens.assign(all.begin(), all.begin() + B);
  if (want_logits) {
    std::vector<float> g(static_cast<size_t>(Bq * N * V));
    cp_.all_gather(std::span<const float>(lg.data(), size_t(Bq * V)), std::span<float>(g));
    out.logits.assign(g.begin(), g.begin() + B * V);
  }
  st.total_s += now_s() - t_start;
  return out;
}

}  // namespace ctxpar::infer
