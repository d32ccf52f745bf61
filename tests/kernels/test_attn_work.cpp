// Work is proportional to visible pairs: visible_pairs() is exact, the kernels skip empty tiles
// (counted through AttnStats), and skipping never changes a result.
#include <gtest/gtest.h>

#include <chrono>

#include "attn_problem.hpp"
#include "ops.hpp"

namespace ctxpar::test {
namespace {

int64_t brute_force_pairs(const AttnParams& p) {
  int64_t n = 0;
  for (int64_t i = 0; i < p.S_q; ++i)
    for (int64_t j = 0; j < p.S_k; ++j) n += p.visible(i, j) ? 1 : 0;
  return n;
}

TEST(VisiblePairs, CausalIsExactlyTheTriangle) {
  for (int64_t S : {1, 2, 63, 64, 65, 1000, 4096}) {
    const Problem pr({S, S, 1, 1, 8, MaskKind::causal, Layout::diagonal}, 1);
    EXPECT_EQ(visible_pairs(pr.params()), S * (S + 1) / 2) << "S=" << S;
  }
}

TEST(VisiblePairs, MatchesBruteForceOnMasksAndDocuments) {
  using M = MaskKind;
  using L = Layout;
  for (const Shape& s : {Shape{300, 500, 1, 1, 8, M::causal, L::straddle, 0, true},
                         Shape{257, 513, 1, 1, 8, M::window, L::zigzag, 77, true},
                         Shape{200, 200, 1, 1, 8, M::none, L::diagonal, 0, true},
                         Shape{130, 70, 1, 1, 8, M::causal, L::future},
                         Shape{130, 70, 1, 1, 8, M::window, L::past, 100}}) {
    for (uint64_t seed : {1, 2, 3}) {
      const Problem pr(s, seed);
      EXPECT_EQ(visible_pairs(pr.params()), brute_force_pairs(pr.params())) << shape_name(s);
    }
  }
}

AttnStats fwd_stats(const Problem& pr) {
  std::vector<float> o(pr.q.size()), lse(pr.shape.S_q * pr.shape.H_q);
  AttnParams p = pr.params();
  p.o = o.data();
  p.lse = lse.data();
  AttnStats st;
  p.stats = &st;
  attn_fwd(p);
  return st;
}

TEST(TileSkipping, CausalComputesAboutHalf) {
  const int64_t S = 2048;
  const Problem causal({S, S, 1, 1, 64, MaskKind::causal, Layout::diagonal}, 1);
  const Problem full({S, S, 1, 1, 64, MaskKind::none, Layout::diagonal}, 1);
  const AttnStats c = fwd_stats(causal), f = fwd_stats(full);
  EXPECT_EQ(f.pairs_computed, S * S);
  EXPECT_EQ(f.tiles_skipped, 0);
  EXPECT_GE(c.pairs_computed, visible_pairs(causal.params()));
  // Only tiles on the diagonal are computed beyond the triangle: about S * (Bq + Bk) / 2 pairs.
  const double ratio = double(c.pairs_computed) / double(f.pairs_computed);
  EXPECT_GT(ratio, 0.5);
  // diagonal tiles add about (Bq + Bk) / (2 S) of the square; measured 0.546 at S = 2048,
  // Bq = 96, Bk = 128
  EXPECT_LT(ratio, 0.58);
  EXPECT_GT(c.tiles_skipped, 0);
}

TEST(TileSkipping, WindowAndDocumentsSkipMost) {
  const int64_t S = 4096;
  const Problem win({S, S, 1, 1, 64, MaskKind::window, Layout::diagonal, 128}, 1);
  const AttnStats w = fwd_stats(win);
  EXPECT_GE(w.pairs_computed, visible_pairs(win.params()));
  EXPECT_LT(w.pairs_computed, S * 400);  // a band of a few tiles, not the triangle (S*S/2)
  const Problem backward_past({64, 4096, 1, 1, 64, MaskKind::causal, Layout::future}, 1);
  const AttnStats fut = fwd_stats(backward_past);
  EXPECT_EQ(fut.pairs_computed, 0);
  EXPECT_EQ(fut.tiles_skipped, fut.tiles_total);
}

TEST(TileSkipping, BackwardSkipsLikeForward) {
  const int64_t S = 1024;
  const Problem pr({S, S, 2, 1, 64, MaskKind::causal, Layout::diagonal}, 1);
  std::vector<float> o(pr.q.size()), lse(S * 2), dq(pr.q.size()), dk(pr.k.size()), dv(pr.v.size());
  AttnParams p = pr.params();
  p.o = o.data();
  p.lse = lse.data();
  p.dq = dq.data();
  p.dk = dk.data();
  p.dv = dv.data();
  attn_fwd(p);
  AttnStats st;
  p.stats = &st;
  attn_bwd(p);
  EXPECT_GE(st.pairs_computed, visible_pairs(p) * 1);
  // triangle plus the diagonal tiles: ~ (1/2 + (Bq + Bk) / 2S) of the full square at S = 1024
  EXPECT_LT(double(st.pairs_computed), 0.6 * double(2 * S * S));
}

// Appending keys that no query can see (future positions, or another document) adds only
// skipped or fully masked tiles: O and LSE are bit-identical, and the extra keys get exactly
// zero gradient while the others' gradients are bit-identical too (single thread, so the dQ
// addition order is fixed).
TEST(TileSkipping, InvisibleKeysChangeNothing) {
  for (bool docs : {false, true}) {
    const Shape s{150, 170, 4, 2, 64, MaskKind::causal, Layout::diagonal, 0, docs};
    const Problem base(s, 4);
    Shape s2 = s;
    s2.S_k = s.S_k + 200;
    Problem ext(s2, 4);
    // ext keeps base's queries and first S_k keys; extra keys are in the future / another doc
    ext.q = base.q;
    ext.dout = base.dout;
    ext.q_pos = base.q_pos;
    ext.q_doc = base.q_doc;
    const int64_t kv = s.H_kv * s.D;
    for (int64_t j = 0; j < s2.S_k; ++j) {
      if (j < s.S_k) {
        std::copy(base.k.begin() + j * kv, base.k.begin() + (j + 1) * kv, ext.k.begin() + j * kv);
        std::copy(base.v.begin() + j * kv, base.v.begin() + (j + 1) * kv, ext.v.begin() + j * kv);
        ext.k_pos[j] = base.k_pos[j];
        if (docs) ext.k_doc[j] = base.k_doc[j];
      } else if (docs) {
        ext.k_pos[j] = base.k_pos[0];  // visible by position, but in a document of its own
        ext.k_doc[j] = 1 << 30;
      } else {
        ext.k_pos[j] = 1 << 30;        // after every query
      }
    }
    auto run = [](const Problem& pr, std::vector<float>& o, std::vector<float>& lse,
                  std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv) {
      o.assign(pr.q.size(), 0.f);
      lse.assign(pr.shape.S_q * pr.shape.H_q, 0.f);
      dq.assign(pr.q.size(), 0.f);
      dk.assign(pr.k.size(), 0.f);
      dv.assign(pr.v.size(), 0.f);
      AttnParams p = pr.params();
      p.o = o.data();
      p.lse = lse.data();
      p.dq = dq.data();
      p.dk = dk.data();
      p.dv = dv.data();
      p.threads = 1;
      attn_fwd(p);
      attn_bwd(p);
    };
    std::vector<float> o1, l1, dq1, dk1, dv1, o2, l2, dq2, dk2, dv2;
    run(base, o1, l1, dq1, dk1, dv1);
    run(ext, o2, l2, dq2, dk2, dv2);
    EXPECT_EQ(o1, o2) << "docs=" << docs;
    EXPECT_EQ(l1, l2);
    EXPECT_EQ(dq1, dq2);
    for (int64_t x = 0; x < s2.S_k * kv; ++x) {
      if (x < s.S_k * kv) {
        ASSERT_EQ(dk1[x], dk2[x]) << x;
        ASSERT_EQ(dv1[x], dv2[x]) << x;
      } else {
        ASSERT_EQ(dk2[x], 0.f) << x;
        ASSERT_EQ(dv2[x], 0.f) << x;
      }
    }
  }
}

}  // namespace

// The kernel's own time breakdown (AttnProfile, bench attn's "where the time goes"): the parts
// are non-negative, add up to no more than the total, the total is about threads x wall time,
// the tile GEMMs take a real share, the backward's dQ ordering is timed, and a profiled call
// gives the same bits as an unprofiled one.
TEST(AttnProfile, PartsAddUpAndChangeNoResult) {
  const int64_t S = 1024;
  for (bool docs : {false, true}) {
    const Problem pr({S, S, 4, 2, 64, MaskKind::causal, Layout::diagonal, 0, docs}, 5);
    struct Out {
      std::vector<float> o, lse, dq, dk, dv;
    };
    auto run = [&](AttnProfile* fwd_prof, AttnProfile* bwd_prof, double* wall) {
      Out r{std::vector<float>(pr.q.size()), std::vector<float>(S * 4), std::vector<float>(pr.q.size()),
            std::vector<float>(pr.k.size()), std::vector<float>(pr.v.size())};
      AttnParams p = pr.params();
      p.o = r.o.data();
      p.lse = r.lse.data();
      p.dq = r.dq.data();
      p.dk = r.dk.data();
      p.dv = r.dv.data();
      p.threads = 2;
      p.profile = fwd_prof;
      const auto t0 = std::chrono::steady_clock::now();
      attn_fwd(p);
      const auto t1 = std::chrono::steady_clock::now();
      p.profile = bwd_prof;
      attn_bwd(p);
      const auto t2 = std::chrono::steady_clock::now();
      if (wall) {
        wall[0] = std::chrono::duration<double>(t1 - t0).count();
        wall[1] = std::chrono::duration<double>(t2 - t1).count();
      }
      return r;
    };
    AttnProfile f, b;
    f.gemm = b.gemm = 123.0;  // overwritten by the call
    double wall[2];
    const Out plain = run(nullptr, nullptr, nullptr), prof = run(&f, &b, wall);
    EXPECT_EQ(plain.o, prof.o);
    EXPECT_EQ(plain.lse, prof.lse);
    EXPECT_EQ(plain.dq, prof.dq);
    EXPECT_EQ(plain.dk, prof.dk);
    EXPECT_EQ(plain.dv, prof.dv);
    int pass = 0;
    for (const AttnProfile* x : {&f, &b}) {
      SCOPED_TRACE(pass == 0 ? "forward" : "backward");
      for (double part : {x->pack, x->gemm, x->softmax, x->mask, x->transpose, x->dq_order, x->idle})
        EXPECT_GE(part, 0.0);
      EXPECT_GE(x->rest(), 0.0);
      EXPECT_GT(x->total, 0.0);
      EXPECT_LE(x->total, 2.0 * wall[pass] * 1.001 + 1e-4);  // two threads inside the call
      // The tile GEMMs are measured (their share, 60-85 % on an idle machine, is bench attn's to
      // report: a share asserted here failed whenever other tests loaded the cores).
      EXPECT_GT(x->gemm, 0.0);
      EXPECT_GT(x->softmax, 0.0);
      EXPECT_GT(x->pack, 0.0);
      if (docs) {
        EXPECT_GT(x->mask, 0.0);  // packed documents leave partial tiles
      }
      ++pass;
    }
    EXPECT_EQ(f.transpose, 0.0);  // forward has none
    EXPECT_EQ(f.dq_order, 0.0);
    EXPECT_GT(b.transpose, 0.0);
    EXPECT_GT(b.dq_order, 0.0);
  }
}

}  // namespace ctxpar::test
