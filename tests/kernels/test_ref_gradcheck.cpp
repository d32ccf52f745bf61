// The fp64 reference backward against central finite differences of its own forward, on tiny
// shapes: L = sum(dO * O); dL/dx ~ (L(x + h) - L(x - h)) / 2h for every entry of q, k and v.
#include <gtest/gtest.h>

#include "attn_problem.hpp"
#include "ref/attn_ref.hpp"

namespace ctxpar::test {
namespace {

double loss(const AttnParams& p, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& d_o) {
  std::vector<double> o(q.size()), lse(p.S_q * p.H_q);
  ref::attn_fwd<double>(p, q.data(), k.data(), v.data(), o.data(), lse.data());
  double L = 0;
  for (size_t x = 0; x < o.size(); ++x) L += o[x] * d_o[x];
  return L;
}

TEST(RefGradcheck, BackwardMatchesFiniteDifferences) {
  using M = MaskKind;
  using Lay = Layout;
  for (const Shape& s : {Shape{5, 7, 2, 1, 4, M::causal, Lay::straddle},
                         Shape{6, 6, 4, 2, 3, M::window, Lay::diagonal, 3, true},
                         Shape{4, 5, 2, 2, 5, M::none, Lay::diagonal, 0, true},
                         Shape{3, 4, 1, 1, 2, M::causal, Lay::future}}) {
    SCOPED_TRACE(shape_name(s));
    const Problem pr(s, 31);
    const AttnParams p = pr.params();
    auto q = convert<double>(pr.q), k = convert<double>(pr.k), v = convert<double>(pr.v);
    const auto d_o = convert<double>(pr.dout);
    std::vector<double> o(q.size()), lse(s.S_q * s.H_q), dq(q.size()), dk(k.size()), dv(v.size());
    ref::attn_fwd<double>(p, q.data(), k.data(), v.data(), o.data(), lse.data());
    ref::attn_bwd<double>(p, q.data(), k.data(), v.data(), o.data(), lse.data(), d_o.data(),
                          dq.data(), dk.data(), dv.data());
    const double h = 1e-5;
    auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
      for (size_t e = 0; e < x.size(); ++e) {
        const double x0 = x[e];
        x[e] = x0 + h;
        const double lp = loss(p, q, k, v, d_o);
        x[e] = x0 - h;
        const double lm = loss(p, q, k, v, d_o);
        x[e] = x0;
        const double fd = (lp - lm) / (2 * h);
        // central difference truncation ~h^2 |f'''| plus rounding ~1e-16 |L| / h
        ASSERT_NEAR(grad[e], fd, 1e-7 * (1 + std::abs(fd))) << name << "[" << e << "]";
      }
    };
    check(q, dq, "dq");
    check(k, dk, "dk");
    check(v, dv, "dv");
  }
}

}  // namespace
}  // namespace ctxpar::test
