// Tracked buffers: live-byte accounting and the reuse of freed large blocks (core/memory.cpp).
#include <gtest/gtest.h>

#include <cstdint>

#include "core/memory.hpp"

using namespace ctxpar;

TEST(Memory, LiveBytesCountOnlyWhatIsAllocated) {
  mem_release_cached();
  const int64_t before = mem_current_bytes();
  {
    Buffer<float> a(1000), b(size_t(1) << 20);
    EXPECT_EQ(mem_current_bytes() - before, int64_t(4 * (1000 + (1 << 20))));
    EXPECT_GE(mem_peak_bytes(), mem_current_bytes());
  }
  EXPECT_EQ(mem_current_bytes(), before);  // freed blocks held for reuse are not live
}

TEST(Memory, FreedLargeBlockIsReusedForTheSameSizeClass) {
  if (!mem_cache_enabled()) GTEST_SKIP() << "AddressSanitizer build: no block cache";
  mem_release_cached();
  void* first = nullptr;
  {
    Buffer<float> big(size_t(1) << 20, false);  // 4 MiB: cached when freed
    first = big.data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 4096, 0u);  // page aligned
    big.data()[0] = 1.f;
  }
  EXPECT_GE(mem_cached_bytes(), int64_t(4) << 20);
  {
    Buffer<float> again((size_t(1) << 20) - 100, false);  // same class (within 25%)
    EXPECT_EQ(static_cast<void*>(again.data()), first);
    EXPECT_EQ(mem_cached_bytes(), 0);
    Buffer<float> zeroed(size_t(1) << 18);  // zero = true still zeroes a recycled block
    for (size_t i = 0; i < zeroed.size(); i += 4096) EXPECT_EQ(zeroed[i], 0.f);
  }
  {
    Buffer<float> other(size_t(1) << 22, false);  // a different class: a new block
    EXPECT_NE(static_cast<void*>(other.data()), first);
  }
  mem_release_cached();
  EXPECT_EQ(mem_cached_bytes(), 0);
}

TEST(Memory, CacheNeverHoldsMoreThanThePeakOfLiveBytes) {
  mem_release_cached();
  mem_reset_peak();
  for (int i = 0; i < 50; ++i) {
    Buffer<float> b(size_t(1 + i) << 16, false);  // growing sizes: each freed into its own class
  }
  EXPECT_LE(mem_cached_bytes(), mem_peak_bytes() + (int64_t(1) << 20));  // + one class's rounding
  mem_release_cached();
}
