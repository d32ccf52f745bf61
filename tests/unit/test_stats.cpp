// The small statistics every table relies on: the median and the sign test that decides which of
// two alternately timed variants is faster (bench infer).
#include <gtest/gtest.h>

#include <cmath>

#include "core/stats.hpp"

using ctxpar::median;
using ctxpar::sign_test_p;

TEST(Stats, MedianOddEvenEmpty) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_TRUE(std::isnan(median({})));
}

TEST(Stats, SignTestMatchesTheBinomialTails) {
  // n = 5: 5 of 5 -> 2/32; 4 of 5 -> 2*6/32.
  EXPECT_DOUBLE_EQ(sign_test_p(5, 5), 2.0 / 32);
  EXPECT_DOUBLE_EQ(sign_test_p(0, 5), 2.0 / 32);
  EXPECT_DOUBLE_EQ(sign_test_p(4, 5), 12.0 / 32);
  // n = 21: 15 of 21 -> 2*(1+21+210+1330+5985+20349+54264)/2^21 = 0.0784 (decides at 10%);
  // 14 of 21 -> 0.189 (does not).
  EXPECT_NEAR(sign_test_p(15, 21), 2.0 * 82160 / 2097152, 1e-12);
  EXPECT_GT(sign_test_p(14, 21), 0.10);
  EXPECT_LT(sign_test_p(15, 21), 0.10);
  // An even split is never significant; p never exceeds 1.
  EXPECT_DOUBLE_EQ(sign_test_p(10, 20), 1.0);
  EXPECT_DOUBLE_EQ(sign_test_p(0, 0), 1.0);
}
