#include "core/memory.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"
#include "ops.hpp"  // device_alloc (the device side of Buffer)

namespace ctxpar {

static std::atomic<int64_t> g_current{0};
static std::atomic<int64_t> g_peak{0};

static std::atomic<int64_t> g_device_current{0};
static std::atomic<int64_t> g_device_peak{0};

void* device_tracked_alloc(size_t bytes, Device device, Stream stream) {
  void* p = device_alloc(bytes, device, stream);
  const int64_t now = g_device_current.fetch_add(int64_t(bytes)) + int64_t(bytes);
  int64_t peak = g_device_peak.load();
  while (now > peak && !g_device_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}
void device_tracked_free(void* p, size_t bytes, Device device, Stream stream) {
  device_free(p, device, stream);
  g_device_current.fetch_sub(int64_t(bytes));
}
void device_tracked_zero(void* p, size_t bytes, Device device, Stream stream) { device_zero(p, bytes, device, stream); }
int64_t device_mem_current_bytes() { return g_device_current.load(); }
int64_t device_mem_peak_bytes() { return g_device_peak.load(); }

int64_t mem_current_bytes() { return g_current.load(); }
int64_t mem_peak_bytes() { return g_peak.load(); }
void mem_reset_peak() { g_peak.store(g_current.load()); }

int64_t mem_rss_peak_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

namespace {

// Freed large blocks are kept for the next allocation of the same size class instead of going
// back to the C library. Why: the strategies and the model allocate their buffers per call
// (per layer, per step); glibc serves such sizes with fresh mmap'ed pages, and every page is
// then faulted in on first touch — inside MPI when the buffer receives (measured here with
// OpenMPI's shared-memory transport: an all-to-all into a fresh 2 MiB buffer runs at 0.7–0.9
// GB/s against 6–8 GB/s into a touched one) or inside a kernel writing its output. The cache
// holds at most as many bytes as the peak of live tracked bytes so far, so a run's resident
// memory stays within twice its working set; blocks below kCacheMin go to malloc as before.
// Sanitizer builds (make debug) keep every free visible to AddressSanitizer: no cache there.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kCacheMin = SIZE_MAX;
#else
constexpr size_t kCacheMin = size_t(64) << 10;
#endif
constexpr size_t kPage = 4096;

// Size class: pages, rounded up to 1, 1.25, 1.5 or 1.75 times a power of two (at most 25%
// slack), so blocks of nearby sizes are reused for each other.
size_t size_class(size_t bytes) {
  size_t pages = (bytes + kPage - 1) / kPage;
  size_t p2 = 1;
  while (p2 * 2 <= pages) p2 *= 2;
  const size_t quarter = p2 >= 4 ? p2 / 4 : 1;
  const size_t c = (pages + quarter - 1) / quarter * quarter;
  return c * kPage;
}

struct BlockCache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free_blocks;  // size class -> cached blocks
  size_t cached_bytes = 0;
};
BlockCache& cache() {
  static BlockCache* c = new BlockCache;  // never destroyed: Buffers may outlive static destructors
  return *c;
}

}  // namespace

bool mem_cache_enabled() { return kCacheMin != SIZE_MAX; }

int64_t mem_cached_bytes() {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return int64_t(c.cached_bytes);
}

void mem_release_cached() {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [size, blocks] : c.free_blocks)
    for (void* p : blocks) std::free(p);
  c.free_blocks.clear();
  c.cached_bytes = 0;
}

void* tracked_alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes >= kCacheMin) {
    const size_t cls = size_class(bytes);
    BlockCache& c = cache();
    {
      std::lock_guard<std::mutex> lock(c.mu);
      auto it = c.free_blocks.find(cls);
      if (it != c.free_blocks.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        c.cached_bytes -= cls;
      }
    }
    if (!p) p = std::aligned_alloc(kPage, cls);
  } else {
    p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  if (!p)
    fail_run("out of memory: allocating " + fmt_bytes(double(bytes)) + " failed with " +
             fmt_bytes(double(g_current.load())) + " already in use by this rank; valid: a shorter seq, more ranks, "
             "or remat (--dry-run shows the plan's memory per rank)");
  const int64_t now = g_current.fetch_add(int64_t(bytes)) + int64_t(bytes);
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void tracked_free(void* p, size_t bytes) {
  g_current.fetch_sub(int64_t(bytes));
  if (bytes >= kCacheMin) {
    const size_t cls = size_class(bytes);
    BlockCache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cached_bytes + cls <= size_t(std::max<int64_t>(g_peak.load(), 0))) {
      c.free_blocks[cls].push_back(p);
      c.cached_bytes += cls;
      return;
    }
  }
  std::free(p);
}

}  // namespace ctxpar

namespace ctxpar {

namespace {

// "MemAvailable:   23456789 kB" → bytes; -1 when absent.
int64_t meminfo_bytes(const char* key) {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  int64_t out = -1;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') {
      long long kb = 0;
      if (std::sscanf(line + n + 1, "%lld", &kb) == 1) out = int64_t(kb) * 1024;
      break;
    }
  std::fclose(f);
  return out;
}

// One integer from a cgroup file; -1 for "max", absent or unreadable.
int64_t read_cgroup_value(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return -1;
  char buf[64] = {};
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  long long v = 0;
  if (!ok || std::strncmp(buf, "max", 3) == 0 || std::sscanf(buf, "%lld", &v) != 1) return -1;
  return int64_t(v);
}

// The least headroom (limit - usage) of this process's memory cgroup and its parents; -1: none.
int64_t cgroup_headroom_bytes() {
  std::FILE* f = std::fopen("/proc/self/cgroup", "r");
  if (!f) return -1;
  char line[1024];
  std::string v2, v1;
  while (std::fgets(line, sizeof line, f)) {
    std::string s(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (s.rfind("0::", 0) == 0) v2 = s.substr(3);
    const size_t c = s.find(":memory:");
    if (c != std::string::npos) v1 = s.substr(c + 8);
  }
  std::fclose(f);
  int64_t best = -1;
  const auto take = [&](int64_t limit, int64_t used) {
    // Limits of "unlimited" cgroup v1 are huge page-rounded numbers: ignore beyond 2^60.
    if (limit <= 0 || limit > (int64_t(1) << 60)) return;
    const int64_t room = std::max<int64_t>(0, limit - std::max<int64_t>(used, 0));
    best = best < 0 ? room : std::min(best, room);
  };
  for (std::string p = v2; !v2.empty(); p = p.substr(0, p.rfind('/'))) {
    const std::string dir = "/sys/fs/cgroup" + (p == "/" ? std::string() : p);
    take(read_cgroup_value(dir + "/memory.max"), read_cgroup_value(dir + "/memory.current"));
    if (p.empty() || p == "/") break;
  }
  if (!v1.empty()) {
    const std::string dir = "/sys/fs/cgroup/memory" + (v1 == "/" ? std::string() : v1);
    take(read_cgroup_value(dir + "/memory.limit_in_bytes"), read_cgroup_value(dir + "/memory.usage_in_bytes"));
  }
  return best;
}

}  // namespace

int64_t node_available_bytes(std::string* source) {
  const int64_t avail = meminfo_bytes("MemAvailable");
  const int64_t cg = cgroup_headroom_bytes();
  if (cg >= 0 && (avail < 0 || cg < avail)) {
    if (source) *source = "the memory cgroup's limit";
    return cg;
  }
  if (source) *source = "MemAvailable";
  return avail;
}

}  // namespace ctxpar
