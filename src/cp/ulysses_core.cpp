#include "cp/ulysses_core.hpp"

#include <algorithm>
#include <span>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/ring_core.hpp"
#include "trace/trace.hpp"

namespace ctxpar::cp {

HeadSplit head_split(int32_t H, int U) {
  CTXPAR_CHECK(H > 0 && U > 0 && (H % U == 0 || U % H == 0),
               "head_split: " << H << " heads cannot be laid over " << U << " ranks");
  HeadSplit h;
  h.U = U;
  h.H = H;
  h.H_loc = H >= U ? H / U : 1;
  return h;
}

std::string check_heads(const std::string& strategy, int32_t H_q, int32_t H_kv, int U) {
  auto fits = [&](int u) { return H_q % u == 0 && (H_kv % u == 0 || u % H_kv == 0); };
  if (fits(U)) return "";
  std::string valid;
  for (int u = 1; u <= H_q; ++u)
    if (fits(u)) valid += (valid.empty() ? "" : ", ") + std::to_string(u);
  const std::string tail = "; ulysses degrees valid for H_q=" + std::to_string(H_q) + ", H_kv=" +
                           std::to_string(H_kv) + ": " + valid;
  if (H_q % U != 0)
    return strategy + ": heads H_q=" + std::to_string(H_q) + " cannot be split over the ulysses degree U=" +
           std::to_string(U) + " (need H_q % U == 0)" + tail;
  return strategy + ": kv_heads H_kv=" + std::to_string(H_kv) + " can be neither split over nor replicated on U=" +
         std::to_string(U) + " ranks (need H_kv % U == 0 or U % H_kv == 0)" + tail;
}

namespace {

template <class T> std::span<T> sp(T* p, size_t n) { return {p, n}; }

// x [S_loc, H, W] on every rank → y [U * S_loc, H_loc, W]: rank j receives heads
// [first(j), first(j) + H_loc) of every rank's tokens, blocks in rank order.
void scatter_heads(Comm& c, const HeadSplit& hs, const float* x, int64_t S_loc, int32_t W, float* y,
                   CpStats& st, Tracer* tr) {
  const size_t row = size_t(hs.H_loc) * W, blk = size_t(S_loc) * row;
  if (hs.U == 1) {
    std::copy_n(x, blk, y);
    return;
  }
  Buffer<float> send(blk * hs.U, false);
  for (int j = 0; j < hs.U; ++j)
    for (int64_t t = 0; t < S_loc; ++t)
      std::copy_n(x + (size_t(t) * hs.H + hs.first(j)) * W, row, send.data() + j * blk + size_t(t) * row);
  timed_collective(c, st, tr, Phase::all_to_all, double(blk * (hs.U - 1) * sizeof(float)),
                   [&] { c.all_to_all(send.span(), sp(y, blk * hs.U)); });
}

// The reverse: y [U * S_loc, H_loc, W] → x [S_loc, H, W]. Replicated heads (H < U) come back
// from U / H ranks each; their values are summed, which is what the gradients need (each replica
// saw a different subset of the query heads).
void gather_heads(Comm& c, const HeadSplit& hs, const float* y, int64_t S_loc, int32_t W, float* x,
                  CpStats& st, Tracer* tr) {
  const size_t row = size_t(hs.H_loc) * W, blk = size_t(S_loc) * row;
  if (hs.U == 1) {
    std::copy_n(y, blk, x);
    return;
  }
  Buffer<float> recv(blk * hs.U, false);
  timed_collective(c, st, tr, Phase::all_to_all, double(blk * (hs.U - 1) * sizeof(float)),
                   [&] { c.all_to_all(sp(y, blk * hs.U), recv.span()); });
  if (hs.replicated()) std::fill_n(x, size_t(S_loc) * hs.H * W, 0.f);
  for (int j = 0; j < hs.U; ++j)
    for (int64_t t = 0; t < S_loc; ++t) {
      const float* src = recv.data() + j * blk + size_t(t) * row;
      float* dst = x + (size_t(t) * hs.H + hs.first(j)) * W;
      if (hs.replicated())
        for (size_t e = 0; e < row; ++e) dst[e] += src[e];
      else
        std::copy_n(src, row, dst);
    }
}

// Positions and document ids of the U * S_loc gathered tokens, in the all-to-all's order.
struct TokenMeta {
  Buffer<int64_t> pos;
  Buffer<int32_t> doc;
  const int32_t* doc_ptr() const { return doc.size() ? doc.data() : nullptr; }
};
TokenMeta gather_meta(Comm& c, const LocalAttn& t, CpStats& st, Tracer* tr) {
  const int U = c.size();
  const size_t n = size_t(t.S_loc);
  TokenMeta m;
  m.pos.resize(n * U, false);
  timed_collective(c, st, tr, Phase::all_gather, double(n * (U - 1) * sizeof(int64_t)),
                   [&] { c.all_gather(sp(t.pos, n), m.pos.span()); });
  if (t.doc) {
    m.doc.resize(n * U, false);
    timed_collective(c, st, tr, Phase::all_gather, double(n * (U - 1) * sizeof(int32_t)),
                     [&] { c.all_gather(sp(t.doc, n), m.doc.span()); });
  }
  return m;
}

}  // namespace

double ulysses_fwd_bytes(const AttnShape& s, int64_t S_loc, int U) {
  if (U == 1) return 0;
  const HeadSplit hq = head_split(s.H_q, U), hk = head_split(s.H_kv, U);
  const double f = sizeof(float), n = double(S_loc) * (U - 1);
  const double q = n * hq.H_loc * s.D * f, kv = 2 * n * hk.H_loc * s.D * f;
  const double o = q, lse = n * hq.H_loc * f;
  const double meta = n * (sizeof(int64_t) + (s.has_docs ? sizeof(int32_t) : 0));
  return q + kv + o + lse + meta;
}

void ulysses_fwd(Comm& u, Comm* ring, const AttnShape& s, LocalAttn& t, Tracer* tr, CpStats& st) {
  const int U = u.size();
  const HeadSplit hq = head_split(s.H_q, U), hk = head_split(s.H_kv, U);
  const size_t N = size_t(t.S_loc) * U;
  Buffer<float> q(N * hq.H_loc * s.D, false), k(N * hk.H_loc * s.D, false), v(N * hk.H_loc * s.D, false);
  Buffer<float> o(N * hq.H_loc * s.D, false), lse(N * hq.H_loc, false);
  if (tr) tr->progress(Phase::all_to_all);
  scatter_heads(u, hq, t.q, t.S_loc, s.D, q.data(), st, tr);
  scatter_heads(u, hk, t.k, t.S_loc, s.D, k.data(), st, tr);
  scatter_heads(u, hk, t.v, t.S_loc, s.D, v.data(), st, tr);
  TokenMeta m = gather_meta(u, t, st, tr);

  BlockAttn a;
  a.S_q = a.S_k = int64_t(N);
  a.H_q = hq.H_loc;
  a.H_kv = hk.H_loc;
  a.D = s.D;
  a.mask = s.mask;
  a.window = s.window;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.q_pos = a.k_pos = m.pos.data();
  a.q_doc = a.k_doc = m.doc_ptr();
  a.o = o.data();
  a.lse = lse.data();
  ring_fwd(ring, a, tr, st);

  gather_heads(u, hq, o.data(), t.S_loc, s.D, t.o, st, tr);
  gather_heads(u, hq, lse.data(), t.S_loc, 1, t.lse, st, tr);
}

void ulysses_bwd(Comm& u, Comm* ring, const AttnShape& s, LocalAttn& t, Tracer* tr, CpStats& st) {
  const int U = u.size();
  const HeadSplit hq = head_split(s.H_q, U), hk = head_split(s.H_kv, U);
  const size_t N = size_t(t.S_loc) * U;
  const size_t nq = N * hq.H_loc * s.D, nk = N * hk.H_loc * s.D;
  Buffer<float> q(nq, false), k(nk, false), v(nk, false), o(nq, false), dout(nq, false), lse(N * hq.H_loc, false);
  Buffer<float> dq(nq, false), dk(nk, false), dv(nk, false);
  if (tr) tr->progress(Phase::all_to_all);
  scatter_heads(u, hq, t.q, t.S_loc, s.D, q.data(), st, tr);
  scatter_heads(u, hk, t.k, t.S_loc, s.D, k.data(), st, tr);
  scatter_heads(u, hk, t.v, t.S_loc, s.D, v.data(), st, tr);
  scatter_heads(u, hq, t.o, t.S_loc, s.D, o.data(), st, tr);
  scatter_heads(u, hq, t.dout, t.S_loc, s.D, dout.data(), st, tr);
  scatter_heads(u, hq, t.lse, t.S_loc, 1, lse.data(), st, tr);
  TokenMeta m = gather_meta(u, t, st, tr);

  BlockAttn a;
  a.S_q = a.S_k = int64_t(N);
  a.H_q = hq.H_loc;
  a.H_kv = hk.H_loc;
  a.D = s.D;
  a.mask = s.mask;
  a.window = s.window;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.q_pos = a.k_pos = m.pos.data();
  a.q_doc = a.k_doc = m.doc_ptr();
  a.o = o.data();
  a.lse = lse.data();
  a.dout = dout.data();
  a.dq = dq.data();
  a.dk = dk.data();
  a.dv = dv.data();
  ring_bwd(ring, a, tr, st);

  gather_heads(u, hq, dq.data(), t.S_loc, s.D, t.dq, st, tr);
  gather_heads(u, hk, dk.data(), t.S_loc, s.D, t.dk, st, tr);
  gather_heads(u, hk, dv.data(), t.S_loc, s.D, t.dv, st, tr);
}

}  // namespace ctxpar::cp
