// GDN under CP, ring schedule (gdn_cp.hpp): the state is handed from piece q to piece q + 1 of the
// chain, one group of heads at a time, so the chain works as a pipeline: while piece q + 1
// computes heads [0, g) with the state it received, piece q computes the next group. A group is
// as many heads as the rank has threads (the op runs heads in parallel), so a chain of Q pieces
// over H heads takes about (G + Q - 1) group steps for G = H / group groups, against G on one
// piece: with many heads per rank the chain's latency nearly disappears. Every receive is posted
// first; sends are waited at the end. Backward: the same along the reversed chain with the end
// state's gradient.
#include <omp.h>

#include <algorithm>
#include <span>

#include "cp/gdn_cp.hpp"

namespace ctxpar {
namespace {

// Tags: one per head group (a piece's predecessor and successor are on different ranks, or on
// this one, so (source, tag) identifies a message); MPI guarantees tags up to 32767.
constexpr int kTagFwd = 1000, kTagBwd = 9000, kMaxGroups = 7999;

struct Groups {
  int size = 1, count = 1;  // heads per group, groups
  Groups(int H) {
    size = std::max(1, std::min(H, omp_get_max_threads()));
    count = (H + size - 1) / size;
    if (count > kMaxGroups) size = (H + kMaxGroups - 1) / kMaxGroups, count = (H + size - 1) / size;
  }
  int begin(int g) const { return g * size; }
  int end(int g, int H) const { return std::min(H, (g + 1) * size); }
};

// The [h0, h1) heads of a [H, rows, cols] state as a span.
std::span<float> heads_of(std::vector<float>& s, int h0, int h1, int64_t per_head) {
  return std::span<float>(s.data() + h0 * per_head, size_t((h1 - h0) * per_head));
}

class GdnRing final : public GdnCp {
 public:
  std::string name() const override { return "ring"; }

  void forward(Comm& comm, const GdnChain& chain, const std::vector<GdnParams>& pieces, GdnCpContext& ctx,
               CpStats* st) override {
    run(comm, chain, pieces, ctx, st, false);
  }
  void backward(Comm& comm, const GdnChain& chain, const std::vector<GdnParams>& pieces, GdnCpContext& ctx,
                CpStats* st) override {
    run(comm, chain, pieces, ctx, st, true);
  }

 private:
  // Forward: along the chain, the state; backward: against it, the state's gradient.
  void run(Comm& comm, const GdnChain& chain, const std::vector<GdnParams>& pieces, GdnCpContext& ctx, CpStats* st,
           bool backward) {
    const int r = comm.rank(), Q = chain.size();
    const std::vector<int> mine = chain.positions_of(r);
    const size_t J = mine.size();
    if (J == 0) return;
    const GdnParams& p0 = pieces[0];
    const int H = p0.H;
    const int64_t per_head = int64_t(p0.Dv) * p0.Dk, SS = H * per_head;
    const Groups grp(H);
    const int tag = backward ? kTagBwd : kTagFwd;
    // Chain order this pass walks: forward ascending positions, backward descending.
    std::vector<size_t> order(J);
    for (size_t i = 0; i < J; ++i) order[i] = backward ? J - 1 - i : i;
    auto prev_pos = [&](int q) { return backward ? q + 1 : q - 1; };  // where the input comes from
    auto next_pos = [&](int q) { return backward ? q - 1 : q + 1; };
    auto on_chain = [&](int q) { return q >= 0 && q < Q; };
    // Inputs: forward the start states (kept for the backward), backward the end states' gradients.
    std::vector<std::vector<float>> in(J, std::vector<float>(static_cast<size_t>(SS), 0.0f)), out = in;
    std::vector<std::vector<Request>> recv(J);
    for (size_t j = 0; j < J; ++j) {
      const int q = mine[j], from = prev_pos(q);
      if (on_chain(from) && chain.owner[size_t(from)] != r)
        for (int g = 0; g < grp.count; ++g)
          recv[j].push_back(comm.send_recv_async(std::span<const float>(), Comm::kNone,
                                                 heads_of(in[j], grp.begin(g), grp.end(g, H), per_head),
                                                 chain.owner[size_t(from)], tag + g));
    }
    std::vector<Request> sends;
    for (size_t jj : order) {
      const int q = mine[jj], from = prev_pos(q), to = next_pos(q);
      const GdnParams& pc = pieces[jj];
      if (!on_chain(from)) {  // the chain's end this pass starts from: the given state or gradient
        const float* given = backward ? pc.ds_out : pc.s0;
        if (given) in[jj].assign(given, given + SS);
      } else if (chain.owner[size_t(from)] == r) {  // this rank's neighbouring piece, already done
        const size_t k = size_t(std::find(mine.begin(), mine.end(), from) - mine.begin());
        in[jj] = out[k];
      }
      const bool remote_in = on_chain(from) && chain.owner[size_t(from)] != r;
      const bool remote_out = on_chain(to) && chain.owner[size_t(to)] != r;
      // Nothing to pipeline with (no remote neighbour): all heads in one call.
      const int groups = remote_in || remote_out ? grp.count : 1;
      for (int g = 0; g < groups; ++g) {
        if (remote_in) {
          const double t = comm.now();
          comm.wait(recv[jj][size_t(g)]);
          if (st) st->exposed_comm_s += comm.now() - t;
        }
        GdnParams p = pc;
        p.head_begin = groups == 1 ? 0 : grp.begin(g);
        p.head_end = groups == 1 ? H : grp.end(g, H);
        if (backward) {
          p.s0 = ctx.s_start[jj].data();
          p.ds_out = in[jj].data();
          p.ds0 = out[jj].data();
          gdn_bwd(p);
        } else {
          p.s0 = in[jj].data();
          p.s_out = out[jj].data();
          gdn_fwd(p);
        }
        if (remote_out) {
          sends.push_back(comm.send_recv_async(std::span<const float>(heads_of(out[jj], p.head_begin, p.head_end, per_head)),
                                               chain.owner[size_t(to)], std::span<float>(), Comm::kNone, tag + g));
          if (st) st->bytes_sent += double(p.head_end - p.head_begin) * per_head * sizeof(float), st->messages += 1;
        }
      }
      if (!on_chain(to)) {  // this pass's far end: the sequence's final state, or the initial one's gradient
        float* result = backward ? pc.ds0 : pc.s_out;
        if (result) std::copy(out[jj].begin(), out[jj].end(), result);
      }
    }
    for (Request& s : sends) comm.wait(s);
    if (!backward) {
      ctx.s_start = std::move(in);
      ctx.T.assign(J, {});
    }
  }
};

}  // namespace

std::unique_ptr<GdnCp> make_gdn_ring() { return std::make_unique<GdnRing>(); }

}  // namespace ctxpar
