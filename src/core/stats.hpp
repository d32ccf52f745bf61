// Small statistics shared by every table and trace: medians are what ctxpar reports (timings on
// shared machines are noisy; a median ignores the outliers a mean would carry).
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
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

}  // namespace ctxpar
