#include "cp/query_ring.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "core/error.hpp"
#include "cp/common.hpp"
#include "dist/topology.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar::cp {

namespace {
template <class T> T* at(std::byte* base, size_t off) { return reinterpret_cast<T*>(base + off); }
}  // namespace

QLayout q_layout(int64_t n, int32_t H_q, int32_t H_kv, int32_t D, DType dtype, bool riders, bool docs) {
  QLayout L;
  L.n = n;
  L.H_q = H_q;
  L.H_kv = H_kv;
  L.D = D;
  L.riders = riders;
  L.docs = docs;
  const size_t e = dtype_bytes(dtype);
  const size_t qb = align64(size_t(n) * H_q * D * e);
  const size_t kb = riders ? align64(size_t(n) * H_kv * D * e) : 0;
  L.q_off = 0;
  L.k_off = qb;
  L.v_off = qb + kb;
  L.pos_off = qb + 2 * kb;
  L.doc_off = L.pos_off + align64(size_t(n) * sizeof(int64_t));
  L.qdoc_off = L.doc_off + (riders ? align64(size_t(n) * sizeof(int64_t)) : 0);
  L.bytes = L.qdoc_off + (docs ? align64(size_t(n) * sizeof(int32_t)) : 0);
  return L;
}

void pack_queries(const QLayout& L, const AttnParams& local, int64_t n_rows, std::byte* base) {
  const size_t e = dtype_bytes(local.dtype), n = size_t(n_rows);
  std::memcpy(base + L.q_off, local.q, n * L.H_q * L.D * e);
  if (L.riders) {
    std::memcpy(base + L.k_off, local.k_new, n * L.H_kv * L.D * e);
    std::memcpy(base + L.v_off, local.v_new, n * L.H_kv * L.D * e);
  }
  for (int64_t i = 0; i < L.n; ++i) {
    at<int64_t>(base, L.pos_off)[i] = i < n_rows ? local.q_pos[i] : -1;
    if (L.riders) at<int64_t>(base, L.doc_off)[i] = i < n_rows && local.q_doc ? local.q_doc[i] : -1;
    if (L.docs) at<int32_t>(base, L.qdoc_off)[i] = i < n_rows ? local.q_doc[i] : -1;
  }
}

AttnParams visiting_block(const QLayout& L, std::byte* base, const AttnParams& local, float* o, float* lse) {
  AttnParams p = local;
  p.S_q = L.n;
  p.q = base + L.q_off;
  p.q_pos = at<int64_t>(base, L.pos_off);
  // The riders' ids are int64 in the block (block_doc); a batched prefill's are the queries' own.
  p.q_doc = L.docs ? at<int32_t>(base, L.qdoc_off) : nullptr;
  p.k_new = L.riders ? base + L.k_off : nullptr;
  p.v_new = L.riders ? base + L.v_off : nullptr;
  p.o = o;
  p.lse = lse;
  return p;
}

int64_t block_doc(const QLayout& L, const std::byte* base, int64_t i) {
  return reinterpret_cast<const int64_t*>(base + L.doc_off)[i];
}

double decode_visit(const QLayout& L, std::byte* base, const AttnParams& local, float* o, float* lse) {
  const int32_t Hq = local.H_q, D = local.D;
  const size_t e = dtype_bytes(local.dtype), kw = size_t(local.H_kv) * D, qw = size_t(Hq) * D;
  double flops = 0;
  for (int64_t i = 0; i < L.n; ++i) {
    const int64_t b = block_doc(L, base, i);
    const int64_t slot = b < 0 ? -1 : local.k_new_slot[b];
    const int64_t S_k = b < 0 ? 0 : local.k_doc_len[b] + (slot >= 0 ? 1 : 0);
    if (slot >= 0) {
      std::memcpy(static_cast<std::byte*>(local.k_cache) + size_t(slot) * kw * e, base + L.k_off + size_t(i) * kw * e, kw * e);
      std::memcpy(static_cast<std::byte*>(local.v_cache) + size_t(slot) * kw * e, base + L.v_off + size_t(i) * kw * e, kw * e);
    }
    if (S_k == 0) {  // nothing of this sequence here (or a padding row): o = 0, lse = -inf
      std::fill_n(o + i * qw, qw, 0.f);
      std::fill_n(lse + i * Hq, Hq, -INFINITY);
      continue;
    }
    const size_t first = size_t(local.k_doc_begin[b]);
    AttnParams p = local;
    p.q = base + L.q_off + size_t(i) * qw * e;
    p.q_pos = reinterpret_cast<const int64_t*>(base + L.pos_off) + i;
    p.q_doc = p.k_doc = nullptr;
    p.k = static_cast<const std::byte*>(local.k) + first * kw * e;
    p.v = static_cast<const std::byte*>(local.v) + first * kw * e;
    p.k_pos = local.k_pos + first;
    p.S_q = 1;
    p.S_k = S_k;
    p.o = o + i * qw;
    p.lse = lse + i * Hq;
    attn_fwd(p);
    flops += attn_fwd_flops(double(S_k), Hq, D);  // a decode query sees every cached key
  }
  return flops;
}

