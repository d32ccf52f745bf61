// Model ops of ops_cuda.hpp on the device: RMSNorm, RoPE, SwiGLU, cross-entropy, AdamW, sum of
// squares, the embedding, bf16 <-> fp32. The formulas are those of kernels/cpu/model_cpu.cpp (same order of
// operations where it matters, e.g. AdamW's constants are derived on the host exactly as the CPU
// op derives them). Reductions: a row per block (RMSNorm, cross-entropy) or per-block partials
// summed in a fixed order by a second kernel (RMSNorm dw, losses, sum of squares), so results do
// not depend on scheduling.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <cmath>
#include <string>

#include "cuda/common.cuh"
#include "cuda/ops_cuda.hpp"

namespace ctxpar::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements.
unsigned grid_for(int64_t n, int per_block = kThreads) {
  const int64_t b = ceil_div(n, per_block);
  return unsigned(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

unsigned row_grid(int64_t rows, const char* op) {
  if (rows > INT32_MAX) throw_arg(std::string(op) + ": too many rows for one launch");
  return unsigned(rows);
}

// ---- RMSNorm ----

__global__ void __launch_bounds__(kThreads)
    rmsnorm_fwd_kernel(const float* x, const float* w, float* y, float* rstd, int64_t dim, float eps) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) ss += xr[j] * xr[j];
  ss = block_sum(ss, red);
  const float rs = 1.0f / sqrtf(ss / float(dim) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  float* yr = y + r * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = xr[j] * rs * w[j];
}

// dx += rstd (dy w - xh c), c = mean_j(dy_j w_j xh_j); per-block partial dw in part[block][dim]
// (thread-owned columns: no races). Rows r = block, block + gridDim, ...
__global__ void __launch_bounds__(kThreads)
    rmsnorm_bwd_kernel(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* part,
                       int64_t rows, int64_t dim) {
  __shared__ float red[32];
  float* pb = part + int64_t(blockIdx.x) * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) pb[j] = 0.f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    const float* dyr = dy + r * dim;
    float* dxr = dx + r * dim;
    const float rs = rstd[r];
    float dot = 0.f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dot += dyr[j] * w[j] * xr[j];
    dot = block_sum(dot, red) * rs;
    const float c = dot / float(dim);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const float xh = xr[j] * rs;
      dxr[j] += rs * (dyr[j] * w[j] - xh * c);
      pb[j] += dyr[j] * xh;
    }
  }
}

// dw[j] += sum_b part[b][j], b in order.
__global__ void column_sum_kernel(const float* part, int nb, float* dw, int64_t dim) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < dim; j += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int b = 0; b < nb; ++b) s += part[int64_t(b) * dim + j];
    dw[j] += s;
  }
}

// ---- RoPE ----

__global__ void rope_table_kernel(const int64_t* pos, int64_t rows, int32_t half, const double* inv_freq, float* cos_t,
                                  float* sin_t) {
  const int64_t n = rows * half;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / half;
    const int32_t i = int32_t(e % half);
    const double a = double(pos[r]) * inv_freq[i];
    double s, c;
    sincos(a, &s, &c);
    cos_t[e] = float(c);
    sin_t[e] = float(s);
  }
}

template <class T>
__device__ __forceinline__ float to_f(T x) {
  return float(x);
}
template <>
__device__ __forceinline__ float to_f<bf16>(bf16 x) {
  return __bfloat162float(x);
}
template <class T>
__device__ __forceinline__ T from_f(float x) {
  return T(x);
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// One thread per (row, head, i < D/2): (a, b) = (x_i, x_{i+D/2}) -> (a c - b s, a s + b c).
template <class T>
__global__ void rope_apply_kernel(T* x, int64_t rows, int32_t H, int32_t D, const float* cos_t, const float* sin_t,
                                  float sgn) {
  const int32_t half = D / 2;
  const int64_t n = rows * H * half;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int32_t i = int32_t(e % half);
    const int64_t rh = e / half;  // row * H + head
    const int64_t r = rh / H;
    T* xa = x + rh * D;
    const float c = cos_t[r * half + i], s = sgn * sin_t[r * half + i];
    const float a = to_f(xa[i]), b = to_f(xa[i + half]);
    xa[i] = from_f<T>(a * c - b * s);
    xa[i + half] = from_f<T>(a * s + b * c);
  }
}

// ---- SwiGLU ----

__global__ void swiglu_fwd_kernel(const float* g, const float* u, float* h, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float s = 1.0f / (1.0f + expf(-g[i]));
    h[i] = g[i] * s * u[i];
  }
}

