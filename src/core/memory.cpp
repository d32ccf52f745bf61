#include "core/memory.hpp"

#include <sys/resource.h>

#include <atomic>
#include <cstdlib>

#include "core/error.hpp"

namespace ctxpar {

static std::atomic<int64_t> g_current{0};
static std::atomic<int64_t> g_peak{0};

int64_t mem_current_bytes() { return g_current.load(); }
int64_t mem_peak_bytes() { return g_peak.load(); }
void mem_reset_peak() { g_peak.store(g_current.load()); }

int64_t mem_rss_peak_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

void* tracked_alloc(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  CTXPAR_CHECK(p != nullptr, "out of memory allocating " << bytes << " bytes (current "
                                                          << g_current.load() << " bytes)");
  const int64_t now = g_current.fetch_add(int64_t(bytes)) + int64_t(bytes);
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void tracked_free(void* p, size_t bytes) {
  std::free(p);
  g_current.fetch_sub(int64_t(bytes));
}

}  // namespace ctxpar
