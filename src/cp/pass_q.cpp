// pass_q (Meta CP, "pass-Q", inference): K/V stay, the query blocks circulate around the CP ring.
// Each rank computes the partial (O, LSE) of every visiting block against its own keys (its KV
// cache plus the new tokens); one all-to-all returns the partials to their owners, which
// lse-merge them in rank order. Forward only. It moves T/N query rows per hop instead of the
// (T+P)/N cached keys of pass-KV (ring.cpp): the better choice when few tokens are new (low miss
// rate; cost model: src/perf). Every rank holds the same number of query rows (a zigzag share of
// the new tokens); positions are global, so the causal mask holds over the cache.
#include "cp/common.hpp"
#include "cp/query_ring.hpp"
#include "cp/strategy.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "dist/topology.hpp"
#include "trace/trace.hpp"

namespace ctxpar {
namespace {

// pass-Q's query blocks (distinct from the ring's K/V tags).
constexpr int kTagQ = 201;
// Row chunks of a block's compute while a transfer is in flight (see cp::progress_chunk_rows).
constexpr int kProgressParts = 8;

class PassQ final : public cp::ForwardOnlyStrategy {
 public:
  explicit PassQ(Topology& topo) : comm_(topo.cp()) {}
  std::string name() const override { return "pass_q"; }
  PartitionKind partition() const override { return PartitionKind::zigzag; }

  std::string validate(const CpCall& s, const Topology& topo) const override {
    return cp::check_common(name(), s, topo.cp_size());
  }

  double comm_volume_fwd(const CpCall& s, bool docs, const Topology& topo) const override {
    const int N = topo.cp_size();  // docs: a batched prefill's sequences travel with the queries
    const int64_t n = s.S_q / N;
    const cp::QLayout L = cp::q_layout(n, s.H_q, s.H_kv, s.D, s.dtype, false, docs);
    return double(N - 1) * (double(L.bytes) + double(cp::partial_elems(n, s.H_q, s.D)) * sizeof(float));
  }

  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    const int64_t n = local.S_q;
    const cp::QLayout L = cp::q_layout(n, local.H_q, local.H_kv, local.D, local.dtype, false, local.docs());
    const int64_t chunk = cp::progress_chunk_rows(n, kProgressParts, local.device);
    if (local.device != Device::cpu) cp::check_device_call(name(), comm_, local);
    cp::pass_q_forward(comm_, L, local, n, kTagQ, tr, st,
                       [&](std::byte* here, const std::byte* meta, int, int s, Request& req, float* o) {
      const CpCall p = cp::visiting_block(L, here, meta, local, o, o + size_t(n) * local.H_q * local.D);
      const int64_t pairs = visible_pairs(p);
      const double flops = attn_fwd_flops(double(pairs), p.H_q, p.D);
      const double t0 = tr ? tr->stamp() : 0;
      cp::fwd_chunked(p, chunk, false, nullptr, nullptr, [&] {
        if (req.pending()) comm_.test(req);
      });
      st.count_attn(pairs, p.H_q, flops, false);
      if (tr) tr->add_span(Phase::attn_fwd, -1, s, t0, tr->stamp(), flops, 0);
    });
  }

 private:
  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_pass_q_strategy(Topology& topo) { return std::make_unique<PassQ>(topo); }

}  // namespace ctxpar
