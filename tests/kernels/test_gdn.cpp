// Gated DeltaNet: the fp64 recurrence's backward against finite differences of its forward; the
// chunked CPU kernel (kernels/cpu/gdn_cpu.cpp) against the fp64 recurrence, forward (o, final
// state) and backward (dq, dk, dv, dg, dbeta, ds0), with the tolerance policy of tests/README.md
// (at most 2x the naive fp32 recurrence's error); prepare + finish equal to gdn_fwd bitwise; the
// thread count changes no bit; invalid arguments refused.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "gdn_problem.hpp"
#include "tolerance.hpp"

namespace ctxpar::test {
namespace {

const std::vector<GdnShape>& shapes() {
  static const std::vector<GdnShape> v = {
      {1, 1, 4, 3, 64, false},    {7, 2, 8, 5, 3, true},        {37, 2, 16, 8, 8, false},
      {64, 3, 16, 24, 16, true},  {100, 2, 32, 32, 64, true},   {50, 1, 8, 8, 1, true},
      {130, 2, 64, 64, 32, false}, {96, 2, 16, 16, 32, true, -3.0f},
      {90, 2, 16, 8, 16, true, -0.4f, 5},  {40, 1, 8, 8, 64, true, -0.4f, 40},
  };
  return v;
}

TEST(GdnRef, BackwardMatchesFiniteDifferences) {
  for (const GdnShape& s : {GdnShape{5, 2, 3, 2, 0, true}, GdnShape{4, 1, 4, 3, 0, false, -2.0f},
                            GdnShape{6, 1, 3, 2, 0, true, -0.4f, 3}}) {
    SCOPED_TRACE(name(s));
    const GdnProblem pr(s, 7);
    auto q = convert<double>(pr.q), k = convert<double>(pr.k), v = convert<double>(pr.v), g = convert<double>(pr.g),
         b = convert<double>(pr.beta), s0 = convert<double>(pr.s0);
    const auto d_o = convert<double>(pr.d_o), ds = convert<double>(pr.ds_out);
    const double sc = 0.7;
    const int32_t* doc = pr.doc.empty() ? nullptr : pr.doc.data();
    auto loss = [&] {
      std::vector<double> o(v.size()), so(ds.size());
      ref::gdn_fwd<double>(s.T, s.H, s.Dk, s.Dv, sc, q.data(), k.data(), v.data(), g.data(), b.data(), doc,
                           s.with_s0 ? s0.data() : nullptr, o.data(), so.data());
      double L = 0;
      for (size_t x = 0; x < o.size(); ++x) L += o[x] * d_o[x];
      for (size_t x = 0; x < so.size(); ++x) L += so[x] * ds[x];
      return L;
    };
    std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), dg(g.size()), db(b.size()), ds0(ds.size());
    ref::gdn_bwd<double>(s.T, s.H, s.Dk, s.Dv, sc, q.data(), k.data(), v.data(), g.data(), b.data(), doc,
                         s.with_s0 ? s0.data() : nullptr, d_o.data(), ds.data(), dq.data(), dk.data(), dv.data(),
                         dg.data(), db.data(), ds0.data());
    const double h = 1e-5;
    auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* nm) {
      for (size_t e = 0; e < x.size(); ++e) {
        const double x0 = x[e];
        x[e] = x0 + h;
        const double lp = loss();
        x[e] = x0 - h;
        const double lm = loss();
        x[e] = x0;
        const double fd = (lp - lm) / (2 * h);
        ASSERT_NEAR(grad[e], fd, 1e-7 * (1 + std::abs(fd))) << nm << "[" << e << "]";
      }
    };
    check(q, dq, "dq");
    check(k, dk, "dk");
    check(v, dv, "dv");
    check(g, dg, "dg");
    check(b, db, "dbeta");
    if (s.with_s0) check(s0, ds0, "ds0");
  }
}

