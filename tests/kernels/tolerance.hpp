// The tolerance policy of tests/README.md in one place: a fast fp32 result is accepted when its
// error against the fp64 reference is at most kFactor times the error of the naive fp32
// reference (kernels/ref templated on float) plus an absolute floor relative to the result's
// magnitude (covers entries the naive version happens to get exactly right, e.g. all-zero rows).
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace ctxpar::test {

constexpr double kFactor = 2.0;
constexpr double kAbsFloor = 1e-6;  // times max(1, max |reference|)

// Relaxation for backward gradients (dQ, dK): dS = P (dP - D_i) is the difference of two
// length-D dot products (dO.v_j and dO.O_i). When a row sees a single key, O_i = v_j exactly and
// the naive code, which forms both dot products in the same order, cancels to exactly 0, while a
// blocked GEMM rounds differently and leaves ~eps |dO||v| per row, summed over the rows of a key.
// The naive error is then 0 and says nothing; this factor widens only the absolute floor.
constexpr double kBwdCancellation = 8.0;

inline double tolerance(double naive_err, const std::vector<double>& ref, double floor_factor = 1.0) {
  double mag = 1.0;
  for (double x : ref)
    if (std::isfinite(x)) mag = std::max(mag, std::abs(x));
  return kFactor * naive_err + floor_factor * kAbsFloor * mag;
}

}  // namespace ctxpar::test
