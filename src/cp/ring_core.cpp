#include "cp/ring_core.hpp"

#include <algorithm>
#include <span>

#include "core/memory.hpp"
#include "cp/common.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar::cp {

namespace {

// Tags separate the two streams of the backward ring (K/V forward-going blocks and the dK/dV
// partial sums); each stream is FIFO per (source, tag), which keeps hops in step order.
constexpr int kTagKv = 101;
constexpr int kTagDkv = 102;

// Row chunks per block while a transfer is in flight (see progress_chunk_rows): enough test()
// calls that the message finishes well inside the block's compute, few enough that the per-call
// overhead of the kernel stays negligible.
constexpr int kProgressParts = 8;

}  // namespace

double ring_kv_message_bytes(int64_t S_k, int32_t H_kv, int32_t D, DType dtype, bool has_doc, bool has_pos) {
  return double(kv_layout(S_k, H_kv, D, dtype, has_doc, has_pos).bytes);
}
double ring_dkv_message_bytes(int64_t S_k, int32_t H_kv, int32_t D) {
  return 2.0 * double(S_k) * H_kv * D * sizeof(float);
}
double ring_latent_message_bytes(int64_t S_k, int32_t latent_width, bool has_doc, bool has_pos) {
  return double(latent_layout(S_k, latent_width, has_doc, has_pos).bytes);
}

namespace {

// Scratch K and V of a visiting latent block (MLA), expanded on arrival; empty otherwise.
struct Expanded {
  Buffer<float> k, v;
  explicit Expanded(const CpCall& a) {
    if (!a.expander) return;
    const size_t n = size_t(a.S_k) * a.H_kv * a.D;
    k.resize(n, false);
    v.resize(n, false);
  }
};

// Where the blocks' positions and document ids come from when the message does not carry them:
// derived on the host (CPU calls with k_pos_zigzag), or every rank's, host and device (device calls,
// whose messages carry K and V only).
struct BlockRows {
  std::vector<std::vector<int64_t>> derived;
  GroupKeyRows group;
  bool device = false;
  BlockRows(Comm& ring, const CpCall& a, Tracer* tr, CpStats& st) : device(a.device != Device::cpu) {
    if (device) group = group_key_rows(ring, a, tr, st);
    else derived = derived_key_positions(a, ring.size(), ring.rank());
  }
};

// The message layout of a call: key_layout(a), or K and V alone for a device call.
KvLayout ring_layout(const CpCall& a) {
  if (a.device == Device::cpu) return key_layout(a);
  return kv_layout(a.S_k, a.H_kv, a.D, a.dtype, /*has_doc=*/false, /*has_pos=*/false, a.k == a.v);
}

// Points `p`'s key side at the block of step s in `msg`: at step 0 the caller's own rows (K/V as
// given: a latent block's are expanded already), later the message's; a latent block is expanded
// into `x`. Positions the message does not carry are the block's owner's, from `rows`.
// Returns the block's latent rows (null without an expander).
const float* bring_block(const KvLayout& L, std::byte* msg, const CpCall& a, int s, Expanded& x,
                         const BlockRows& rows, int owner, CpCall& p) {
  if (rows.device) {
    point_keys_at(L, msg, p);
    rows.group.point(p, owner, owner + 1);
    return nullptr;
  }
  if (!L.has_pos) p.k_pos = rows.derived[size_t(owner)].data();
  if (!a.expander) {
    point_keys_at(L, msg, p);
    return nullptr;
  }
  if (s == 0) {
    p.k = a.k; p.v = a.v; p.k_pos = a.k_pos; p.k_doc = a.k_doc;
    return a.latent;
  }
  point_keys_at(L, msg, p);
  const float* lat = latent_at(L, msg);
  a.expander->expand(lat, a.S_k, x.k.data(), x.v.data());
  p.k = x.k.data();
  p.v = x.v.data();
  return lat;
}

}  // namespace

void ring_fwd(Comm* ring, const CpCall& a, Tracer* tr, CpStats& st) {
  const int P = ring ? ring->size() : 1;
  if (P == 1) {
    counted_fwd(a, tr, st, 0);
    return;
  }
  const int r = ring->rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
  if (a.device != Device::cpu) check_device_call("ring", *ring, a);
  const KvLayout L = ring_layout(a);
  Buffer<std::byte> kv[2] = {Buffer<std::byte>(L.bytes, false, a.device, a.stream),
                             Buffer<std::byte>(L.bytes, false, a.device, a.stream)};
  pack_kv(L, a, kv[0].data());
  Expanded x(a);
  const BlockRows rows(*ring, a, tr, st);
  const int64_t chunk = progress_chunk_rows(a.S_q, kProgressParts, a.device);
  Buffer<float> o_tmp(size_t(chunk) * a.H_q * a.D, false, a.device, a.stream),
      lse_tmp(size_t(chunk) * a.H_q, false, a.device, a.stream);
  CpCall p = a;

  for (int s = 0; s < P; ++s) {
    const int cur = s % 2;
    if (tr) tr->progress(Phase::attn_fwd);
    Request req;
    if (s < P - 1) {  // post the next hop before computing this block
      req = ring->send_recv_async(buf(kv[cur]), next, buf(kv[1 - cur]), prev, kTagKv);
      st.messages += 1;
      st.bytes_sent += double(L.bytes);
    }
    bring_block(L, kv[cur].data(), a, s, x, rows, (r - s + P) % P, p);
    const int64_t pairs = visible_pairs(p);
    const double flops = attn_fwd_flops(double(pairs), a.H_q, a.D);
    const double t0 = tr ? tr->stamp() : 0;
    // Step 0 initializes (o, lse) even when nothing is visible (o = 0, lse = -inf); a later
    // block with no visible pair (sliding window, other documents) changes nothing.
    if (s == 0 || pairs > 0)
      fwd_chunked(p, chunk, /*merge=*/s > 0, o_tmp.data(), lse_tmp.data(), [&] {
        if (req.pending()) ring->test(req);
      });
    st.count_attn(pairs, a.H_q, flops, false);
    if (tr) tr->add_span(Phase::attn_fwd, -1, s, t0, tr->stamp(), flops, 0);
    timed_wait(*ring, req, st, tr, s, double(L.bytes));
  }
}

