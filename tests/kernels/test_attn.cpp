// Fast CPU attention (kernels/cpu) against the fp64 reference (kernels/ref) on random shapes:
// odd sizes, S_q != S_k, key blocks in the past / future / straddling the diagonal, zigzag
// query shards, packed documents, sliding windows, MHA / GQA / MQA, rows that see no key.
// Tolerance: tests/README.md (tolerance.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstring>
#include <random>

#include "attn_problem.hpp"
#include "cpu/tile_ops.hpp"
#include "ops.hpp"
#include "ref/attn_ref.hpp"
#include "tolerance.hpp"

namespace ctxpar::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct FwdResult {
  std::vector<float> o, lse;
};

FwdResult run_fast_fwd(const Problem& pr, int threads = 0) {
  FwdResult r{std::vector<float>(pr.q.size()), std::vector<float>(pr.shape.S_q * pr.shape.H_q)};
  AttnParams p = pr.params();
  p.o = r.o.data();
  p.lse = r.lse.data();
  p.threads = threads;
  attn_fwd(p);
  return r;
}

// Forward of the fp64 reference and of the naive fp32 reference.
struct RefFwd {
  std::vector<double> o64, lse64;
  std::vector<float> o32, lse32;
};

RefFwd run_ref_fwd(const Problem& pr) {
  RefFwd r;
  const AttnParams p = pr.params();
  const auto q = convert<double>(pr.q), k = convert<double>(pr.k), v = convert<double>(pr.v);
  r.o64.resize(pr.q.size());
  r.lse64.resize(pr.shape.S_q * pr.shape.H_q);
  ref::attn_fwd<double>(p, q.data(), k.data(), v.data(), r.o64.data(), r.lse64.data());
  r.o32.resize(pr.q.size());
  r.lse32.resize(pr.shape.S_q * pr.shape.H_q);
  ref::attn_fwd<float>(p, pr.q.data(), pr.k.data(), pr.v.data(), r.o32.data(), r.lse32.data());
  return r;
}

void expect_close(const char* what, const std::vector<float>& fast, const std::vector<float>& naive,
                  const std::vector<double>& ref, double floor_factor = 1.0) {
  const double e_fast = max_abs_err(fast, ref), e_naive = max_abs_err(naive, ref);
  ASSERT_TRUE(std::isfinite(e_naive)) << what << ": the naive fp32 reference itself disagrees on -inf/NaN";
  EXPECT_LE(e_fast, tolerance(e_naive, ref, floor_factor)) << what << ": fast err " << e_fast << ", naive fp32 err "
                                             << e_naive;
}

std::vector<Shape> shapes() {
  using M = MaskKind;
  using L = Layout;
  return {
      {100, 100, 4, 4, 64, M::causal, L::diagonal},
      {137, 203, 4, 1, 40, M::causal, L::straddle},         // MQA, odd sizes, S_q != S_k
      {96, 160, 8, 2, 128, M::causal, L::past},             // GQA 4:1, keys entirely in the past
      {77, 130, 4, 2, 64, M::causal, L::future},            // keys entirely in the future
      {150, 150, 4, 1, 97, M::none, L::diagonal},           // no mask, odd D
      {200, 200, 2, 2, 64, M::window, L::diagonal, 37},     // sliding window
      {190, 190, 4, 1, 128, M::causal, L::diagonal, 0, true},  // packed documents
      {128, 256, 8, 2, 64, M::causal, L::zigzag},           // zigzag query shard
      {120, 250, 2, 1, 256, M::causal, L::straddle, 0, true},  // D = 256, documents
      {1, 300, 4, 4, 128, M::causal, L::past},              // one query row (decode-like)
      {300, 1, 4, 2, 32, M::causal, L::straddle},           // one key
      {64, 64, 8, 8, 8, M::none, L::diagonal, 0, true},     // documents without a causal mask
      {250, 180, 4, 4, 128, M::window, L::straddle, 100, true},
      {97, 97, 3, 1, 17, M::causal, L::diagonal},           // 3 heads MQA, D = 17
      {128, 256, 4, 2, 64, M::window, L::zigzag, 50},
      {200, 200, 4, 4, 64, M::window, L::diagonal, 1},      // window 1: each row sees itself only
  };
}

class AttnShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(AttnShapes, ForwardMatchesReference) {
  const Problem pr(GetParam(), 17);
  const FwdResult fast = run_fast_fwd(pr);
  const RefFwd ref = run_ref_fwd(pr);
  expect_close("O", fast.o, ref.o32, ref.o64);
  expect_close("LSE", fast.lse, ref.lse32, ref.lse64);
  // Rows that see no key: O exactly 0 and LSE exactly -inf (checked element-wise, not by norm).
  const int64_t D = pr.shape.D;
  for (size_t r = 0; r < ref.lse64.size(); ++r) {
    if (ref.lse64[r] != -kInf) continue;
    ASSERT_EQ(fast.lse[r], -INFINITY) << "row/head " << r;
    for (int64_t d = 0; d < D; ++d) ASSERT_EQ(fast.o[r * D + d], 0.f) << "row/head " << r;
  }
}

TEST_P(AttnShapes, BackwardMatchesReferenceAndAccumulates) {
  const Problem pr(GetParam(), 23);
  const RefFwd ref = run_ref_fwd(pr);
  // Existing gradients (as left by an earlier ring step) that the call must add to.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> n01(0.f, 1.f);
  std::vector<float> dq0(pr.q.size()), dk0(pr.k.size()), dv0(pr.v.size());
  for (auto* x : {&dq0, &dk0, &dv0})
    for (auto& e : *x) e = n01(rng);

  // fast: fp32 inputs, O and LSE rounded from the fp64 forward (what a caller would hold)
  const auto o32r = convert<float>(ref.o64), lse32r = convert<float>(ref.lse64);
  std::vector<float> dq = dq0, dk = dk0, dv = dv0;
  AttnParams p = pr.params();
  p.o = const_cast<float*>(o32r.data());
  p.lse = const_cast<float*>(lse32r.data());
  p.dq = dq.data();
  p.dk = dk.data();
  p.dv = dv.data();
  attn_bwd(p);

  // fp64 reference on the same starting gradients
  std::vector<double> dq64 = convert<double>(dq0), dk64 = convert<double>(dk0), dv64 = convert<double>(dv0);
  {
    const auto q = convert<double>(pr.q), k = convert<double>(pr.k), v = convert<double>(pr.v),
               d_o = convert<double>(pr.dout);
    ref::attn_bwd<double>(p, q.data(), k.data(), v.data(), ref.o64.data(), ref.lse64.data(),
                          d_o.data(), dq64.data(), dk64.data(), dv64.data());
  }
  // naive fp32
  std::vector<float> dqn = dq0, dkn = dk0, dvn = dv0;
  ref::attn_bwd<float>(p, pr.q.data(), pr.k.data(), pr.v.data(), o32r.data(), lse32r.data(),
                       pr.dout.data(), dqn.data(), dkn.data(), dvn.data());
  expect_close("dQ", dq, dqn, dq64, kBwdCancellation);
  expect_close("dK", dk, dkn, dk64, kBwdCancellation);
  expect_close("dV", dv, dvn, dv64);
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttnShapes, ::testing::ValuesIn(shapes()),
                         [](const auto& info) { return shape_name(info.param); });

// Every tile-op set end to end against the same reference: the scalar fallback (a CPU without
// AVX2/FMA), AVX2 + FMA, and AVX-512 (tile_ops() picks the widest; the others are forced here so
// each runs on a machine that has it). A set this CPU lacks is reported Skipped.
class AttnIsaPath : public ::testing::TestWithParam<const char*> {};

TEST_P(AttnIsaPath, ForwardAndBackwardMatchReference) {
  const std::string isa = GetParam();
  if (isa == "avx2" && !cpu::avx2_supported()) GTEST_SKIP() << "this CPU has no AVX2+FMA";
  if (isa == "avx512" && !cpu::avx512_supported()) GTEST_SKIP() << "this CPU has no AVX-512 F/DQ/BW/VL";
  cpu::force_tile_ops(isa == "scalar" ? &cpu::tile_ops_scalar()
                      : isa == "avx2" ? &cpu::tile_ops_avx2()
                                      : &cpu::tile_ops_avx512());
  for (const Shape& s : {Shape{137, 203, 4, 1, 40, MaskKind::causal, Layout::straddle, 0, true},
                         Shape{96, 96, 4, 2, 128, MaskKind::window, Layout::diagonal, 30}}) {
    SCOPED_TRACE(shape_name(s));
    const Problem pr(s, 3);
    const FwdResult fast = run_fast_fwd(pr);
    const RefFwd ref = run_ref_fwd(pr);
    expect_close("O", fast.o, ref.o32, ref.o64);
    expect_close("LSE", fast.lse, ref.lse32, ref.lse64);
    std::vector<float> dq(pr.q.size()), dk(pr.k.size()), dv(pr.v.size());
    AttnParams p = pr.params();
    p.o = const_cast<float*>(fast.o.data());
    p.lse = const_cast<float*>(fast.lse.data());
    p.dq = dq.data();
    p.dk = dk.data();
    p.dv = dv.data();
    attn_bwd(p);
    std::vector<double> dq64(dq.size()), dk64(dk.size()), dv64(dv.size());
    const auto q = convert<double>(pr.q), k = convert<double>(pr.k), v = convert<double>(pr.v),
               d_o = convert<double>(pr.dout);
    ref::attn_bwd<double>(p, q.data(), k.data(), v.data(), ref.o64.data(), ref.lse64.data(),
                          d_o.data(), dq64.data(), dk64.data(), dv64.data());
    std::vector<float> dqn(dq.size()), dkn(dk.size()), dvn(dv.size());
    ref::attn_bwd<float>(p, pr.q.data(), pr.k.data(), pr.v.data(), fast.o.data(), fast.lse.data(),
                         pr.dout.data(), dqn.data(), dkn.data(), dvn.data());
    expect_close("dQ", dq, dqn, dq64, kBwdCancellation);
    expect_close("dK", dk, dkn, dk64, kBwdCancellation);
    expect_close("dV", dv, dvn, dv64);
  }
  cpu::force_tile_ops(nullptr);
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttnIsaPath, ::testing::Values("scalar", "avx2", "avx512"),
                         [](const auto& info) { return std::string(info.param); });

