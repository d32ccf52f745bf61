#include "cp/ulysses_core.hpp"

#include <algorithm>
#include <span>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "cp/common.hpp"
#include "ops.hpp"
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

// One tensor of a head <-> token all-to-all between x [S_loc, H, W] on every rank and
// y [U * S_loc, H_loc, W] (rank j holds heads [first(j), first(j) + H_loc) of every rank's
// tokens, blocks in rank order), elements of `elem` bytes on the call's device. scatter_heads
// reads `from` = x and writes `to` = y; gather_heads reads `from` = y and writes `to` = x.
struct HeadTensor {
  const HeadSplit& hs;
  int32_t W;
  size_t elem;
  const void* from;
  void* to;
  bool exact = false;  // int64 exact sums (ops.hpp dk_fixed): replicated heads summed as integers
  size_t x_row() const { return size_t(hs.H) * W * elem; }
  size_t y_row() const { return size_t(hs.H_loc) * W * elem; }
  size_t head_offset(int j) const { return size_t(hs.first(j)) * W * elem; }
  size_t block(int64_t S_loc) const { return size_t(S_loc) * y_row(); }  // bytes of one rank's y rows
  const std::byte* src() const { return static_cast<const std::byte*>(from); }
  std::byte* dst() const { return static_cast<std::byte*>(to); }
};
HeadTensor tensor(const HeadSplit& hs, int32_t W, DType t, const void* from, void* to) {
  return HeadTensor{hs, W, dtype_bytes(t), from, to};
}
HeadTensor exact_tensor(const HeadSplit& hs, int32_t W, const int64_t* from, int64_t* to) {
  return HeadTensor{hs, W, sizeof(int64_t), from, to, true};
}

// Bytes each rank sends to one destination for `ts`.
size_t per_rank(std::initializer_list<HeadTensor> ts, int64_t S_loc) {
  size_t n = 0;
  for (const HeadTensor& t : ts) n += t.block(S_loc);
  return n;
}

// Where the tensors live and the stream that orders them (a device call's).
struct On {
  Device device;
  Stream stream;
  explicit On(const CpCall& a) : device(a.device), stream(a.stream) {}
};

// x → y for every tensor of `ts` in ONE all-to-all (fewer synchronisations than one per tensor):
// the part for rank j packs each tensor's heads of rank j, tensor after tensor.
void scatter_heads(Comm& c, std::initializer_list<HeadTensor> ts, int64_t S_loc, On on, CpStats& st, Tracer* tr) {
  const int U = c.size();
  if (U == 1) {
    for (const HeadTensor& t : ts) device_copy(t.to, t.from, t.block(S_loc), on.device, on.stream);
    return;
  }
  const size_t per = per_rank(ts, S_loc);
  Buffer<std::byte> send(per * U, false, on.device, on.stream), recv(per * U, false, on.device, on.stream);
  for (int j = 0; j < U; ++j) {
    std::byte* out = send.data() + size_t(j) * per;
    for (const HeadTensor& t : ts) {
      device_copy_2d(out, t.y_row(), t.src() + t.head_offset(j), t.x_row(), t.y_row(), size_t(S_loc), on.device,
                     on.stream);
      out += t.block(S_loc);
    }
  }
  timed_collective(
      c, st, tr, Phase::all_to_all, double(per * (U - 1)), [&] { c.all_to_all(buf(send), buf(recv)); }, on.device);
  for (int j = 0; j < U; ++j) {
    const std::byte* in = recv.data() + size_t(j) * per;
    for (const HeadTensor& t : ts) {
      device_copy(t.dst() + size_t(j) * t.block(S_loc), in, t.block(S_loc), on.device, on.stream);
      in += t.block(S_loc);
    }
  }
}

