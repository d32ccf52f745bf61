// decode_pass_q (inference decode): every sequence's new token is one query row, owned by the
// rank that runs its dense work; the query blocks (padded to the same rows on every rank) carry
// the tokens' own K/V and circulate around the CP ring as in pass_q. The rank that stores a
// sequence's next token (the KV cache's round-robin target) appends its K/V when the block
// visits, so the token also sees itself; every rank attends each row to its cache of that
// sequence; the partials return by one all-to-all and are merged in rank order. Forward only.
#include "core/error.hpp"
#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/query_ring.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "trace/trace.hpp"

namespace ctxpar {
namespace {

constexpr int kTagQ = 201;  // the query blocks (as pass_q; distinct from the ring's K/V tags)

class DecodePassQ final : public CpStrategy {
 public:
  explicit DecodePassQ(Topology& topo) : comm_(topo.cp()) {}
  std::string name() const override { return "decode_pass_q"; }
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

  // local.S_q = the padded rows of this rank's block (q_doc has S_q entries); the leading rows
  // with q_doc >= 0 are this rank's sequences (q, k_new, v_new, q_pos hold those rows), the rest
  // padding (q_doc -1).
  void forward(const AttnParams& local, Tracer* tr, CpStats& st) override {
    const int N = comm_.size(), r = comm_.rank(), next = (r + 1) % N, prev = (r + N - 1) % N;
    const int64_t Bq = local.S_q;
    const cp::QLayout L = cp::q_layout(Bq, local.H_q, local.H_kv, local.D, local.dtype, true);
    const int64_t n = local_rows(local);
    Buffer<std::byte> blk(L.bytes * 2, true);
    cp::pack_queries(L, local, n, blk.data());
    const size_t pe = cp::partial_elems(Bq, local.H_q, local.D);
    Buffer<float> part(pe * size_t(N), false);
    for (int s = 0; s < N; ++s) {
      std::byte* here = blk.data() + size_t(s % 2) * L.bytes;
      std::byte* there = blk.data() + size_t(1 - s % 2) * L.bytes;
      Request req;
      if (s < N - 1) {
        req = comm_.send_recv_async(std::span<std::byte>(here, L.bytes), next, std::span<std::byte>(there, L.bytes), prev,
                                    kTagQ);
        st.messages += 1;
        st.bytes_sent += double(L.bytes);
      }
      const int origin = (r - s + N) % N;
      float* o = part.data() + size_t(origin) * pe;
      const double t0 = tr ? tr->now_us() : 0;
      const double flops = cp::decode_visit(L, here, local, o, o + size_t(Bq) * local.H_q * local.D);
      st.attn_flops += flops;
      if (tr) tr->add_span(Phase::attn_fwd, -1, origin, t0, tr->now_us(), flops, 0);
      cp::timed_wait(comm_, req, st, tr, s, double(L.bytes));
    }
    cp::return_and_merge(comm_, part, Bq, n, local.H_q, local.D, local.o, local.lse, tr, st);
  }

  void backward(const AttnParams&, Tracer*, CpStats&) override {
    CTXPAR_FATAL("decode_pass_q is an inference strategy: it has no backward");
  }

 private:
  // Rows of this rank's own sequences: the leading rows with a document id.
  static int64_t local_rows(const AttnParams& p) {
    int64_t n = 0;
    while (n < p.S_q && p.q_doc[n] >= 0) ++n;
    return n;
  }
  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_decode_pass_q_strategy(Topology& topo) { return std::make_unique<DecodePassQ>(topo); }

}  // namespace ctxpar
