// decode_pass_q (inference decode): every sequence's new token is one query row, owned by the
// rank that runs its dense work; the query blocks (padded to the same rows on every rank) carry
// the tokens' own K/V and circulate around the CP ring as in pass_q. The rank that stores a
// sequence's next token (the KV cache's round-robin target) appends its K/V when the block
// visits, so the token also sees itself; every rank attends each row to its cache of that
// sequence; the partials return by one all-to-all and are merged in rank order. Forward only.
#include "cp/common.hpp"
#include "cp/query_ring.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "trace/trace.hpp"

namespace ctxpar {
namespace {

constexpr int kTagQ = 201;  // the query blocks (as pass_q; distinct from the ring's K/V tags)

class DecodePassQ final : public cp::DecodeStrategy {
 public:
  explicit DecodePassQ(Topology& topo) : comm_(topo.cp()) {}
  std::string name() const override { return "decode_pass_q"; }

  // local.S_q = the padded rows of this rank's block (q_doc has S_q entries); the leading rows
  // with q_doc >= 0 are this rank's sequences (q, k_new, v_new, q_pos hold those rows), the rest
  // padding (q_doc -1).
  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    const int64_t Bq = local.S_q, n = local_rows(local);
    const cp::QLayout L = cp::q_layout(Bq, local.H_q, local.H_kv, local.D, local.dtype, true);
    if (local.device != Device::cpu) cp::check_device_call(name(), comm_, local);
    cp::pass_q_forward(comm_, L, local, n, kTagQ, tr, st,
                       [&](std::byte* here, const std::byte* meta, int, int s, Request&, float* part) {
                         cp::decode_visit_traced(L, here, meta, local, part, s, tr, st);
                       });
  }

 private:
  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_decode_pass_q_strategy(Topology& topo) { return std::make_unique<DecodePassQ>(topo); }

}  // namespace ctxpar
