// decode_allgather (inference decode): as decode_pass_q, but every rank's query block (with the
// new tokens' own K/V) is all-gathered at once instead of passed around the ring: one collective
// instead of N - 1 hops, then every rank visits all N blocks against its KV cache; the partials
// return by one all-to-all and are merged in rank order. Forward only.
#include <cstring>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/query_ring.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "trace/trace.hpp"

namespace ctxpar {
namespace {

class DecodeAllGather final : public CpStrategy {
 public:
  explicit DecodeAllGather(Topology& topo) : comm_(topo.cp()) {}
  std::string name() const override { return "decode_allgather"; }
  PartitionKind partition() const override { return PartitionKind::contiguous; }
  bool has_backward() const override { return false; }

  std::string validate(const AttnParams& s, const Topology& topo) const override {
    (void)topo;
    return s.H_q > 0 && s.H_kv > 0 && s.H_q % s.H_kv == 0 ? "" : name() + ": heads must be a positive multiple of kv_heads";
  }

  // `s.S_q`: the padded query rows of one rank's block.
  double comm_volume_fwd(const AttnParams& s, bool docs, const Topology& topo) const override {
    const int N = topo.cp_size();
    (void)docs;
    const cp::QLayout L = cp::q_layout(s.S_q, s.H_q, s.H_kv, s.D, s.dtype, true);
    return double(N - 1) * (double(L.bytes) + double(cp::partial_elems(s.S_q, s.H_q, s.D)) * sizeof(float));
  }

  void forward(const AttnParams& local, Tracer* tr, CpStats& st) override {
    const int N = comm_.size();
    const int64_t Bq = local.S_q;
    int64_t n = 0;
    while (n < Bq && local.q_doc[n] >= 0) ++n;
    const cp::QLayout L = cp::q_layout(Bq, local.H_q, local.H_kv, local.D, local.dtype, true);
    Buffer<std::byte> blk(L.bytes * size_t(N), true);
    cp::pack_queries(L, local, n, blk.data());
    const size_t pe = cp::partial_elems(Bq, local.H_q, local.D);
    Buffer<float> part(pe * size_t(N), false);
    if (N > 1) {
      Buffer<std::byte> mine(L.bytes, false);
      std::memcpy(mine.data(), blk.data(), L.bytes);
      cp::timed_collective(comm_, st, tr, Phase::all_gather, double(L.bytes) * (N - 1),
                           [&] { comm_.all_gather(mine.span(), blk.span()); });
    }
    for (int j = 0; j < N; ++j) {
      float* o = part.data() + size_t(j) * pe;
      const double t0 = tr ? tr->now_us() : 0;
      const double flops = cp::decode_visit(L, blk.data() + size_t(j) * L.bytes, local, o, o + size_t(Bq) * local.H_q * local.D);
      st.attn_flops += flops;
      if (tr) tr->add_span(Phase::attn_fwd, -1, j, t0, tr->now_us(), flops, 0);
    }
    cp::return_and_merge(comm_, part, Bq, n, local.H_q, local.D, local.o, local.lse, tr, st);
  }

  void backward(const AttnParams&, Tracer*, CpStats&) override {
    CTXPAR_FATAL("decode_allgather is an inference strategy: it has no backward");
  }

 private:
  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_decode_allgather_strategy(Topology& topo) {
  return std::make_unique<DecodeAllGather>(topo);
}

}  // namespace ctxpar
