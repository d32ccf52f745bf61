// The attention ops of kernels/ops.hpp: one entry point each, dispatched on the descriptor's
// device to the CPU kernels (cpu/attn_cpu.cpp) or the CUDA kernels (cuda/, in builds with
// CTXPAR_WITH_CUDA). The only file that chooses a backend.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "cpu/ops_cpu.hpp"
#include "ops.hpp"
#if defined(CTXPAR_WITH_CUDA)
#include "cuda/ops_cuda.hpp"
#endif

namespace ctxpar {

#if !defined(CTXPAR_WITH_CUDA)
namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw std::invalid_argument(std::string(op) + ": device = cuda, but this build has no CUDA backend "
                              "(configure with nvcc and NCCL under /usr/local/cuda, CTXPAR_CUDA=AUTO or ON)");
}
}  // namespace
#endif

void attn_fwd(const AttnParams& p) {
  if (p.device == Device::cpu) return cpu::attn_fwd(p);
#if defined(CTXPAR_WITH_CUDA)
  cuda::attn_fwd(p);
#else
  no_cuda("attn_fwd");
#endif
}

int64_t attn_query_block(int32_t D) { return cpu::attn_query_block(D); }

void fixed_to_float(const int64_t* fixed, float* x, int64_t n) {
  const double unit = std::ldexp(1.0, -kFixedShift);
  for (int64_t i = 0; i < n; ++i) x[i] = float(double(fixed[i]) * unit);
}

void attn_bwd(const AttnParams& p) {
  if (p.device == Device::cpu) return cpu::attn_bwd(p);
  if (p.dk_fixed || p.dv_fixed)
    throw std::invalid_argument("attn_bwd: exact dK/dV sums (dk_fixed, deterministic=true) are CPU only so far");
#if defined(CTXPAR_WITH_CUDA)
  cuda::attn_bwd(p);
#else
  no_cuda("attn_bwd");
#endif
}

void lse_merge(float* o, float* lse, const float* o_b, const float* lse_b, int64_t rows, int32_t H, int32_t D,
               Device device, Stream stream) {
  if (device == Device::cpu) return cpu::lse_merge(o, lse, o_b, lse_b, rows, H, D);
#if defined(CTXPAR_WITH_CUDA)
  cuda::lse_merge(o, lse, o_b, lse_b, rows, H, D, stream);
#else
  (void)stream;
  no_cuda("lse_merge");
#endif
}

// ---- memory ----
#if defined(CTXPAR_WITH_CUDA)
#define CTXPAR_ON_CUDA(op, call) return cuda::call
#else
#define CTXPAR_ON_CUDA(op, call) no_cuda(op)
#endif

void* device_alloc(size_t bytes, Device device, Stream stream) {
  if (bytes == 0) return nullptr;
  if (device == Device::cpu) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
  CTXPAR_ON_CUDA("device_alloc", device_alloc(bytes, stream));
}

Stream stream_create(Device device) {
  if (device == Device::cpu) return nullptr;
  CTXPAR_ON_CUDA("stream_create", stream_create());
}

void stream_destroy(Stream stream, Device device) {
  if (device == Device::cpu) return;
  CTXPAR_ON_CUDA("stream_destroy", stream_destroy(stream));
}

void stream_synchronize(Stream stream, Device device) {
  if (device == Device::cpu) return;
  CTXPAR_ON_CUDA("stream_synchronize", stream_synchronize(stream));
}

Event event_record(Stream stream, Device device) {
  if (device == Device::cpu) return nullptr;
  CTXPAR_ON_CUDA("event_record", event_record(stream));
}

double event_seconds(Event start, Event end, Device device) {
  if (device == Device::cpu) return 0;
  CTXPAR_ON_CUDA("event_seconds", event_seconds(start, end));
}

void event_destroy(Event e, Device device) {
  if (device == Device::cpu || !e) return;
  CTXPAR_ON_CUDA("event_destroy", event_destroy(e));
}

void device_free(void* p, Device device, Stream stream) {
  if (!p) return;
  if (device == Device::cpu) return std::free(p);
  CTXPAR_ON_CUDA("device_free", device_free(p, stream));
}

void device_copy(void* dst, const void* src, size_t bytes, Device device, Stream stream) {
  if (device == Device::cpu) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
  CTXPAR_ON_CUDA("device_copy", device_copy(dst, src, bytes, stream));
}

void copy_to_device(void* dst, const void* host_src, size_t bytes, Device device, Stream stream) {
  if (device == Device::cpu) return device_copy(dst, host_src, bytes, device, stream);
  CTXPAR_ON_CUDA("copy_to_device", copy_to_device(dst, host_src, bytes, stream));
}

void copy_to_host(void* host_dst, const void* src, size_t bytes, Device device, Stream stream) {
  if (device == Device::cpu) return device_copy(host_dst, src, bytes, device, stream);
  CTXPAR_ON_CUDA("copy_to_host", copy_to_host(host_dst, src, bytes, stream));
}

void device_zero(void* p, size_t bytes, Device device, Stream stream) {
  if (device == Device::cpu) {
    if (bytes) std::memset(p, 0, bytes);
    return;
  }
  CTXPAR_ON_CUDA("device_zero", device_zero(p, bytes, stream));
}

void device_copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                    Device device, Stream stream) {
  if (device == Device::cpu) {
    for (size_t i = 0; i < rows; ++i)
      if (width) std::memcpy(static_cast<char*>(dst) + i * dst_pitch, static_cast<const char*>(src) + i * src_pitch, width);
    return;
  }
  CTXPAR_ON_CUDA("device_copy_2d", device_copy_2d(dst, dst_pitch, src, src_pitch, width, rows, stream));
}

void add_f32_2d(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t width, int64_t rows,
                Device device, Stream stream) {
  if (device == Device::cpu) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < width; ++c) dst[r * dst_ld + c] += src[r * src_ld + c];
    return;
  }
  CTXPAR_ON_CUDA("add_f32_2d", add_f32_2d(dst, dst_ld, src, src_ld, width, rows, stream));
}

void fill_f32(float* x, float value, int64_t n, Device device, Stream stream) {
  if (device == Device::cpu) {
    for (int64_t i = 0; i < n; ++i) x[i] = value;
    return;
  }
  CTXPAR_ON_CUDA("fill_f32", fill_f32(x, value, n, stream));
}

void add_f32(float* dst, const float* src, int64_t n, Device device, Stream stream) {
  if (device == Device::cpu) {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    return;
  }
  CTXPAR_ON_CUDA("add_f32", add_f32(dst, src, n, stream));
}
#undef CTXPAR_ON_CUDA

}  // namespace ctxpar
