// GDN under CP, ring schedule (gdn_cp.hpp): the state is handed from piece q to piece q + 1 of the
// chain. Forward: post the receives of every piece whose predecessor is on another rank, prepare
// every piece (independent of the state), then piece by piece in chain order: wait for the state
// (or take it from this rank's previous piece), finish, hand the end state on. Backward: the same
// in reverse with the end state's gradient; the whole backward of a piece runs once its gradient
// is in (sequential: the backward has no state-independent part split off yet).
#include <span>

#include "cp/gdn_cp.hpp"

namespace ctxpar {
namespace {

// Tags: one per receiving piece (MPI matches by source and tag; chains up to 7999 pieces).
constexpr int kTagFwd = 1000, kTagBwd = 9000;

class GdnRing final : public GdnCp {
 public:
  std::string name() const override { return "ring"; }

  void forward(Comm& comm, const GdnChain& chain, const std::vector<GdnParams>& pieces, GdnCpContext& ctx,
               CpStats* st) override {
    const int r = comm.rank(), Q = chain.size();
    const std::vector<int> mine = chain.positions_of(r);
    const size_t J = mine.size();
    if (J == 0) return;
    const int64_t SS = gdn_state_floats(pieces[0]);
    ctx.s_start.assign(J, std::vector<float>(static_cast<size_t>(SS), 0.0f));
    ctx.T.assign(J, {});
    std::vector<Request> in(J);
    for (size_t j = 0; j < J; ++j) {
      const int q = mine[j];
      if (q > 0 && chain.owner[size_t(q - 1)] != r)
        in[j] = comm.send_recv_async(std::span<const float>(), Comm::kNone, std::span<float>(ctx.s_start[j]),
                                     chain.owner[size_t(q - 1)], kTagFwd + q);
    }
    // Pieces that wait for a state prepare first; the chain's head (its state is at hand) runs
    // in one call below, without the workspace.
    std::vector<std::vector<float>> ws(J);
    for (size_t j = 0; j < J; ++j) {
      if (mine[j] == 0) continue;
      GdnParams p = pieces[j];
      p.s0 = nullptr;
      p.s_out = nullptr;
      ws[j].resize(size_t(gdn_workspace_floats(p)));
      gdn_fwd_prepare(p, ws[j].data());
    }
    std::vector<float> s_end(static_cast<size_t>(SS));
    for (size_t j = 0; j < J; ++j) {
      const int q = mine[j];
      if (q == 0) {
        if (pieces[j].s0) ctx.s_start[j].assign(pieces[j].s0, pieces[j].s0 + SS);
      } else if (chain.owner[size_t(q - 1)] == r) {
        ctx.s_start[j] = s_end;  // this rank's previous piece
      } else {
        const double t = comm.now();
        comm.wait(in[j]);
        if (st) st->exposed_comm_s += comm.now() - t;
      }
      GdnParams p = pieces[j];
      p.s0 = ctx.s_start[j].data();
      p.s_out = s_end.data();
      if (q == 0) {
        gdn_fwd(p);
      } else {
        gdn_fwd_finish(p, ws[j].data());
      }
      if (q + 1 == Q) {
        if (pieces[j].s_out) std::copy(s_end.begin(), s_end.end(), pieces[j].s_out);
      } else if (chain.owner[size_t(q + 1)] != r) {
        Request out = comm.send_recv_async(std::span<const float>(s_end), chain.owner[size_t(q + 1)],
                                           std::span<float>(), Comm::kNone, kTagFwd + q + 1);
        comm.wait(out);
        if (st) st->bytes_sent += double(SS) * sizeof(float), st->messages += 1;
      }
    }
  }

  void backward(Comm& comm, const GdnChain& chain, const std::vector<GdnParams>& pieces, GdnCpContext& ctx,
                CpStats* st) override {
    const int r = comm.rank(), Q = chain.size();
    const std::vector<int> mine = chain.positions_of(r);
    const size_t J = mine.size();
    if (J == 0) return;
    const int64_t SS = gdn_state_floats(pieces[0]);
    std::vector<std::vector<float>> ds_end(J, std::vector<float>(static_cast<size_t>(SS), 0.0f));
    std::vector<Request> in(J);
    for (size_t j = 0; j < J; ++j) {
      const int q = mine[j];
      if (q + 1 < Q && chain.owner[size_t(q + 1)] != r)
        in[j] = comm.send_recv_async(std::span<const float>(), Comm::kNone, std::span<float>(ds_end[j]),
                                     chain.owner[size_t(q + 1)], kTagBwd + q);
    }
    std::vector<float> ds_start(static_cast<size_t>(SS));
    for (size_t jj = J; jj-- > 0;) {
      const int q = mine[jj];
      if (q + 1 == Q) {
        if (pieces[jj].ds_out) ds_end[jj].assign(pieces[jj].ds_out, pieces[jj].ds_out + SS);
      } else if (chain.owner[size_t(q + 1)] == r) {
        ds_end[jj] = ds_start;  // from this rank's next piece
      } else {
        const double t = comm.now();
        comm.wait(in[jj]);
        if (st) st->exposed_comm_s += comm.now() - t;
      }
      GdnParams p = pieces[jj];
      p.s0 = ctx.s_start[jj].data();
      p.ds_out = ds_end[jj].data();
      p.ds0 = ds_start.data();
      gdn_bwd(p);
      if (q == 0) {
        if (pieces[jj].ds0) std::copy(ds_start.begin(), ds_start.end(), pieces[jj].ds0);
      } else if (chain.owner[size_t(q - 1)] != r) {
        Request out = comm.send_recv_async(std::span<const float>(ds_start), chain.owner[size_t(q - 1)],
                                           std::span<float>(), Comm::kNone, kTagBwd + q - 1);
        comm.wait(out);
        if (st) st->bytes_sent += double(SS) * sizeof(float), st->messages += 1;
      }
    }
  }
};

}  // namespace

std::unique_ptr<GdnCp> make_gdn_ring() { return std::make_unique<GdnRing>(); }

}  // namespace ctxpar
