// allgather's visible-keys schedule (config frugal=true; CpSchedule::visible): every rank's document ids
// (and positions unless derivable) are all-gathered once per batch and mask; from them every rank
// computes the same plan (cp/visible.hpp); each rank then receives, from every other, only the K/V
// rows some query of its can see (one point-to-point message per pair), and attends to its own
// rows and those, in rank order. The backward returns the received rows' dK/dV (fp32) the same
// way; each owner adds them to its own, in rank order. A call the schedule does not serve (not
// training's self-attention, an MLA latent: cp::visible_call) runs the plain all-gather.
#include <algorithm>
#include <cstring>

#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/strategy.hpp"
#include "cp/visible.hpp"
#include "dist/topology.hpp"
#include "trace/trace.hpp"

namespace ctxpar {
namespace {

class VisibleAllGather final : public ScheduleOf {
 public:
  explicit VisibleAllGather(Topology& topo) : ScheduleOf(make_allgather_strategy(topo)), comm_(topo.cp()) {}
  bool moves_latent() const override { return false; }  // the visible rows of K and V move

  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    if (!cp::visible_call(local)) return plain().forward(local, tr, st);
    const Compact c = exchange_visible(local, tr, st);
    const CpCall p = c.call(local);
    if (tr) tr->progress(Phase::attn_fwd);
    cp::counted_fwd(p, tr, st, -1);
  }

  void backward(const CpCall& local, Tracer* tr, CpStats& st) override {
    if (!cp::visible_call(local)) return plain().backward(local, tr, st);
    const Compact c = exchange_visible(local, tr, st);
    const cp::VisiblePlan& plan = c.keys->plan;
    const int P = comm_.size(), r = comm_.rank();
    const int64_t n = local.S_k, w = int64_t(local.H_kv) * local.D;
    Buffer<float> dk(size_t(c.off.back() * w)), dv(size_t(c.off.back() * w));  // zeroed: the kernel accumulates
    std::fill_n(local.dq, size_t(local.S_q) * local.H_q * local.D, 0.f);
    CpCall p = c.call(local);
    p.dk = dk.data();
    p.dv = dv.data();
    if (tr) tr->progress(Phase::attn_bwd);
    cp::counted_bwd(p, tr, st, -1);
    std::copy_n(dk.data() + c.off[size_t(r)] * w, n * w, local.dk);
    std::copy_n(dv.data() + c.off[size_t(r)] * w, n * w, local.dv);
    // The received rows' dK/dV go home: [dK | dV] of segment i to rank i; rank j returns those of
    // this rank's rows it saw (plan.send[j]), added in rank order.
    const size_t row = cp::grad_row_bytes(local);
    std::vector<Buffer<std::byte>> out(static_cast<size_t>(P)), in(static_cast<size_t>(P));
    for (int i = 0; i < P; ++i) {
      if (i == r) continue;
      const size_t m = plan.recv[size_t(i)].size();
      out[size_t(i)].resize(2 * m * row, false);
      std::memcpy(out[size_t(i)].data(), dk.data() + c.off[size_t(i)] * w, m * row);
      std::memcpy(out[size_t(i)].data() + m * row, dv.data() + c.off[size_t(i)] * w, m * row);
      in[size_t(i)].resize(2 * plan.send[size_t(i)].size() * row, false);
    }
    exchange(out, in, -1, kTagVisibleBack, tr, st);
    for (int j = 0; j < P; ++j)
      if (j != r) cp::add_visible_grads(local, plan.send[size_t(j)], reinterpret_cast<const float*>(in[size_t(j)].data()));
  }

 private:
  static constexpr int kTagVisible = 121, kTagVisibleBack = 122;
  struct Compact {
    const cp::VisibleKeys* keys = nullptr;
    Buffer<std::byte> k, v;
    std::vector<int64_t> pos;
    std::vector<int32_t> doc;
    std::vector<int64_t> off;  // [P + 1]: the first compact row of each rank's segment
    CpCall call(const CpCall& local) const {
      CpCall p = local;
      p.k = k.data();
      p.v = v.data();
      p.S_k = off.back();
      p.k_pos = pos.data();
      p.k_doc = local.k_doc ? doc.data() : nullptr;
      return p;
    }
  };

