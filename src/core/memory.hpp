// Tracked, aligned host buffers. Every large array in ctxpar lives in a Buffer<T>, so the peak
// bytes per rank in the trace count what the code allocated (resident set size is recorded too).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "dtype.hpp"  // Device, Stream

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

// Memory on a device other than the CPU (Buffer below; kernels/ops.hpp's device_alloc, ordered on
// `stream`), counted apart from the host's: the device's bytes in use and their peak.
void* device_tracked_alloc(size_t bytes, Device device, Stream stream);
void device_tracked_free(void* p, size_t bytes, Device device, Stream stream);
void device_tracked_zero(void* p, size_t bytes, Device device, Stream stream);
int64_t device_mem_current_bytes();
int64_t device_mem_peak_bytes();

// An array on the host (the default) or on a device: Buffer(n, zero, device, stream) lives in
// that device's memory, allocated, zeroed and released in order on `stream` (Device::cuda), and
// only its pointer is usable on the host (operator[], span() and begin() are for host buffers).
template <class T> class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n, bool zero = true) { resize(n, zero); }
  Buffer(size_t n, bool zero, Device device, Stream stream) : device_(device), stream_(stream) { resize(n, zero); }
  ~Buffer() { release(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), device_(o.device_), stream_(o.stream_) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      device_ = o.device_;
      stream_ = o.stream_;
    }
    return *this;
  }
  void resize(size_t n, bool zero = true) {
    release();
    if (!n) return;
    p_ = static_cast<T*>(on_host() ? tracked_alloc(n * sizeof(T)) : device_tracked_alloc(n * sizeof(T), device_, stream_));
    n_ = n;
    if (zero) this->zero();
  }
  void zero() {
    if (!n_) return;
    if (on_host()) std::memset(static_cast<void*>(p_), 0, n_ * sizeof(T));
    else device_tracked_zero(p_, n_ * sizeof(T), device_, stream_);
  }
  Device device() const { return device_; }
  Stream stream() const { return stream_; }
  bool on_host() const { return device_ == Device::cpu; }
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
  void release() {
    if (p_) {
      if (on_host()) tracked_free(p_, n_ * sizeof(T));
      else device_tracked_free(p_, n_ * sizeof(T), device_, stream_);
    }
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
  Device device_ = Device::cpu;
  Stream stream_ = nullptr;
};

}  // namespace ctxpar
