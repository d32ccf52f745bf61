// lse_merge: merging attention over disjoint key sets equals one softmax over their union; exact
// on -inf rows; the error does not grow with the number of merged parts (a ring of P ranks
// merges P partial results).
#include <gtest/gtest.h>

#include <cmath>

#include "attn_problem.hpp"
#include "ops.hpp"
#include "ref/attn_ref.hpp"
#include "tolerance.hpp"

namespace ctxpar::test {
namespace {

// Problem restricted to keys [j0, j1) (a ring step's key block).
AttnParams key_slice(const Problem& pr, int64_t j0, int64_t j1) {
  AttnParams p = pr.params();
  const int64_t kv = pr.shape.H_kv * pr.shape.D;
  p.k = pr.k.data() + j0 * kv;
  p.v = pr.v.data() + j0 * kv;
  p.k_pos = pr.k_pos.data() + j0;
  if (p.k_doc) p.k_doc = pr.k_doc.data() + j0;
  p.S_k = j1 - j0;
  return p;
}

// Merges the fast forward of `parts` consecutive key slices; the naive fp32 twin does the same
// with ref::attn_fwd<float> and ref::lse_merge<float>. Returns {fast err, naive err, tolerance}
// of O against one fp64 softmax over all keys.
struct MergeErr {
  double fast_o, naive_o, tol_o, fast_lse, naive_lse, tol_lse;
};

MergeErr merged_error(const Problem& pr, int parts, std::vector<float>* lse_out = nullptr) {
  const int64_t nq = pr.shape.S_q * pr.shape.H_q;
  std::vector<float> o(pr.q.size()), lse(nq), on(pr.q.size()), lsen(nq);
  std::vector<float> ob(pr.q.size()), lseb(nq), obn(pr.q.size()), lsebn(nq);
  for (int part = 0; part < parts; ++part) {
    const int64_t j0 = pr.shape.S_k * part / parts, j1 = pr.shape.S_k * (part + 1) / parts;
    AttnParams p = key_slice(pr, j0, j1);
    p.o = part == 0 ? o.data() : ob.data();
    p.lse = part == 0 ? lse.data() : lseb.data();
    attn_fwd(p);
    ref::attn_fwd<float>(p, pr.q.data(), p.k_as<float>(), p.v_as<float>(), part == 0 ? on.data() : obn.data(),
                         part == 0 ? lsen.data() : lsebn.data());
    if (part > 0) {
      lse_merge(o.data(), lse.data(), ob.data(), lseb.data(), pr.shape.S_q, pr.shape.H_q, pr.shape.D);
      ref::lse_merge<float>(on.data(), lsen.data(), obn.data(), lsebn.data(), pr.shape.S_q,
                            pr.shape.H_q, pr.shape.D);
    }
  }
  const AttnParams p = pr.params();
  const auto q = convert<double>(pr.q), k = convert<double>(pr.k), v = convert<double>(pr.v);
  std::vector<double> o64(pr.q.size()), lse64(nq);
  ref::attn_fwd<double>(p, q.data(), k.data(), v.data(), o64.data(), lse64.data());
  if (lse_out) *lse_out = lse;
  MergeErr e;
  e.fast_o = max_abs_err(o, o64);
  e.naive_o = max_abs_err(on, o64);
  e.tol_o = tolerance(e.naive_o, o64);
  e.fast_lse = max_abs_err(lse, lse64);
  e.naive_lse = max_abs_err(lsen, lse64);
  e.tol_lse = tolerance(e.naive_lse, lse64);
  return e;
}

TEST(LseMerge, TwoPartsEqualOneSoftmaxOverTheUnion) {
  using M = MaskKind;
  using L = Layout;
  for (const Shape& s : {Shape{128, 256, 4, 2, 64, M::causal, L::diagonal, 0, true},
                         Shape{97, 200, 2, 1, 128, M::causal, L::straddle},
                         Shape{100, 100, 4, 4, 40, M::none, L::diagonal, 0, true},
                         Shape{90, 180, 2, 2, 64, M::window, L::straddle, 40}}) {
    SCOPED_TRACE(shape_name(s));
    const MergeErr e = merged_error(Problem(s, 8), 2);
    ASSERT_TRUE(std::isfinite(e.naive_o));
    EXPECT_LE(e.fast_o, e.tol_o) << "naive " << e.naive_o;
    EXPECT_LE(e.fast_lse, e.tol_lse) << "naive " << e.naive_lse;
  }
}

// P = 8 parts (a ring of 8): still within the policy, and not worse than a fixed multiple of
// the 2-part error (the merge accumulates no error beyond one rounding per step).
TEST(LseMerge, ErrorDoesNotGrowWithParts) {
  const Problem pr({128, 512, 4, 2, 64, MaskKind::causal, Layout::straddle, 0, true}, 12);
  const MergeErr e2 = merged_error(pr, 2), e8 = merged_error(pr, 8);
  EXPECT_LE(e8.fast_o, e8.tol_o);
  EXPECT_LE(e8.fast_lse, e8.tol_lse);
  EXPECT_LE(e8.fast_o, 4 * e2.fast_o + 1e-6);
}

TEST(LseMerge, MinusInfinityRowsAreExact) {
  const int64_t rows = 3;
  const int32_t H = 2, D = 5;
  const float ninf = -INFINITY;
  // row 0: a = -inf, b finite -> b copied; row 1: b = -inf -> a kept; row 2: both -inf.
  std::vector<float> lse = {ninf, ninf, 1.5f, -2.f, ninf, ninf};
  std::vector<float> lse_b = {0.25f, 3.f, ninf, ninf, ninf, ninf};
  std::vector<float> o(rows * H * D), o_b(rows * H * D);
  for (size_t x = 0; x < o.size(); ++x) {
    o[x] = lse[x / D] == ninf ? 0.f : 0.1f * float(x);
    o_b[x] = -0.3f * float(x) + 1.f;
  }
  const auto o0 = o;
  lse_merge(o.data(), lse.data(), o_b.data(), lse_b.data(), rows, H, D);
  for (int64_t r = 0; r < rows * H; ++r) {
    for (int32_t d = 0; d < D; ++d) {
      const float expect = r < 2 ? o_b[r * D + d] : o0[r * D + d];
      ASSERT_EQ(o[r * D + d], expect) << "row/head " << r;
      ASSERT_FALSE(std::isnan(o[r * D + d]));
    }
  }
  EXPECT_EQ(lse[0], 0.25f);
  EXPECT_EQ(lse[1], 3.f);
  EXPECT_EQ(lse[2], 1.5f);
  EXPECT_EQ(lse[3], -2.f);
  EXPECT_EQ(lse[4], ninf);
  EXPECT_EQ(lse[5], ninf);
}

// Large LSEs (long sequences, big logits) do not overflow: only differences are exponentiated.
TEST(LseMerge, LargeLseNoOverflow) {
  std::vector<float> lse = {200.f}, lse_b = {200.f + std::log(3.f)};
  std::vector<float> o = {1.f}, o_b = {5.f};
  lse_merge(o.data(), lse.data(), o_b.data(), lse_b.data(), 1, 1, 1);
  EXPECT_NEAR(o[0], 0.25f * 1.f + 0.75f * 5.f, 1e-5f);
  EXPECT_NEAR(lse[0], 200.f + std::log(4.f), 1e-4f);
}

}  // namespace
}  // namespace ctxpar::test