// The reverse, y → x, in one all-to-all. Replicated heads (H < U) come back from U / H ranks
// each; their values are summed (the gradients need it, each replica saw a different subset of
// the query heads): fp32 tensors in rank order, exact ones as integers (CPU).
void gather_heads(Comm& c, std::initializer_list<HeadTensor> ts, int64_t S_loc, On on, CpStats& st, Tracer* tr) {
  const int U = c.size();
  if (U == 1) {
    for (const HeadTensor& t : ts) device_copy(t.to, t.from, t.block(S_loc), on.device, on.stream);
    return;
  }
  const size_t per = per_rank(ts, S_loc);
  Buffer<std::byte> send(per * U, false, on.device, on.stream), recv(per * U, false, on.device, on.stream);
  for (int j = 0; j < U; ++j) {
    std::byte* out = send.data() + size_t(j) * per;
    for (const HeadTensor& t : ts) {
      device_copy(out, t.src() + size_t(j) * t.block(S_loc), t.block(S_loc), on.device, on.stream);
      out += t.block(S_loc);
    }
  }
  timed_collective(
      c, st, tr, Phase::all_to_all, double(per * (U - 1)), [&] { c.all_to_all(buf(send), buf(recv)); }, on.device);
  for (const HeadTensor& t : ts)
    if (t.hs.replicated()) device_zero(t.to, size_t(S_loc) * t.x_row(), on.device, on.stream);
  for (int j = 0; j < U; ++j) {
    const std::byte* in = recv.data() + size_t(j) * per;
    for (const HeadTensor& t : ts) {
      std::byte* dst = t.dst() + t.head_offset(j);
      if (t.hs.replicated() && t.exact) {
        CTXPAR_CHECK(on.device == Device::cpu, "exact sums of replicated heads are CPU only");
        const int64_t w = int64_t(t.y_row() / sizeof(int64_t)), ld = int64_t(t.x_row() / sizeof(int64_t));
        const int64_t* src = reinterpret_cast<const int64_t*>(in);
        int64_t* out = reinterpret_cast<int64_t*>(dst);
        for (int64_t i = 0; i < S_loc; ++i)
          for (int64_t e = 0; e < w; ++e) out[i * ld + e] += src[i * w + e];
      } else if (t.hs.replicated()) {
        CTXPAR_CHECK(t.elem == sizeof(float), "replicated heads are summed in fp32");
        const int64_t w = int64_t(t.y_row() / sizeof(float));
        add_f32_2d(reinterpret_cast<float*>(dst), int64_t(t.x_row() / sizeof(float)), reinterpret_cast<const float*>(in),
                   w, w, S_loc, on.device, on.stream);
      } else {
        device_copy_2d(dst, t.x_row(), in, t.y_row(), t.y_row(), size_t(S_loc), on.device, on.stream);
      }
      in += t.block(S_loc);
    }
  }
}

// Positions and document ids of the U * S_loc gathered tokens, in the all-to-all's order: on the
// host (gathered from the host copies), and for a device call uploaded once.
struct TokenMeta {
  std::vector<int64_t> pos;
  std::vector<int32_t> doc;
  Buffer<int64_t> pos_dev;
  Buffer<int32_t> doc_dev;
};
TokenMeta gather_meta(Comm& c, const CpCall& t, CpStats& st, Tracer* tr) {
  const int U = c.size();
  const size_t n = size_t(t.S_q);
  const CpCall h = t.host_rows();
  TokenMeta m;
  m.pos.resize(n * U);
  timed_collective(c, st, tr, Phase::all_gather, double(n * (U - 1) * sizeof(int64_t)),
                   [&] { c.all_gather(std::span<const int64_t>(h.q_pos, n), std::span<int64_t>(m.pos)); });
  if (h.q_doc) {
    m.doc.resize(n * U);
    timed_collective(c, st, tr, Phase::all_gather, double(n * (U - 1) * sizeof(int32_t)),
                     [&] { c.all_gather(std::span<const int32_t>(h.q_doc, n), std::span<int32_t>(m.doc)); });
  }
  if (t.device != Device::cpu) {
    m.pos_dev = to_device(m.pos, t.device, t.stream);
    m.doc_dev = to_device(m.doc, t.device, t.stream);
  }
  return m;
}

// The call on the U * S_loc gathered tokens with H_loc heads (buffers set by the caller).
CpCall gathered_call(const CpCall& t, const HeadSplit& hq, const HeadSplit& hk, const TokenMeta& m) {
  CpCall a = t;
  a.k_pos_zigzag = 0;  // the gathered rows of U ranks are no rank's zigzag shard: positions travel
  a.S_q = a.S_k = int64_t(m.pos.size());
  a.H_q = hq.H_loc;
  a.H_kv = hk.H_loc;
  const bool dev = t.device != Device::cpu;
  const int32_t* doc = m.doc.empty() ? nullptr : m.doc.data();
  a.q_pos = a.k_pos = dev ? m.pos_dev.data() : m.pos.data();
  a.q_doc = a.k_doc = doc && dev ? m.doc_dev.data() : doc;
  a.q_pos_host = a.k_pos_host = m.pos.data();
  a.q_doc_host = a.k_doc_host = doc;
  return a;
}

}  // namespace

double ulysses_fwd_bytes(const CpCall& s, bool docs, int64_t S_loc, int U) {
  if (U == 1) return 0;
  const HeadSplit hq = head_split(s.H_q, U), hk = head_split(s.H_kv, U);
  const double f = sizeof(float), e = double(dtype_bytes(s.dtype)), n = double(S_loc) * (U - 1);
  const double q = n * hq.H_loc * s.D * e, kv = 2 * n * hk.H_loc * s.D * e;
  const double o = q, lse = n * hq.H_loc * f;
  const double meta = n * (sizeof(int64_t) + (docs ? sizeof(int32_t) : 0));
  return q + kv + o + lse + meta;
}