// Forward tasks own their rows: the result is bit-identical for any thread count.
TEST(AttnThreads, ForwardIsIndependentOfThreadCount) {
  const Problem pr({300, 300, 8, 2, 64, MaskKind::causal, Layout::diagonal, 0, true}, 9);
  const FwdResult a = run_fast_fwd(pr, 1), b = run_fast_fwd(pr, 2), c = run_fast_fwd(pr, 5);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.o, c.o);
  EXPECT_EQ(a.lse, c.lse);
}

// Backward with several threads: dK/dV are owned per task and dQ contributions are added in
// key-tile order at each accumulator's turn, so dQ, dK and dV have the same bits for any thread
// count and any schedule (a race would lose whole tile contributions; a lock in arrival order
// would differ in the last bits). Masks whose visible key tiles are sparse (documents, window)
// exercise the turn skipping the empty tiles.
TEST(AttnThreads, BackwardIsIndependentOfThreadCount) {
  const Shape shapes[] = {{400, 400, 8, 2, 64, MaskKind::causal, Layout::diagonal},
                          {300, 700, 6, 3, 32, MaskKind::causal, Layout::straddle, 0, true},
                          {500, 500, 4, 1, 64, MaskKind::window, Layout::diagonal, 97},
                          {256, 512, 4, 4, 16, MaskKind::none, Layout::zigzag}};
  for (const Shape& sh : shapes) {
    const Problem pr(sh, 11);
    const FwdResult f = run_fast_fwd(pr);
    auto grads = [&](int threads) {
      std::vector<float> g(pr.q.size() + 2 * pr.k.size());
      AttnParams p = pr.params();
      p.o = const_cast<float*>(f.o.data());
      p.lse = const_cast<float*>(f.lse.data());
      p.dq = g.data();
      p.dk = g.data() + pr.q.size();
      p.dv = g.data() + pr.q.size() + pr.k.size();
      p.threads = threads;
      attn_bwd(p);
      return g;
    };
    const auto g1 = grads(1);
    for (int threads : {2, 3, 4, 7})
      for (int rep = 0; rep < 3; ++rep) EXPECT_EQ(grads(threads), g1) << shape_name(sh) << ", " << threads << " threads";
  }
}


