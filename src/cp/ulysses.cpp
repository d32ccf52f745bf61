// ulysses: all-to-all from tokens to heads over the whole CP group ([S_loc, H, D] →
// [S, H/U, D]), a local attention kernel on full-length sequences of H/U heads, and the
// all-to-all back (DeepSpeed-Ulysses). K/V heads fewer than U are replicated (see HeadSplit),
// which lifts the H_kv >= U limit of other implementations. Tokens are zigzag-sharded like every
// other strategy here (harmless for ulysses, and the same layout as usp's).
#include "cp/common.hpp"
#include "cp/ring_core.hpp"
#include "cp/strategy.hpp"
#include "cp/ulysses_core.hpp"
#include "dist/topology.hpp"

namespace ctxpar {
namespace {

class Ulysses final : public CpStrategy {
 public:
  explicit Ulysses(Topology& topo) : comm_(topo.cp()) {}
  std::string name() const override { return "ulysses"; }
  PartitionKind partition() const override { return PartitionKind::zigzag; }

  std::string validate(const CpCall& s, const Topology& topo) const override {
    const int U = topo.cp_size();
    std::string e = cp::check_common(name(), s, U);
    if (e.empty()) e = cp::refuse_latent(name(), s);
    if (e.empty()) e = cp::check_heads(name(), s.H_q, s.H_kv, U);
    return e;
  }

  double comm_volume_fwd(const CpCall& s, bool docs, const Topology& topo) const override {
    const int U = topo.cp_size();
    return cp::ulysses_fwd_bytes(s, docs, s.S_q / U, U);
  }

  // Inside: one local kernel call (the ring of one rank).
  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    cp::ulysses_fwd(comm_, local, [&](const CpCall& a) { cp::ring_fwd(nullptr, a, tr, st); }, tr, st);
  }
  void backward(const CpCall& local, Tracer* tr, CpStats& st) override {
    cp::ulysses_bwd(comm_, local, [&](const CpCall& a) { cp::ring_bwd(nullptr, a, tr, st); }, tr, st);
  }

 private:
  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_ulysses_strategy(Topology& topo) { return std::make_unique<Ulysses>(topo); }

}  // namespace ctxpar