// The chunked kernel within 2x the naive fp32 recurrence's error, every output.
TEST(Gdn, ChunkedMatchesRecurrence) {
  for (const GdnShape& s : shapes()) {
    SCOPED_TRACE(name(s));
    const GdnProblem pr(s, 11);
    const auto ref = run_ref<double>(pr);
    const auto naive = run_ref<float>(pr);
    const auto fast = run_fast(pr);
    auto expect = [&](const std::vector<float>& f, const std::vector<float>& nv, const std::vector<double>& r,
                      const char* nm) {
      const double ef = max_abs_err(f, r), en = max_abs_err(nv, r);
      // The chunked form sums in another order than the recurrence; both errors are ~eps |x|.
      const double tol = tolerance(en, r, 8.0);
      EXPECT_LE(ef, tol) << nm << ": chunked " << ef << " vs naive fp32 " << en;
    };
    expect(fast.o, naive.o, ref.o, "o");
    expect(fast.s_out, naive.s_out, ref.s_out, "s_out");
    expect(fast.dq, naive.dq, ref.dq, "dq");
    expect(fast.dk, naive.dk, ref.dk, "dk");
    expect(fast.dv, naive.dv, ref.dv, "dv");
    expect(fast.dg, naive.dg, ref.dg, "dg");
    expect(fast.dbeta, naive.dbeta, ref.dbeta, "dbeta");
    if (s.with_s0) expect(fast.ds0, naive.ds0, ref.ds0, "ds0");
  }
}

// What a rank of a context-parallel schedule does: prepare while the state travels, finish with
// it. Identical bits to the one-call forward.
TEST(Gdn, PrepareThenFinishEqualsForwardBitwise) {
  for (const GdnShape& s : shapes()) {
    SCOPED_TRACE(name(s));
    const GdnProblem pr(s, 13);
    std::vector<float> o1(pr.v.size()), o2(pr.v.size()), s1(int64_t(s.H) * s.Dv * s.Dk), s2(s1.size());
    GdnParams p = pr.params();
    p.o = o1.data(), p.s_out = s1.data();
    gdn_fwd(p);
    p.o = o2.data(), p.s_out = s2.data();
    std::vector<float> ws(gdn_workspace_floats(p));
    gdn_fwd_prepare(p, ws.data());
    gdn_fwd_finish(p, ws.data());
    EXPECT_EQ(o1, o2);
    EXPECT_EQ(s1, s2);
  }
}

// The per-thread scratch a memory plan counts bounds every call's, whatever its documents, and is
// exact for whole chunks of one document; a chunk length beyond the call costs the call's rows,
// not the chunk's (gdn_chunk=4096 at 256 rows once held 6 x 4096^2 floats a thread).
TEST(Gdn, ThreadScratchIsBoundedWhateverTheDocuments) {
  std::vector<GdnShape> all = shapes();
  for (int docs : {2, 7, 31}) all.push_back({96, 2, 16, 8, 16, false, -0.4f, docs});
  for (const GdnShape& s : all) {
    SCOPED_TRACE(name(s));
    const GdnProblem pr(s, 5);
    for (bool bwd : {false, true}) {
      const int64_t exact = gdn_thread_scratch_floats(pr.params(), bwd);
      const int64_t bound = gdn_thread_scratch_bound(s.T, s.Dk, s.Dv, s.chunk, bwd);
      EXPECT_LE(exact, bound) << (bwd ? "backward" : "forward");
      if (s.docs == 1 && s.T % s.chunk == 0) EXPECT_EQ(exact, bound) << (bwd ? "backward" : "forward");
    }
  }
  for (bool bwd : {false, true}) {
    EXPECT_EQ(gdn_thread_scratch_bound(256, 16, 16, 4096, bwd), gdn_thread_scratch_bound(256, 16, 16, 256, bwd));
    EXPECT_LT(gdn_thread_scratch_bound(256, 16, 16, 4096, bwd), int64_t(1) << 21);  // under 8 MiB a thread
  }
}

