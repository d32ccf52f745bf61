// The CUDA backend of kernels/ops.hpp (docs/DESIGN.md §1 C12): the same ops with the same semantics, on
// device pointers, asynchronous on a caller-given stream (0 = the legacy default stream).
// Implementations: attn_fwd.cu, attn_bwd.cu (flash attention on bf16 tensor cores),
// gemm_cublaslt.cu (cuBLASLt), elementwise.cu (model ops). kernels/README.md, "CUDA kernels",
// describes the design and what has been verified.
//
// Precision contract
//  - Attention (AttnParams with dtype bf16, kernels/attn_params.hpp): Q, K, V and dO in bf16;
//    every product accumulated in fp32; softmax statistics in fp32; O written in fp32 (so that a
//    ring's lse_merge of partial results stays fp32; convert with f32_to_bf16 where a bf16 O is
//    wanted); LSE fp32 (natural log); dQ, dK, dV fp32, ACCUMULATED. P and dS are rounded to bf16
//    before they enter the tensor-core products (as in FlashAttention-2); tests/gpu states the
//    tolerance this is held to.
//  - Model ops: fp32 in, fp32 out, as the CPU ops (rope_apply also has a bf16 overload).
//  - GEMM: bf16 x bf16 -> bf16 or fp32, fp32 x fp32 -> fp32; always fp32 accumulation.
//
// Errors: invalid arguments throw std::invalid_argument, CUDA/cuBLASLt failures
// std::runtime_error (naming the call). Kernels are launched asynchronously; an error inside a
// kernel surfaces at the next synchronizing call.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "attn_params.hpp"
#include "dtype_cuda.hpp"
#include "ops.hpp"  // AdamWStep

namespace ctxpar::cuda {

using bf16 = __nv_bfloat16;


// ---- devices ----
// Number of CUDA devices; 0 when the driver/runtime reports an error (no GPU, no driver) — the
// tests skip and `device=cuda` runs fail with a message in that case.
int device_count();
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" for the current device.
const char* device_description();

// ---- attention ----
// The CUDA backend of ctxpar::attn_fwd / attn_bwd (kernels/ops.hpp dispatches here for
// Device::cuda): the descriptor's pointers are device memory (positions and document ids too),
// dtype bf16, asynchronous on p.stream. Requirements: D % 8 == 0 and D <= 256 (the kernels are
// instantiated for padded head dims 32, 64, 128, 256: D = 64 / 128 / 256 run without padding,
// other D on the next size up); H_q % H_kv == 0; every tensor pointer 16-byte aligned (cudaMalloc
// gives 256) and every input row stride (q_stride, k_stride, v_stride, dout_stride) a multiple of 8. p.stats, when set (a HOST pointer), is filled like the CPU path's, counted on this
// backend's tiles (forward: 64 query rows x 64 keys, 32 keys for D > 128; backward: 32 or 64
// query rows x 64 keys, 32 for D > 128; pairs summed over query heads), and synchronizes the
// stream to do so.

// O and LSE of softmax(scale Q K^T + mask) V (flash forward, online softmax in fp32). Query tiles
// of 64 rows x key tiles of 64 keys (32 for D > 128) with no visible pair are skipped; rows that
// see no key get O = 0, LSE = -inf.
void attn_fwd(const AttnParams& p);

// dQ +=, dK +=, dV += (FlashAttention-2 backward from LSE: P recomputed, D_i = dO_i . O_i).
// Under GQA/MQA dK/dV sum over the query heads of a group. dQ (and dK/dV when H_q > H_kv) are
// added with fp32 atomics, so the rounding of those sums depends on scheduling (not
// bit-reproducible run to run); for H_q == H_kv dK/dV are added in a fixed order.
void attn_bwd(const AttnParams& p);

// Merges a partial result (o_b, lse_b) over a disjoint key set into (o, lse), in place; exactly
// the formula of ctxpar::lse_merge (ops.hpp): -inf rows exact, never NaN. o, o_b [rows, H, D]
// fp32; lse, lse_b [rows, H] fp32 (device).
void lse_merge(float* o, float* lse, const float* o_b, const float* lse_b, int64_t rows, int32_t H, int32_t D,
               cudaStream_t stream = nullptr);

// Internal check of the tensor-core fragment helpers, for tests/gpu only: one warp computes, for
// 16x16 row-major fp32-exact bf16 inputs,
//   c[0]  = A  B^T          (A [16][32] row-major, Bt [16][32] row-major: the S = Q K^T path)
//   c[1]  = At^T Bk         (At [32][16] = A stored k-major, Bk [32][16]: the dQ = dS K path)
//   c[2]  = bf16(c[0]) Bk2  (the accumulator reused as A operand, Bk2 [16][16]: the O += P V path)
// All device pointers; c is [3][16][16] fp32. With small-integer inputs every product is exact,
// so the test compares c with a host GEMM for equality.
void mma_selftest(const bf16* A, const bf16* Bt, const bf16* At, const bf16* Bk, const bf16* Bk2, float* c,
                  cudaStream_t stream = nullptr);

// ---- GEMM (cuBLASLt) ----
// Row-major, as ctxpar::sgemm: C = alpha * op(A) op(B) + beta * C, op = transpose when trans_*;
// A is [M,K] (or [K,M] when trans_a), B is [K,N] (or [N,K]); leading dimensions in elements.
// One cuBLASLt handle and a 32 MiB workspace per device, and one cached plan (layouts and
// the heuristic's algorithm) per distinct call shape; thread-safe.
// Generic entry: (A, B, C) types (f32, f32, f32), (bf16, bf16, bf16) or (bf16, bf16, f32).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, DType a_type,
          int64_t lda, const void* B, DType b_type, int64_t ldb, float beta, void* C, DType c_type, int64_t ldc,
          cudaStream_t stream = nullptr);