// Row strides: q, k, v, dout as views into wider rows (q inside a fused [S, (H_q + 2 H_kv) D + pad]
// projection with k and v beside it, dout padded). The CPU kernel packs its inputs, so the strided
// call is bit-identical to the packed one (one thread: the dQ additions in a fixed order); the
// reference on the same strided buffers is identical to the reference on packed ones.
TEST(AttnStrides, StridedViewsMatchPackedBitForBit) {
  for (const Shape& s : {Shape{137, 137, 8, 2, 40, MaskKind::causal, Layout::diagonal, 0, true},
                         Shape{96, 96, 4, 1, 64, MaskKind::window, Layout::diagonal, 30}}) {
    SCOPED_TRACE(shape_name(s));
    const Problem pr(s, 31);
    const int64_t S = s.S_q, qw = int64_t(s.H_q) * s.D, kw = int64_t(s.H_kv) * s.D;
    const int64_t ld = qw + 2 * kw + 8, dld = qw + 24;  // fused QKV row (+ padding), padded dout row
    std::vector<float> fused(size_t(S * ld), NAN), dpad(size_t(S * dld), NAN);
    for (int64_t i = 0; i < S; ++i) {
      std::copy_n(pr.q.begin() + i * qw, qw, fused.begin() + i * ld);
      std::copy_n(pr.k.begin() + i * kw, kw, fused.begin() + i * ld + qw);
      std::copy_n(pr.v.begin() + i * kw, kw, fused.begin() + i * ld + qw + kw);
      std::copy_n(pr.dout.begin() + i * qw, qw, dpad.begin() + i * dld);
    }
    AttnParams packed = pr.params(), strided = pr.params();
    packed.threads = strided.threads = 1;
    strided.q = fused.data();
    strided.k = fused.data() + qw;
    strided.v = fused.data() + qw + kw;
    strided.dout = dpad.data();
    strided.q_stride = strided.k_stride = strided.v_stride = ld;
    strided.dout_stride = dld;
    EXPECT_FALSE(strided.packed());
    auto run = [&](AttnParams p) {
      std::vector<float> out(pr.q.size() + size_t(S) * s.H_q + pr.q.size() + 2 * pr.k.size(), 0.f);
      p.o = out.data();
      p.lse = p.o + pr.q.size();
      p.dq = p.lse + S * s.H_q;
      p.dk = p.dq + pr.q.size();
      p.dv = p.dk + pr.k.size();
      attn_fwd(p);
      attn_bwd(p);
      return out;
    };
    const std::vector<float> a = run(packed), b = run(strided);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "strided call differs from packed";
    // The reference honours the strides too.
    std::vector<float> o1(pr.q.size()), l1(size_t(S) * s.H_q), o2(o1.size()), l2(l1.size());
    ref::attn_fwd<float>(packed, pr.q.data(), pr.k.data(), pr.v.data(), o1.data(), l1.data());
    ref::attn_fwd<float>(strided, fused.data(), fused.data() + qw, fused.data() + qw + kw, o2.data(), l2.data());
    EXPECT_EQ(o1, o2);
    EXPECT_EQ(l1, l2);
    std::vector<float> g1(pr.q.size() + 2 * pr.k.size(), 0.f), g2(g1.size(), 0.f);
    ref::attn_bwd<float>(packed, pr.q.data(), pr.k.data(), pr.v.data(), o1.data(), l1.data(), pr.dout.data(),
                         g1.data(), g1.data() + pr.q.size(), g1.data() + pr.q.size() + pr.k.size());
    ref::attn_bwd<float>(strided, fused.data(), fused.data() + qw, fused.data() + qw + kw, o1.data(), l1.data(),
                         dpad.data(), g2.data(), g2.data() + pr.q.size(), g2.data() + pr.q.size() + pr.k.size());
    EXPECT_EQ(g1, g2);
  }
}

TEST(AttnStrides, OverlappingRowsAreRefused) {
  const Problem pr({64, 64, 4, 2, 32, MaskKind::causal, Layout::diagonal}, 1);
  std::vector<float> o(pr.q.size()), lse(size_t(64 * 4));
  AttnParams p = pr.params();
  p.o = o.data();
  p.lse = lse.data();
  p.k_stride = int64_t(2) * 32 - 1;  // narrower than one row of H_kv * D
  try {
    attn_fwd(p);
    FAIL() << "a k_stride below H_kv * D was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("k_stride"), std::string::npos) << e.what();
  }
}

// The outputs of one forward and backward with exact dK/dV sums.
struct ExactOut {
  std::vector<float> o, lse, dq;
  std::vector<int64_t> dk, dv;
};
// attn_fwd, then attn_bwd with exact dK/dV sums, on `p` (inputs and shape set) at `threads`.
ExactOut run_exact(AttnParams p, int threads) {
  const size_t nq = size_t(p.S_q) * p.H_q, nk = size_t(p.S_k) * p.H_kv * p.D;
  ExactOut r{std::vector<float>(nq * p.D), std::vector<float>(nq), std::vector<float>(nq * p.D),
             std::vector<int64_t>(nk), std::vector<int64_t>(nk)};
  p.o = r.o.data();
  p.lse = r.lse.data();
  p.dq = r.dq.data();
  p.dk_fixed = r.dk.data();
  p.dv_fixed = r.dv.data();
  p.threads = threads;
  attn_fwd(p);
  attn_bwd_exact(p);
  return r;
}

