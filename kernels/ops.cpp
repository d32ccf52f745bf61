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

void attn_bwd_exact(const AttnParams& p) {
  if (p.device != Device::cpu)
    throw std::invalid_argument("attn_bwd_exact: exact dK/dV sums (dk_fixed) are CPU only so far");
  cpu::attn_bwd_exact(p);
}

void attn_bwd(const AttnParams& p) {
  if (p.device == Device::cpu) return cpu::attn_bwd(p);
  if (p.dk_fixed || p.dv_fixed) throw std::invalid_argument("attn_bwd: dk_fixed and dv_fixed are attn_bwd_exact's");
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

void stream_wait_event(Stream stream, Event e, Device device) {
  if (device == Device::cpu) return;
  CTXPAR_ON_CUDA("stream_wait_event", stream_wait_event(stream, e));
}

void stream_wait_stream(Stream waiter, Stream stream, Device device) {
  if (device == Device::cpu) return;
  const Event e = event_record(stream, device);
  stream_wait_event(waiter, e, device);
  event_destroy(e, device);
}

void range_push(const char* name, Device device) {
  if (device == Device::cpu) return;
  CTXPAR_ON_CUDA("range_push", range_push(name));
}

void range_pop(Device device) {
  if (device == Device::cpu) return;
  CTXPAR_ON_CUDA("range_pop", range_pop());
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

void* pinned_alloc(size_t bytes, Device device) {
  if (bytes == 0) return nullptr;
  if (device == Device::cpu) return device_alloc(bytes, device);
  CTXPAR_ON_CUDA("pinned_alloc", pinned_alloc(bytes));
}

void pinned_free(void* p, Device device) {
  if (!p) return;
  if (device == Device::cpu) return std::free(p);
  CTXPAR_ON_CUDA("pinned_free", pinned_free(p));
}

void copy_in_async(void* dst, const void* pinned_src, size_t bytes, Device device, Stream stream) {
  if (device == Device::cpu) {
    if (bytes) std::memcpy(dst, pinned_src, bytes);
    return;
  }
  CTXPAR_ON_CUDA("copy_in_async", copy_in_async(dst, pinned_src, bytes, stream));
}

void copy_out_async(void* pinned_dst, const void* src, size_t bytes, Device device, Stream stream) {
  if (device == Device::cpu) {
    if (bytes) std::memcpy(pinned_dst, src, bytes);
    return;
  }
  CTXPAR_ON_CUDA("copy_out_async", copy_out_async(pinned_dst, src, bytes, stream));
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
#pragma omp parallel for simd schedule(static) if (n > (int64_t(1) << 16))
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    return;
  }
  CTXPAR_ON_CUDA("add_f32", add_f32(dst, src, n, stream));
}

// ---- model ops on a call's device ----

void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps,
                 Device device, Stream stream) {
  if (device == Device::cpu) return rmsnorm_fwd(x, w, y, rstd, rows, dim, eps);
  CTXPAR_ON_CUDA("rmsnorm_fwd", rmsnorm_fwd(x, w, y, rstd, rows, dim, eps, stream));
}

void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                 int64_t rows, int64_t dim, Device device, Stream stream) {
  if (device == Device::cpu) return rmsnorm_bwd(dy, x, w, rstd, dx, dw, rows, dim);
  CTXPAR_ON_CUDA("rmsnorm_bwd", rmsnorm_bwd(dy, x, w, rstd, dx, dw, rows, dim, stream));
}

void rope_apply(float* x, int64_t rows, int32_t H, int32_t D, const float* cos_t, const float* sin_t, bool inverse,
                Device device, Stream stream) {
  if (device == Device::cpu) return rope_apply(x, rows, H, D, cos_t, sin_t, inverse);
  CTXPAR_ON_CUDA("rope_apply", rope_apply(x, rows, H, D, cos_t, sin_t, inverse, stream));
}

void swiglu_fwd(const float* g, const float* u, float* h, int64_t n, Device device, Stream stream) {
  if (device == Device::cpu) return swiglu_fwd(g, u, h, n);
  CTXPAR_ON_CUDA("swiglu_fwd", swiglu_fwd(g, u, h, n, stream));
}

void swiglu_bwd(const float* dh, const float* g, const float* u, float* dg, float* du, int64_t n, Device device,
                Stream stream) {
  if (device == Device::cpu) return swiglu_bwd(dh, g, u, dg, du, n);
  CTXPAR_ON_CUDA("swiglu_bwd", swiglu_bwd(dh, g, u, dg, du, n, stream));
}

void cross_entropy_fwd_bwd(const float* logits, const int32_t* labels, int64_t rows, int64_t V, float grad_scale,
                           float* dlogits, double* loss_sum, Device device, Stream stream) {
  if (device == Device::cpu) {
    *loss_sum = cross_entropy_fwd_bwd(logits, labels, rows, V, grad_scale, dlogits);
    return;
  }
  CTXPAR_ON_CUDA("cross_entropy_fwd_bwd", cross_entropy_fwd_bwd(logits, labels, rows, V, grad_scale, dlogits, loss_sum, stream));
}

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& hp, Device device,
                  Stream stream) {
  if (device == Device::cpu) return adamw_update(p, g, m, v, n, hp);
  CTXPAR_ON_CUDA("adamw_update", adamw_update(p, g, m, v, n, hp, stream));
}

double sum_squares(const float* x, int64_t n, Device device, Stream stream) {
  if (device == Device::cpu) return sum_squares(x, n);
  double* d = static_cast<double*>(device_alloc(sizeof(double), device, stream));
  double s = 0;
#if defined(CTXPAR_WITH_CUDA)
  cuda::sum_squares(x, n, d, stream);
#endif
  copy_to_host(&s, d, sizeof(double), device, stream);
  device_free(d, device, stream);
  return s;
}

void embedding_fwd(const float* emb, const int32_t* tokens, int64_t rows, int64_t dim, float* x, Device device,
                   Stream stream) {
  if (device == Device::cpu) return embedding_fwd(emb, tokens, rows, dim, x);
  CTXPAR_ON_CUDA("embedding_fwd", embedding_fwd(emb, tokens, rows, dim, x, stream));
}

void embedding_bwd(const float* dx, const int32_t* tokens, int64_t rows, int64_t dim, float* demb, Device device,
                   Stream stream) {
  if (device == Device::cpu) return embedding_bwd(dx, tokens, rows, dim, demb);
  CTXPAR_ON_CUDA("embedding_bwd", embedding_bwd(dx, tokens, rows, dim, demb, stream));
}

void f32_to_bf16(const float* x, uint16_t* y, int64_t n, Device device, Stream stream) {
  if (device == Device::cpu) {
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_bits(x[i]);
    return;
  }
  CTXPAR_ON_CUDA("f32_to_bf16", f32_to_bf16(x, reinterpret_cast<cuda::bf16*>(y), n, stream));
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, DType a_type,
          int64_t lda, const void* B, DType b_type, int64_t ldb, float beta, void* C, DType c_type, int64_t ldc,
          Device device, Stream stream) {
  if (device == Device::cpu) {
    if (a_type != DType::f32 || b_type != DType::f32 || c_type != DType::f32)
      throw std::invalid_argument("gemm: the CPU backend takes fp32 operands only");
    return sgemm(trans_a, trans_b, M, N, K, alpha, static_cast<const float*>(A), lda, static_cast<const float*>(B), ldb,
                 beta, static_cast<float*>(C), ldc);
  }
  CTXPAR_ON_CUDA("gemm", gemm(trans_a, trans_b, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type, ldc,
                              stream));
}
#undef CTXPAR_ON_CUDA

}  // namespace ctxpar
