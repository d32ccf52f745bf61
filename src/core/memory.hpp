// Tracked, aligned host buffers. Every large array in ctxpar lives in a Buffer<T>, so the peak
// bytes per rank in the trace count what the code allocated (resident set size is recorded too).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>

namespace ctxpar {

int64_t mem_current_bytes();
int64_t mem_peak_bytes();
void mem_reset_peak();            // peak := current
int64_t mem_rss_peak_bytes();     // the process's peak resident set (getrusage)

// Host memory this process may still use on its node: MemAvailable of /proc/meminfo, or less
// when the process's cgroup (v2 memory.max, or v1 memory.limit_in_bytes) leaves less; `source`
// says which. -1 when neither can be read.
int64_t node_available_bytes(std::string* source = nullptr);

// 64-byte aligned (page aligned from 64 KiB); fatal on failure. Blocks of 64 KiB and more are
// recycled by size class (memory.cpp says why): freeing one keeps it for the next allocation of
// its class, up to the peak of live tracked bytes; mem_current/peak count live bytes only.
void* tracked_alloc(size_t bytes);
void tracked_free(void* p, size_t bytes);
int64_t mem_cached_bytes();   // freed blocks held for reuse
void mem_release_cached();    // hands them back to the C library
bool mem_cache_enabled();     // false in AddressSanitizer builds (every free stays visible to it)

template <class T> class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n, bool zero = true) { resize(n, zero); }
  ~Buffer() { release(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) { release(); p_ = std::exchange(o.p_, nullptr); n_ = std::exchange(o.n_, 0); }
    return *this;
  }
  void resize(size_t n, bool zero = true) {
    release();
    if (n) { p_ = static_cast<T*>(tracked_alloc(n * sizeof(T))); n_ = n; }
    if (zero && n) std::memset(static_cast<void*>(p_), 0, n * sizeof(T));
  }
  void zero() { if (n_) std::memset(static_cast<void*>(p_), 0, n_ * sizeof(T)); }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  std::span<T> span() { return {p_, n_}; }
  std::span<const T> span() const { return {p_, n_}; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }

 private:
  void release() { if (p_) tracked_free(p_, n_ * sizeof(T)); p_ = nullptr; n_ = 0; }
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace ctxpar