// Exact dK/dV (AttnParams::dk_fixed, deterministic=true): a rank's queries are two zigzag chunks
// of whole query tiles; attending them alone to every key (in position order) gives the same
// bits of O, LSE and dQ as the whole sequence's call, and the integer dK/dV sums of the ranks
// add up to exactly the whole call's, at any thread count. The converted sums agree with the
// fp32 kernel within the usual tolerance.
TEST(AttnExact, AnySplitOfTheQueriesGivesTheSameBits) {
  const Shape shapes[] = {{0, 0, 4, 2, 64, MaskKind::causal, Layout::diagonal},
                          {0, 0, 4, 1, 32, MaskKind::causal, Layout::diagonal, 0, true},
                          {0, 0, 2, 2, 160, MaskKind::window, Layout::diagonal, 70}};
  for (Shape sh : shapes)
   for (int tiles_per_block : {1, 2}) {  // blocks of one query tile (fixed_rows 0) or of two
    const int64_t B = attn_query_block(sh.D) * tiles_per_block;
    const int64_t fixed_rows = tiles_per_block > 1 ? B : 0;
    sh.S_q = sh.S_k = 12 * B;  // splits into 2P chunks of whole blocks for P = 1, 2, 3, 6
    Problem pr(sh, 17);
    for (int64_t i = 0; i < sh.S_q; ++i) pr.q_pos[size_t(i)] = pr.k_pos[size_t(i)] = i;  // aligned blocks
    const int64_t wq = int64_t(sh.H_q) * sh.D, wk = int64_t(sh.H_kv) * sh.D, S = sh.S_q;
    using Out = ExactOut;
    // The call for the query rows `rows` (ascending positions) against every key.
    auto call = [&](const std::vector<int64_t>& rows, int threads) {
      const int64_t n = int64_t(rows.size());
      std::vector<float> q(size_t(n * wq)), dout(size_t(n * wq));
      std::vector<int32_t> doc;
      for (int64_t i = 0; i < n; ++i) {
        std::copy_n(pr.q.data() + rows[size_t(i)] * wq, wq, q.data() + i * wq);
        std::copy_n(pr.dout.data() + rows[size_t(i)] * wq, wq, dout.data() + i * wq);
        if (sh.docs) doc.push_back(pr.q_doc[size_t(rows[size_t(i)])]);
      }
      AttnParams p = pr.params();
      p.S_q = n;
      p.q = q.data();
      p.dout = dout.data();
      p.q_pos = rows.data();
      p.q_doc = sh.docs ? doc.data() : nullptr;
      p.fixed_rows = fixed_rows;
      return run_exact(p, threads);
    };
    std::vector<int64_t> all(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) all[size_t(i)] = i;
    const Out whole = call(all, 2);
    // The sums are right: converted, they match the fp32 kernel's dK within the tolerance.
    {
      std::vector<float> dk(pr.k.size()), dk32(pr.k.size()), dq(pr.q.size()), dv(pr.k.size());
      fixed_to_float(whole.dk.data(), dk.data(), int64_t(dk.size()));
      AttnParams p = pr.params();
      p.o = const_cast<float*>(whole.o.data());
      p.lse = const_cast<float*>(whole.lse.data());
      p.dq = dq.data();
      p.dk = dk32.data();
      p.dv = dv.data();
      attn_bwd(p);
      double err = 0, big = 0;
      for (size_t i = 0; i < dk.size(); ++i) {
        err = std::max(err, double(std::abs(dk[i] - dk32[i])));
        big = std::max(big, double(std::abs(dk32[i])));
      }
      EXPECT_LE(err, 1e-5 * big) << shape_name(sh) << " block " << B;
    }
    for (int P : {2, 3, 6}) {
      const int64_t c = S / (2 * P);
      std::vector<int64_t> dk(pr.k.size()), dv(pr.k.size());
      for (int r = 0; r < P; ++r) {
        std::vector<int64_t> rows;
        for (int64_t chunk : {int64_t(r), int64_t(2 * P - 1 - r)})
          for (int64_t i = chunk * c; i < (chunk + 1) * c; ++i) rows.push_back(i);
        const Out part = call(rows, r % 2 + 1);
        for (size_t i = 0; i < rows.size(); ++i) {
          const int64_t g = rows[i];
          ASSERT_EQ(0, std::memcmp(part.o.data() + i * wq, whole.o.data() + g * wq, wq * sizeof(float)))
              << shape_name(sh) << " block " << B << " P " << P << " O row " << g;
          ASSERT_EQ(0, std::memcmp(part.lse.data() + i * sh.H_q, whole.lse.data() + g * sh.H_q, sh.H_q * sizeof(float)))
              << shape_name(sh) << " P " << P << " LSE row " << g;
          ASSERT_EQ(0, std::memcmp(part.dq.data() + i * wq, whole.dq.data() + g * wq, wq * sizeof(float)))
              << shape_name(sh) << " P " << P << " dQ row " << g;
        }
        for (size_t i = 0; i < dk.size(); ++i) {
          dk[i] += part.dk[i];
          dv[i] += part.dv[i];
        }
      }
      EXPECT_EQ(dk, whole.dk) << shape_name(sh) << " block " << B << " P " << P;
      EXPECT_EQ(dv, whole.dv) << shape_name(sh) << " block " << B << " P " << P;
    }
    (void)wk;
  }
}

