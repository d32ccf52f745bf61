// Warp-level tensor-core building blocks (sm_80+ PTX, runs on sm_90): the bf16 m16n8k16 MMA with
// fp32 accumulators, fragment loads from shared memory, the accumulator -> A-operand conversion
// and 16-byte cp.async. Every helper states the fragment layout it produces, from the PTX ISA
// ("Matrix Fragments for mma.m16n8k16 with floating point type", "ldmatrix"); with
//   g = lane / 4 (groupID), t = lane % 4 (threadID_in_group):
//   A (16x16, row m, col k), 4 x b32 registers of two bf16 (low half = lower column):
//     a[0] = A(g, 2t..2t+1)   a[1] = A(g+8, 2t..2t+1)   a[2] = A(g, 2t+8..)   a[3] = A(g+8, 2t+8..)
//   B (16x8, row k, col n), 2 registers:  b[0] = B(2t..2t+1, g)   b[1] = B(2t+8..2t+9, g)
//   C/D (16x8 fp32): c[0], c[1] = C(g, 2t), C(g, 2t+1);  c[2], c[3] = C(g+8, 2t), C(g+8, 2t+1)
// These are exercised one by one by cuda::mma_selftest (tests/gpu), so a layout error shows there
// first, not as a wrong attention result. With CTXPAR_CUDA_EMU (tests only) the PTX is replaced
// by the CPU emulator's implementation of the same instructions (kernels/cuda/emu/emu.hpp).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace ctxpar::cuda::detail {

using bf16 = __nv_bfloat16;

// c += a * b (16x16 by 16x8, fp32 accumulate).
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(CTXPAR_CUDA_EMU)
  emu::mma_16816(c, a, b);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Two floats -> one register of two bf16 (round to nearest even); `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t lds32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

#if !defined(CTXPAR_CUDA_EMU)
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// A fragment from a row-major tile: A(m, k) = base[m * ld + k]. ld even.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* base, int ld) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  a[0] = lds32(base + g * ld + 2 * t);
  a[1] = lds32(base + (g + 8) * ld + 2 * t);
  a[2] = lds32(base + g * ld + 2 * t + 8);
  a[3] = lds32(base + (g + 8) * ld + 2 * t + 8);
}

// A fragment from a tile stored k-major: A(m, k) = base[k * ld + m] (e.g. dS stored as [key][query]
// read as A = dS[query][key]). ldmatrix.x4.trans: lanes 8q..8q+7 give the rows of 8x8 matrix q;
// matrix q -> a[q] covers m-block (q & 1), k-block (q >> 1). ld a multiple of 8 (16-byte rows).
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const bf16* base, int ld) {
  const int lane = threadIdx.x & 31, mat = lane >> 3, r = lane & 7;
  const bf16* p = base + ((mat >> 1) * 8 + r) * ld + (mat & 1) * 8;
#if defined(CTXPAR_CUDA_EMU)
  emu::ldmatrix_x4(a, p, true);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(smem_addr(p)));
#endif
}

// B fragment from a tile stored n-major: B(k, n) = base[n * ld + k] (e.g. K rows for S = Q K^T:
// n = key, k = head dim). ld even.
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[2], const bf16* base, int ld) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  b[0] = lds32(base + g * ld + 2 * t);
  b[1] = lds32(base + g * ld + 2 * t + 8);
}

// Two B fragments (n-blocks 0..7 and 8..15) from a tile stored k-major: B(k, n) = base[k * ld + n]
// (e.g. V rows for O = P V: k = key, n = head dim). ldmatrix.x4.trans; matrix q covers k-block
// (q & 1), n-block (q >> 1), so b0 = {m0, m1}, b1 = {m2, m3}. ld a multiple of 8.
__device__ __forceinline__ void load_b_kn_x2n(uint32_t (&b0)[2], uint32_t (&b1)[2], const bf16* base, int ld) {
  const int lane = threadIdx.x & 31, mat = lane >> 3, r = lane & 7;
  const bf16* p = base + ((mat & 1) * 8 + r) * ld + (mat >> 1) * 8;
#if defined(CTXPAR_CUDA_EMU)
  uint32_t r4[4];
  emu::ldmatrix_x4(r4, p, true);
  b0[0] = r4[0];
  b0[1] = r4[1];
  b1[0] = r4[2];
  b1[1] = r4[3];
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(b0[0]), "=r"(b0[1]), "=r"(b1[0]), "=r"(b1[1])
               : "r"(smem_addr(p)));
#endif
}

// The accumulators of two adjacent 16x8 tiles (columns 0..7 in c0, 8..15 in c1) as the bf16 A
// fragment of the 16x16 block they form: the C layout of a column pair equals the A layout, so
// no data moves between lanes (the FlashAttention-2 register reuse of P).
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// ---- cp.async (16 bytes, global -> shared, L2 only) ----
// valid = false writes 16 zero bytes and reads nothing (src-size 0): tails and padding.
#if defined(CTXPAR_CUDA_EMU)
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) { emu::cp_async16(smem, gmem, valid); }
__device__ __forceinline__ void cp_async_commit() { emu::cp_async_commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  emu::cp_async_wait(N);
}
#else
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

}  // namespace ctxpar::cuda::detail
