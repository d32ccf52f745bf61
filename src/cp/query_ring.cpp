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

std::vector<std::byte> pack_queries(const QLayout& L, const CpCall& local, int64_t n_rows, std::byte* base) {
  const size_t e = dtype_bytes(local.dtype), n = size_t(n_rows);
  device_copy(base + L.q_off, local.q, n * L.H_q * L.D * e, local.device, local.stream);
  if (L.riders) {
    device_copy(base + L.k_off, local.k_new, n * L.H_kv * L.D * e, local.device, local.stream);
    device_copy(base + L.v_off, local.v_new, n * L.H_kv * L.D * e, local.device, local.stream);
  }
  const CpCall h = local.host_rows();
  std::vector<std::byte> meta(meta_bytes(L));
  const auto sec = [&](size_t off) { return meta.data() + (off - L.pos_off); };  // a section of the block, on the host
  for (int64_t i = 0; i < L.n; ++i) {
    reinterpret_cast<int64_t*>(sec(L.pos_off))[i] = i < n_rows ? h.q_pos[i] : -1;
    if (L.riders) reinterpret_cast<int64_t*>(sec(L.doc_off))[i] = i < n_rows && h.q_doc ? h.q_doc[i] : -1;
    if (L.docs) reinterpret_cast<int32_t*>(sec(L.qdoc_off))[i] = i < n_rows ? h.q_doc[i] : -1;
  }
  copy_to_device(base + L.pos_off, meta.data(), meta.size(), local.device, local.stream);
  return meta;
}

BlockMeta gather_block_meta(Comm& c, const QLayout& L, const std::vector<std::byte>& mine, Tracer* tr, CpStats& st) {
  BlockMeta b;
  b.bytes = meta_bytes(L);
  b.all.resize(b.bytes * size_t(c.size()));
  timed_collective(c, st, tr, Phase::all_gather, double(b.bytes) * (c.size() - 1),
                   [&] { c.all_gather(std::span<const std::byte>(mine), std::span<std::byte>(b.all)); });
  return b;
}

CpCall visiting_block(const QLayout& L, std::byte* base, const std::byte* meta, const CpCall& local, float* o,
                          float* lse) {
  CpCall p = local;
  p.S_q = L.n;
  p.q = base + L.q_off;
  p.q_pos = at<int64_t>(base, L.pos_off);
  p.q_pos_host = reinterpret_cast<const int64_t*>(meta);
  // The riders' ids are int64 in the block (block_doc); a batched prefill's are the queries' own.
  p.q_doc = L.docs ? at<int32_t>(base, L.qdoc_off) : nullptr;
  p.q_doc_host = L.docs ? reinterpret_cast<const int32_t*>(meta + (L.qdoc_off - L.pos_off)) : nullptr;
  p.k_new = L.riders ? base + L.k_off : nullptr;
  p.v_new = L.riders ? base + L.v_off : nullptr;
  p.o = o;
  p.lse = lse;
  return p;
}

int64_t block_doc(const QLayout& L, const std::byte* meta, int64_t i) {
  return reinterpret_cast<const int64_t*>(meta + (L.doc_off - L.pos_off))[i];
}

double decode_visit(const QLayout& L, std::byte* base, const std::byte* meta, const CpCall& local, float* o,
                    float* lse) {
  const int32_t Hq = local.H_q, D = local.D;
  const size_t e = dtype_bytes(local.dtype), kw = size_t(local.H_kv) * D, qw = size_t(Hq) * D;
  const Device dev = local.device;
  const int64_t* pos_host = reinterpret_cast<const int64_t*>(meta);
  double pairs = 0;
  for (int64_t i = 0; i < L.n; ++i) {
    const int64_t b = block_doc(L, meta, i);
    const int64_t slot = b < 0 ? -1 : local.k_new_slot[b];
    const int64_t S_k = b < 0 ? 0 : local.k_doc_len[b] + (slot >= 0 ? 1 : 0);
    if (slot >= 0) {
      device_copy(static_cast<std::byte*>(local.k_cache) + size_t(slot) * kw * e, base + L.k_off + size_t(i) * kw * e,
                  kw * e, dev, local.stream);
      device_copy(static_cast<std::byte*>(local.v_cache) + size_t(slot) * kw * e, base + L.v_off + size_t(i) * kw * e,
                  kw * e, dev, local.stream);
    }
    if (S_k == 0) {  // nothing of this sequence here (or a padding row): o = 0, lse = -inf
      device_zero(o + i * qw, qw * sizeof(float), dev, local.stream);
      fill_f32(lse + i * Hq, -INFINITY, Hq, dev, local.stream);
      continue;
    }
    const size_t first = size_t(local.k_doc_begin[b]);
    CpCall p = local;
    p.q = base + L.q_off + size_t(i) * qw * e;
    p.q_pos = at<int64_t>(base, L.pos_off) + i;
    p.q_pos_host = pos_host + i;
    p.q_doc = p.k_doc = nullptr;
    p.q_doc_host = p.k_doc_host = nullptr;
    p.k = static_cast<const std::byte*>(local.k) + first * kw * e;
    p.v = static_cast<const std::byte*>(local.v) + first * kw * e;
    p.k_pos = local.k_pos + first;
    if (local.k_pos_host) p.k_pos_host = local.k_pos_host + first;
    p.S_q = 1;
    p.S_k = S_k;
    p.o = o + i * qw;
    p.lse = lse + i * Hq;
    attn_fwd(p);
    // Causal: a decode query sees every cached key; a window sees the last `window` of them.
    pairs += p.mask == MaskKind::window ? double(visible_pairs(p)) : double(S_k);
  }
  return pairs;
}

