// GDN under CP, scan schedule (gdn_cp.hpp). A piece maps its start state x to its end state
// x T + B (per head; B the end state from a zero start, T the piece's transition). The start state
// of piece q is the composition of the maps of pieces 0..q-1 applied to the sequence's initial
// state: an exclusive scan along the chain in ceil(log2 Q) rounds (Hillis-Steele; in round d a
// piece hands its running composition to the piece d places on). A composition that includes the
// chain's head is a constant (its B alone travels), so T is formed only for pieces 1..Q-2. The
// backward runs the same scan along the reversed chain on the transposed maps dx -> dx T^T + D
// (D the start-state gradient of the piece's own outputs), then adds what the end state's gradient
// contributes (a second backward with zero output gradient).
#include <algorithm>
#include <span>

#include "cp/gdn_cp.hpp"

namespace ctxpar {
namespace {

// + the sending position; MPI guarantees tags up to 32767, so chains up to 7700 pieces (25000 + 7700 < 32767)
constexpr int kTagFwd = 17000, kTagBwd = 25000;

// x -> x T + B per head; x and B [H, Dv, Dk], T [H, Dk, Dk]. `constant`: composed from the
// chain's head, only B (the state itself) matters. Empty B: the identity map.
struct Affine {
  std::vector<float> T, B;
  bool constant = false;
};

// b <- (a, then b): T = T_a T_b, B = B_a T_b + B_b.
void compose_into(const Affine& a, Affine& b, const GdnParams& p) {
  if (b.B.empty()) {
    b = a;
    return;
  }
  const int64_t SB = int64_t(p.Dv) * p.Dk, ST = int64_t(p.Dk) * p.Dk;
  std::vector<float> B = b.B, T;
  if (!a.constant) T.assign(size_t(p.H * ST), 0.0f);
  for (int h = 0; h < p.H; ++h) {
    sgemm(false, false, p.Dv, p.Dk, p.Dk, 1.0f, a.B.data() + h * SB, p.Dk, b.T.data() + h * ST, p.Dk, 1.0f,
          B.data() + h * SB, p.Dk);
    if (!a.constant)
      sgemm(false, false, p.Dk, p.Dk, p.Dk, 1.0f, a.T.data() + h * ST, p.Dk, b.T.data() + h * ST, p.Dk, 0.0f,
            T.data() + h * ST, p.Dk);
  }
  b.B = std::move(B);
  b.T = std::move(T);
  b.constant = a.constant;
}

// Exclusive scan along the chain: this rank's positions `mine` (ascending; position q of a chain
// of Q, rank_of(q) holding it), `maps[j]` the map of position mine[j] (T present where
// 1 <= q <= Q-2). Returns, per position, the composition of positions 0..q-1 (a constant: the
// state entering it); empty for q = 0.
template <class RankOf>
std::vector<std::vector<float>> exclusive_scan(Comm& comm, int Q, const std::vector<int>& mine, RankOf rank_of,
                                               std::vector<Affine> incl, const GdnParams& p, int tag, CpStats* st) {
  const size_t J = mine.size();
  const int64_t SB = int64_t(p.H) * p.Dv * p.Dk, ST = int64_t(p.H) * p.Dk * p.Dk;
  std::vector<Affine> excl(J);
  for (size_t j = 0; j < J; ++j) incl[j].constant = mine[j] == 0;
  for (int d = 1; d < Q; d <<= 1) {
    // incl[j] covers positions [q - d + 1, q]: a constant once it reaches the head.
    std::vector<std::vector<float>> out(J), in(J);
    std::vector<Request> reqs;
    for (size_t j = 0; j < J; ++j) {
      const int q = mine[j];
      const bool sends = q + d < Q, recvs = q - d >= 0;
      if (sends) {
        out[j] = incl[j].B;
        if (!incl[j].constant) out[j].insert(out[j].end(), incl[j].T.begin(), incl[j].T.end());
      }
      if (recvs) in[j].resize(size_t(SB + (q - d < d ? 0 : ST)));  // the sender's reaches the head: B only
      // tag = the sending position (two positions of one rank may talk to one peer in a round)
      if (recvs)
        reqs.push_back(comm.send_recv_async(std::span<const float>(), Comm::kNone, std::span<float>(in[j]),
                                            rank_of(q - d), tag + q - d));
      if (sends) {
        reqs.push_back(comm.send_recv_async(std::span<const float>(out[j]), rank_of(q + d), std::span<float>(),
                                            Comm::kNone, tag + q));
        if (st) st->bytes_sent += double(out[j].size()) * sizeof(float), st->messages += 1;
      }
    }
    const double t = comm.now();
    for (Request& rq : reqs) comm.wait(rq);
    if (st) st->exposed_comm_s += comm.now() - t;
    for (size_t j = 0; j < J; ++j) {
      const int q = mine[j];
      if (q - d < 0) continue;
      Affine x;
      x.constant = q - d < d;
      x.B.assign(in[j].begin(), in[j].begin() + SB);
      if (!x.constant) x.T.assign(in[j].begin() + SB, in[j].end());
      compose_into(x, excl[j], p);
      if (q + 2 * d < Q) compose_into(x, incl[j], p);  // sent again in a later round
    }
  }
  std::vector<std::vector<float>> res(J);
  for (size_t j = 0; j < J; ++j) res[j] = std::move(excl[j].B);
  return res;
}

void identity_maps(std::vector<float>& T, const GdnParams& p) {
  T.assign(size_t(p.H) * p.Dk * p.Dk, 0.0f);
  for (int h = 0; h < p.H; ++h)
    for (int i = 0; i < p.Dk; ++i) T[(int64_t(h) * p.Dk + i) * p.Dk + i] = 1.0f;
}

class GdnScan final : public GdnCp {
 public:
  std::string name() const override { return "scan"; }

