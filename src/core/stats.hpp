// Small statistics shared by every table and trace: medians are what ctxpar reports (timings on
// shared machines are noisy; a median ignores the outliers a mean would carry).
#pragma once
#include <algorithm>
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

}  // namespace ctxpar