// Heads computed in ranges (what the ring schedule pipelines) equal one call, bit for bit, and
// leave the other heads untouched.
TEST(Gdn, HeadRangesEqualOneCallBitwise) {
  const GdnShape s{70, 5, 16, 8, 16, true, -0.4f, 3};
  const GdnProblem pr(s, 29);
  const auto whole = run_fast(pr);
  RefOut<float> parts;
  const int64_t SS = int64_t(s.H) * s.Dv * s.Dk;
  parts.o.assign(pr.v.size(), -1), parts.s_out.assign(SS, -1), parts.dq.assign(pr.q.size(), -1);
  parts.dk.assign(pr.k.size(), -1), parts.dv.assign(pr.v.size(), -1), parts.dg.assign(pr.g.size(), -1);
  parts.dbeta.assign(pr.beta.size(), -1), parts.ds0.assign(SS, -1);
  for (auto [h0, h1] : {std::pair{0, 2}, std::pair{2, 3}, std::pair{3, 5}}) {
    GdnParams p = pr.params();
    p.head_begin = h0, p.head_end = h1;
    p.o = parts.o.data(), p.s_out = parts.s_out.data();
    gdn_fwd(p);
    p.d_o = pr.d_o.data(), p.ds_out = pr.ds_out.data();
    p.dq = parts.dq.data(), p.dk = parts.dk.data(), p.dv = parts.dv.data(), p.dg = parts.dg.data();
    p.dbeta = parts.dbeta.data(), p.ds0 = parts.ds0.data();
    gdn_bwd(p);
  }
  EXPECT_EQ(parts.o, whole.o);
  EXPECT_EQ(parts.s_out, whole.s_out);
  EXPECT_EQ(parts.dq, whole.dq);
  EXPECT_EQ(parts.dk, whole.dk);
  EXPECT_EQ(parts.dv, whole.dv);
  EXPECT_EQ(parts.dg, whole.dg);
  EXPECT_EQ(parts.dbeta, whole.dbeta);
  EXPECT_EQ(parts.ds0, whole.ds0);
  GdnParams bad = pr.params();
  std::vector<float> o(pr.v.size());
  bad.o = o.data();
  bad.head_begin = 3, bad.head_end = 2;
  EXPECT_THROW(gdn_fwd(bad), std::invalid_argument);
}

TEST(Gdn, ThreadCountChangesNoBit) {
  const GdnProblem pr({200, 3, 32, 16, 32, true}, 17);
  omp_set_num_threads(1);
  const auto a = run_fast(pr);
  omp_set_num_threads(2);
  const auto b = run_fast(pr);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dg, b.dg);
  EXPECT_EQ(a.ds0, b.ds0);
}

// Where the second document begins (a cut on a document boundary), or the middle.
int64_t first_doc_end(const GdnProblem& pr) {
  for (size_t t = 1; t < pr.doc.size(); ++t)
    if (pr.doc[t] != pr.doc[t - 1]) return int64_t(t);
  return pr.s.T / 2;
}

