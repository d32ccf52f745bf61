// Model ops (kernels/ops.hpp "model ops (training)"): the fast fp32 path against the fp64
// reference of kernels/ref/model_ref.hpp under the tolerance policy (tests/README.md: error at
// most 2x the naive fp32 reference's error plus a 1e-6 floor relative to the magnitude), the
// backward ops against finite differences of the fp64 reference, and the model pieces that do
// not need MPI: tp-sliced initialization, FLOP formulas, the synthetic data stream.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/config.hpp"
#include "cp/strategy.hpp"
#include "core/random.hpp"
#include "cpu/tile_ops.hpp"
#include "model/data.hpp"
#include "shard/placement.hpp"
#include "model/flops.hpp"
#include "model/model.hpp"
#include "ops.hpp"
#include "ref/model_ref.hpp"
#include "shard/partition.hpp"

namespace ctxpar {
namespace {

constexpr double kFactor = 2.0, kFloor = 1e-6;

std::vector<float> rnd(size_t n, uint64_t id, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * uniform_pm1(splitmix64(id * 7919 + i));
  return v;
}
std::vector<double> to_d(const std::vector<float>& v) { return {v.begin(), v.end()}; }

double max_err(const std::vector<float>& a, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(double(a[i]) - ref[i]));
  return e;
}
double mag(const std::vector<double>& ref) {
  double m = 1;
  for (double x : ref) m = std::max(m, std::fabs(x));
  return m;
}
// fast vs fp64 within kFactor x (naive fp32 vs fp64) + floor.
void expect_policy(const char* what, const std::vector<float>& fast, const std::vector<float>& naive,
                   const std::vector<double>& ref) {
  const double ef = max_err(fast, ref), en = max_err(naive, ref), tol = kFactor * en + kFloor * mag(ref);
  EXPECT_LE(ef, tol) << what << ": fast err " << ef << ", naive fp32 err " << en;
}

TEST(ModelOps, RmsNormForwardBackward) {
  for (int64_t dim : {1, 7, 64, 300}) {
    const int64_t rows = 37;
    const float eps = 1e-5f;
    auto x = rnd(size_t(rows * dim), 1, 2.0f), w = rnd(static_cast<size_t>(dim), 2), dy = rnd(size_t(rows * dim), 3);
    std::vector<float> y(x.size()), rs(static_cast<size_t>(rows)), yn(x.size()), rsn(static_cast<size_t>(rows));
    std::vector<double> yd(x.size()), rsd(static_cast<size_t>(rows));
    rmsnorm_fwd(x.data(), w.data(), y.data(), rs.data(), rows, dim, eps);
    ref::rmsnorm_fwd<float>(x.data(), w.data(), yn.data(), rsn.data(), rows, dim, eps);
    auto xd = to_d(x), wd = to_d(w), dyd = to_d(dy);
    ref::rmsnorm_fwd<double>(xd.data(), wd.data(), yd.data(), rsd.data(), rows, dim, double(eps));
    expect_policy("rmsnorm y", y, yn, yd);
    // Backward accumulates: start from a nonzero dx and dw.
    auto dx0 = rnd(x.size(), 4), dw0 = rnd(static_cast<size_t>(dim), 5);
    std::vector<float> dx = dx0, dw = dw0, dxn = dx0, dwn = dw0;
    std::vector<double> dxd = to_d(dx0), dwd = to_d(dw0);
    rmsnorm_bwd(dy.data(), x.data(), w.data(), rs.data(), dx.data(), dw.data(), rows, dim);
    ref::rmsnorm_bwd<float>(dy.data(), x.data(), w.data(), rsn.data(), dxn.data(), dwn.data(), rows, dim);
    ref::rmsnorm_bwd<double>(dyd.data(), xd.data(), wd.data(), rsd.data(), dxd.data(), dwd.data(), rows, dim);
    expect_policy("rmsnorm dx", dx, dxn, dxd);
    expect_policy("rmsnorm dw", dw, dwn, dwd);
    // The fp64 reference backward against central differences of sum(dy * y).
    auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
      std::vector<double> yy(xx.size()), r(static_cast<size_t>(rows));
      ref::rmsnorm_fwd<double>(xx.data(), ww.data(), yy.data(), r.data(), rows, dim, double(eps));
      double s = 0;
      for (size_t i = 0; i < yy.size(); ++i) s += yy[i] * dyd[i];
      return s;
    };
    const double h = 1e-6;
    for (size_t i : {size_t(0), x.size() / 2, x.size() - 1}) {
      auto xp = xd, xm = xd;
      xp[i] += h;
      xm[i] -= h;
      EXPECT_NEAR((loss(xp, wd) - loss(xm, wd)) / (2 * h), dxd[i] - double(dx0[i]), 1e-6) << "dx[" << i << "]";
    }
    for (size_t j : {size_t(0), size_t(dim - 1)}) {
      auto wp = wd, wm = wd;
      wp[j] += h;
      wm[j] -= h;
      EXPECT_NEAR((loss(xd, wp) - loss(xd, wm)) / (2 * h), dwd[j] - double(dw0[j]), 1e-6) << "dw[" << j << "]";
    }
  }
}

