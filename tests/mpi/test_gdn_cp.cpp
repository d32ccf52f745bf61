// GDN under context parallelism (src/cp/gdn_cp.hpp): both schedules against the one-rank result,
// forward (o, the final state) and backward (every gradient, the initial state's), with pieces of
// unequal length and ranks with no token at all; the scan's bytes within its bound.
#include <gtest/gtest.h>

#include <cmath>
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

void run_case(const std::string& schedule, const Case& c) {
  Comm& comm = world();
  const int r = comm.rank(), P = comm.size();
  const GdnShape& s = c.s;
  SCOPED_TRACE(schedule + " " + c.what + " " + name(s) + " P" + std::to_string(P));
  const GdnProblem pr(s, 23);  // same seed on every rank: the same whole sequence
  const auto ref = run_ref<double>(pr);
  const auto whole = run_fast(pr);
  const auto [t0, t1] = piece(s.T, r, P);
  const int64_t n = t1 - t0, SS = int64_t(s.H) * s.Dv * s.Dk;
  std::vector<float> o(n * s.H * s.Dv), s_out(SS, -7.0f), dq(n * s.H * s.Dk), dk(dq.size()), dv(o.size()),
      dg(n * s.H), db(n * s.H), ds0(SS, -7.0f);
  GdnParams p = pr.params();
  p.T = n;
  p.q += t0 * s.H * s.Dk, p.k += t0 * s.H * s.Dk, p.v += t0 * s.H * s.Dv, p.g += t0 * s.H, p.beta += t0 * s.H;
  p.o = o.data(), p.s_out = s_out.data();
  p.d_o = pr.d_o.data() + t0 * s.H * s.Dv, p.ds_out = pr.ds_out.data();
  p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data(), p.dg = dg.data(), p.dbeta = db.data(), p.ds0 = ds0.data();
  auto cp = make_gdn_cp(schedule);
  ASSERT_TRUE(cp);
  GdnCpContext ctx;
  CpStats st;
  cp->forward(comm, p, ctx, &st);
  cp->backward(comm, p, ctx, &st);
  // Each local slice within 4x the one-rank chunked kernel's error against fp64 (+ a floor).
  auto close = [&](const std::vector<float>& got, int64_t off, const std::vector<float>& one,
                   const std::vector<double>& r64, const char* nm) {
    const std::vector<double> rs(r64.begin() + off, r64.begin() + off + int64_t(got.size()));
    const double e = max_abs_err(got, rs), e1 = max_abs_err(one, r64);
    EXPECT_LE(e, 4 * e1 + 1e-5) << nm << " (one rank's error " << e1 << ")";
  };
  close(o, t0 * s.H * s.Dv, whole.o, ref.o, "o");
  close(dq, t0 * s.H * s.Dk, whole.dq, ref.dq, "dq");
  close(dk, t0 * s.H * s.Dk, whole.dk, ref.dk, "dk");
  close(dv, t0 * s.H * s.Dv, whole.dv, ref.dv, "dv");
  close(dg, t0 * s.H, whole.dg, ref.dg, "dg");
  close(db, t0 * s.H, whole.dbeta, ref.dbeta, "dbeta");
  if (r + 1 == P) {
    close(s_out, 0, whole.s_out, ref.s_out, "s_out");
  } else {
    EXPECT_EQ(s_out[0], -7.0f) << "s_out written on a rank that is not the last";
  }
  if (r == 0) {
    close(ds0, 0, whole.ds0, ref.ds0, "ds0");
  } else {
    EXPECT_EQ(ds0[0], -7.0f) << "ds0 written on a rank other than 0";
  }
  if (schedule == "scan" && P > 1) {
    const double rounds = std::ceil(std::log2(double(P)));
    EXPECT_LE(st.bytes_sent, 2 * rounds * s.H * s.Dk * (s.Dk + s.Dv) * 4.0) << "scan bytes per rank";
  }
  if (schedule == "ring") {
    EXPECT_EQ(st.bytes_sent, ((r + 1 < P) + (r > 0)) * SS * 4.0);
  }
  EXPECT_TRUE(all_ok(!::testing::Test::HasFailure()));
}

const Case kCases[] = {
    {{96, 2, 16, 8, 16, true}, "even"},
    {{37, 3, 8, 12, 5, true}, "uneven pieces, chunk not dividing them"},
    {{3, 1, 4, 4, 2, true}, "fewer tokens than ranks"},
    {{160, 2, 32, 32, 32, false, -2.0f}, "fast decay, zero initial state"},
};

TEST(GdnCp, RingEqualsOneRank) {
  for (const Case& c : kCases) run_case("ring", c);
}

TEST(GdnCp, ScanEqualsOneRank) {
  for (const Case& c : kCases) run_case("scan", c);
}

TEST(GdnCp, UnknownScheduleIsNull) {
  EXPECT_EQ(make_gdn_cp("zigzag"), nullptr);
  EXPECT_EQ(gdn_cp_names().size(), 2u);
}

}  // namespace
}  // namespace ctxpar::test