__global__ void swiglu_bwd_kernel(const float* dh, const float* g, const float* u, float* dg, float* du, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float s = 1.0f / (1.0f + expf(-g[i]));
    const float gi = g[i], d = dh[i];
    dg[i] = d * u[i] * (s * (1.0f + gi * (1.0f - s)));
    du[i] = d * gi * s;
  }
}

// ---- cross-entropy: one block per row ----

__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(const float* logits, const int32_t* labels, int64_t V, float grad_scale, float* dlogits,
                         double* row_loss) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* z = logits + r * V;
  float* dz = dlogits + r * V;
  const int32_t y = labels[r];
  if (y < 0) {  // ignored row: zero gradient, no loss (uniform over the block)
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dz[j] = 0.f;
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    return;
  }
  const float zy = z[y];  // read before any thread writes dz (which may alias z): the block
                          // reductions below synchronize before the first write
  // per-thread online max / sum, then combined over the block
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = z[j];
    if (v > m) {
      s = s * expf(m - v) + 1.f;
      m = v;
    } else if (v != -INFINITY) {  // (-inf) - (-inf) would be NaN
      s += expf(v - m);
    }
  }
  const float gm = block_max(m, red);
  s = m == -INFINITY ? 0.f : s * expf(m - gm);
  s = block_sum(s, red);
  const float lse = gm + logf(s);
  if (threadIdx.x == 0) row_loss[r] = double(lse) - double(zy);
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    float d = grad_scale * expf(z[j] - lse);
    if (j == y) d -= grad_scale;
    dz[j] = d;
  }
}

// *out = sum of x[0..n) in double, one block, fixed order per thread and fixed tree.
__global__ void __launch_bounds__(1024) sum_doubles_kernel(const double* x, int64_t n, double* out) {
  __shared__ double red[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *out = s;
}

// ---- AdamW ----

struct AdamWConsts {
  float b1, b2, bc2_sqrt, decay, step_size, eps, gs;
};

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamWConsts k) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = k.gs * g[i];
    const float mi = k.b1 * m[i] + (1.0f - k.b1) * gi;
    const float vi = k.b2 * v[i] + (1.0f - k.b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
    p[i] = p[i] * k.decay - k.step_size * mi / denom;
  }
}

// ---- sum of squares: per-block partials (double), then sum_doubles_kernel ----

__global__ void __launch_bounds__(kThreads) sum_squares_kernel(const float* x, int64_t n, double* part) {
  __shared__ double red[32];
  double s = 0.0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    s += double(x[i]) * double(x[i]);
  s = block_sum(s, red);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// ---- conversions ----

__global__ void f32_to_bf16_kernel(const float* x, bf16* y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}
__global__ void bf16_to_f32_kernel(const bf16* x, float* y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

// ---- embedding ----

// x[r] = emb[tokens[r]], one element per thread.
__global__ void embedding_fwd_kernel(const float* emb, const int32_t* tokens, int64_t rows, int64_t dim, float* x) {
  const int64_t n = rows * dim;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / dim, j = e - r * dim;
    x[e] = emb[int64_t(tokens[r]) * dim + j];
  }
}

// demb[tokens[r]] += dx[r]: a thread owns column j and adds the rows in order (a token may
// repeat; no atomics, so the sum's order is the CPU op's and the result the same bits).
__global__ void embedding_bwd_kernel(const float* dx, const int32_t* tokens, int64_t rows, int64_t dim, float* demb) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < dim; j += int64_t(gridDim.x) * blockDim.x)
    for (int64_t r = 0; r < rows; ++r) demb[int64_t(tokens[r]) * dim + j] += dx[r * dim + j];
}

// ---- memory ----

__global__ void add_f32_kernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