TEST(ModelOps, RopeMatchesReferenceAndInverts) {
  const int32_t H = 3, D = 16;
  const int64_t rows = 20;
  std::vector<double> inv(D / 2);
  rope_inv_freq(D, 500000.0, 8.0, 1.0, 4.0, 64.0, inv.data());
  std::vector<int64_t> pos(rows);
  for (int64_t r = 0; r < rows; ++r) pos[size_t(r)] = 131072 - 7 * r;  // long context: large angles
  std::vector<float> c(size_t(rows * D / 2)), s(c.size());
  rope_table(pos.data(), rows, D, inv.data(), c.data(), s.data());
  auto x = rnd(size_t(rows * H * D), 6);
  std::vector<float> y = x, yn = x;
  std::vector<double> yd = to_d(x);
  rope_apply(y.data(), rows, H, D, c.data(), s.data(), false);
  ref::rope_apply<float>(yn.data(), rows, H, D, pos.data(), inv.data(), false);
  ref::rope_apply<double>(yd.data(), rows, H, D, pos.data(), inv.data(), false);
  expect_policy("rope", y, yn, yd);
  rope_apply(y.data(), rows, H, D, c.data(), s.data(), true);  // the backward is the inverse
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-6) << i;
}

TEST(ModelOps, RopeLlama3Scaling) {
  // Llama 3.1 (theta 5e5, factor 8, low 1, high 4, original 8192), D = 128: the highest
  // frequency is unchanged, the lowest divided by 8, the band between interpolated.
  const int32_t D = 128;
  std::vector<double> inv(D / 2);
  rope_inv_freq(D, 500000.0, 8.0, 1.0, 4.0, 8192.0, inv.data());
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  const double f_last = std::pow(500000.0, -2.0 * 63 / 128);
  EXPECT_NEAR(inv[63], f_last / 8, 1e-18);
  const double kPi = 3.14159265358979323846;
  for (int i = 0; i < D / 2; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / D), wl = 2 * kPi / f;
    if (wl < 8192.0 / 4) EXPECT_DOUBLE_EQ(inv[size_t(i)], f) << i;
    else if (wl > 8192.0) EXPECT_DOUBLE_EQ(inv[size_t(i)], f / 8) << i;
    else EXPECT_TRUE(inv[size_t(i)] < f && inv[size_t(i)] > f / 8) << i;
  }
  std::vector<double> plain(D / 2);
  rope_inv_freq(D, 500000.0, 1.0, 1.0, 4.0, 8192.0, plain.data());  // factor 1 = no scaling
  for (int i = 0; i < D / 2; ++i) EXPECT_NEAR(plain[size_t(i)], std::pow(500000.0, -2.0 * i / D), 1e-15 * (1 + plain[size_t(i)]));
}

TEST(ModelOps, SwiGlu) {
  const int64_t n = 1001;
  auto g = rnd(static_cast<size_t>(n), 7, 6.0f), u = rnd(static_cast<size_t>(n), 8, 2.0f), dh = rnd(static_cast<size_t>(n), 9);
  std::vector<float> h(static_cast<size_t>(n)), hn(static_cast<size_t>(n)), dg(static_cast<size_t>(n)), du(static_cast<size_t>(n)), dgn(static_cast<size_t>(n)), dun(static_cast<size_t>(n));
  std::vector<double> hd(static_cast<size_t>(n)), dgd(static_cast<size_t>(n)), dud(static_cast<size_t>(n));
  auto gd = to_d(g), ud = to_d(u), dhd = to_d(dh);
  swiglu_fwd(g.data(), u.data(), h.data(), n);
  ref::swiglu_fwd<float>(g.data(), u.data(), hn.data(), n);
  ref::swiglu_fwd<double>(gd.data(), ud.data(), hd.data(), n);
  expect_policy("swiglu h", h, hn, hd);
  swiglu_bwd(dh.data(), g.data(), u.data(), dg.data(), du.data(), n);
  ref::swiglu_bwd<float>(dh.data(), g.data(), u.data(), dgn.data(), dun.data(), n);
  ref::swiglu_bwd<double>(dhd.data(), gd.data(), ud.data(), dgd.data(), dud.data(), n);
  expect_policy("swiglu dg", dg, dgn, dgd);
  expect_policy("swiglu du", du, dun, dud);
  for (int64_t i : {int64_t(0), n / 3, n - 1}) {  // fp64 reference vs central differences
    const double e = 1e-6;
    double hp, hm;
    double gp = gd[size_t(i)] + e, gm = gd[size_t(i)] - e, ui = ud[size_t(i)];
    ref::swiglu_fwd<double>(&gp, &ui, &hp, 1);
    ref::swiglu_fwd<double>(&gm, &ui, &hm, 1);
    EXPECT_NEAR(dhd[size_t(i)] * (hp - hm) / (2 * e), dgd[size_t(i)], 1e-7);
  }
}

