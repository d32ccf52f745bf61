#include "cp/ulysses_core.hpp"

#include <algorithm>
#include <span>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/deterministic.hpp"
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

std::string check_heads(const std::string& strategy, const AttnParams& s, int U) {
  std::string e = check_heads(strategy, s.H_q, s.H_kv, U);
  if (e.empty() && s.deterministic && U > 1 && s.H_kv % U != 0)
    e = strategy + ": deterministic = true with kv_heads H_kv=" + std::to_string(s.H_kv) + " replicated on U=" +
        std::to_string(U) + " ranks: a replicated K/V head's gradient would be summed in fp32 after the all-to-all; "
        "valid: a ulysses degree dividing H_kv, or strategy=allgather or ring";
  return e;
}

namespace {

template <class T> std::span<T> sp(T* p, size_t n) { return {p, n}; }

// One tensor of a head <-> token all-to-all between x [S_loc, H, W] on every rank and
// y [U * S_loc, H_loc, W] (rank j holds heads [first(j), first(j) + H_loc) of every rank's
// tokens, blocks in rank order). scatter_heads reads `from` = x and writes `to` = y;
// gather_heads reads `from` = y and writes `to` = x.
struct HeadTensor {
  const HeadSplit& hs;
  int32_t W;
  const float* from;
  float* to;
  size_t block(int64_t S_loc) const { return size_t(S_loc) * hs.H_loc * W; }  // y-rows of one rank
};

// Floats each rank sends to one destination for `ts`.
size_t per_rank(std::initializer_list<HeadTensor> ts, int64_t S_loc) {
  size_t n = 0;
  for (const HeadTensor& t : ts) n += t.block(S_loc);
  return n;
}

// x → y for every tensor of `ts` in ONE all-to-all (fewer synchronisations than one per tensor):
// the part for rank j packs each tensor's heads of rank j, tensor after tensor.
void scatter_heads(Comm& c, std::initializer_list<HeadTensor> ts, int64_t S_loc, CpStats& st, Tracer* tr) {
  const int U = c.size();
  if (U == 1) {
    for (const HeadTensor& t : ts) std::copy_n(t.from, t.block(S_loc), t.to);
    return;
  }
  const size_t per = per_rank(ts, S_loc);
  Buffer<float> send(per * U, false), recv(per * U, false);
  for (int j = 0; j < U; ++j) {
    float* out = send.data() + size_t(j) * per;
    for (const HeadTensor& t : ts) {
      const size_t row = size_t(t.hs.H_loc) * t.W;
      for (int64_t tok = 0; tok < S_loc; ++tok, out += row)
        std::copy_n(t.from + (size_t(tok) * t.hs.H + t.hs.first(j)) * t.W, row, out);
    }
  }
  timed_collective(c, st, tr, Phase::all_to_all, double(per * (U - 1) * sizeof(float)),
                   [&] { c.all_to_all(send.span(), recv.span()); });
  for (int j = 0; j < U; ++j) {
    const float* in = recv.data() + size_t(j) * per;
    for (const HeadTensor& t : ts) {
      std::copy_n(in, t.block(S_loc), t.to + size_t(j) * t.block(S_loc));
      in += t.block(S_loc);
    }
  }
}

// The reverse, y → x, in one all-to-all. Replicated heads (H < U) come back from U / H ranks
// each; their values are summed, which is what the gradients need (each replica saw a different
// subset of the query heads).
void gather_heads(Comm& c, std::initializer_list<HeadTensor> ts, int64_t S_loc, CpStats& st, Tracer* tr) {
  const int U = c.size();
  if (U == 1) {
    for (const HeadTensor& t : ts) std::copy_n(t.from, t.block(S_loc), t.to);
    return;
  }
  const size_t per = per_rank(ts, S_loc);
  Buffer<float> send(per * U, false), recv(per * U, false);
  for (int j = 0; j < U; ++j) {
    float* out = send.data() + size_t(j) * per;
    for (const HeadTensor& t : ts) {
      std::copy_n(t.from + size_t(j) * t.block(S_loc), t.block(S_loc), out);
      out += t.block(S_loc);
    }
  }
  timed_collective(c, st, tr, Phase::all_to_all, double(per * (U - 1) * sizeof(float)),
                   [&] { c.all_to_all(send.span(), recv.span()); });
  for (const HeadTensor& t : ts)
    if (t.hs.replicated()) std::fill_n(t.to, size_t(S_loc) * t.hs.H * t.W, 0.f);
  for (int j = 0; j < U; ++j) {
    const float* in = recv.data() + size_t(j) * per;
    for (const HeadTensor& t : ts) {
      const size_t row = size_t(t.hs.H_loc) * t.W;
      for (int64_t tok = 0; tok < S_loc; ++tok, in += row) {
        float* dst = t.to + (size_t(tok) * t.hs.H + t.hs.first(j)) * t.W;
        if (t.hs.replicated())
          for (size_t e = 0; e < row; ++e) dst[e] += in[e];
        else
          std::copy_n(in, row, dst);
      }
    }
  }
}

// Positions and document ids of the U * S_loc gathered tokens, in the all-to-all's order.
struct TokenMeta {
  Buffer<int64_t> pos;
  Buffer<int32_t> doc;
  const int32_t* doc_ptr() const { return doc.size() ? doc.data() : nullptr; }
};
TokenMeta gather_meta(Comm& c, const AttnParams& t, CpStats& st, Tracer* tr) {
  const int U = c.size();
  const size_t n = size_t(t.S_q);
  TokenMeta m;
  m.pos.resize(n * U, false);
  timed_collective(c, st, tr, Phase::all_gather, double(n * (U - 1) * sizeof(int64_t)),
                   [&] { c.all_gather(sp(t.q_pos, n), m.pos.span()); });
  if (t.q_doc) {
    m.doc.resize(n * U, false);
    timed_collective(c, st, tr, Phase::all_gather, double(n * (U - 1) * sizeof(int32_t)),
                     [&] { c.all_gather(sp(t.q_doc, n), m.doc.span()); });
  }
  return m;
}

// The call on the U * S_loc gathered tokens with H_loc heads (buffers set by the caller).
AttnParams gathered_call(const AttnParams& t, const HeadSplit& hq, const HeadSplit& hk, const TokenMeta& m) {
  AttnParams a = t;
  a.k_pos_zigzag = 0;  // the gathered rows of U ranks are no rank's zigzag shard: positions travel
  a.S_q = a.S_k = int64_t(m.pos.size());
  a.H_q = hq.H_loc;
  a.H_kv = hk.H_loc;
  a.q_pos = a.k_pos = m.pos.data();
  a.q_doc = a.k_doc = m.doc_ptr();
  return a;
}

}  // namespace