void ring_bwd(Comm* ring, const CpCall& a, Tracer* tr, CpStats& st) {
  const int P = ring ? ring->size() : 1;
  const size_t q_elems = size_t(a.S_q) * a.H_q * a.D;
  const size_t kv_elems = size_t(a.S_k) * a.H_kv * a.D;
  if (a.device != Device::cpu && ring) check_device_call("ring", *ring, a);
  device_zero(a.dq, q_elems * sizeof(float), a.device, a.stream);
  // MLA: a block's dK/dV are computed into dkx/dvx and turned into the latent's gradient, which
  // is what travels (and what the caller gets, in a.dlatent).
  const bool lat = a.expander != nullptr;
  const size_t lat_elems = lat ? size_t(a.S_k) * a.latent_width : 0;
  Buffer<float> dkx(lat ? kv_elems : 0, false), dvx(lat ? kv_elems : 0, false);
  if (P == 1) {
    CpCall p = a;
    if (lat) {
      p.dk = dkx.data();
      p.dv = dvx.data();
    }
    device_zero(p.dk, kv_elems * sizeof(float), a.device, a.stream);
    device_zero(p.dv, kv_elems * sizeof(float), a.device, a.stream);
    counted_bwd(p, tr, st, 0);
    if (lat) {
      std::fill_n(a.dlatent, lat_elems, 0.f);
      a.expander->backward(a.latent, a.S_k, dkx.data(), dvx.data(), a.dlatent);
    }
    return;
  }
  CpCall p = a;
  const int r = ring->rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
  const KvLayout L = ring_layout(a);
  Buffer<std::byte> kv[2] = {Buffer<std::byte>(L.bytes, false, a.device, a.stream),
                             Buffer<std::byte>(L.bytes, false, a.device, a.stream)};
  pack_kv(L, a, kv[0].data());
  Expanded x(a);
  const BlockRows rows(*ring, a, tr, st);
  // dK and dV of one block, packed [dK | dV] so that a hop is one message (MLA: the latent's
  // gradient). part[s % 2] is this rank's contribution at step s (plus what came before); two of
  // them because the previous step's send may still be in flight while the next is computed.
  const size_t part_elems = lat ? lat_elems : 2 * kv_elems;
  Buffer<float> part[2] = {Buffer<float>(part_elems, false, a.device, a.stream),
                           Buffer<float>(part_elems, false, a.device, a.stream)};
  Buffer<float> incoming(part_elems, false, a.device, a.stream);
  const double dkv_bytes = double(part_elems * sizeof(float));
  const int64_t chunk = progress_chunk_rows(a.S_q, kProgressParts, a.device);
  Request kv_req, dkv_req;

  for (int s = 0; s < P; ++s) {
    const int cur = s % 2;
    if (tr) tr->progress(Phase::attn_bwd);
    if (s < P - 1) {
      kv_req = ring->send_recv_async(buf(kv[cur]), next, buf(kv[1 - cur]), prev, kTagKv);
      st.messages += 1;
      st.bytes_sent += double(L.bytes);
    }
    part[cur].zero();
    const float* block_latent = bring_block(L, kv[cur].data(), a, s, x, rows, (r - s + P) % P, p);
    if (lat) {
      dkx.zero();
      dvx.zero();
      p.dk = dkx.data();
      p.dv = dvx.data();
    } else {
      p.dk = part[cur].data();
      p.dv = part[cur].data() + kv_elems;
    }
    const int64_t pairs = visible_pairs(p);
    const double flops = attn_bwd_flops(double(pairs), a.H_q, a.D);
    const double t0 = tr ? tr->stamp() : 0;
    if (pairs > 0)
      bwd_chunked(p, chunk, [&] {
        if (kv_req.pending()) ring->test(kv_req);
        if (dkv_req.pending()) ring->test(dkv_req);
      });
    st.count_attn(pairs, a.H_q, flops, true);
    if (tr) tr->add_span(Phase::attn_bwd, -1, s, t0, tr->stamp(), flops, 0);
    if (lat && pairs > 0) a.expander->backward(block_latent, a.S_k, dkx.data(), dvx.data(), part[cur].data());
    // The partial sum of the ranks that held this block before (posted by prev at step s - 1).
    if (s > 0) {
      timed_wait(*ring, dkv_req, st, tr, s, dkv_bytes);
      add_f32(part[cur].data(), incoming.data(), int64_t(part_elems), a.device, a.stream);
    }
    // After the last step the sum goes home: rank r + 1 receives its own block's dK/dV.
    dkv_req = ring->send_recv_async(buf(part[cur]), next, buf(incoming), prev, kTagDkv);
    st.messages += 1;
    st.bytes_sent += dkv_bytes;
    timed_wait(*ring, kv_req, st, tr, s, double(L.bytes));
  }
  timed_wait(*ring, dkv_req, st, tr, P, dkv_bytes);
  if (lat) {
    std::copy_n(incoming.data(), lat_elems, a.dlatent);
    return;
  }
  device_copy(a.dk, incoming.data(), kv_elems * sizeof(float), a.device, a.stream);
  device_copy(a.dv, incoming.data() + kv_elems, kv_elems * sizeof(float), a.device, a.stream);
}

}  // namespace ctxpar::cp
