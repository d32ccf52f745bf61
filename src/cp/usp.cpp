// usp (unified sequence parallelism): ulysses all-to-all on the `ulysses` axis inside, pass-KV
// ring on the `ring` axis outside. CP rank c = ring_rank * U + ulysses_rank, so the zigzag shard
// of the whole CP group (2P chunks) gives the U ranks of one ring position exactly ring-level
// zigzag chunks r and 2R-1-r after their all-to-all: every ring step stays balanced, and a ring
// hop carries a block U times larger (with H_kv/U heads) than a pure ring over P ranks would.
#include "cp/common.hpp"
#include "cp/ring_core.hpp"
#include "cp/strategy.hpp"
#include "cp/ulysses_core.hpp"
#include "dist/topology.hpp"

namespace ctxpar {
namespace {

class Usp final : public CpStrategy {
 public:
  explicit Usp(Topology& topo) : ulysses_(topo.axis(Axis::ulysses)), ring_(topo.axis(Axis::ring)) {}
  std::string name() const override { return "usp"; }
  PartitionKind partition() const override { return PartitionKind::zigzag; }

  std::string validate(const CpCall& s, const Topology& topo) const override {
    const int U = topo.size(Axis::ulysses), R = topo.size(Axis::ring);
    std::string e = cp::check_common(name(), s, U * R);
    if (e.empty()) e = cp::refuse_latent(name(), s);
    if (e.empty()) e = cp::check_heads(name(), s.H_q, s.H_kv, U);
    return e;
  }

  double comm_volume_fwd(const CpCall& s, bool docs, const Topology& topo) const override {
    const int U = topo.size(Axis::ulysses), R = topo.size(Axis::ring);
    const int64_t S_loc = s.S_q / (U * R);
    const cp::HeadSplit hk = cp::head_split(s.H_kv, U);
    return cp::ulysses_fwd_bytes(s, docs, S_loc, U) +
           (R - 1) * cp::ring_kv_message_bytes(S_loc * U, hk.H_loc, s.D, s.dtype, docs);
  }

  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    cp::ulysses_fwd(ulysses_, local, [&](const CpCall& a) { cp::ring_fwd(&ring_, a, tr, st); }, tr, st);
  }
  void backward(const CpCall& local, Tracer* tr, CpStats& st) override {
    cp::ulysses_bwd(ulysses_, local, [&](const CpCall& a) { cp::ring_bwd(&ring_, a, tr, st); }, tr, st);
  }

 private:
  Comm& ulysses_;
  Comm& ring_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_usp_strategy(Topology& topo) { return std::make_unique<Usp>(topo); }

}  // namespace ctxpar
