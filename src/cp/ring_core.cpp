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

template <class T> std::span<T> whole(Buffer<T>& b) { return b.span(); }

}  // namespace

double ring_kv_message_bytes(int64_t S_k, int32_t H_kv, int32_t D, DType dtype, bool has_doc) {
  return double(kv_layout(S_k, H_kv, D, dtype, has_doc).bytes);
}
double ring_dkv_message_bytes(int64_t S_k, int32_t H_kv, int32_t D) {
  return 2.0 * double(S_k) * H_kv * D * sizeof(float);
}

void ring_fwd(Comm* ring, const AttnParams& a, Tracer* tr, CpStats& st) {
  const int P = ring ? ring->size() : 1;
  if (P == 1) {
    const double flops = call_fwd_flops(a);
    const double t0 = tr ? tr->now_us() : 0;
    attn_fwd(a);
    st.attn_flops += flops;
    if (tr) tr->add_span(Phase::attn_fwd, -1, 0, t0, tr->now_us(), flops, 0);
    return;
  }
  const int r = ring->rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
  const KvLayout L = kv_layout(a.S_k, a.H_kv, a.D, a.dtype, a.k_doc != nullptr);
  Buffer<std::byte> kv[2] = {Buffer<std::byte>(L.bytes, false), Buffer<std::byte>(L.bytes, false)};
  pack_kv(L, a, kv[0].data());
  const int64_t chunk = progress_chunk_rows(a.S_q, kProgressParts);
  Buffer<float> o_tmp(size_t(chunk) * a.H_q * a.D, false), lse_tmp(size_t(chunk) * a.H_q, false);
  AttnParams p = a;

  for (int s = 0; s < P; ++s) {
    const int cur = s % 2;
    if (tr) tr->progress(Phase::attn_fwd);
    Request req;
    if (s < P - 1) {  // post the next hop before computing this block
      req = ring->send_recv_async(whole(kv[cur]), next, whole(kv[1 - cur]), prev, kTagKv);
      st.messages += 1;
      st.bytes_sent += double(L.bytes);
    }
    point_keys_at(L, kv[cur].data(), p);
    const int64_t pairs = visible_pairs(p);
    const double flops = attn_fwd_flops(double(pairs), a.H_q, a.D);
    const double t0 = tr ? tr->now_us() : 0;
    // Step 0 initializes (o, lse) even when nothing is visible (o = 0, lse = -inf); a later
    // block with no visible pair (sliding window, other documents) changes nothing.
    if (s == 0 || pairs > 0)
      fwd_chunked(p, chunk, /*merge=*/s > 0, o_tmp.data(), lse_tmp.data(), [&] {
        if (req.pending()) ring->test(req);
      });
    st.attn_flops += flops;
    if (tr) tr->add_span(Phase::attn_fwd, -1, s, t0, tr->now_us(), flops, 0);
    timed_wait(*ring, req, st, tr, s, double(L.bytes));
  }
}

void ring_bwd(Comm* ring, const AttnParams& a, Tracer* tr, CpStats& st) {
  const int P = ring ? ring->size() : 1;
  const size_t q_elems = size_t(a.S_q) * a.H_q * a.D;
  const size_t kv_elems = size_t(a.S_k) * a.H_kv * a.D;
  std::fill_n(a.dq, q_elems, 0.f);
  if (P == 1) {
    std::fill_n(a.dk, kv_elems, 0.f);
    std::fill_n(a.dv, kv_elems, 0.f);
    const double flops = call_bwd_flops(a);
    const double t0 = tr ? tr->now_us() : 0;
    attn_bwd(a);
    st.attn_flops += flops;
    if (tr) tr->add_span(Phase::attn_bwd, -1, 0, t0, tr->now_us(), flops, 0);
    return;
  }
  AttnParams p = a;
  const int r = ring->rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
  const KvLayout L = kv_layout(a.S_k, a.H_kv, a.D, a.dtype, a.k_doc != nullptr);
  Buffer<std::byte> kv[2] = {Buffer<std::byte>(L.bytes, false), Buffer<std::byte>(L.bytes, false)};
  pack_kv(L, a, kv[0].data());
  // dK and dV of one block, packed [dK | dV] so that a hop is one message. part[s % 2] is this
  // rank's contribution at step s (plus what came before); two of them because the previous
  // step's send may still be in flight while the next is computed.
  Buffer<float> part[2] = {Buffer<float>(2 * kv_elems, false), Buffer<float>(2 * kv_elems, false)};
  Buffer<float> incoming(2 * kv_elems, false);
  const double dkv_bytes = ring_dkv_message_bytes(a.S_k, a.H_kv, a.D);
  const int64_t chunk = progress_chunk_rows(a.S_q, kProgressParts);
  Request kv_req, dkv_req;

  for (int s = 0; s < P; ++s) {
    const int cur = s % 2;
    if (tr) tr->progress(Phase::attn_bwd);
    if (s < P - 1) {
      kv_req = ring->send_recv_async(whole(kv[cur]), next, whole(kv[1 - cur]), prev, kTagKv);
      st.messages += 1;
      st.bytes_sent += double(L.bytes);
    }
    part[cur].zero();
    point_keys_at(L, kv[cur].data(), p);
    p.dk = part[cur].data();
    p.dv = part[cur].data() + kv_elems;
    const int64_t pairs = visible_pairs(p);
    const double flops = attn_bwd_flops(double(pairs), a.H_q, a.D);
    const double t0 = tr ? tr->now_us() : 0;
    if (pairs > 0)
      bwd_chunked(p, chunk, [&] {
        if (kv_req.pending()) ring->test(kv_req);
        if (dkv_req.pending()) ring->test(dkv_req);
      });
    st.attn_flops += flops;
    if (tr) tr->add_span(Phase::attn_bwd, -1, s, t0, tr->now_us(), flops, 0);
    // The partial sum of the ranks that held this block before (posted by prev at step s - 1).
    if (s > 0) {
      timed_wait(*ring, dkv_req, st, tr, s, dkv_bytes);
      float* dst = part[cur].data();
      const float* src = incoming.data();
      for (size_t i = 0; i < 2 * kv_elems; ++i) dst[i] += src[i];
    }
    // After the last step the sum goes home: rank r + 1 receives its own block's dK/dV.
    dkv_req = ring->send_recv_async(whole(part[cur]), next, whole(incoming), prev, kTagDkv);
    st.messages += 1;
    st.bytes_sent += dkv_bytes;
    timed_wait(*ring, kv_req, st, tr, s, double(L.bytes));
  }
  timed_wait(*ring, dkv_req, st, tr, P, dkv_bytes);
  std::copy_n(incoming.data(), kv_elems, a.dk);
  std::copy_n(incoming.data() + kv_elems, kv_elems, a.dv);
}

}  // namespace ctxpar::cp
