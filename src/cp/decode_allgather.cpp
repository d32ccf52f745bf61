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

  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    const int N = comm_.size();
    const Device dev = local.device;
    if (dev != Device::cpu) cp::check_device_call(name(), comm_, local);
    const int64_t Bq = local.S_q, n = local_rows(local);
    const cp::QLayout L = cp::q_layout(Bq, local.H_q, local.H_kv, local.D, local.dtype, true);
    Buffer<std::byte> blk(L.bytes * size_t(N), true, dev, local.stream);
    const size_t pe = cp::partial_elems(Bq, local.H_q, local.D);
    Buffer<float> part(pe * size_t(N), false, dev, local.stream);
    Buffer<std::byte> mine(N > 1 ? L.bytes : 0, true, dev, local.stream);
    const std::vector<std::byte> meta_mine = cp::pack_queries(L, local, n, N > 1 ? mine.data() : blk.data());
    if (N > 1)
      cp::timed_collective(comm_, st, tr, Phase::all_gather, double(L.bytes) * (N - 1),
                           [&] { comm_.all_gather(buf(mine), buf(blk)); }, dev);
    // A device call reads the blocks' metadata from a host copy of every rank's.
    const cp::BlockMeta meta = dev != Device::cpu ? cp::gather_block_meta(comm_, L, meta_mine, tr, st) : cp::BlockMeta{};
    for (int j = 0; j < N; ++j) {
      std::byte* b = blk.data() + size_t(j) * L.bytes;
      cp::decode_visit_traced(L, b, meta.of(j, L, b), local, part.data() + size_t(j) * pe, j, tr, st);
    }
    cp::return_and_merge(comm_, part, Bq, n, local, tr, st);
  }

 private:
  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_decode_allgather_strategy(Topology& topo) {
  return std::make_unique<DecodeAllGather>(topo);
}

}  // namespace ctxpar