// fp32 in/out (exact fp32 products: CUBLAS_COMPUTE_32F, no TF32).
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc, cudaStream_t stream = nullptr);
// bf16 in/out, fp32 accumulation (C rounded to bf16 once).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, bf16* C, int64_t ldc, cudaStream_t stream = nullptr);
// bf16 in, fp32 out (e.g. weight gradients accumulated with beta = 1).
void gemm_bf16_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                   int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc,
                   cudaStream_t stream = nullptr);
// "cuBLASLt <version>" (provenance).
const char* gemm_library_name();
// Destroys the cached handles, plans and workspaces (all devices). Optional; for tests and clean
// shutdown before cudaDeviceReset.
void gemm_release();

// ---- model ops (ops.hpp "model ops (training)"), fp32 device arrays ----
// Same formulas and the same accumulate/overwrite semantics as the CPU ops; reductions run in
// fp32 in a fixed order (results are reproducible run to run).
void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps,
                 cudaStream_t stream = nullptr);
// dx += ..., dw += sum over rows (per-block partial sums, then a fixed-order sum: the same bits every run).
void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                 int64_t rows, int64_t dim, cudaStream_t stream = nullptr);
// cos/sin tables [rows, D/2] of pos[r] * inv_freq[i], computed in double on the device (pos and
// inv_freq device arrays; inv_freq from ctxpar::rope_inv_freq, copied to the device).
void rope_table(const int64_t* pos, int64_t rows, int32_t D, const double* inv_freq, float* cos_t, float* sin_t,
                cudaStream_t stream = nullptr);
// x [rows, H, D] rotated in place, "rotate half" pairing (i, i + D/2); inverse = the backward.
void rope_apply(float* x, int64_t rows, int32_t H, int32_t D, const float* cos_t, const float* sin_t, bool inverse,
                cudaStream_t stream = nullptr);
// bf16 overload: computed in fp32, rounded once (e.g. q/k in place before attention).
void rope_apply(bf16* x, int64_t rows, int32_t H, int32_t D, const float* cos_t, const float* sin_t, bool inverse,
                cudaStream_t stream = nullptr);