void ulysses_fwd(Comm& u, const CpCall& t, const UlyssesInner& inner, Tracer* tr, CpStats& st) {
  const int U = u.size();
  if (t.device != Device::cpu) check_device_call("ulysses", u, t);
  const HeadSplit hq = head_split(t.H_q, U), hk = head_split(t.H_kv, U);
  const size_t N = size_t(t.S_q) * U;
  const int32_t D = t.D;
  const On on(t);
  const size_t e = dtype_bytes(t.dtype);
  Buffer<std::byte> q(N * hq.H_loc * D * e, false, on.device, on.stream), k(N * hk.H_loc * D * e, false, on.device, on.stream),
      v(N * hk.H_loc * D * e, false, on.device, on.stream);
  Buffer<float> o(N * hq.H_loc * D, false, on.device, on.stream), lse(N * hq.H_loc, false, on.device, on.stream);
  if (tr) tr->progress(Phase::all_to_all);
  scatter_heads(u, {tensor(hq, D, t.dtype, t.q, q.data()), tensor(hk, D, t.dtype, t.k, k.data()),
                    tensor(hk, D, t.dtype, t.v, v.data())},
                t.S_q, on, st, tr);
  const TokenMeta m = gather_meta(u, t, st, tr);

  CpCall a = gathered_call(t, hq, hk, m);
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.o = o.data();
  a.lse = lse.data();
  inner(a);

  gather_heads(u, {tensor(hq, D, DType::f32, o.data(), t.o), tensor(hq, 1, DType::f32, lse.data(), t.lse)}, t.S_q, on,
               st, tr);
}

namespace {

// ulysses_bwd and ulysses_bwd_exact: the inner's dK/dV in fp32, or as exact integer sums.
void bwd(Comm& u, const CpCall& t, const UlyssesInner& inner, bool exact, Tracer* tr, CpStats& st) {
  const int U = u.size();
  if (t.device != Device::cpu) check_device_call("ulysses", u, t);
  const HeadSplit hq = head_split(t.H_q, U), hk = head_split(t.H_kv, U);
  const size_t N = size_t(t.S_q) * U;
  const int32_t D = t.D;
  const On on(t);
  const size_t nq = N * hq.H_loc * D, nk = N * hk.H_loc * D, e = dtype_bytes(t.dtype);
  const auto bytes = [&](size_t n) { return Buffer<std::byte>(n, false, on.device, on.stream); };
  const auto floats = [&](size_t n) { return Buffer<float>(n, false, on.device, on.stream); };
  Buffer<std::byte> q = bytes(nq * e), k = bytes(nk * e), v = bytes(nk * e), dout = bytes(nq * e);
  Buffer<float> o = floats(nq), lse = floats(N * hq.H_loc), dq = floats(nq), dk = floats(nk), dv = floats(nk);
  if (tr) tr->progress(Phase::all_to_all);
  scatter_heads(u,
                {tensor(hq, D, t.dtype, t.q, q.data()), tensor(hk, D, t.dtype, t.k, k.data()),
                 tensor(hk, D, t.dtype, t.v, v.data()), tensor(hq, D, DType::f32, t.o, o.data()),
                 tensor(hq, D, t.dtype, t.dout, dout.data()), tensor(hq, 1, DType::f32, t.lse, lse.data())},
                t.S_q, on, st, tr);
  const TokenMeta m = gather_meta(u, t, st, tr);

  CpCall a = gathered_call(t, hq, hk, m);
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.o = o.data();
  a.lse = lse.data();
  a.dout = dout.data();
  a.dq = dq.data();
  a.dk = dk.data();
  a.dv = dv.data();
  if (exact) {
    // A K/V head on U / H_kv ranks, each with part of its group's query heads: their integer sums
    // added before the one rounding. With t.dk_fixed the caller takes the integers (K/V heads
    // replicated over tp too).
    const size_t own = size_t(t.S_k) * t.H_kv * D;
    Buffer<int64_t> dki(nk, false), dvi(nk, false), dk_sum(t.dk_fixed ? 0 : own, false), dv_sum(t.dk_fixed ? 0 : own, false);
    int64_t* dk_to = t.dk_fixed ? t.dk_fixed : dk_sum.data();
    int64_t* dv_to = t.dk_fixed ? t.dv_fixed : dv_sum.data();
    a.dk_fixed = dki.data();
    a.dv_fixed = dvi.data();
    inner(a);
    gather_heads(u, {tensor(hq, D, DType::f32, dq.data(), t.dq), exact_tensor(hk, D, dki.data(), dk_to),
                     exact_tensor(hk, D, dvi.data(), dv_to)},
                 t.S_q, on, st, tr);
    if (t.dk_fixed) return;
    fixed_to_float(dk_sum.data(), t.dk, int64_t(own));
    fixed_to_float(dv_sum.data(), t.dv, int64_t(own));
    return;
  }
  inner(a);

  gather_heads(u, {tensor(hq, D, DType::f32, dq.data(), t.dq), tensor(hk, D, DType::f32, dk.data(), t.dk),
                   tensor(hk, D, DType::f32, dv.data(), t.dv)},
               t.S_q, on, st, tr);
}

}  // namespace

void ulysses_bwd(Comm& u, const CpCall& t, const UlyssesInner& inner, Tracer* tr, CpStats& st) {
  bwd(u, t, inner, /*exact=*/false, tr, st);
}

void ulysses_bwd_exact(Comm& u, const CpCall& t, const UlyssesInner& inner, Tracer* tr, CpStats& st) {
  bwd(u, t, inner, /*exact=*/true, tr, st);
}

}  // namespace ctxpar::cp