TEST(ModelOps, CrossEntropyInPlaceAndIgnoredRows) {
  const int64_t rows = 9, V = 1000;
  auto z = rnd(size_t(rows * V), 10, 8.0f);
  std::vector<int32_t> labels = {3, -1, 999, 0, 500, -1, 7, 7, 123};
  const float scale = 1.0f / 7;
  std::vector<float> dz(z.size()), inplace = z, dzn(z.size());
  std::vector<double> zd = to_d(z), dzd(z.size());
  const double l = cross_entropy_fwd_bwd(z.data(), labels.data(), rows, V, scale, dz.data());
  const double l_in = cross_entropy_fwd_bwd(inplace.data(), labels.data(), rows, V, scale, inplace.data());
  const double ln = ref::cross_entropy_fwd_bwd<float>(z.data(), labels.data(), rows, V, scale, dzn.data());
  const double ld = ref::cross_entropy_fwd_bwd<double>(zd.data(), labels.data(), rows, V, double(scale), dzd.data());
  EXPECT_LE(std::fabs(l - ld), kFactor * std::fabs(ln - ld) + kFloor * std::fabs(ld));
  EXPECT_EQ(l, l_in);
  EXPECT_EQ(dz, inplace);  // aliasing dlogits with logits gives the same result
  expect_policy("ce dlogits", dz, dzn, dzd);
  for (int64_t j = 0; j < V; ++j) EXPECT_EQ(dz[size_t(1 * V + j)], 0.0f);  // ignored row
  double row_sum = 0;  // softmax - onehot sums to 0 on a counted row
  for (int64_t j = 0; j < V; ++j) row_sum += dzd[size_t(j)];
  EXPECT_NEAR(row_sum, 0.0, 1e-12);
}

TEST(ModelOps, AdamWMatchesReference) {
  const int64_t n = 513;
  auto p0 = rnd(static_cast<size_t>(n), 11), g = rnd(static_cast<size_t>(n), 12, 0.1f);
  std::vector<float> p = p0, m(static_cast<size_t>(n)), v(static_cast<size_t>(n)), pn = p0, mn(static_cast<size_t>(n)), vn(static_cast<size_t>(n));
  std::vector<double> pd = to_d(p0), md(static_cast<size_t>(n)), vd(static_cast<size_t>(n)), gd = to_d(g);
  AdamWStep hp;
  hp.lr = 1e-2;
  hp.weight_decay = 0.1;
  hp.grad_scale = 0.5;
  for (int64_t t = 1; t <= 3; ++t) {
    hp.step = t;
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, hp);
    ref::adamw_update<float>(pn.data(), g.data(), mn.data(), vn.data(), n, hp.lr, hp.beta1, hp.beta2, hp.eps,
                             hp.weight_decay, hp.grad_scale, t);
    ref::adamw_update<double>(pd.data(), gd.data(), md.data(), vd.data(), n, hp.lr, hp.beta1, hp.beta2, hp.eps,
                              hp.weight_decay, hp.grad_scale, t);
  }
  expect_policy("adamw p", p, pn, pd);
  // First step of Adam moves each weight by about lr (sign of the gradient) plus the decay.
  std::vector<float> q = p0, mq(static_cast<size_t>(n)), vq(static_cast<size_t>(n));
  hp.step = 1;
  adamw_update(q.data(), g.data(), mq.data(), vq.data(), n, hp);
  for (int64_t i = 0; i < n; ++i) {
    if (std::fabs(g[size_t(i)]) > 1e-3f) {
      EXPECT_NEAR(q[size_t(i)], p0[size_t(i)] * (1 - 1e-3) - 1e-2 * (g[size_t(i)] > 0 ? 1 : -1), 1e-5);
    }
  }
}