void swiglu_fwd(const float* g, const float* u, float* h, int64_t n, cudaStream_t stream = nullptr);
void swiglu_bwd(const float* dh, const float* g, const float* u, float* dg, float* du, int64_t n,
                cudaStream_t stream = nullptr);
// As ctxpar::cross_entropy_fwd_bwd, but the SUM over counted rows of (logsumexp - logit[label])
// is written to *loss_sum (one DEVICE double; the call stays asynchronous) instead of returned.
// dlogits may alias logits. Labels int32 on the device; label < 0 = ignored row.
void cross_entropy_fwd_bwd(const float* logits, const int32_t* labels, int64_t rows, int64_t V, float grad_scale,
                           float* dlogits, double* loss_sum, cudaStream_t stream = nullptr);
// AdamW, the same fp32 arithmetic as the CPU op (constants derived on the host the same way).
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& hp,
                  cudaStream_t stream = nullptr);
// Sum of squares in double, written to *out (one DEVICE double).
void sum_squares(const float* x, int64_t n, double* out, cudaStream_t stream = nullptr);

// The embedding: x[r] = emb[tokens[r]] (rows x dim); the backward demb[tokens[r]] += dx[r],
// rows added in order (no atomics: the CPU op's order, reproducible). tokens int32 on the device.
void embedding_fwd(const float* emb, const int32_t* tokens, int64_t rows, int64_t dim, float* x,
                   cudaStream_t stream = nullptr);
void embedding_bwd(const float* dx, const int32_t* tokens, int64_t rows, int64_t dim, float* demb,
                   cudaStream_t stream = nullptr);

// ---- conversions ----
// Host: x rounded to the nearest bf16 (ties to even), returned as a float; finite x only. The
// host side of tests and benches builds its bf16 inputs with it.
inline float round_bf16_host(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}
void f32_to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t stream = nullptr);
void bf16_to_f32(const bf16* x, float* y, int64_t n, cudaStream_t stream = nullptr);

// ---- memory (the CUDA backend of ops.hpp's "memory of a call's device") ----
// Stream-ordered: device_alloc / device_free are cudaMallocAsync / cudaFreeAsync on `stream`;
// copies, zeroing and add_f32 are asynchronous on it, except copy_to_host, which synchronizes it.
cudaStream_t stream_create();  // cudaStreamNonBlocking
void stream_destroy(cudaStream_t stream);
void stream_synchronize(cudaStream_t stream);
cudaEvent_t event_record(cudaStream_t stream);  // a new timing event, recorded
double event_seconds(cudaEvent_t start, cudaEvent_t end);
void event_destroy(cudaEvent_t e);
void stream_wait_event(cudaStream_t stream, cudaEvent_t e);  // cudaStreamWaitEvent
void range_push(const char* name);  // NVTX (nvtx3, header-only): a named range on this thread
void range_pop();
void* device_alloc(size_t bytes, cudaStream_t stream);
void device_free(void* p, cudaStream_t stream);
void device_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);
void* pinned_alloc(size_t bytes);  // cudaHostAlloc (default flags)
void pinned_free(void* p);
void copy_in_async(void* dst, const void* pinned_src, size_t bytes, cudaStream_t stream);   // H2D, async
void copy_out_async(void* pinned_dst, const void* src, size_t bytes, cudaStream_t stream);  // D2H, async
void copy_to_device(void* dst, const void* host_src, size_t bytes, cudaStream_t stream);
void copy_to_host(void* host_dst, const void* src, size_t bytes, cudaStream_t stream);
void device_zero(void* p, size_t bytes, cudaStream_t stream);
void device_copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                    cudaStream_t stream);
void fill_f32(float* x, float value, int64_t n, cudaStream_t stream);
void add_f32(float* dst, const float* src, int64_t n, cudaStream_t stream);
void add_f32_2d(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t width, int64_t rows,
                cudaStream_t stream);

}  // namespace ctxpar::cuda