// Exact dK/dV in parts of a K/V group's heads (AttnParams::fixed_heads): the group's query heads
// split over calls that each hold the K/V head (K/V heads replicated over ulysses or tp ranks) give
// integer sums that add up to exactly the whole call's, and each head's O, LSE and dQ have the
// whole call's bits. A part that does not divide the group is refused.
TEST(AttnExact, HeadPartsSplitOverCallsSumToTheWholeCall) {
  Shape sh{0, 0, 8, 2, 64, MaskKind::causal, Layout::diagonal, 0, true};
  sh.S_q = sh.S_k = 2 * attn_query_block(sh.D);
  Problem pr(sh, 29);
  for (int64_t i = 0; i < sh.S_q; ++i) pr.q_pos[size_t(i)] = pr.k_pos[size_t(i)] = i;
  const int64_t S = sh.S_q, D = sh.D, G = sh.H_q / sh.H_kv;
  using Out = ExactOut;
  // query heads [h0, h0 + n) with their K/V head(s): every K/V head of the range, in order
  auto call = [&](int32_t h0, int32_t n, int32_t fixed_heads, int threads) {
    const int32_t kv0 = int32_t(h0 / G), n_kv = std::max<int32_t>(1, int32_t(n / G));
    std::vector<float> q(size_t(S * n * D)), dout(q.size()), k(size_t(S * n_kv * D)), v(k.size());
    for (int64_t i = 0; i < S; ++i) {
      std::copy_n(pr.q.data() + (i * sh.H_q + h0) * D, n * D, q.data() + i * n * D);
      std::copy_n(pr.dout.data() + (i * sh.H_q + h0) * D, n * D, dout.data() + i * n * D);
      std::copy_n(pr.k.data() + (i * sh.H_kv + kv0) * D, n_kv * D, k.data() + i * n_kv * D);
      std::copy_n(pr.v.data() + (i * sh.H_kv + kv0) * D, n_kv * D, v.data() + i * n_kv * D);
    }
    AttnParams p = pr.params();
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.dout = dout.data();
    p.H_q = n;
    p.H_kv = n_kv;
    p.fixed_heads = fixed_heads;
    return run_exact(p, threads);
  };
  for (int32_t f : {1, 2}) {
    const Out whole = call(0, sh.H_q, f, 2);
    for (int32_t n : {2, 1}) {  // query heads per call (half a group, or one head)
      if (n % f != 0) continue;  // a call holds whole parts
      std::vector<int64_t> dk(whole.dk.size()), dv(whole.dv.size());
      for (int32_t h0 = 0; h0 < sh.H_q; h0 += n) {
        const Out part = call(h0, n, f, h0 % 2 + 1);
        const int32_t kv = int32_t(h0 / G);
        for (int64_t i = 0; i < S; ++i) {
          ASSERT_EQ(0, std::memcmp(part.o.data() + i * n * D, whole.o.data() + (i * sh.H_q + h0) * D, n * D * 4))
              << "parts of " << f << " heads, calls of " << n << ", O row " << i << " head " << h0;
          ASSERT_EQ(0, std::memcmp(part.dq.data() + i * n * D, whole.dq.data() + (i * sh.H_q + h0) * D, n * D * 4))
              << "parts of " << f << " heads, calls of " << n << ", dQ row " << i << " head " << h0;
          for (int64_t d = 0; d < D; ++d) {
            dk[size_t((i * sh.H_kv + kv) * D + d)] += part.dk[size_t(i * D + d)];
            dv[size_t((i * sh.H_kv + kv) * D + d)] += part.dv[size_t(i * D + d)];
          }
        }
      }
      EXPECT_EQ(dk, whole.dk) << "parts of " << f << " heads, calls of " << n << " heads";
      EXPECT_EQ(dv, whole.dv) << "parts of " << f << " heads, calls of " << n << " heads";
    }
  }
  // the whole group as one part (the default) sums differently: the split calls' sums above are
  // not the same integers by accident
  const Out one = call(0, sh.H_q, 0, 1), per_head = call(0, sh.H_q, 1, 1);
  EXPECT_NE(one.dk, per_head.dk);
  try {
    call(0, sh.H_q, 3, 1);
    ADD_FAILURE() << "fixed_heads = 3 of a 4-head group accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("fixed_heads = 3"), std::string::npos) << e.what();
  }
}