  void forward(Comm& comm, const GdnChain& chain, const std::vector<GdnParams>& pieces, GdnCpContext& ctx,
               CpStats* st) override {
    const int r = comm.rank(), Q = chain.size();
    const std::vector<int> mine = chain.positions_of(r);
    const size_t J = mine.size();
    if (J == 0) return;
    const int64_t SS = gdn_state_floats(pieces[0]);
    std::vector<Affine> maps(J);
    std::vector<std::vector<float>> ws(J);
    ctx.T.assign(J, {});
    for (size_t j = 0; j < J; ++j) {
      const int q = mine[j];
      GdnParams p = pieces[j];
      p.s0 = q == 0 ? pieces[j].s0 : nullptr;
      maps[j].B.assign(static_cast<size_t>(SS), 0.0f);
      p.s_out = maps[j].B.data();
      if (q == 0) {  // the chain's head: its start is known, nothing to correct later
        gdn_fwd(p);
        continue;
      }
      ws[j].resize(size_t(gdn_workspace_floats(p)));
      gdn_fwd_prepare(p, ws[j].data());
      gdn_fwd_finish(p, ws[j].data());  // o and the end state from a zero start
      if (q >= 1 && q + 1 < Q) {
        identity_maps(maps[j].T, p);
        gdn_state_apply(p, ws[j].data(), maps[j].T.data(), p.Dk, false);
      }
      ctx.T[j] = maps[j].T;
    }
    std::vector<std::vector<float>> s_end(J);
    for (size_t j = 0; j < J; ++j) s_end[j] = maps[j].B;
    ctx.s_start = exclusive_scan(comm, Q, mine, [&](int q) { return chain.owner[size_t(q)]; }, std::move(maps),
                                 pieces[0], kTagFwd, st);
    for (size_t j = 0; j < J; ++j) {
      const int q = mine[j];
      if (q == 0) {
        ctx.s_start[j] = pieces[j].s0 ? std::vector<float>(pieces[j].s0, pieces[j].s0 + SS)
                                      : std::vector<float>(static_cast<size_t>(SS), 0.0f);
      } else {
        GdnParams p = pieces[j];
        std::vector<float> X = ctx.s_start[j];
        gdn_state_apply(p, ws[j].data(), X.data(), p.Dv, true);  // o += the start state's part; X = s_start T
        for (int64_t e = 0; e < SS; ++e) s_end[j][e] += X[e];
      }
      if (q + 1 == Q && pieces[j].s_out) std::copy(s_end[j].begin(), s_end[j].end(), pieces[j].s_out);
    }
  }