// Exact sums (ops.hpp exact_add): the same bits in any order and any grouping of the additions,
// within the truncation bound of the exact value, and out-of-range values counted, never summed.
TEST(ModelOps, ExactSumsHaveOneResultInAnyOrder) {
  const int64_t n = 2000;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)  // magnitudes from 1e-12 to 1e3, both signs
    x[size_t(i)] = float(std::ldexp(uniform_pm1(splitmix64(uint64_t(i) + 17)), int(i % 50) - 40));
  // the exact sum, in long double with a fixed order (its rounding far below the bound below)
  long double exact = 0;
  for (float v : x) exact += (long double)v;
  double sums[3];
  for (int order = 0; order < 3; ++order) {
    std::vector<float> y = x;
    if (order == 1) std::reverse(y.begin(), y.end());
    if (order == 2)
      for (int64_t i = n - 1; i > 0; --i) std::swap(y[size_t(i)], y[splitmix64(uint64_t(i)) % uint64_t(i + 1)]);
    int64_t hi = 0, lo = 0;
    if (order == 2) {  // in two groups, summed apart and added as integers (as two ranks)
      int64_t h2 = 0, l2 = 0;
      for (int64_t i = 0; i < 700; ++i) EXPECT_EQ(exact_add(&y[size_t(i)], 1, 1, 1, &hi, &lo, 1), 0);
      for (int64_t i = 700; i < n; ++i) EXPECT_EQ(exact_add(double(y[size_t(i)]), &h2, &l2), 0);
      hi += h2;
      lo += l2;
    } else {
      for (float v : y) EXPECT_EQ(exact_add(&v, 1, 1, 1, &hi, &lo, 1), 0);
    }
    sums[order] = exact_value(hi, lo);
  }
  EXPECT_EQ(sums[0], sums[1]);
  EXPECT_EQ(sums[0], sums[2]);
  // each addition truncated below 2^-64, then one rounding to double
  EXPECT_NEAR(double(sums[0] - exact), 0.0, double(n) * std::ldexp(1.0, -kExactLo) + std::fabs(sums[0]) * 1.2e-16);
  // rows with a leading dimension, into accumulators of another one
  std::vector<int64_t> h(12, 0), l(12, 0);
  const float m[6] = {1.5f, -2.25f, 1e-9f, 3.0f, -0.5f, 7.0f};
  EXPECT_EQ(exact_add(m, 2, 2, 3, h.data(), l.data(), 4), 0);  // rows {1.5, -2.25}, {3, -0.5}
  std::vector<float> out(12);
  exact_to_float(h.data(), l.data(), out.data(), 12);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.25f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[4], 3.0f);
  EXPECT_EQ(out[5], -0.5f);
  // out of range and non-finite: counted, added as 0
  int64_t hh[3] = {0, 0, 0}, ll[3] = {0, 0, 0};
  const float bad[3] = {std::ldexp(1.0f, kExactRange), std::numeric_limits<float>::quiet_NaN(), 0.25f};
  EXPECT_EQ(exact_add(bad, 1, 3, 3, hh, ll, 3), 2);
  EXPECT_EQ(exact_value(hh[0], ll[0]), 0.0);
  EXPECT_EQ(exact_value(hh[1], ll[1]), 0.0);
  EXPECT_EQ(exact_value(hh[2], ll[2]), 0.25);
}