void decode_visit_traced(const QLayout& L, std::byte* base, const std::byte* meta, const CpCall& local, float* part,
                         int step, Tracer* tr, CpStats& st) {
  const double t0 = tr ? tr->stamp() : 0;
  const double pairs = decode_visit(L, base, meta, local, part, part + size_t(L.n) * local.H_q * local.D);
  const double flops = attn_fwd_flops(pairs, local.H_q, local.D);
  st.count_attn(int64_t(pairs), local.H_q, flops, false);
  if (tr) tr->add_span(Phase::attn_fwd, -1, step, t0, tr->stamp(), flops, 0);
}

void pass_q_forward(Comm& c, const QLayout& L, const CpCall& local, int64_t n_rows, int tag, Tracer* tr,
                    CpStats& st, const QueryVisit& visit) {
  const int N = c.size(), r = c.rank(), next = (r + 1) % N, prev = (r + N - 1) % N;
  const bool dev = local.device != Device::cpu;
  Buffer<std::byte> blk(L.bytes * 2, true, local.device, local.stream);
  const std::vector<std::byte> mine = pack_queries(L, local, n_rows, blk.data());
  const BlockMeta meta = dev ? gather_block_meta(c, L, mine, tr, st) : BlockMeta{};
  std::byte* blocks[2] = {blk.data(), blk.data() + L.bytes};
  const size_t pe = partial_elems(L.n, local.H_q, local.D);
  Buffer<float> part(pe * size_t(N), false, local.device, local.stream);
  for (int s = 0; s < N; ++s) {
    std::byte* here = blocks[s % 2];
    if (tr) tr->progress(Phase::attn_fwd);
    Request req;
    if (s < N - 1) {  // post the next hop before computing on this block
      req = c.send_recv_async(buf_at(here, L.bytes, local.device), next, buf_at(blocks[1 - s % 2], L.bytes, local.device),
                              prev, tag);
      st.messages += 1;
      st.bytes_sent += double(L.bytes);
    }
    const int origin = (r - s + N) % N;
    visit(here, meta.of(origin, L, here), origin, s, req, part.data() + size_t(origin) * pe);
    timed_wait(c, req, st, tr, s, double(L.bytes));
  }
  return_and_merge(c, part, L.n, n_rows, local, tr, st);
}

void ForwardOnlyStrategy::backward(const CpCall&, Tracer*, CpStats&) {
  CTXPAR_FATAL(name() << " is an inference strategy: it has no backward");
}

std::string DecodeStrategy::validate(const CpCall& s, const Topology& topo) const {
  (void)topo;
  if (!(s.H_q > 0 && s.H_kv > 0 && s.H_q % s.H_kv == 0)) return name() + ": heads must be a positive multiple of kv_heads";
  return s.packed() ? "" : name() + ": " + kPackedOnly;
}

double DecodeStrategy::comm_volume_fwd(const CpCall& s, bool docs, const Topology& topo) const {
  (void)docs;  // inference has one document per sequence
  const int N = topo.cp_size();
  const QLayout L = q_layout(s.S_q, s.H_q, s.H_kv, s.D, s.dtype, true);
  return double(N - 1) * (double(L.bytes) + double(partial_elems(s.S_q, s.H_q, s.D)) * sizeof(float));
}

int64_t DecodeStrategy::local_rows(const CpCall& p) {
  const int32_t* doc = p.host_rows().q_doc;
  int64_t n = 0;
  while (n < p.S_q && doc[n] >= 0) ++n;
  return n;
}

size_t partial_elems(int64_t n, int32_t H_q, int32_t D) { return size_t(n) * H_q * (size_t(D) + 1); }

void return_and_merge(Comm& c, Buffer<float>& part, int64_t n_block, int64_t n_rows, const CpCall& local,
                      Tracer* tr, CpStats& st) {
  const int N = c.size();
  const int32_t H_q = local.H_q, D = local.D;
  const size_t pe = partial_elems(n_block, H_q, D), ow = size_t(n_block) * H_q * D;
  Buffer<float> back(pe * size_t(N), false, local.device, local.stream);
  if (N > 1) {
    timed_collective(c, st, tr, Phase::all_to_all, double(pe) * sizeof(float) * (N - 1),
                     [&] { c.all_to_all(buf(part), buf(back)); }, local.device);
  } else {
    device_copy(back.data(), part.data(), pe * sizeof(float), local.device, local.stream);
  }
  if (n_rows == 0) return;
  // Merge in rank order (a fixed order: the result does not depend on arrival times).
  Tracer::Scope sc(tr, Phase::attn_fwd, -1, N, 0, 0);
  device_copy(local.o, back.data(), size_t(n_rows) * H_q * D * sizeof(float), local.device, local.stream);
  device_copy(local.lse, back.data() + ow, size_t(n_rows) * H_q * sizeof(float), local.device, local.stream);
  for (int j = 1; j < N; ++j) {
    const float* bo = back.data() + size_t(j) * pe;
    lse_merge(local.o, local.lse, bo, bo + ow, n_rows, H_q, D, local.device, local.stream);
  }
}

}  // namespace ctxpar::cp
