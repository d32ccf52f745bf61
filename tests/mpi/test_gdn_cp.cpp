// GDN under context parallelism (src/cp/gdn_cp.hpp): both schedules on contiguous and zigzag
// chains against the one-rank result, forward (o, the final state) and backward (every gradient,
// the initial state's), with pieces of unequal length and pieces with no token at all; the bytes
// each schedule sends (the ring: one state per remote border; the scan: within its bound).
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "cp/gdn_cp.hpp"
#include "gdn_problem.hpp"
#include "mpi_test_env.hpp"

namespace ctxpar::test {
namespace {

// This rank's contiguous piece [t0, t1) of T tokens over P ranks (the first T % P ranks one more).
std::pair<int64_t, int64_t> piece(int64_t T, int r, int P) {
  const int64_t base = T / P, extra = T % P;
  const int64_t t0 = r * base + std::min<int64_t>(r, extra);
  return {t0, t0 + base + (r < extra ? 1 : 0)};
}

struct Case {
  GdnShape s;
  const char* what;
};

void run_case(const std::string& schedule, const GdnChain& chain, const char* chain_name, const Case& c) {
  Comm& comm = world();
  const int r = comm.rank(), P = comm.size(), Q = chain.size();
  const GdnShape& s = c.s;
  SCOPED_TRACE(schedule + " " + chain_name + " " + c.what + " " + name(s) + " P" + std::to_string(P));
  const GdnProblem pr(s, 23);  // same seed on every rank: the same whole sequence
  const auto ref = run_ref<double>(pr);
  const auto whole = run_fast(pr);
  const int64_t SS = int64_t(s.H) * s.Dv * s.Dk;
  // Full-size outputs; this rank fills the rows of its pieces.
  std::vector<float> o(pr.v.size()), s_out(SS, -7.0f), dq(pr.q.size()), dk(dq.size()), dv(o.size()), dg(pr.g.size()),
      db(dg.size()), ds0(SS, -7.0f);
  std::vector<GdnParams> pieces;
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (int q : chain.positions_of(r)) {
    const auto [t0, t1] = piece(s.T, q, Q);
    rows.emplace_back(t0, t1);
    GdnParams p = pr.params();
    p.T = t1 - t0;
    p.q += t0 * s.H * s.Dk, p.k += t0 * s.H * s.Dk, p.v += t0 * s.H * s.Dv, p.g += t0 * s.H, p.beta += t0 * s.H;
    if (p.doc) p.doc += t0, p.reset_at_0 = t0 > 0 && pr.doc[size_t(t0)] != pr.doc[size_t(t0 - 1)];
    p.s0 = q == 0 ? p.s0 : nullptr;
    p.o = o.data() + t0 * s.H * s.Dv, p.s_out = q + 1 == Q ? s_out.data() : nullptr;
    p.d_o = pr.d_o.data() + t0 * s.H * s.Dv, p.ds_out = q + 1 == Q ? pr.ds_out.data() : nullptr;
    p.dq = dq.data() + t0 * s.H * s.Dk, p.dk = dk.data() + t0 * s.H * s.Dk, p.dv = dv.data() + t0 * s.H * s.Dv;
    p.dg = dg.data() + t0 * s.H, p.dbeta = db.data() + t0 * s.H, p.ds0 = q == 0 ? ds0.data() : nullptr;
    pieces.push_back(p);
  }
  auto cp = make_gdn_cp(schedule);
  ASSERT_TRUE(cp);
  GdnCpContext ctx;
  CpStats st;
  cp->forward(comm, chain, pieces, ctx, &st);
  cp->backward(comm, chain, pieces, ctx, &st);
  // This rank's rows within 4x the one-rank chunked kernel's error against fp64 (+ a floor).
  auto close = [&](const std::vector<float>& got, int width, const std::vector<float>& one,
                   const std::vector<double>& r64, const char* nm) {
    std::vector<float> g;
    std::vector<double> rs;
    for (auto [t0, t1] : rows)
      for (int64_t e = t0 * width; e < t1 * width; ++e) g.push_back(got[e]), rs.push_back(r64[e]);
    const double e = max_abs_err(g, rs), e1 = max_abs_err(one, r64);
    EXPECT_LE(e, 4 * e1 + 1e-5) << nm << " (one rank's error " << e1 << ")";
  };
  close(o, s.H * s.Dv, whole.o, ref.o, "o");
  close(dq, s.H * s.Dk, whole.dq, ref.dq, "dq");
  close(dk, s.H * s.Dk, whole.dk, ref.dk, "dk");
  close(dv, s.H * s.Dv, whole.dv, ref.dv, "dv");
  close(dg, s.H, whole.dg, ref.dg, "dg");
  close(db, s.H, whole.dbeta, ref.dbeta, "dbeta");
  auto whole_state = [&](const std::vector<float>& x, const std::vector<float>& one, const std::vector<double>& r64,
                         bool mine, const char* nm) {
    if (mine) {
      EXPECT_LE(max_abs_err(x, r64), 4 * max_abs_err(one, r64) + 1e-5) << nm;
    } else {
      EXPECT_EQ(x[0], -7.0f) << nm << " written by a rank that does not hold that end of the chain";
    }
  };
  whole_state(s_out, whole.s_out, ref.s_out, chain.owner[size_t(Q - 1)] == r, "s_out");
  whole_state(ds0, whole.ds0, ref.ds0, chain.owner[0] == r, "ds0");
  if (schedule == "scan" && Q > 1) {
    // per piece and direction: at most ceil(log2 Q) messages of B and T
    const double rounds = std::ceil(std::log2(double(Q)));
    EXPECT_LE(st.bytes_sent, 2 * double(rows.size()) * rounds * s.H * s.Dk * (s.Dk + s.Dv) * 4.0)
        << "scan bytes per rank";
  }
  if (schedule == "ring") {
    int hops = 0;  // piece borders this rank sends across, forward and backward
    for (int q : chain.positions_of(r)) {
      hops += q + 1 < Q && chain.owner[size_t(q + 1)] != r;
      hops += q > 0 && chain.owner[size_t(q - 1)] != r;
    }
    EXPECT_EQ(st.bytes_sent, hops * SS * 4.0);
  }
  EXPECT_TRUE(all_ok(!::testing::Test::HasFailure()));
}

const Case kCases[] = {
    {{96, 2, 16, 8, 16, true}, "even"},
    {{37, 3, 8, 12, 5, true}, "uneven pieces, chunk not dividing them"},
    {{3, 1, 4, 4, 2, true}, "fewer tokens than ranks"},
    {{160, 2, 32, 32, 32, false, -2.0f}, "fast decay, zero initial state"},
    {{120, 2, 16, 8, 8, true, -0.4f, 6}, "packed documents"},
};

TEST(GdnCp, RingEqualsOneRank) {
  const int P = world().size();
  for (const Case& c : kCases) {
    run_case("ring", GdnChain::contiguous(P), "contiguous", c);
    run_case("ring", GdnChain::zigzag(P), "zigzag", c);
  }
}

TEST(GdnCp, ScanEqualsOneRank) {
  const int P = world().size();
  for (const Case& c : kCases) {
    run_case("scan", GdnChain::contiguous(P), "contiguous", c);
    run_case("scan", GdnChain::zigzag(P), "zigzag", c);
  }
}

TEST(GdnCp, UnknownScheduleIsNull) {
  EXPECT_EQ(make_gdn_cp("zigzag"), nullptr);
  EXPECT_EQ(gdn_cp_names().size(), 2u);
  EXPECT_THROW(GdnChain::zigzag(GdnChain::kMaxPieces), std::invalid_argument);
  EXPECT_EQ(GdnChain::zigzag(3).positions_of(1), (std::vector<int>{1, 4}));
}

}  // namespace
}  // namespace ctxpar::test