// rmsnorm_bwd_exact: dx as rmsnorm_bwd's (the same bits), dw the exact sum of the rows' products
// (within the policy against the fp64 reference); embedding_bwd_exact against embedding_bwd.
TEST(ModelOps, ExactNormAndEmbeddingGradients) {
  const int64_t rows = 61, dim = 40;
  auto x = rnd(size_t(rows * dim), 21, 2.0f), w = rnd(size_t(dim), 22), dy = rnd(size_t(rows * dim), 23);
  std::vector<float> y(x.size()), rs(static_cast<size_t>(rows));
  rmsnorm_fwd(x.data(), w.data(), y.data(), rs.data(), rows, dim, 1e-5f);
  std::vector<float> dx(x.size(), 0.5f), dxe(x.size(), 0.5f), dw(size_t(dim), 0.0f), dwn(size_t(dim), 0.0f);
  rmsnorm_bwd(dy.data(), x.data(), w.data(), rs.data(), dx.data(), dw.data(), rows, dim);
  std::vector<int64_t> h(size_t(dim), 0), l(size_t(dim), 0);
  EXPECT_EQ(rmsnorm_bwd_exact(dy.data(), x.data(), w.data(), rs.data(), dxe.data(), h.data(), l.data(), rows, dim), 0);
  EXPECT_EQ(dx, dxe);
  std::vector<float> dwe(static_cast<size_t>(dim));
  exact_to_float(h.data(), l.data(), dwe.data(), dim);
  std::vector<float> dx0(x.size(), 0.5f);
  ref::rmsnorm_bwd<float>(dy.data(), x.data(), w.data(), rs.data(), dx0.data(), dwn.data(), rows, dim);
  std::vector<double> dxd(x.size(), 0.5), dwd(size_t(dim), 0.0), rsd(rs.begin(), rs.end());
  auto xd = to_d(x), wd = to_d(w), dyd = to_d(dy);
  ref::rmsnorm_bwd<double>(dyd.data(), xd.data(), wd.data(), rsd.data(), dxd.data(), dwd.data(), rows, dim);
  expect_policy("exact rmsnorm dw", dwe, dwn, dwd);
  // rows in another order: the same bits
  std::vector<int64_t> h2(size_t(dim), 0), l2(size_t(dim), 0);
  std::vector<float> dxr(x.size(), 0.5f);
  for (int64_t r = rows - 1; r >= 0; --r)
    rmsnorm_bwd_exact(dy.data() + r * dim, x.data() + r * dim, w.data(), rs.data() + r, dxr.data() + r * dim, h2.data(),
                      l2.data(), 1, dim);
  EXPECT_EQ(h, h2);
  EXPECT_EQ(l, l2);
  // the embedding: a repeated token's rows summed
  const int32_t tok[5] = {3, 1, 3, 0, 3};
  auto g = rnd(size_t(5 * dim), 24);
  std::vector<float> demb(size_t(4 * dim), 0.0f), deme(size_t(4 * dim));
  std::vector<int64_t> eh(size_t(4 * dim), 0), el(size_t(4 * dim), 0);
  embedding_bwd(g.data(), tok, 5, dim, demb.data());
  EXPECT_EQ(embedding_bwd_exact(g.data(), tok, 5, dim, eh.data(), el.data()), 0);
  exact_to_float(eh.data(), el.data(), deme.data(), 4 * dim);
  for (int64_t i = 0; i < 4 * dim; ++i) {
    const int64_t r = i / dim, j = i % dim;
    double e = 0;
    for (int t = 0; t < 5; ++t) e += tok[t] == r ? double(g[size_t(t * dim + j)]) : 0.0;
    EXPECT_EQ(double(deme[size_t(i)]), double(float(e))) << i;  // exact sum, one rounding
    EXPECT_NEAR(demb[size_t(i)], e, 1e-6) << i;
  }
}