__global__ void fill_f32_kernel(float* x, float value, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

__global__ void add_f32_2d_kernel(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t width,
                                  int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i - r * width;
    dst[r * dst_ld + c] += src[r * src_ld + c];
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps,
                 cudaStream_t stream) {
  if (rows == 0) return;
  CTXPAR_LAUNCH(rmsnorm_fwd_kernel, row_grid(rows, "rmsnorm_fwd"), kThreads, 0, stream, x, w, y, rstd, dim, eps);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                 int64_t rows, int64_t dim, cudaStream_t stream) {
  if (rows == 0 || dim == 0) return;
  // Enough blocks to fill a GPU; few enough that the partials stay small (nb x dim floats).
  const int nb = int(rows < 256 ? rows : 256);
  Scratch<float> part(int64_t(nb) * dim, stream);
  CTXPAR_LAUNCH(rmsnorm_bwd_kernel, unsigned(nb), kThreads, 0, stream, dy, x, w, rstd, dx, part.get(), rows, dim);
  CTXPAR_CUDA_LAUNCH_CHECK();
  CTXPAR_LAUNCH(column_sum_kernel, grid_for(dim), kThreads, 0, stream, part.get(), nb, dw, dim);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void rope_table(const int64_t* pos, int64_t rows, int32_t D, const double* inv_freq, float* cos_t, float* sin_t,
                cudaStream_t stream) {
  const int32_t half = D / 2;
  if (rows == 0 || half == 0) return;
  CTXPAR_LAUNCH(rope_table_kernel, grid_for(rows * half), kThreads, 0, stream, pos, rows, half, inv_freq, cos_t, sin_t);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

namespace {
template <class T>
void rope_apply_launch(T* x, int64_t rows, int32_t H, int32_t D, const float* cos_t, const float* sin_t, bool inverse,
                       cudaStream_t stream) {
  if (D % 2 != 0) throw_arg("rope_apply: D must be even");
  if (rows == 0 || H == 0 || D == 0) return;
  auto kern = rope_apply_kernel<T>;
  CTXPAR_LAUNCH(kern, grid_for(rows * H * (D / 2)), kThreads, 0, stream, x, rows, H, D, cos_t, sin_t,
                inverse ? -1.0f : 1.0f);
  CTXPAR_CUDA_LAUNCH_CHECK();
}
}  // namespace

void rope_apply(float* x, int64_t rows, int32_t H, int32_t D, const float* cos_t, const float* sin_t, bool inverse,
                cudaStream_t stream) {
  rope_apply_launch(x, rows, H, D, cos_t, sin_t, inverse, stream);
}

void rope_apply(bf16* x, int64_t rows, int32_t H, int32_t D, const float* cos_t, const float* sin_t, bool inverse,
                cudaStream_t stream) {
  rope_apply_launch(x, rows, H, D, cos_t, sin_t, inverse, stream);
}

void swiglu_fwd(const float* g, const float* u, float* h, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  CTXPAR_LAUNCH(swiglu_fwd_kernel, grid_for(n), kThreads, 0, stream, g, u, h, n);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void swiglu_bwd(const float* dh, const float* g, const float* u, float* dg, float* du, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  CTXPAR_LAUNCH(swiglu_bwd_kernel, grid_for(n), kThreads, 0, stream, dh, g, u, dg, du, n);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void cross_entropy_fwd_bwd(const float* logits, const int32_t* labels, int64_t rows, int64_t V, float grad_scale,
                           float* dlogits, double* loss_sum, cudaStream_t stream) {
  if (rows == 0) {
    CTXPAR_CUDA_CHECK(cudaMemsetAsync(loss_sum, 0, sizeof(double), stream));
    return;
  }
  Scratch<double> row_loss(rows, stream);
  CTXPAR_LAUNCH(cross_entropy_kernel, row_grid(rows, "cross_entropy_fwd_bwd"), kThreads, 0, stream, logits, labels, V,
                grad_scale, dlogits, row_loss.get());
  CTXPAR_CUDA_LAUNCH_CHECK();
  CTXPAR_LAUNCH(sum_doubles_kernel, 1u, 1024, 0, stream, row_loss.get(), rows, loss_sum);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& hp, cudaStream_t stream) {
  if (n == 0) return;
  // Exactly the CPU op's constants (kernels/cpu/model_cpu.cpp).
  AdamWConsts k;
  k.b1 = float(hp.beta1);
  k.b2 = float(hp.beta2);
  const float bc1 = float(1 - std::pow(hp.beta1, double(hp.step)));
  k.bc2_sqrt = std::sqrt(float(1 - std::pow(hp.beta2, double(hp.step))));
  k.decay = 1.0f - float(hp.lr) * float(hp.weight_decay);
  k.step_size = float(hp.lr) / bc1;
  k.eps = float(hp.eps);
  k.gs = float(hp.grad_scale);
  CTXPAR_LAUNCH(adamw_kernel, grid_for(n), kThreads, 0, stream, p, g, m, v, n, k);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void sum_squares(const float* x, int64_t n, double* out, cudaStream_t stream) {
  if (n == 0) {
    CTXPAR_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  const unsigned nb = grid_for(n) < 1024 ? grid_for(n) : 1024;
  Scratch<double> part(nb, stream);
  CTXPAR_LAUNCH(sum_squares_kernel, nb, kThreads, 0, stream, x, n, part.get());
  CTXPAR_CUDA_LAUNCH_CHECK();
  CTXPAR_LAUNCH(sum_doubles_kernel, 1u, 1024, 0, stream, part.get(), int64_t(nb), out);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void embedding_fwd(const float* emb, const int32_t* tokens, int64_t rows, int64_t dim, float* x, cudaStream_t stream) {
  if (rows == 0 || dim == 0) return;
  CTXPAR_LAUNCH(embedding_fwd_kernel, grid_for(rows * dim), kThreads, 0, stream, emb, tokens, rows, dim, x);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void embedding_bwd(const float* dx, const int32_t* tokens, int64_t rows, int64_t dim, float* demb,
                   cudaStream_t stream) {
  if (rows == 0 || dim == 0) return;
  CTXPAR_LAUNCH(embedding_bwd_kernel, grid_for(dim), kThreads, 0, stream, dx, tokens, rows, dim, demb);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void f32_to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  CTXPAR_LAUNCH(f32_to_bf16_kernel, grid_for(n), kThreads, 0, stream, x, y, n);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void bf16_to_f32(const bf16* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  CTXPAR_LAUNCH(bf16_to_f32_kernel, grid_for(n), kThreads, 0, stream, x, y, n);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

// ---- memory (ops.hpp "memory of a call's device") ----

cudaStream_t stream_create() {
  cudaStream_t s = nullptr;
  CTXPAR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void stream_destroy(cudaStream_t stream) {
  if (stream) CTXPAR_CUDA_CHECK(cudaStreamDestroy(stream));
}

void stream_synchronize(cudaStream_t stream) { CTXPAR_CUDA_CHECK(cudaStreamSynchronize(stream)); }

cudaEvent_t event_record(cudaStream_t stream) {
  cudaEvent_t e = nullptr;
  CTXPAR_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  CTXPAR_CUDA_CHECK(cudaEventRecord(e, stream));
  return e;
}

double event_seconds(cudaEvent_t start, cudaEvent_t end) {
  CTXPAR_CUDA_CHECK(cudaEventSynchronize(end));
  float ms = 0;
  CTXPAR_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
  return double(ms) * 1e-3;
}

void event_destroy(cudaEvent_t e) { cudaEventDestroy(e); }

void stream_wait_event(cudaStream_t stream, cudaEvent_t e) { CTXPAR_CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0)); }

void range_push(const char* name) { nvtxRangePushA(name); }

void range_pop() { nvtxRangePop(); }

void* device_alloc(size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  CTXPAR_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
  return p;
}

void device_free(void* p, cudaStream_t stream) {
  if (p) CTXPAR_CUDA_CHECK(cudaFreeAsync(p, stream));
}

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes) CTXPAR_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}

void pinned_free(void* p) {
  if (p) CTXPAR_CUDA_CHECK(cudaFreeHost(p));
}

void copy_in_async(void* dst, const void* pinned_src, size_t bytes, cudaStream_t stream) {
  if (bytes) CTXPAR_CUDA_CHECK(cudaMemcpyAsync(dst, pinned_src, bytes, cudaMemcpyHostToDevice, stream));
}

void copy_out_async(void* pinned_dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes) CTXPAR_CUDA_CHECK(cudaMemcpyAsync(pinned_dst, src, bytes, cudaMemcpyDeviceToHost, stream));
}

void device_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes) CTXPAR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

void copy_to_device(void* dst, const void* host_src, size_t bytes, cudaStream_t stream) {
  // From pageable host memory the runtime stages the source before it returns, so the caller may
  // release it at once (the contract of ops.hpp).
  if (bytes) CTXPAR_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream));
}

void copy_to_host(void* host_dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (!bytes) return;
  CTXPAR_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  CTXPAR_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void device_zero(void* p, size_t bytes, cudaStream_t stream) {
  if (bytes) CTXPAR_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
}

void device_copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                    cudaStream_t stream) {
  if (width && rows)
    CTXPAR_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, stream));
}

void add_f32_2d(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t width, int64_t rows,
                cudaStream_t stream) {
  const int64_t n = width * rows;
  if (n <= 0) return;
  CTXPAR_LAUNCH(add_f32_2d_kernel, grid_for(n), kThreads, 0, stream, dst, dst_ld, src, src_ld, width, n);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void fill_f32(float* x, float value, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  CTXPAR_LAUNCH(fill_f32_kernel, grid_for(n), kThreads, 0, stream, x, value, n);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void add_f32(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  CTXPAR_LAUNCH(add_f32_kernel, grid_for(n), kThreads, 0, stream, dst, src, n);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

}  // namespace ctxpar::cuda
