// GDN under CP, ring schedule (gdn_cp.hpp): the state is handed from rank r to rank r + 1.
// Forward: post the receive, prepare every chunk (independent of the state), wait, finish with the
// received state, hand the end state on. Backward: the end state's gradient comes from rank r + 1,
// the whole backward of the piece runs with it, the start state's gradient goes to rank r - 1
// (sequential: the backward has no state-independent part split off yet).
#include <span>

#include "cp/gdn_cp.hpp"

namespace ctxpar {
namespace {

constexpr int kTagFwd = 701, kTagBwd = 702;

class GdnRing final : public GdnCp {
 public:
  std::string name() const override { return "ring"; }

  void forward(Comm& comm, const GdnParams& p0, GdnCpContext& ctx, CpStats* st) override {
    const int r = comm.rank(), P = comm.size();
    const int64_t SS = gdn_state_floats(p0);
    ctx.s_start.assign(size_t(SS), 0.0f);
    ctx.T.clear();
    Request in;
    if (r > 0) in = comm.send_recv_async(std::span<const float>(), Comm::kNone, std::span<float>(ctx.s_start), r - 1, kTagFwd);
    GdnParams p = p0;
    p.s0 = nullptr;
    p.s_out = nullptr;
    std::vector<float> ws(size_t(gdn_workspace_floats(p)));
    gdn_fwd_prepare(p, ws.data());
    if (r > 0) {
      const double t = comm.now();
      comm.wait(in);
      if (st) st->exposed_comm_s += comm.now() - t;
    } else if (p0.s0) {
      ctx.s_start.assign(p0.s0, p0.s0 + SS);
    }
    std::vector<float> s_end(static_cast<size_t>(SS));
    p.s0 = ctx.s_start.data();
    p.s_out = s_end.data();
    gdn_fwd_finish(p, ws.data());
    if (r + 1 < P) {
      Request out = comm.send_recv_async(std::span<const float>(s_end), r + 1, std::span<float>(), Comm::kNone, kTagFwd);
      comm.wait(out);
      if (st) st->bytes_sent += double(SS) * sizeof(float), st->messages += 1;
    } else if (p0.s_out) {
      std::copy(s_end.begin(), s_end.end(), p0.s_out);
    }
  }

  void backward(Comm& comm, const GdnParams& p0, GdnCpContext& ctx, CpStats* st) override {
    const int r = comm.rank(), P = comm.size();
    const int64_t SS = gdn_state_floats(p0);
    std::vector<float> ds_end(size_t(SS), 0.0f), ds_start(static_cast<size_t>(SS));
    if (r + 1 < P) {
      Request in = comm.send_recv_async(std::span<const float>(), Comm::kNone, std::span<float>(ds_end), r + 1, kTagBwd);
      const double t = comm.now();
      comm.wait(in);
      if (st) st->exposed_comm_s += comm.now() - t;
    } else if (p0.ds_out) {
      ds_end.assign(p0.ds_out, p0.ds_out + SS);
    }
    GdnParams p = p0;
    p.s0 = ctx.s_start.data();
    p.ds_out = ds_end.data();
    p.ds0 = ds_start.data();
    gdn_bwd(p);
    if (r > 0) {
      Request out = comm.send_recv_async(std::span<const float>(ds_start), r - 1, std::span<float>(), Comm::kNone, kTagBwd);
      comm.wait(out);
      if (st) st->bytes_sent += double(SS) * sizeof(float), st->messages += 1;
    } else if (p0.ds0) {
      std::copy(ds_start.begin(), ds_start.end(), p0.ds0);
    }
  }
};

}  // namespace

std::unique_ptr<GdnCp> make_gdn_ring() { return std::make_unique<GdnRing>(); }

}  // namespace ctxpar