// gemm_tn_exact: every block's product element a function of the block's rows alone (the same
// bits for 1 and 2 threads, for a sub-rectangle of the operands, for K split over two calls), on
// every tile-kernel instruction set (blocks below kExactLibraryBlock rows; longer ones, BLIS per block, below); each
// element within fp32's error of the exact block sums;
// on the FMA paths (AVX2, AVX-512) bit-identical to a fused multiply-add chain per block.
TEST(ModelOps, GemmTnExactIsAFunctionOfEachBlock) {
  const int64_t M = 37, N = 53, G = 24, K = 4 * G, lda = M + 3, ldb = N + 5, ld = N + 1;  // N: 3 panels + 5
  auto A = rnd(size_t(K * lda), 41), B = rnd(size_t(K * ldb), 42);
  const size_t nacc = size_t(M * ld);
  auto run = [&](int threads, int64_t i0, int64_t j0, int64_t m, int64_t n, int64_t k0, int64_t k,
                 std::vector<int64_t>& hi, std::vector<int64_t>& lo) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    const int64_t bad = gemm_tn_exact(m, n, k, G, A.data() + k0 * lda + i0, lda, B.data() + k0 * ldb + j0, ldb,
                                      hi.data() + i0 * ld + j0, lo.data() + i0 * ld + j0, ld);
    omp_set_num_threads(saved);
    EXPECT_EQ(bad, 0);
  };
  const cpu::TileOps* paths[3] = {&cpu::tile_ops_scalar(), cpu::avx2_supported() ? &cpu::tile_ops_avx2() : nullptr,
                                  cpu::avx512_supported() ? &cpu::tile_ops_avx512() : nullptr};
  for (const cpu::TileOps* ops : paths) {
    if (!ops) continue;  // an instruction set this CPU lacks (the others still run)
    SCOPED_TRACE(ops->isa);
    cpu::force_tile_ops(ops);
    std::vector<int64_t> h1(nacc, 0), l1(nacc, 0), h2(nacc, 0), l2(nacc, 0), h3(nacc, 0), l3(nacc, 0);
    run(1, 0, 0, M, N, 0, K, h1, l1);
    run(2, 0, 0, M, N, 0, K, h2, l2);
    EXPECT_EQ(h1, h2);
    EXPECT_EQ(l1, l2);
    // the same elements from a sub-rectangle (rows 5.., columns 16..) and K in two calls
    run(1, 5, 16, M - 5, N - 16, 0, 2 * G, h3, l3);
    run(2, 5, 16, M - 5, N - 16, 2 * G, 2 * G, h3, l3);
    for (int64_t i = 5; i < M; ++i)
      for (int64_t j = 16; j < N; ++j) {
        EXPECT_EQ(h3[size_t(i * ld + j)], h1[size_t(i * ld + j)]) << i << "," << j;
        EXPECT_EQ(l3[size_t(i * ld + j)], l1[size_t(i * ld + j)]) << i << "," << j;
      }
    const bool fused = ops != paths[0];
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double exact = 0, mag = 0;
        int64_t hf = 0, lf = 0;
        for (int64_t b = 0; b < K; b += G) {
          float chain = 0.f;
          for (int64_t k = b; k < b + G; ++k) {
            const double p = double(A[size_t(k * lda + i)]) * double(B[size_t(k * ldb + j)]);
            exact += p;
            mag += std::fabs(p);
            chain = std::fma(A[size_t(k * lda + i)], B[size_t(k * ldb + j)], chain);
          }
          exact_add(double(chain), &hf, &lf);
        }
        const double got = exact_value(h1[size_t(i * ld + j)], l1[size_t(i * ld + j)]);
        EXPECT_NEAR(got, exact, 2.0 * double(G) * 6e-8 * mag) << i << "," << j;
        // the columns past the last whole panel take the fused chain on every path
        if (fused || j >= N / 16 * 16) {
          EXPECT_EQ(got, exact_value(hf, lf)) << i << "," << j;
        }
      }
  }
  cpu::force_tile_ops(nullptr);
  // blocks of kExactLibraryBlock rows and more: one sgemm per block; the same bits for 1 and 2
  // threads and for K in two calls, within fp32's error of the exact block sums
  const int64_t G2 = kExactLibraryBlock, K2 = 2 * G2;
  auto A2 = rnd(size_t(K2 * M), 43), B2 = rnd(size_t(K2 * N), 44);
  std::vector<int64_t> g1(size_t(M * N), 0), m1(g1.size(), 0), g2(g1.size(), 0), m2(g1.size(), 0);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  EXPECT_EQ(gemm_tn_exact(M, N, K2, G2, A2.data(), M, B2.data(), N, g1.data(), m1.data(), N), 0);
  omp_set_num_threads(2);
  EXPECT_EQ(gemm_tn_exact(M, N, G2, G2, A2.data(), M, B2.data(), N, g2.data(), m2.data(), N), 0);
  EXPECT_EQ(gemm_tn_exact(M, N, G2, G2, A2.data() + G2 * M, M, B2.data() + G2 * N, N, g2.data(), m2.data(), N), 0);
  omp_set_num_threads(saved);
  EXPECT_EQ(g1, g2);
  EXPECT_EQ(m1, m2);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < K2; ++k) {
        const double p = double(A2[size_t(k * M + i)]) * double(B2[size_t(k * N + j)]);
        exact += p;
        mag += std::fabs(p);
      }
      EXPECT_NEAR(exact_value(g1[size_t(i * N + j)], m1[size_t(i * N + j)]), exact, 2.0 * double(G2) * 6e-8 * mag);
    }
}

// sum_squares: fixed blocks, so 1 and 2 threads give the same bits.
TEST(ModelOps, SumSquaresDoesNotDependOnThreads) {
  auto x = rnd(100003, 31);
  double ref = 0;
  for (float v : x) ref += double(v) * double(v);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = sum_squares(x.data(), int64_t(x.size()));
  omp_set_num_threads(2);
  const double two = sum_squares(x.data(), int64_t(x.size()));
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
  EXPECT_NEAR(one, ref, 1e-9 * ref);
}

Config tiny_config() {
  state_strategy_choices();  // the registry's strategy names, as the program states them
  Config c = parse_config("", "", {"layers=2", "dim=32", "ffn_dim=48", "heads=4", "kv_heads=2", "head_dim=8",
                                   "vocab=40", "seq=64"});
  return c;
}