  void backward(Comm& comm, const GdnChain& chain, const std::vector<GdnParams>& pieces, GdnCpContext& ctx,
                CpStats* st) override {
    const int r = comm.rank(), Q = chain.size();
    const std::vector<int> fwd_pos = chain.positions_of(r);
    const size_t J = fwd_pos.size();
    if (J == 0) return;
    const int64_t SS = gdn_state_floats(pieces[0]);
    // The reversed chain: position Q-1-q; this rank's pieces in ascending reversed position.
    std::vector<int> mine(J);
    std::vector<size_t> piece_of(J);
    for (size_t j = 0; j < J; ++j) mine[j] = Q - 1 - fwd_pos[J - 1 - j], piece_of[j] = J - 1 - j;
    std::vector<Affine> maps(J);
    for (size_t j = 0; j < J; ++j) {
      const size_t k = piece_of[j];
      GdnParams p = pieces[k];
      p.s0 = ctx.s_start[k].data();
      p.ds_out = mine[j] == 0 ? pieces[k].ds_out : nullptr;
      maps[j].B.assign(static_cast<size_t>(SS), 0.0f);
      p.ds0 = maps[j].B.data();
      gdn_bwd(p);  // the gradients of the piece's own outputs (and, at the chain's end, of s_out)
      const std::vector<float>& T = ctx.T[k];
      if (!T.empty()) {
        maps[j].T.assign(T.size(), 0.0f);
        for (int h = 0; h < p.H; ++h)
          for (int i = 0; i < p.Dk; ++i)
            for (int c = 0; c < p.Dk; ++c)
              maps[j].T[(int64_t(h) * p.Dk + c) * p.Dk + i] = T[(int64_t(h) * p.Dk + i) * p.Dk + c];
      }
    }
    std::vector<std::vector<float>> ds_start(J);
    for (size_t j = 0; j < J; ++j) ds_start[j] = maps[j].B;
    const std::vector<std::vector<float>> ds_end = exclusive_scan(
        comm, Q, mine, [&](int q) { return chain.owner[size_t(Q - 1 - q)]; }, std::move(maps), pieces[0], kTagBwd, st);
    for (size_t j = 0; j < J; ++j) {
      const size_t k = piece_of[j];
      const GdnParams& p0 = pieces[k];
      if (mine[j] > 0) {
        // What the end state's gradient adds: a backward with zero output gradient.
        const int64_t nk = p0.T * p0.H * p0.Dk, nv = p0.T * p0.H * p0.Dv, ng = p0.T * p0.H;
        std::vector<float> dq(nk), dk(nk), dv(nv), dg(ng), db(ng), ds0(static_cast<size_t>(SS));
        GdnParams c = p0;
        c.s0 = ctx.s_start[k].data();
        c.d_o = nullptr;
        c.ds_out = ds_end[j].data();
        c.dq = dq.data(), c.dk = dk.data(), c.dv = dv.data(), c.dg = dg.data(), c.dbeta = db.data(), c.ds0 = ds0.data();
        gdn_bwd(c);
        for (int64_t e = 0; e < nk; ++e) p0.dq[e] += dq[e], p0.dk[e] += dk[e];
        for (int64_t e = 0; e < nv; ++e) p0.dv[e] += dv[e];
        for (int64_t e = 0; e < ng; ++e) p0.dg[e] += dg[e], p0.dbeta[e] += db[e];
        for (int64_t e = 0; e < SS; ++e) ds_start[j][e] += ds0[e];
      }
      if (fwd_pos[k] == 0 && p0.ds0) std::copy(ds_start[j].begin(), ds_start[j].end(), p0.ds0);
    }
  }
};

}  // namespace

std::unique_ptr<GdnCp> make_gdn_scan() { return std::make_unique<GdnScan>(); }

}  // namespace ctxpar
