// Internal helpers of the CUDA backend (not part of the API): error checks, launch checks,
// stream-ordered scratch memory, a warp/block reduction toolkit.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace ctxpar::cuda::detail {

// Throws std::runtime_error naming the failed call, file and line: kernels/ has no dependency on
// src/core (CTXPAR_CHECK), and an exception reaches the caller's error handling the same way.
[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error: ") + what + " -> " + cudaGetErrorName(e) + " (" +
                           cudaGetErrorString(e) + ") at " + file + ":" + std::to_string(line));
}

#define CTXPAR_CUDA_CHECK(expr)                                                                  \
  do {                                                                                           \
    const cudaError_t ctxpar_cuda_e_ = (expr);                                                   \
    if (ctxpar_cuda_e_ != cudaSuccess) ::ctxpar::cuda::detail::throw_cuda(ctxpar_cuda_e_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a <<<...>>> launch: configuration errors (too much shared memory, bad grid) surface here,
// not at the next synchronizing call.
#define CTXPAR_CUDA_LAUNCH_CHECK() CTXPAR_CUDA_CHECK(cudaGetLastError())

// Kernel launch and dynamic shared memory, spelled through macros so that the same sources also
// build for the CPU emulator of tests/gpu (CTXPAR_CUDA_EMU: kernels run as fibers on the host,
// see kernels/cuda/emu/emu.hpp). A kernel that is a template instance is passed as a variable
// (`auto kern = k<A, B>;`) because of the commas.
#if defined(CTXPAR_CUDA_EMU)
#define CTXPAR_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
  ::ctxpar::cuda::emu::launch((stream), kernel, dim3(grid), dim3(block), size_t(smem_bytes), __VA_ARGS__)
#define CTXPAR_DYNAMIC_SMEM(name) unsigned char* name = ::ctxpar::cuda::emu::dynamic_smem()
#else
#define CTXPAR_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
  kernel<<<(grid), (block), (smem_bytes), (stream)>>>(__VA_ARGS__)
#define CTXPAR_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

[[noreturn]] inline void throw_arg(const std::string& msg) { throw std::invalid_argument("ctxpar::cuda: " + msg); }

// Stream-ordered scratch allocation (cudaMallocAsync from the device's default pool): freed on the
// same stream after the kernels that use it, so no host synchronization is needed.
template <class T>
class Scratch {
 public:
  Scratch(int64_t n, cudaStream_t s) : n_(n), s_(s) {
    if (n > 0) CTXPAR_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), size_t(n) * sizeof(T), s));
  }
  ~Scratch() {
    if (p_) cudaFreeAsync(p_, s_);  // destructor: no throw; an error shows at the next checked call
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return p_; }
  int64_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  int64_t n_ = 0;
  cudaStream_t s_;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t imax64(int64_t a, int64_t b) { return a > b ? a : b; }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- device-side reductions ----
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ double warp_sum(double x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets the
// result. `red` is shared scratch of 32 elements; the function synchronizes before returning, so
// it may be called repeatedly with the same scratch.
template <class T>
__device__ __forceinline__ T block_sum(T x, T* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  x = warp_sum(x);
  if (lane == 0) red[warp] = x;
  __syncthreads();
  T total = T(0);
  for (int w = 0; w < nwarps; ++w) total += red[w];  // fixed order: the same bits every run
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_max(float x, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  x = warp_max(x);
  if (lane == 0) red[warp] = x;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < nwarps; ++w) m = fmaxf(m, red[w]);
  __syncthreads();
  return m;
}

}  // namespace ctxpar::cuda::detail