TEST(Model, TensorParallelSlicesAssembleTheSameModel) {
  Config c = tiny_config();
  c.kv_heads = 4;  // 4 K/V heads: whole heads for tp 2 and 4
  const ParamLayout full(model_dims(c, 1, 0));
  std::vector<float> w(static_cast<size_t>(full.local_elems()));
  full.init(42, w.data());
  for (int T : {2, 4}) {
    ASSERT_EQ(validate_model_shape(c, T), "");
    for (int t = 0; t < T; ++t) {
      const ParamLayout sl(model_dims(c, T, t));
      std::vector<float> ws(size_t(sl.local_elems()));
      sl.init(42, ws.data());
      for (size_t i = 0; i < sl.tensors().size(); ++i) {
        const ParamInfo &p = sl.tensors()[i], &f = full.tensors()[i];
        ASSERT_EQ(p.name, f.name);
        for (int64_t r = 0; r < p.loc_rows; ++r)
          for (int64_t col = 0; col < p.loc_cols; ++col)
            ASSERT_EQ(ws[size_t(p.offset + r * p.loc_cols + col)],
                      w[size_t(f.offset + (p.row0 + r) * f.cols + p.col0 + col)])
                << p.name << " tp " << t << "/" << T;
      }
    }
  }
  // A different seed is a different model.
  std::vector<float> w2(w.size());
  full.init(43, w2.data());
  EXPECT_NE(w, w2);
}

TEST(Model, ValidationNamesTheProblem) {
  Config c = tiny_config();
  EXPECT_NE(validate_model_shape(c, 4).find("kv_heads"), std::string::npos);  // 2 K/V heads over tp:4
  c.head_dim = 7;
  EXPECT_NE(validate_model_shape(c, 1).find("head_dim"), std::string::npos);
}

TEST(Model, FlopFormulas) {
  const Config c = tiny_config();
  const ModelDims d = model_dims(c, 1, 0);
  EXPECT_EQ(causal_visible_pairs({4}), 10.0);           // 4 + 3 + 2 + 1
  EXPECT_EQ(causal_visible_pairs({2, 3}), 3.0 + 6.0);   // per document
  // Sliding window W: a query sees min(position + 1, W) keys of its document.
  EXPECT_EQ(window_visible_pairs({4}, 2), 1.0 + 2 + 2 + 2);
  EXPECT_EQ(window_visible_pairs({2, 5}, 3), 3.0 + (1 + 2 + 3 + 3 + 3));
  EXPECT_EQ(window_visible_pairs({7}, 100), causal_visible_pairs({7}));
  EXPECT_EQ(window_prefill_pairs(3, 2, 3), 3.0 + 3 + 3);  // positions 2, 3, 4
  EXPECT_EQ(window_prefill_pairs(3, 2, 1000), partial_prefill_pairs(3, 2));
  {  // against the one counter (kernels/ops.hpp visible_pairs) on packed documents
    const std::vector<int64_t> lengths = {5, 17, 1, 40};
    std::vector<int64_t> pos;
    std::vector<int32_t> doc;
    for (size_t i = 0; i < lengths.size(); ++i)
      for (int64_t j = 0; j < lengths[i]; ++j) {
        pos.push_back(int64_t(pos.size()));
        doc.push_back(int32_t(i));
      }
    AttnParams p;
    p.S_q = p.S_k = int64_t(pos.size());
    p.H_q = p.H_kv = 1;
    p.D = 2;
    p.q_pos = p.k_pos = pos.data();
    p.q_doc = p.k_doc = doc.data();
    p.mask = MaskKind::window;
    p.window = 6;
    EXPECT_EQ(window_visible_pairs(lengths, 6), double(visible_pairs(p)));
  }
  // Projections: per token per layer 2*dim*(H_q D + 2 H_kv D) + 2 H_q D dim + 6 dim F; head 2 dim V.
  const double fwd = 64.0 * (2 * (2 * 32 * (32 + 2 * 16) + 2 * 32 * 32 + 6 * 32 * 48) + 2 * 32 * 40);
  EXPECT_DOUBLE_EQ(train_matmul_flops(d, 64), 3 * fwd);
  EXPECT_DOUBLE_EQ(train_attn_flops(d, 100, 0), 3.5 * 4 * 4 * 8 * 100 * 2);
  ModelDims dl = d;  // one global and one local layer: each at its own pairs
  dl.kinds = "GL";
  EXPECT_DOUBLE_EQ(train_attn_flops(dl, 100, 30), 3.5 * 4 * 4 * 8 * (100 + 30));
  EXPECT_EQ(d.param_count(), 2 * (2 * 32 + 32 * 32 * 2 + 32 * 16 * 2 + 3 * 32 * 48) + 2 * 40 * 32 + 32);
}

