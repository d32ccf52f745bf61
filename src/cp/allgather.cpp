// allgather: every rank all-gathers K and V (with positions and document ids) of the whole CP
// group and attends its local queries to all of them (Meta's CP, "all-gather KV"). Queries stay
// zigzag-sharded, so causal work is equal on every rank. The gathered keys stay in rank-block
// order: the mask comes from their global positions, so no reordering copy is needed, and the
// backward's dK/dV come out in the same rank-block order, which is exactly what reduce_scatter
// hands back to the owners. K/V of grouped-query attention are gathered with H_kv heads only.
#include <algorithm>
#include <span>

#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar {
namespace {

class AllGather final : public CpStrategy {
 public:
  explicit AllGather(Topology& topo) : comm_(topo.cp()) {}
  std::string name() const override { return "allgather"; }
  PartitionKind partition() const override { return PartitionKind::zigzag; }

  std::string validate(const AttnShape& s, const Topology& topo) const override {
    return cp::check_common(name(), s, cp_size(topo));
  }

  double comm_volume_fwd(const AttnShape& s, const Topology& topo) const override {
    const int P = cp_size(topo);
    const double S_loc = double(s.S) / P;
    const double per_token = 2.0 * s.H_kv * s.D * sizeof(float) + sizeof(int64_t) + (s.has_docs ? sizeof(int32_t) : 0);
    return (P - 1) * S_loc * per_token;
  }

  void forward(const AttnShape& s, LocalAttn& t, Tracer* tr, CpStats& st) override {
    Gathered g = gather(s, t, tr, st);
    AttnParams p = params(s, t, g);
    p.o = t.o;
    p.lse = t.lse;
    const double flops = cp::attn_fwd_flops(pairs(p), s.H_q, s.D);
    const double t0 = tr ? tr->now_us() : 0;
    if (tr) tr->progress(Phase::attn_fwd);
    attn_fwd(p);
    st.attn_flops += flops;
    if (tr) tr->add_span(Phase::attn_fwd, -1, -1, t0, tr->now_us(), flops, 0);
  }

  void backward(const AttnShape& s, LocalAttn& t, Tracer* tr, CpStats& st) override {
    // K/V are gathered again rather than kept from forward: the strategy holds no state between
    // calls (a model with L layers calls forward L times before the first backward).
    Gathered g = gather(s, t, tr, st);
    const int P = comm_.size();
    const size_t loc = size_t(t.S_loc) * s.H_kv * s.D;
    Buffer<float> dk_all(loc * P), dv_all(loc * P);  // zeroed: the kernel accumulates
    std::fill_n(t.dq, size_t(t.S_loc) * s.H_q * s.D, 0.f);
    AttnParams p = params(s, t, g);
    p.o = t.o;
    p.lse = t.lse;
    p.dout = t.dout;
    p.dq = t.dq;
    p.dk = dk_all.data();
    p.dv = dv_all.data();
    const double flops = cp::attn_bwd_flops(pairs(p), s.H_q, s.D);
    const double t0 = tr ? tr->now_us() : 0;
    if (tr) tr->progress(Phase::attn_bwd);
    attn_bwd(p);
    st.attn_flops += flops;
    if (tr) tr->add_span(Phase::attn_bwd, -1, -1, t0, tr->now_us(), flops, 0);
    // Block j of the gathered keys belongs to rank j: reduce-scatter sums every rank's
    // contribution and leaves each owner its own rows.
    const double bytes = double((P - 1) * loc * sizeof(float));
    if (tr) tr->progress(Phase::reduce_scatter);
    cp::timed_collective(comm_, st, tr, Phase::reduce_scatter, bytes,
                         [&] { comm_.reduce_scatter(dk_all.span(), std::span<float>(t.dk, loc)); });
    cp::timed_collective(comm_, st, tr, Phase::reduce_scatter, bytes,
                         [&] { comm_.reduce_scatter(dv_all.span(), std::span<float>(t.dv, loc)); });
  }

 private:
  struct Gathered {
    Buffer<float> k, v;
    Buffer<int64_t> pos;
    Buffer<int32_t> doc;
  };

  static int cp_size(const Topology& topo) {
    return topo.size(Axis::ulysses) * topo.size(Axis::ring);
  }

  Gathered gather(const AttnShape& s, const LocalAttn& t, Tracer* tr, CpStats& st) {
    const int P = comm_.size();
    const size_t n = size_t(t.S_loc), loc = n * s.H_kv * s.D;
    Gathered g;
    g.k.resize(loc * P, false);
    g.v.resize(loc * P, false);
    g.pos.resize(n * P, false);
    if (tr) tr->progress(Phase::all_gather);
    const double kv_bytes = double((P - 1) * loc * sizeof(float));
    cp::timed_collective(comm_, st, tr, Phase::all_gather, kv_bytes,
                         [&] { comm_.all_gather(std::span<const float>(t.k, loc), g.k.span()); });
    cp::timed_collective(comm_, st, tr, Phase::all_gather, kv_bytes,
                         [&] { comm_.all_gather(std::span<const float>(t.v, loc), g.v.span()); });
    cp::timed_collective(comm_, st, tr, Phase::all_gather, double((P - 1) * n * sizeof(int64_t)),
                         [&] { comm_.all_gather(std::span<const int64_t>(t.pos, n), g.pos.span()); });
    if (t.doc) {
      g.doc.resize(n * P, false);
      cp::timed_collective(comm_, st, tr, Phase::all_gather, double((P - 1) * n * sizeof(int32_t)),
                           [&] { comm_.all_gather(std::span<const int32_t>(t.doc, n), g.doc.span()); });
    }
    return g;
  }

  AttnParams params(const AttnShape& s, const LocalAttn& t, const Gathered& g) const {
    AttnParams p;
    p.q = t.q;
    p.k = g.k.data();
    p.v = g.v.data();
    p.S_q = t.S_loc;
    p.S_k = int64_t(g.pos.size());
    p.H_q = s.H_q;
    p.H_kv = s.H_kv;
    p.D = s.D;
    p.q_pos = t.pos;
    p.k_pos = g.pos.data();
    p.q_doc = t.doc;
    p.k_doc = t.doc ? g.doc.data() : nullptr;
    p.mask = s.mask;
    p.window = s.window;
    return p;
  }

  static int64_t pairs(const AttnParams& p) {
    return cp::count_visible_pairs(p.S_q, p.q_pos, p.q_doc, p.S_k, p.k_pos, p.k_doc, p.mask, p.window);
  }

  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_allgather_strategy(Topology& topo) { return std::make_unique<AllGather>(topo); }

}  // namespace ctxpar
