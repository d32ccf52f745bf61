// ring's visible-keys schedule (config frugal=true; CpSchedule::visible): the pass-KV ring's schedule of
// P steps, but at step d a block goes straight from its owner r - d to r, and holds only the rows
// some query of r can see (cp/visible.hpp). The owner sends from its own K/V at every step, so
// nothing is forwarded and a row no query of the receiver can see never leaves home; a step with
// no rows either way posts nothing and computes nothing. The next distance is posted before the
// current block is computed, as in the plain ring. Backward: the same K/V flow; a block's dK/dV
// (fp32, just the received rows) go straight back to their owner, which adds them in distance
// order. Bytes: the rows some query of the receiver can see, and the plan's document ids
// (positions too unless derivable). A call the schedule does not serve (cp::visible_call: not
// training's self-attention, or an MLA latent) runs the plain ring.
#include <algorithm>

#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/ring_core.hpp"
#include "cp/strategy.hpp"
#include "model/flops.hpp"
#include "cp/visible.hpp"
#include "dist/topology.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar::cp {

namespace {

constexpr int kTagVisibleKv = 103;
constexpr int kTagVisibleDkv = 104;
constexpr int kProgressParts = 8;  // row chunks per block while a transfer is in flight (ring_core.cpp)

// The schedule of one call: the plan, and per distance d the peers and the visiting block's keys.
class VisibleRing {
 public:
  VisibleRing(Comm& c, const CpCall& a, const VisibleKeys& keys)
      : c_(c), a_(a), P_(c.size()), r_(c.rank()), keys_(keys), row_(kv_row_bytes(a)) {
    pos_.resize(size_t(P_));
    doc_.resize(size_t(P_));
    for (int i = 0; i < P_; ++i)
      if (i != r_) {
        pos_[size_t(i)] = keys_.recv_pos(i);
        doc_[size_t(i)] = keys_.recv_doc(i);
      }
  }
  int to(int d) const { return (r_ + d) % P_; }
  int from(int d) const { return (r_ - d + P_) % P_; }
  // This rank's rows that rank to(d) sees; rank from(d)'s rows this rank sees.
  const std::vector<int32_t>& out_rows(int d) const { return keys_.plan.send[size_t(to(d))]; }
  const std::vector<int32_t>& in_rows(int d) const { return keys_.plan.recv[size_t(from(d))]; }

  // Posts the K/V rows of distance d: packs out_rows(d) into `out`, receives in_rows(d) into `in`.
  // A direction without rows is not posted; with none either way the request is empty.
  Request post_kv(int d, Buffer<std::byte>& out, Buffer<std::byte>& in, CpStats& st) {
    out.resize(2 * out_rows(d).size() * row_, false);
    in.resize(2 * in_rows(d).size() * row_, false);
    pack_visible_rows(a_, out_rows(d), out.data());
    return post(out, to(d), in, from(d), kTagVisibleKv, st);
  }
  // Posts the return of distance d's gradients: `g` ([dK | dV] of in_rows(d)) to its owner, and
  // this rank's own rows' gradients from to(d) into `back`.
  Request post_grads(int d, Buffer<float>& g, Buffer<float>& back, CpStats& st) {
    back.resize(2 * out_rows(d).size() * size_t(a_.H_kv) * a_.D, false);
    return post(g, from(d), back, to(d), kTagVisibleDkv, st);
  }

  // Step d (> 0), whose block arrives in in[d % 2]: posts step d + 1 (in flight while this block is
  // computed), then waits for step d's transfer `req`, which afterwards holds step d + 1's.
  void arrive(int d, Buffer<std::byte> (&out)[2], Buffer<std::byte> (&in)[2], Request& req, Tracer* tr, CpStats& st) {
    Request next;
    if (d + 1 < P_) next = post_kv(d + 1, out[(d + 1) % 2], in[(d + 1) % 2], st);
    timed_wait(c_, req, st, tr, d, double(in[d % 2].size()));
    req = std::move(next);
  }

  // `p`'s key side pointed at distance d's block, received in `in`.
  void point(int d, const Buffer<std::byte>& in, CpCall& p) const {
    const size_t m = in_rows(d).size();
    p.k = in.data();
    p.v = in.data() + m * row_;
    p.S_k = int64_t(m);
    p.k_pos = pos_[size_t(from(d))].data();
    p.k_doc = a_.k_doc ? doc_[size_t(from(d))].data() : nullptr;
  }

 private:
  template <class T> Request post(Buffer<T>& out, int to, Buffer<T>& in, int from, int tag, CpStats& st) {
    const bool send = out.size() > 0, recv = in.size() > 0;
    if (!send && !recv) return Request();
    if (send) {
      st.messages += 1;
      st.bytes_sent += double(out.size() * sizeof(T));
    }
    return c_.send_recv_async(out.span(), send ? to : Comm::kNone, in.span(), recv ? from : Comm::kNone, tag);
  }