TEST(Model, SyntheticStreamIsDeterministicAndLearnable) {
  Config c = tiny_config();
  c.docs = "random";
  c.doc_mean = 16;
  auto src = make_token_source(c);
  std::vector<int32_t> t1(64), d1(64), t2(64), d2(64), t3(64), d3(64);
  src->sample(5, 64, t1.data(), d1.data());
  src->sample(5, 64, t2.data(), d2.data());
  src->sample(6, 64, t3.data(), d3.data());
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(d1, d2);
  EXPECT_NE(t1, t3);
  int follows = 0, pairs = 0;
  for (int i = 1; i < 64; ++i) {
    EXPECT_TRUE(t1[size_t(i)] >= 0 && t1[size_t(i)] < c.vocab);
    EXPECT_TRUE(d1[size_t(i)] == d1[size_t(i - 1)] || d1[size_t(i)] == d1[size_t(i - 1)] + 1);
    if (d1[size_t(i)] != d1[size_t(i - 1)]) continue;
    ++pairs;
    follows += t1[size_t(i)] == synthetic_successor(t1[size_t(i - 1)], c.vocab);
  }
  EXPECT_GT(follows, pairs / 2);  // the rule holds 3/4 of the time
  // Batches: labels shifted globally, then sharded; every rank's labels match the global shift.
  const Partition part(PartitionKind::zigzag, 64, 2);
  int64_t labelled = 0;
  for (int r = 0; r < 2; ++r) {
    Batch b = make_batch(*src, 5, part, r);
    for (size_t i = 0; i < b.pos.size(); ++i) {
      const int64_t g = b.pos[i];
      EXPECT_EQ(b.tokens[i], t1[size_t(g)]);
      const bool has_next = g + 1 < 64 && d1[size_t(g + 1)] == d1[size_t(g)];
      EXPECT_EQ(b.labels[i], has_next ? t1[size_t(g + 1)] : -1);
      labelled += b.labels[i] >= 0;
    }
  }
  // labelled_tokens counts the whole sequence (both shards), the loss's denominator.
  EXPECT_EQ(make_batch(*src, 5, part, 0).labelled_tokens, labelled);
}

// placement=auto: make_batch runs the balanced placement only where the price says it is
// strictly cheaper than the zigzag rows, and then exactly the balanced placement's rows.
TEST(Model, AutoPlacementRunsTheCheaperPlacement) {
  Config c = tiny_config();
  c.docs = "random";
  c.doc_mean = 16;
  auto src = make_token_source(c);
  const Partition part(PartitionKind::zigzag, 64, 4);
  const PlacementPrice busiest = [](const Placement& p, const std::vector<int64_t>&) {
    return double(*std::max_element(p.work.begin(), p.work.end()));
  };
  const PlacementPrice same = [](const Placement&, const std::vector<int64_t>&) { return 1.0; };
  const PlacementPrice calmest = [&](const Placement& p, const std::vector<int64_t>& l) { return -busiest(p, l); };
  int balanced_cheaper = 0;
  for (int64_t index = 0; index < 8; ++index) {
    const Batch zz = make_batch(*src, index, part, 1);
    const Batch bal = make_batch(*src, index, part, 1, PlacementKind::balanced);
    const Placement pb = balanced_placement(zz.doc_lengths, 4, part.local_size(1));
    const bool cheaper = busiest(pb, zz.doc_lengths) < busiest(zigzag_placement(zz.doc_lengths, 4), zz.doc_lengths);
    balanced_cheaper += cheaper;
    const Batch a = make_batch(*src, index, part, 1, PlacementKind::automatic, &busiest);
    EXPECT_EQ(a.placed, cheaper) << index;
    EXPECT_EQ(a.pos, cheaper ? bal.pos : zz.pos) << index;
    EXPECT_EQ(a.tokens, cheaper ? bal.tokens : zz.tokens) << index;
    const Batch tie = make_batch(*src, index, part, 1, PlacementKind::automatic, &same);
    EXPECT_FALSE(tie.placed);
    EXPECT_EQ(tie.pos, zz.pos);
    EXPECT_FALSE(make_batch(*src, index, part, 1, PlacementKind::automatic, &calmest).placed && cheaper) << index;
  }
  EXPECT_GT(balanced_cheaper, 0);  // the mix has batches that zigzag leaves uneven
}

}  // namespace
}  // namespace ctxpar
