// decode_allgather (inference decode): as decode_pass_q, but every rank's query block (with the
// new tokens' own K/V) is all-gathered at once instead of passed around the ring: one collective
// instead of N - 1 hops, then every rank visits all N blocks against its KV cache; the partials
// return by one all-to-all and are merged in rank order. Forward only.
#include <cstring>

#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/query_ring.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "trace/trace.hpp"

namespace ctxpar {
namespace {

class DecodeAllGather final : public cp::DecodeStrategy {
 public:
  explicit DecodeAllGather(Topology& topo) : comm_(topo.cp()) {}
  std::string name() const override { return "decode_allgather"; }

  void forward(const AttnParams& local, Tracer* tr, CpStats& st) override {
    const int N = comm_.size();
    const int64_t Bq = local.S_q, n = local_rows(local);
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
    for (int j = 0; j < N; ++j)
      cp::decode_visit_traced(L, blk.data() + size_t(j) * L.bytes, local, part.data() + size_t(j) * pe, j, tr, st);
    cp::return_and_merge(comm_, part, Bq, n, local.H_q, local.D, local.o, local.lse, tr, st);
  }

 private:
  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_decode_allgather_strategy(Topology& topo) {
  return std::make_unique<DecodeAllGather>(topo);
}

}  // namespace ctxpar