// Splitting the sequence anywhere and carrying the state (what context parallelism does) gives
// the one-piece result: forward (o) and backward (every gradient, ds flowing back). A cut at a
// multiple of the chunk gives it bit for bit, documents running across the cut included (chunks
// end at the call's multiples of the chunk: deterministic=true's pieces).
TEST(Gdn, StateCarriedAcrossASplitEqualsOnePiece) {
  for (const GdnShape& s : {GdnShape{90, 2, 16, 8, 16, true}, GdnShape{90, 2, 16, 8, 16, true, -0.4f, 4}}) {
  SCOPED_TRACE(name(s));
  const GdnProblem pr(s, 19);
  const auto whole = run_fast(pr);
  const auto ref = run_ref<double>(pr);
  for (int64_t cut : {int64_t(1), int64_t(16), int64_t(41), int64_t(48), int64_t(89), first_doc_end(pr)}) {
    SCOPED_TRACE("cut " + std::to_string(cut));
    const int64_t SS = int64_t(s.H) * s.Dv * s.Dk;
    std::vector<float> o(pr.v.size()), mid(SS), end(SS), dq(pr.q.size()), dk(pr.k.size()), dv(pr.v.size()),
        dg(pr.g.size()), db(pr.beta.size()), dmid(SS), ds0(SS);
    auto piece = [&](int64_t t0, int64_t t1, const float* s_in, float* s_out_, const float* ds_in, float* ds_out_) {
      GdnParams p = pr.params();
      p.T = t1 - t0;
      p.q += t0 * s.H * s.Dk, p.k += t0 * s.H * s.Dk, p.v += t0 * s.H * s.Dv, p.g += t0 * s.H, p.beta += t0 * s.H;
      if (p.doc) p.doc += t0, p.reset_at_0 = t0 > 0 && pr.doc[size_t(t0)] != pr.doc[size_t(t0 - 1)];
      p.s0 = s_in, p.s_out = s_out_, p.o = o.data() + t0 * s.H * s.Dv;
      gdn_fwd(p);
      p.d_o = pr.d_o.data() + t0 * s.H * s.Dv, p.ds_out = ds_in;
      p.dq = dq.data() + t0 * s.H * s.Dk, p.dk = dk.data() + t0 * s.H * s.Dk, p.dv = dv.data() + t0 * s.H * s.Dv;
      p.dg = dg.data() + t0 * s.H, p.dbeta = db.data() + t0 * s.H, p.ds0 = ds_out_;
      return p;
    };
    GdnParams a = piece(0, cut, pr.s0.data(), mid.data(), nullptr, nullptr);
    GdnParams b = piece(cut, s.T, mid.data(), end.data(), pr.ds_out.data(), dmid.data());
    gdn_bwd(b);
    a.ds_out = dmid.data(), a.ds0 = ds0.data();
    gdn_bwd(a);
    auto close = [&](const std::vector<float>& x, const std::vector<float>& w, const std::vector<double>& r,
                     const char* nm) {
      // both within the chunked tolerance of the fp64 result; the split differs from the one
      // piece only by where chunks start
      EXPECT_LE(max_abs_err(x, r), 4 * max_abs_err(w, r) + 1e-5) << nm;
    };
    close(o, whole.o, ref.o, "o");
    close(end, whole.s_out, ref.s_out, "s_out");
    close(dq, whole.dq, ref.dq, "dq");
    close(dk, whole.dk, ref.dk, "dk");
    close(dv, whole.dv, ref.dv, "dv");
    close(dg, whole.dg, ref.dg, "dg");
    close(db, whole.dbeta, ref.dbeta, "dbeta");
    close(ds0, whole.ds0, ref.ds0, "ds0");
    if (cut % s.chunk == 0) {
      EXPECT_EQ(o, whole.o);
      EXPECT_EQ(end, whole.s_out);
      EXPECT_EQ(dq, whole.dq);
      EXPECT_EQ(dk, whole.dk);
      EXPECT_EQ(dv, whole.dv);
      EXPECT_EQ(dg, whole.dg);
      EXPECT_EQ(db, whole.dbeta);
      EXPECT_EQ(ds0, whole.ds0);
    }
  }
  }
}

TEST(Gdn, InvalidArgumentsRefused) {
  const GdnProblem pr({8, 1, 4, 4, 4, false}, 3);
  std::vector<float> o(pr.v.size());
  GdnParams p = pr.params();
  p.o = o.data();
  GdnParams bad = p;
  bad.chunk = 0;
  EXPECT_THROW(gdn_fwd(bad), std::invalid_argument);
  bad = p;
  bad.Dk = 0;
  EXPECT_THROW(gdn_fwd(bad), std::invalid_argument);
  bad = p;
  bad.k = nullptr;
  EXPECT_THROW(gdn_fwd(bad), std::invalid_argument);
  bad = p;
  EXPECT_THROW(gdn_bwd(bad), std::invalid_argument);  // no d_o, no gradient outputs
  GdnParams empty = p;
  empty.T = 0;
  EXPECT_NO_THROW(gdn_fwd(empty));
}

}  // namespace
}  // namespace ctxpar::test