double ulysses_fwd_bytes(const AttnParams& s, bool docs, int64_t S_loc, int U) {
  if (U == 1) return 0;
  const HeadSplit hq = head_split(s.H_q, U), hk = head_split(s.H_kv, U);
  const double f = sizeof(float), n = double(S_loc) * (U - 1);
  const double q = n * hq.H_loc * s.D * f, kv = 2 * n * hk.H_loc * s.D * f;
  const double o = q, lse = n * hq.H_loc * f;
  const double meta = n * (sizeof(int64_t) + (docs ? sizeof(int32_t) : 0));
  return q + kv + o + lse + meta;
}

void ulysses_fwd(Comm& u, Comm* ring, const AttnParams& t, Tracer* tr, CpStats& st) {
  const int U = u.size();
  const HeadSplit hq = head_split(t.H_q, U), hk = head_split(t.H_kv, U);
  const size_t N = size_t(t.S_q) * U;
  const int32_t D = t.D;
  Buffer<float> q(N * hq.H_loc * D, false), k(N * hk.H_loc * D, false), v(N * hk.H_loc * D, false);
  Buffer<float> o(N * hq.H_loc * D, false), lse(N * hq.H_loc, false);
  if (tr) tr->progress(Phase::all_to_all);
  scatter_heads(u, {{hq, D, t.q_as<float>(), q.data()}, {hk, D, t.k_as<float>(), k.data()}, {hk, D, t.v_as<float>(), v.data()}},
                t.S_q, st, tr);
  const TokenMeta m = gather_meta(u, t, st, tr);

  AttnParams a = gathered_call(t, hq, hk, m);
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.o = o.data();
  a.lse = lse.data();
  if (t.deterministic) canonical_fwd(ring, a, /*ring_hops=*/true, tr, st);  // cp/deterministic.hpp
  else ring_fwd(ring, a, tr, st);

  gather_heads(u, {{hq, D, o.data(), t.o}, {hq, 1, lse.data(), t.lse}}, t.S_q, st, tr);
}

void ulysses_bwd(Comm& u, Comm* ring, const AttnParams& t, Tracer* tr, CpStats& st) {
  const int U = u.size();
  const HeadSplit hq = head_split(t.H_q, U), hk = head_split(t.H_kv, U);
  const size_t N = size_t(t.S_q) * U;
  const int32_t D = t.D;
  const size_t nq = N * hq.H_loc * D, nk = N * hk.H_loc * D;
  Buffer<float> q(nq, false), k(nk, false), v(nk, false), o(nq, false), dout(nq, false), lse(N * hq.H_loc, false);
  Buffer<float> dq(nq, false), dk(nk, false), dv(nk, false);
  if (tr) tr->progress(Phase::all_to_all);
  scatter_heads(u,
                {{hq, D, t.q_as<float>(), q.data()}, {hk, D, t.k_as<float>(), k.data()}, {hk, D, t.v_as<float>(), v.data()},
                 {hq, D, t.o, o.data()}, {hq, D, t.dout_as<float>(), dout.data()}, {hq, 1, t.lse, lse.data()}},
                t.S_q, st, tr);
  const TokenMeta m = gather_meta(u, t, st, tr);

  AttnParams a = gathered_call(t, hq, hk, m);
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.o = o.data();
  a.lse = lse.data();
  a.dout = dout.data();
  a.dq = dq.data();
  a.dk = dk.data();
  a.dv = dv.data();
  if (t.deterministic) canonical_bwd(ring, a, /*ring_hops=*/true, tr, st);
  else ring_bwd(ring, a, tr, st);

  gather_heads(u, {{hq, D, dq.data(), t.dq}, {hk, D, dk.data(), t.dk}, {hk, D, dv.data(), t.dv}}, t.S_q, st, tr);
}

}  // namespace ctxpar::cp
