// ring (pass-KV): queries stay, K/V blocks travel one hop per step around the whole CP group
// (ring order = CP rank), double-buffered with the next hop posted before the current block is
// computed; zigzag sharding gives every step the same causal work. See cp/ring_core.hpp for the
// step structure of forward and backward and for how transfers are kept moving. The same
// forward serves the pass-KV prefill over a KV cache (keys = a rank's cache, S_k >= S_q). With
// MLA the ring moves the latent and expands each visiting block (moves_latent). The ring's other
// schedules are strategies of their own (registry.cpp).
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

  std::string validate(const CpCall& s, const Topology& topo) const override {
    return cp::check_common(name(), s, topo.cp_size());
  }

  bool moves_latent() const override { return true; }

  double comm_volume_fwd(const CpCall& s, bool docs, const Topology& topo) const override {
    const int P = topo.cp_size();
    return (P - 1) * message_bytes(s, docs, P);
  }
  // The backward's (ring_core.cpp): the visiting K/V block and the next in flight, the dK/dV
  // partial sums (fp32) being sent and being filled, and the one arriving: flat in P at a fixed S / P.
  // MLA: two latent blocks, three latent-gradient sums, and the expanded block's K/V and dK/dV.
  double buffer_bytes(const CpCall& s, bool docs, const Topology& topo) const override {
    const int P = topo.cp_size();
    const int64_t n = s.S_k / P;
    if (s.latent_width > 0)
      return 2.0 * message_bytes(s, docs, P) + 3.0 * double(n) * s.latent_width * sizeof(float) +
             (P > 1 ? 2.0 : 1.0) * cp::ring_dkv_message_bytes(n, s.H_kv, s.D);
    if (P <= 1) return 0;
    return 2.0 * message_bytes(s, docs, P) + 3.0 * cp::ring_dkv_message_bytes(n, s.H_kv, s.D);
  }

  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    cp::ring_fwd(&comm_, local, tr, st);
  }
  void backward(const CpCall& local, Tracer* tr, CpStats& st) override {
    cp::ring_bwd(&comm_, local, tr, st);
  }

 private:
  static double message_bytes(const CpCall& s, bool docs, int P) {
    const bool pos = s.k_pos_zigzag <= 0;  // derivable positions do not travel
    return s.latent_width > 0 ? cp::ring_latent_message_bytes(s.S_k / P, s.latent_width, docs, pos)
                              : cp::ring_kv_message_bytes(s.S_k / P, s.H_kv, s.D, s.dtype, docs, pos);
  }
  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_ring_strategy(Topology& topo) { return std::make_unique<Ring>(topo); }

}  // namespace ctxpar