  Comm& c_;
  const CpCall& a_;
  const int P_, r_;
  const VisibleKeys& keys_;
  const size_t row_;
  std::vector<std::vector<int64_t>> pos_;
  std::vector<std::vector<int32_t>> doc_;
};

void ring_fwd_visible(Comm& ring, const CpCall& a, const VisibleKeys& keys, Tracer* tr, CpStats& st) {
  VisibleRing vr(ring, a, keys);
  const int P = ring.size();
  const int64_t chunk = progress_chunk_rows(a.S_q, kProgressParts);
  Buffer<float> o_tmp(size_t(chunk) * a.H_q * a.D, false), lse_tmp(size_t(chunk) * a.H_q, false);
  Buffer<std::byte> out[2], in[2];
  Request req;
  if (P > 1) req = vr.post_kv(1, out[1], in[1], st);
  CpCall p = a;
  for (int d = 0; d < P; ++d) {
    if (tr) tr->progress(Phase::attn_fwd);
    if (d > 0) {
      vr.arrive(d, out, in, req, tr, st);
      if (vr.in_rows(d).empty()) continue;  // nothing of from(d) is visible here: no step
      vr.point(d, in[d % 2], p);
    }
    // Step 0 (the own block) initializes (o, lse) even when nothing is visible.
    const int64_t pairs = visible_pairs(p);
    const double flops = attn_fwd_flops(double(pairs), p.H_q, p.D);
    const double t0 = tr ? tr->stamp() : 0;
    fwd_chunked(p, chunk, /*merge=*/d > 0, o_tmp.data(), lse_tmp.data(), [&] {
      if (req.pending()) ring.test(req);
    });
    st.count_attn(pairs, p.H_q, flops, false);
    if (tr) tr->add_span(Phase::attn_fwd, -1, d, t0, tr->stamp(), flops, 0);
  }
}

void ring_bwd_visible(Comm& ring, const CpCall& a, const VisibleKeys& keys, Tracer* tr, CpStats& st) {
  VisibleRing vr(ring, a, keys);
  const int P = ring.size();
  const size_t w = size_t(a.H_kv) * a.D;
  std::fill_n(a.dq, size_t(a.S_q) * a.H_q * a.D, 0.f);
  std::fill_n(a.dk, size_t(a.S_k) * w, 0.f);  // the own block's step writes here first
  std::fill_n(a.dv, size_t(a.S_k) * w, 0.f);
  const int64_t chunk = progress_chunk_rows(a.S_q, kProgressParts);
  Buffer<std::byte> out[2], in[2];
  Buffer<float> grads[2], back[2];  // a visiting block's [dK | dV]; this rank's rows' coming home
  Request kv_req, back_req;
  int back_d = 0;  // the distance whose gradients back_req brings
  const auto settle_back = [&](int step) {  // the returned gradients of back_d, added in distance order
    if (back_d == 0) return;
    timed_wait(ring, back_req, st, tr, step, double(back[back_d % 2].size() * sizeof(float)));
    add_visible_grads(a, vr.out_rows(back_d), back[back_d % 2].data());
    back_d = 0;
  };
  if (P > 1) kv_req = vr.post_kv(1, out[1], in[1], st);
  CpCall p = a;
  for (int d = 0; d < P; ++d) {
    if (tr) tr->progress(Phase::attn_bwd);
    if (d > 0) {
      vr.arrive(d, out, in, kv_req, tr, st);
      Buffer<float>& g = grads[d % 2];
      g.resize(2 * vr.in_rows(d).size() * w);  // zeroed: the kernel accumulates
      if (!vr.in_rows(d).empty()) {
        vr.point(d, in[d % 2], p);
        p.dk = g.data();
        p.dv = g.data() + vr.in_rows(d).size() * w;
      }
    }
    if (d == 0 || !vr.in_rows(d).empty()) {
      const int64_t pairs = visible_pairs(p);
      const double flops = attn_bwd_flops(double(pairs), p.H_q, p.D);
      const double t0 = tr ? tr->stamp() : 0;
      bwd_chunked(p, chunk, [&] {
        if (kv_req.pending()) ring.test(kv_req);
        if (back_req.pending()) ring.test(back_req);
      });
      st.count_attn(pairs, p.H_q, flops, true);
      if (tr) tr->add_span(Phase::attn_bwd, -1, d, t0, tr->stamp(), flops, 0);
    }
    if (d == 0) continue;
    settle_back(d);
    back_req = vr.post_grads(d, grads[d % 2], back[d % 2], st);
    back_d = d;
  }
  settle_back(P);
}

}  // namespace
}  // namespace ctxpar::cp

namespace ctxpar {
namespace {

class VisibleRing final : public ScheduleOf {
 public:
  explicit VisibleRing(Topology& topo) : ScheduleOf(make_ring_strategy(topo)), comm_(topo.cp()) {}
  bool moves_latent() const override { return false; }  // the visible rows of K and V move
  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    if (!cp::visible_call(local)) return plain().forward(local, tr, st);
    cp::ring_fwd_visible(comm_, local, visible_.get(comm_, local, tr, st), tr, st);
  }
  void backward(const CpCall& local, Tracer* tr, CpStats& st) override {
    if (!cp::visible_call(local)) return plain().backward(local, tr, st);
    cp::ring_bwd_visible(comm_, local, visible_.get(comm_, local, tr, st), tr, st);
  }

 private:
  Comm& comm_;
  cp::VisibleCache visible_;  // the plans of the current batch
};

}  // namespace

std::unique_ptr<CpStrategy> make_visible_ring_strategy(Topology& topo) { return std::make_unique<VisibleRing>(topo); }

}  // namespace ctxpar