// Forward, then a backward with exact dK/dV (blocks of `fixed_rows` queries) that must be refused
// with a message containing `why` (`spoil` changes the problem between the two).
void expect_exact_bwd_refused(Problem& pr, const std::function<void(Problem&)>& spoil, const std::string& why,
                              int64_t fixed_rows = 0) {
  std::vector<float> o(pr.q.size()), lse(size_t(pr.shape.S_q) * pr.shape.H_q), dq(pr.q.size());
  std::vector<int64_t> dk(pr.k.size()), dv(pr.k.size());
  AttnParams p = pr.params();
  p.o = o.data();
  p.lse = lse.data();
  p.dq = dq.data();
  p.dk_fixed = dk.data();
  p.dv_fixed = dv.data();
  p.fixed_rows = fixed_rows;
  attn_fwd(p);
  spoil(pr);
  try {
    attn_bwd_exact(p);
    ADD_FAILURE() << "accepted; expected a refusal naming '" << why << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

// A contribution beyond the fixed-point range (or NaN) stops the call with a message instead of
// overflowing the integer sums.
TEST(AttnExact, OutOfRangeContributionsAreRefused) {
  Shape sh{0, 0, 2, 2, 64, MaskKind::causal, Layout::diagonal};
  sh.S_q = sh.S_k = attn_query_block(sh.D);
  for (float bad : {1e7f, std::numeric_limits<float>::quiet_NaN()}) {
    Problem pr(sh, 5);
    for (int64_t i = 0; i < sh.S_q; ++i) pr.q_pos[size_t(i)] = pr.k_pos[size_t(i)] = i;
    expect_exact_bwd_refused(pr, [&](Problem& x) { x.dout[3] = bad; }, "range");  // dV of key 0 gets bad * 1
  }
}

TEST(AttnExact, QueryTilesMustBeAlignedBlocks) {
  Shape sh{0, 0, 2, 2, 64, MaskKind::causal, Layout::diagonal};
  sh.S_q = sh.S_k = attn_query_block(sh.D) + 5;
  Problem pr(sh, 3);  // positions 1000 + i: not a multiple of the block
  expect_exact_bwd_refused(pr, [](Problem&) {}, "aligned block");
  // blocks of fixed_rows: whole multiples of the tile, each one aligned block of positions
  sh.S_q = sh.S_k = 3 * attn_query_block(sh.D);
  Problem aligned(sh, 3);
  for (int64_t i = 0; i < sh.S_q; ++i) aligned.q_pos[size_t(i)] = aligned.k_pos[size_t(i)] = i;
  for (int64_t rows : {attn_query_block(sh.D) + 16, 2 * attn_query_block(sh.D)})  // not a multiple; 3 tiles
    expect_exact_bwd_refused(aligned, [](Problem&) {}, rows % attn_query_block(sh.D) ? "not a multiple" : "aligned block",
                             rows);
}

}  // namespace
// Inference with deterministic=true (ops.hpp attn_exact_*): the keys split into 1, 2, 3 and 5
// calls of random subsets, in shuffled order: the max of the calls' maxima and the sum of their
// integer sums have the bits of the one call over all keys, and so does the finished O and LSE;
// which agree with attn_fwd within fp32 error (rows that see nothing: O = 0, LSE = -inf).
TEST(AttnExact, InferenceAnySplitOfTheKeysGivesTheSameBits) {
  const Shape shapes[] = {{37, 300, 4, 2, 64, MaskKind::causal, Layout::straddle},
                          {9, 200, 6, 2, 80, MaskKind::causal, Layout::past, 0, true},
                          {16, 150, 2, 1, 32, MaskKind::window, Layout::straddle, 40},
                          {5, 64, 2, 2, 16, MaskKind::causal, Layout::future}};
  for (const Shape& sh : shapes) {
    Problem pr(sh, 23);
    const int64_t rows = sh.S_q * sh.H_q, width = rows * (sh.D + 1);
    // the call over the key rows `keys`: its maxima and its integer sums for the maxima M
    auto sub = [&](const std::vector<int64_t>& keys) {
      std::vector<float> k, v;
      std::vector<int64_t> kp;
      std::vector<int32_t> kd;
      const int64_t w = int64_t(sh.H_kv) * sh.D;
      for (int64_t j : keys) {
        k.insert(k.end(), pr.k.begin() + j * w, pr.k.begin() + (j + 1) * w);
        v.insert(v.end(), pr.v.begin() + j * w, pr.v.begin() + (j + 1) * w);
        kp.push_back(pr.k_pos[size_t(j)]);
        if (sh.docs) kd.push_back(pr.k_doc[size_t(j)]);
      }
      AttnParams p = pr.params();
      p.k = k.data();
      p.v = v.data();
      p.k_pos = kp.data();
      p.k_doc = sh.docs ? kd.data() : nullptr;
      p.S_k = int64_t(keys.size());
      return std::make_tuple(p, std::move(k), std::move(v), std::move(kp), std::move(kd));
    };
    std::vector<int64_t> all(size_t(sh.S_k));
    for (int64_t j = 0; j < sh.S_k; ++j) all[size_t(j)] = j;
    std::vector<float> M0(static_cast<size_t>(rows));
    std::vector<int64_t> hi0(static_cast<size_t>(width)), lo0(static_cast<size_t>(width));
    attn_exact_max(pr.params(), M0.data());
    EXPECT_EQ(0, attn_exact_sums(pr.params(), M0.data(), hi0.data(), lo0.data()));
    std::vector<float> o0(static_cast<size_t>(rows * sh.D)), lse0(static_cast<size_t>(rows));
    AttnParams pf = pr.params();
    pf.o = o0.data();
    pf.lse = lse0.data();
    attn_exact_finish(pf, M0.data(), hi0.data(), lo0.data());
    // against the flash kernel
    std::vector<float> o1(o0.size()), lse1(lse0.size());
    AttnParams pk = pr.params();
    pk.o = o1.data();
    pk.lse = lse1.data();
    attn_fwd(pk);
    for (size_t t = 0; t < lse0.size(); ++t) {
      if (lse1[t] == -INFINITY) {
        EXPECT_EQ(lse0[t], -INFINITY) << shape_name(sh) << " row-head " << t;
        continue;
      }
      EXPECT_NEAR(lse0[t], lse1[t], 2e-5 * std::max(1.f, std::abs(lse1[t]))) << shape_name(sh) << " row-head " << t;
      for (int32_t d = 0; d < sh.D; ++d)
        EXPECT_NEAR(o0[t * sh.D + d], o1[t * sh.D + d], 2e-5) << shape_name(sh) << " row-head " << t << " d " << d;
    }
    std::mt19937_64 rng(5);
    for (int parts : {1, 2, 3, 5}) {
      std::vector<int64_t> order = all;
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<std::vector<int64_t>> split(static_cast<size_t>(parts));
      for (size_t j = 0; j < order.size(); ++j) split[rng() % size_t(parts)].push_back(order[j]);
      std::vector<float> M(static_cast<size_t>(rows), -INFINITY), m(static_cast<size_t>(rows));
      for (const auto& keys : split) {
        auto call = sub(keys);
        attn_exact_max(std::get<0>(call), m.data());
        for (int64_t t = 0; t < rows; ++t) M[size_t(t)] = std::max(M[size_t(t)], m[size_t(t)]);
      }
      ASSERT_EQ(0, std::memcmp(M.data(), M0.data(), M.size() * sizeof(float))) << shape_name(sh) << " parts " << parts;
      std::vector<int64_t> hi(static_cast<size_t>(width)), lo(static_cast<size_t>(width));
      for (const auto& keys : split) {
        auto call = sub(keys);
        EXPECT_EQ(0, attn_exact_sums(std::get<0>(call), M.data(), hi.data(), lo.data()));
      }
      EXPECT_EQ(hi, hi0) << shape_name(sh) << " parts " << parts;
      EXPECT_EQ(lo, lo0) << shape_name(sh) << " parts " << parts;
      std::vector<float> o(o0.size()), lse(lse0.size());
      AttnParams q = pr.params();
      q.o = o.data();
      q.lse = lse.data();
      attn_exact_finish(q, M.data(), hi.data(), lo.data());
      EXPECT_EQ(0, std::memcmp(o.data(), o0.data(), o.size() * sizeof(float))) << shape_name(sh) << " parts " << parts;
      EXPECT_EQ(0, std::memcmp(lse.data(), lse0.data(), lse.size() * sizeof(float))) << shape_name(sh);
    }
  }
}

}  // namespace ctxpar::test
