// ring (pass-KV): queries stay, K/V blocks travel one hop per step around the whole CP group
// (ring order = CP rank), double-buffered with the next hop posted before the current block is
// computed; zigzag sharding gives every step the same causal work. See cp/ring_core.hpp for the
// step structure of forward and backward and for how transfers are kept moving.
#include "cp/common.hpp"
#include "cp/ring_core.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"

namespace ctxpar {
namespace {

class Ring final : public CpStrategy {
 public:
  explicit Ring(Topology& topo) : comm_(topo.cp()) {}
  std::string name() const override { return "ring"; }
  PartitionKind partition() const override { return PartitionKind::zigzag; }

  std::string validate(const AttnShape& s, const Topology& topo) const override {
    return cp::check_common(name(), s, cp_size(topo));
  }

  double comm_volume_fwd(const AttnShape& s, const Topology& topo) const override {
    const int P = cp_size(topo);
    return (P - 1) * cp::ring_kv_message_bytes(s.S / P, s.H_kv, s.D, s.has_docs);
  }

  void forward(const AttnShape& s, LocalAttn& t, Tracer* tr, CpStats& st) override {
    cp::BlockAttn a = block(s, t);
    cp::ring_fwd(&comm_, a, tr, st);
  }
  void backward(const AttnShape& s, LocalAttn& t, Tracer* tr, CpStats& st) override {
    cp::BlockAttn a = block(s, t);
    cp::ring_bwd(&comm_, a, tr, st);
  }

 private:
  static int cp_size(const Topology& topo) { return topo.size(Axis::ulysses) * topo.size(Axis::ring); }

  static cp::BlockAttn block(const AttnShape& s, LocalAttn& t) {
    cp::BlockAttn a;
    a.S_q = a.S_k = t.S_loc;
    a.H_q = s.H_q;
    a.H_kv = s.H_kv;
    a.D = s.D;
    a.mask = s.mask;
    a.window = s.window;
    a.q = t.q;
    a.k = t.k;
    a.v = t.v;
    a.q_pos = a.k_pos = t.pos;
    a.q_doc = a.k_doc = t.doc;
    a.o = t.o;
    a.lse = t.lse;
    a.dout = t.dout;
    a.dq = t.dq;
    a.dk = t.dk;
    a.dv = t.dv;
    return a;
  }

  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_ring_strategy(Topology& topo) { return std::make_unique<Ring>(topo); }

}  // namespace ctxpar
