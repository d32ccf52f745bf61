// GDN under CP, scan schedule (gdn_cp.hpp). Rank r's piece maps its start state x to its end
// state x T_r + B_r (per head; B_r the end state from a zero start, T_r the piece's transition).
// The start state of rank r is the composition of the maps of ranks 0..r-1 applied to the
// sequence's initial state: an exclusive scan over the ranks in ceil(log2 P) rounds (Hillis-
// Steele; in round d a rank hands its running composition to the rank d places on). A composition
// that includes the chain's head is a constant (its B alone travels), so T_r is formed only on
// ranks 1..P-2. The backward runs the same scan in reverse rank order on the transposed maps
// dx -> dx T_r^T + D_r (D_r the start-state gradient of the piece's own outputs), then adds what
// the end state's gradient contributes (a second backward with zero output gradient).
#include <algorithm>
#include <span>

#include "cp/gdn_cp.hpp"

namespace ctxpar {
namespace {

constexpr int kTagFwd = 711, kTagBwd = 712;  // + round

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

// Exclusive scan along the chain: position q (0 = head), rank_of(position) the rank there. `mine`
// is this position's map (T present for 1 <= q <= P-2). Returns the composition of positions
// 0..q-1 (a constant: the state entering position q); q = 0 gets an empty vector.
template <class RankOf>
std::vector<float> exclusive_scan(Comm& comm, int q, RankOf rank_of, Affine incl, const GdnParams& p, int tag,
                                  CpStats* st) {
  const int P = comm.size();
  const int64_t SB = int64_t(p.H) * p.Dv * p.Dk, ST = int64_t(p.H) * p.Dk * p.Dk;
  incl.constant = q == 0;
  Affine excl;
  for (int d = 1, round = 0; d < P; d <<= 1, ++round) {
    const bool sends = q + d < P, recvs = q - d >= 0;
    // incl covers positions [q - d + 1, q]: a constant once it reaches the head.
    std::vector<float> out, in;
    if (sends) {
      out = incl.B;
      if (!incl.constant) out.insert(out.end(), incl.T.begin(), incl.T.end());
    }
    const bool in_constant = recvs && q - d < d;  // the sender's composition reaches the head
    if (recvs) in.resize(size_t(SB + (in_constant ? 0 : ST)));
    Request rq = comm.send_recv_async(std::span<const float>(out), sends ? rank_of(q + d) : Comm::kNone,
                                      std::span<float>(in), recvs ? rank_of(q - d) : Comm::kNone, tag + round);
    const double t = comm.now();
    comm.wait(rq);
    if (st) {
      st->exposed_comm_s += comm.now() - t;
      if (sends) st->bytes_sent += double(out.size()) * sizeof(float), st->messages += 1;
    }
    if (!recvs) continue;
    Affine x;
    x.constant = in_constant;
    x.B.assign(in.begin(), in.begin() + SB);
    if (!in_constant) x.T.assign(in.begin() + SB, in.end());
    compose_into(x, excl, p);
    if (q + 2 * d < P) compose_into(x, incl, p);  // sent again in a later round
  }
  return excl.B;
}

void identity_maps(std::vector<float>& T, const GdnParams& p) {
  T.assign(size_t(p.H) * p.Dk * p.Dk, 0.0f);
  for (int h = 0; h < p.H; ++h)
    for (int i = 0; i < p.Dk; ++i) T[(int64_t(h) * p.Dk + i) * p.Dk + i] = 1.0f;
}

class GdnScan final : public GdnCp {
 public:
  std::string name() const override { return "scan"; }