void decode_visit_traced(const QLayout& L, std::byte* base, const AttnParams& local, float* part, int step, Tracer* tr,
                         CpStats& st) {
  const double t0 = tr ? tr->now_us() : 0;
  const double flops = decode_visit(L, base, local, part, part + size_t(L.n) * local.H_q * local.D);
  st.attn_flops += flops;
  if (tr) tr->add_span(Phase::attn_fwd, -1, step, t0, tr->now_us(), flops, 0);
}

void pass_q_forward(Comm& c, const QLayout& L, const AttnParams& local, int64_t n_rows, int tag, Tracer* tr,
                    CpStats& st, const QueryVisit& visit) {
  const int N = c.size(), r = c.rank(), next = (r + 1) % N, prev = (r + N - 1) % N;
  Buffer<std::byte> blk(L.bytes * 2, true);
  pack_queries(L, local, n_rows, blk.data());
  std::byte* blocks[2] = {blk.data(), blk.data() + L.bytes};
  const size_t pe = partial_elems(L.n, local.H_q, local.D);
  Buffer<float> part(pe * size_t(N), false);
  for (int s = 0; s < N; ++s) {
    std::byte* here = blocks[s % 2];
    if (tr) tr->progress(Phase::attn_fwd);
    Request req;
    if (s < N - 1) {  // post the next hop before computing on this block
      req = c.send_recv_async(std::span<std::byte>(here, L.bytes), next, std::span<std::byte>(blocks[1 - s % 2], L.bytes),
                              prev, tag);
      st.messages += 1;
      st.bytes_sent += double(L.bytes);
    }
    const int origin = (r - s + N) % N;
    visit(here, origin, s, req, part.data() + size_t(origin) * pe);
    timed_wait(c, req, st, tr, s, double(L.bytes));
  }
  return_and_merge(c, part, L.n, n_rows, local.H_q, local.D, local.o, local.lse, tr, st);
}

void ForwardOnlyStrategy::backward(const AttnParams&, Tracer*, CpStats&) {
  CTXPAR_FATAL(name() << " is an inference strategy: it has no backward");
}

std::string DecodeStrategy::validate(const AttnParams& s, const Topology& topo) const {
  (void)topo;
  if (!(s.H_q > 0 && s.H_kv > 0 && s.H_q % s.H_kv == 0)) return name() + ": heads must be a positive multiple of kv_heads";
  return s.packed() ? "" : name() + ": " + kPackedOnly;
}

double DecodeStrategy::comm_volume_fwd(const AttnParams& s, bool docs, const Topology& topo) const {
  (void)docs;  // inference has one document per sequence
  const int N = topo.cp_size();
  const QLayout L = q_layout(s.S_q, s.H_q, s.H_kv, s.D, s.dtype, true);
  return double(N - 1) * (double(L.bytes) + double(partial_elems(s.S_q, s.H_q, s.D)) * sizeof(float));
}

int64_t DecodeStrategy::local_rows(const AttnParams& p) {
  int64_t n = 0;
  while (n < p.S_q && p.q_doc[n] >= 0) ++n;
  return n;
}

size_t partial_elems(int64_t n, int32_t H_q, int32_t D) { return size_t(n) * H_q * (size_t(D) + 1); }

void return_and_merge(Comm& c, Buffer<float>& part, int64_t n_block, int64_t n_rows, int32_t H_q, int32_t D,
                      float* o, float* lse, Tracer* tr, CpStats& st) {
  const int N = c.size();
  const size_t pe = partial_elems(n_block, H_q, D), ow = size_t(n_block) * H_q * D;
  Buffer<float> back(pe * size_t(N), false);
  if (N > 1) {
    timed_collective(c, st, tr, Phase::all_to_all, double(pe) * sizeof(float) * (N - 1),
                     [&] { c.all_to_all(part.span(), back.span()); });
  } else {
    std::memcpy(back.data(), part.data(), pe * sizeof(float));
  }
  if (n_rows == 0) return;
  // Merge in rank order (a fixed order: the result does not depend on arrival times).
  Tracer::Scope sc(tr, Phase::attn_fwd, -1, N, 0, 0);
  std::memcpy(o, back.data(), size_t(n_rows) * H_q * D * sizeof(float));
  std::memcpy(lse, back.data() + ow, size_t(n_rows) * H_q * sizeof(float));
  for (int j = 1; j < N; ++j) {
    const float* bo = back.data() + size_t(j) * pe;
    lse_merge(o, lse, bo, bo + ow, n_rows, H_q, D);
  }
}

}  // namespace ctxpar::cp