  // One round per distance d = 1 .. P-1: send `out[(r + sign d) mod P]`, receive `in[(r - sign d) mod P]`
  // (sign -1 reverses the direction, for the backward); waits for all; counts bytes and messages.
  void exchange(std::vector<Buffer<std::byte>>& out, std::vector<Buffer<std::byte>>& in, int sign, int tag, Tracer* tr,
                CpStats& st) {
    const int P = comm_.size(), r = comm_.rank();
    std::vector<Request> reqs;
    for (int d = 1; d < P; ++d) {
      const int to = (r + sign * d + P) % P, from = (r - sign * d + P) % P;
      reqs.push_back(comm_.send_recv_async(out[size_t(to)].span(), to, in[size_t(from)].span(), from, tag));
      st.bytes_sent += double(out[size_t(to)].size());
      st.messages += out[size_t(to)].size() > 0 ? 1 : 0;
    }
    for (Request& q : reqs) cp::timed_wait(comm_, q, st, tr, -1, 0);
  }

  Compact exchange_visible(const CpCall& t, Tracer* tr, CpStats& st) {
    const int P = comm_.size(), r = comm_.rank();
    const int64_t n = t.S_k;
    const size_t row = cp::kv_row_bytes(t);
    Compact c;
    c.keys = &visible_.get(comm_, t, tr, st);
    const cp::VisiblePlan& plan = c.keys->plan;
    c.off.assign(size_t(P + 1), 0);
    for (int i = 0; i < P; ++i) c.off[size_t(i + 1)] = c.off[size_t(i)] + (i == r ? n : int64_t(plan.recv[size_t(i)].size()));
    const int64_t rows = c.off.back();
    c.k.resize(size_t(rows) * row, false);
    c.v.resize(size_t(rows) * row, false);
    for (int i = 0; i < P; ++i) {  // the rows of segment i: all of this rank's, the visible ones of the others
      const std::vector<int64_t> p = i == r ? std::vector<int64_t>(t.k_pos, t.k_pos + n) : c.keys->recv_pos(i);
      c.pos.insert(c.pos.end(), p.begin(), p.end());
      if (!t.k_doc) continue;
      const std::vector<int32_t> d = i == r ? std::vector<int32_t>(t.k_doc, t.k_doc + n) : c.keys->recv_doc(i);
      c.doc.insert(c.doc.end(), d.begin(), d.end());
    }
    std::memcpy(c.k.data() + size_t(c.off[size_t(r)]) * row, t.k, size_t(n) * row);
    std::memcpy(c.v.data() + size_t(c.off[size_t(r)]) * row, t.v, size_t(n) * row);
    std::vector<Buffer<std::byte>> out(static_cast<size_t>(P)), in(static_cast<size_t>(P));
    for (int j = 0; j < P; ++j) {
      if (j == r) continue;
      out[size_t(j)].resize(2 * plan.send[size_t(j)].size() * row, false);
      cp::pack_visible_rows(t, plan.send[size_t(j)], out[size_t(j)].data());
      in[size_t(j)].resize(2 * plan.recv[size_t(j)].size() * row, false);
    }
    exchange(out, in, +1, kTagVisible, tr, st);
    for (int i = 0; i < P; ++i) {
      if (i == r) continue;
      const size_t m = plan.recv[size_t(i)].size();
      std::memcpy(c.k.data() + size_t(c.off[size_t(i)]) * row, in[size_t(i)].data(), m * row);
      std::memcpy(c.v.data() + size_t(c.off[size_t(i)]) * row, in[size_t(i)].data() + m * row, m * row);
    }
    return c;
  }

  Comm& comm_;
  cp::VisibleCache visible_;  // the plans of the current batch
};

}  // namespace

std::unique_ptr<CpStrategy> make_visible_allgather_strategy(Topology& topo) {
  return std::make_unique<VisibleAllGather>(topo);
}

}  // namespace ctxpar