  void forward(Comm& comm, const GdnParams& p0, GdnCpContext& ctx, CpStats* st) override {
    const int r = comm.rank(), P = comm.size();
    const int64_t SS = gdn_state_floats(p0);
    GdnParams p = p0;
    p.s0 = r == 0 ? p0.s0 : nullptr;
    Affine mine;
    mine.B.assign(size_t(SS), 0.0f);
    p.s_out = mine.B.data();
    std::vector<float> ws(size_t(gdn_workspace_floats(p)));
    gdn_fwd_prepare(p, ws.data());
    gdn_fwd_finish(p, ws.data());  // o and the end state from this rank's own start (zero for r > 0)
    if (r >= 1 && r + 1 < P) {
      identity_maps(mine.T, p);
      gdn_state_apply(p, ws.data(), mine.T.data(), p.Dk, false);
    }
    ctx.T = mine.T;
    std::vector<float> s_end = mine.B;
    if (r == 0) {
      ctx.s_start = p0.s0 ? std::vector<float>(p0.s0, p0.s0 + SS) : std::vector<float>(size_t(SS), 0.0f);
      exclusive_scan(comm, 0, [](int q) { return q; }, std::move(mine), p, kTagFwd, st);
    } else {
      ctx.s_start = exclusive_scan(comm, r, [](int q) { return q; }, std::move(mine), p, kTagFwd, st);
      std::vector<float> X = ctx.s_start;
      gdn_state_apply(p, ws.data(), X.data(), p.Dv, true);  // o += the start state's part; X = s_start T
      for (int64_t e = 0; e < SS; ++e) s_end[e] += X[e];
    }
    if (r + 1 == P && p0.s_out) std::copy(s_end.begin(), s_end.end(), p0.s_out);
  }

  void backward(Comm& comm, const GdnParams& p0, GdnCpContext& ctx, CpStats* st) override {
    const int r = comm.rank(), P = comm.size();
    const int q = P - 1 - r;  // position along the reversed chain
    const int64_t SS = gdn_state_floats(p0);
    GdnParams p = p0;
    p.s0 = ctx.s_start.data();
    p.ds_out = r + 1 == P ? p0.ds_out : nullptr;
    Affine mine;
    mine.B.assign(size_t(SS), 0.0f);
    p.ds0 = mine.B.data();
    gdn_bwd(p);  // the gradients of this rank's own outputs (and, on the last rank, of s_out)
    if (!ctx.T.empty()) {
      mine.T.assign(ctx.T.size(), 0.0f);
      for (int h = 0; h < p.H; ++h)
        for (int i = 0; i < p.Dk; ++i)
          for (int j = 0; j < p.Dk; ++j)
            mine.T[(int64_t(h) * p.Dk + j) * p.Dk + i] = ctx.T[(int64_t(h) * p.Dk + i) * p.Dk + j];
    }
    std::vector<float> ds_start = mine.B;
    auto rank_of = [P](int pos) { return P - 1 - pos; };
    if (q == 0) {
      exclusive_scan(comm, 0, rank_of, std::move(mine), p, kTagBwd, st);
    } else {
      const std::vector<float> ds_end = exclusive_scan(comm, q, rank_of, std::move(mine), p, kTagBwd, st);
      // What the end state's gradient adds: a backward with zero output gradient.
      const int64_t nk = p.T * p.H * p.Dk, nv = p.T * p.H * p.Dv, ng = p.T * p.H;
      std::vector<float> dq(nk), dk(nk), dv(nv), dg(ng), db(ng), ds0(SS);
      GdnParams c = p;
      c.d_o = nullptr;
      c.ds_out = ds_end.data();
      c.dq = dq.data(), c.dk = dk.data(), c.dv = dv.data(), c.dg = dg.data(), c.dbeta = db.data(), c.ds0 = ds0.data();
      gdn_bwd(c);
      for (int64_t e = 0; e < nk; ++e) p0.dq[e] += dq[e], p0.dk[e] += dk[e];
      for (int64_t e = 0; e < nv; ++e) p0.dv[e] += dv[e];
      for (int64_t e = 0; e < ng; ++e) p0.dg[e] += dg[e], p0.dbeta[e] += db[e];
      for (int64_t e = 0; e < SS; ++e) ds_start[e] += ds0[e];
    }
    if (r == 0 && p0.ds0) std::copy(ds_start.begin(), ds_start.end(), p0.ds0);
  }
};

}  // namespace

std::unique_ptr<GdnCp> make_gdn_scan() { return std::make_unique<GdnScan>(); }

}  // namespace ctxpar
