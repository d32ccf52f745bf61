// Small statistics shared by every table and trace: medians are what ctxpar reports (timings on
// shared machines are noisy; a median ignores the outliers a mean would carry).
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace ctxpar {

// Median (mean of the two middle values for an even count); NaN for an empty vector (no data).
inline double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Two-sided p-value of the sign test: the chance of a split at least as uneven as `wins` of `n`
// paired comparisons when neither side is really better (each pair a fair coin).
inline double sign_test_p(int wins, int n) {
  if (n <= 0) return 1.0;
  const int k = std::min(wins, n - wins);
  double tail = 0, c = 1;  // c = binomial(n, i)
  for (int i = 0; i <= k; ++i) {
    tail += c;
    c = c * double(n - i) / double(i + 1);
  }
  return std::min(1.0, 2 * tail / std::ldexp(1.0, n));
}

// "" when every value of x (dims: its shape, row-major) is finite, else the first non-finite one
// and its index: "inf at [12, 3, 0]". For a tensor about to be written: a NaN or Inf never reaches
// an output file unannounced.
inline std::string first_non_finite(const float* x, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) continue;
    std::string idx;
    int64_t rem = i;
    for (size_t d = dims.size(); d-- > 0;) {
      idx = std::to_string(rem % dims[d]) + (idx.empty() ? "" : ", ") + idx;
      rem /= dims[d];
    }
    return std::string(std::isnan(x[i]) ? "nan" : x[i] > 0 ? "inf" : "-inf") + " at [" + idx + "]";
  }
  return "";
}

}  // namespace ctxpar
