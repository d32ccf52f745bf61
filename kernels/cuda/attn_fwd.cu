// Flash-attention forward on bf16 tensor cores (mma.sync m16n8k16, fp32 accumulate), lse_merge,
// the shared attention helpers (tile ranges, argument checks, work counters) and the device
// queries of ops_cuda.hpp.
//
// Forward design (FlashAttention-2 structure): one CTA = 4 warps = one query tile of 64 rows of
// one query head (16 rows per warp); grid (H_q, query tiles), the query tiles in reverse order so
// that under a causal mask the longest tiles start first and query heads of one KV group run next
// to each other (their K/V tiles are shared in L2). The Q tile is loaded once; per key tile (64
// keys, 32 for D > 128) whose position/document ranges admit a visible pair:
//   K and V tiles -> shared memory by cp.async (V's copy overlaps S = Q K^T),
//   S = Q K^T by mma (Q and K fragments from padded shared rows: conflict-free),
//   per-element mask only in partial and tail tiles, x = S * scale * log2(e),
//   online softmax in base 2 with the row max/sum in fp32 (rows live in the 4 lanes of a quad),
//   P rounded to bf16 and reused in registers as the A operand of O += P V (V via ldmatrix.trans).
// At the end O /= l, LSE = ln2 (m + log2 l); a row with l = 0 gets O = 0, LSE = -inf.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "cuda/attn_common.cuh"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops_cuda.hpp"

namespace ctxpar::cuda {

using namespace detail;

// ---------------------------------------------------------------------------------------------
// devices

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error for later callers
    return 0;
  }
  return n;
}

const char* device_description() {
  thread_local std::string s;
  int dev = 0;
  CTXPAR_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  CTXPAR_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  char gib[32];
  snprintf(gib, sizeof gib, "%.1f", double(p.totalGlobalMem) / double(1ull << 30));
  s = std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
      std::to_string(p.multiProcessorCount) + " SMs, " + gib + " GiB)";
  return s.c_str();
}

// ---------------------------------------------------------------------------------------------
// shared attention helpers

namespace detail {

namespace {

__device__ __forceinline__ int64_t wmin(int64_t x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = imin64(x, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, x, o)));
  return x;
}
__device__ __forceinline__ int64_t wmax(int64_t x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = imax64(x, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, x, o)));
  return x;
}

// One block of 128 threads per tile: min/max of pos and doc over the tile's rows.
__global__ void __launch_bounds__(128)
    tile_ranges_kernel(const int64_t* pos, const int32_t* doc, int64_t S, int tile, tiles::Range* out) {
  __shared__ int64_t red[4][4];
  const int64_t r0 = int64_t(blockIdx.x) * tile, r1 = imin64(S, r0 + tile);
  int64_t pmin = INT64_MAX, pmax = INT64_MIN, dmin = INT64_MAX, dmax = INT64_MIN;
  for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
    if (pos) {
      pmin = imin64(pmin, pos[r]);
      pmax = imax64(pmax, pos[r]);
    }
    if (doc) {
      dmin = imin64(dmin, int64_t(doc[r]));
      dmax = imax64(dmax, int64_t(doc[r]));
    }
  }
  pmin = wmin(pmin);
  pmax = wmax(pmax);
  dmin = wmin(dmin);
  dmax = wmax(dmax);
  const int w = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    red[0][w] = pmin;
    red[1][w] = pmax;
    red[2][w] = dmin;
    red[3][w] = dmax;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < 4; ++i) {
      red[0][0] = imin64(red[0][0], red[0][i]);
      red[1][0] = imax64(red[1][0], red[1][i]);
      red[2][0] = imin64(red[2][0], red[2][i]);
      red[3][0] = imax64(red[3][0], red[3][i]);
    }
    tiles::Range t;
    t.pos_min = pos ? red[0][0] : 0;
    t.pos_max = pos ? red[1][0] : 0;
    t.doc_min = doc ? int32_t(red[2][0]) : 0;
    t.doc_max = doc ? int32_t(red[3][0]) : 0;
    out[blockIdx.x] = t;
  }
}

}  // namespace

void tile_ranges(const int64_t* pos, const int32_t* doc, int64_t S, int tile, tiles::Range* ranges, cudaStream_t s) {
  const int64_t n = ceil_div(S, tile);
  if (n == 0) return;
  if (n > INT32_MAX) throw_arg("sequence too long for the tile-range grid");
  CTXPAR_LAUNCH(tile_ranges_kernel, unsigned(n), 128, 0, s, pos, doc, S, tile, ranges);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

void read_stats(const unsigned long long* dev, AttnStats* stats, cudaStream_t s) {
  unsigned long long h[4];
  CTXPAR_CUDA_CHECK(cudaMemcpyAsync(h, dev, sizeof h, cudaMemcpyDeviceToHost, s));
  CTXPAR_CUDA_CHECK(cudaStreamSynchronize(s));
  stats->tiles_total = int64_t(h[0]);
  stats->tiles_skipped = int64_t(h[1]);
  stats->tiles_partial = int64_t(h[2]);
  stats->pairs_computed = int64_t(h[3]);
}

int check_attn_args(const AttnParams& a, bool backward) {
  auto need = [](bool ok, const char* what) {
    if (!ok) throw_arg(what);
  };
  need(a.device == Device::cuda, "the descriptor's device must be cuda (its pointers are device memory)");
  need(a.dtype == DType::bf16, "the CUDA kernels take bf16 q, k, v, dout (dtype bf16)");
  need(a.S_q >= 0 && a.S_k >= 0, "S_q and S_k must be >= 0");
  need(a.H_q > 0 && a.H_kv > 0 && a.H_q % a.H_kv == 0, "need H_q > 0, H_kv > 0 and H_q % H_kv == 0");
  need(a.D > 0 && a.D % 8 == 0 && a.D <= 256,
       "head dim D must be a multiple of 8 and at most 256 (16-byte rows for cp.async; kernels up to 256)");
  need(!*a.stride_error(), a.stride_error());
  need(a.q_ld() % 8 == 0 && a.k_ld() % 8 == 0 && a.v_ld() % 8 == 0 && a.dout_ld() % 8 == 0,
       "row strides must be multiples of 8 elements (16-byte rows for cp.async)");
  need(a.mask == MaskKind::none || (a.q_pos && a.k_pos), "causal/window masks need q_pos and k_pos");
  need(a.mask != MaskKind::window || a.window > 0, "window mask needs window > 0");
  need((a.q_doc == nullptr) == (a.k_doc == nullptr), "give both q_doc and k_doc or neither");
  const float sc = a.softmax_scale();
  need(std::isfinite(sc) && sc > 0.f, "softmax scale must be finite and > 0");
  need(a.q && a.k && a.v && a.o && a.lse, "q, k, v, o, lse must be set");
  need(aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.o), "q, k, v, o must be 16-byte aligned");
  if (backward) {
    need(a.dout && a.dq && a.dk && a.dv, "backward needs dout, dq, dk, dv");
    need(aligned16(a.dout), "dout must be 16-byte aligned");
  }
  return a.D <= 32 ? 32 : a.D <= 64 ? 64 : a.D <= 128 ? 128 : 256;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// forward kernel

namespace {

struct FwdArgs {
  AttnParams p;      // the call (device pointers; q, k, v bf16)
  float scale_log2;  // softmax scale * log2(e)
  const tiles::Range* q_ranges;
  const tiles::Range* k_ranges;
  unsigned long long* stats;  // 4 device counters or null
};

template <int kD, int kBc>
struct FwdCfg {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBr = 16 * kWarps;  // query rows per CTA
  static constexpr int kLd = kD + 8;       // padded shared row (elements): 16-byte rows, no bank conflicts
  static constexpr size_t kSmemBytes =
      size_t(kBr + 2 * kBc) * kLd * sizeof(bf16) + size_t(kBc) * (sizeof(int64_t) + sizeof(int32_t));
  static_assert(kD % 16 == 0 && kBc % 16 == 0, "tile shapes must be multiples of the MMA shape");
};

template <int kD, int kBc>
__global__ void __launch_bounds__(FwdCfg<kD, kBc>::kThreads) attn_fwd_kernel(const FwdArgs a) {
  using C = FwdCfg<kD, kBc>;
  constexpr int kLd = C::kLd, kBr = C::kBr, kNt = kBc / 8, kDt = kD / 8;
  CTXPAR_DYNAMIC_SMEM(smem_raw);
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + kBr * kLd;
  bf16* Vs = Ks + kBc * kLd;
  int64_t* kpos_s = reinterpret_cast<int64_t*>(Vs + kBc * kLd);
  int32_t* kdoc_s = reinterpret_cast<int32_t*>(kpos_s + kBc);

  const int h = blockIdx.x;
  const int64_t qt = int64_t(gridDim.y) - 1 - blockIdx.y;  // longest causal tiles first
  const int64_t i0 = qt * kBr;
  const int hk = h / (a.p.H_q / a.p.H_kv);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

  load_rows_async<kBr, kD, C::kThreads>(Qs, kLd, a.p.q_as<bf16>(), i0, a.p.S_q, a.p.q_ld(), h, a.p.D);
  cp_async_commit();

  // The two query rows of this thread in the accumulator layout: warp*16 + g and + 8.
  int64_t qp[2] = {0, 0};
  int32_t qd[2] = {0, 0};
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t gi = i0 + warp * 16 + g + 8 * rr;
    if (gi < a.p.S_q) {
      if (a.p.q_pos) qp[rr] = a.p.q_pos[gi];
      if (a.p.docs()) qd[rr] = a.p.q_doc[gi];
    }
  }

  float o_acc[kDt][4];
#pragma unroll
  for (int i = 0; i < kDt; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max of x (base-2 scaled logits) per row
  float l_run[2] = {0.f, 0.f};              // this thread's part of the running sum per row

  const tiles::Range qr = a.q_ranges[qt];
  const int64_t n_kt = (a.p.S_k + kBc - 1) / kBc;
  const int rows_here = int(imin64(kBr, a.p.S_q - i0));
  TileCounters cnt;
  cnt.total = (unsigned long long)n_kt;

  for (int64_t kt = 0; kt < n_kt; ++kt) {
    const int64_t j0 = kt * kBc;
    const tiles::Vis vis = tiles::classify(a.p.mask, a.p.window, a.p.docs(), qr, a.k_ranges[kt]);  // uniform over the block
    if (vis == tiles::Vis::empty) {
      ++cnt.skipped;
      continue;
    }
    const bool tail = j0 + kBc > a.p.S_k;
    const bool need_mask = vis == tiles::Vis::partial || tail;
    if (need_mask) ++cnt.partial;
    cnt.pairs += (unsigned long long)rows_here * (unsigned long long)imin64(kBc, a.p.S_k - j0);

    __syncthreads();  // every warp is done with the previous tile's Ks, Vs, kpos_s
    load_rows_async<kBc, kD, C::kThreads>(Ks, kLd, a.p.k_as<bf16>(), j0, a.p.S_k, a.p.k_ld(), hk, a.p.D);
    cp_async_commit();
    load_rows_async<kBc, kD, C::kThreads>(Vs, kLd, a.p.v_as<bf16>(), j0, a.p.S_k, a.p.v_ld(), hk, a.p.D);
    cp_async_commit();
    if (need_mask) {
      for (int c = tid; c < kBc; c += C::kThreads) {
        const int64_t j = j0 + c;
        kpos_s[c] = (j < a.p.S_k && a.p.k_pos) ? a.p.k_pos[j] : 0;
        kdoc_s[c] = (j < a.p.S_k && a.p.docs()) ? a.p.k_doc[j] : 0;
      }
    }
    cp_async_wait<1>();  // Q (first time) and K have landed; V may still be in flight
    __syncthreads();

    // S = Q K^T for this warp's 16 rows x kBc keys
    float s[kNt][4];
#pragma unroll
    for (int i = 0; i < kNt; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t af[4];
      load_a(af, Qs + (warp * 16) * kLd + kk * 16, kLd);
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        uint32_t bfr[2];
        load_b_nk(bfr, Ks + (nt * 8) * kLd + kk * 16, kLd);
        mma_16816(s[nt], af, bfr);
      }
    }

    // scale to base-2 logits; mask (partial / tail tiles); row max over the quad
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * a.scale_log2;
        if (need_mask) {
          const int c = nt * 8 + 2 * t + (e & 1);
          const int rr = e >> 1;
          const bool ok = j0 + c < a.p.S_k && pair_visible(a.p.mask, a.p.window, qd[rr] == kdoc_s[c], qp[rr] - kpos_s[c]);
          if (!ok) x = -INFINITY;
        }
        s[nt][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 1));
      mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 2));
      const float m_new = fmaxf(m_run[rr], mx[rr]);
      // A row with nothing visible so far keeps m = -inf; subtracting 0 instead keeps exp2 of
      // -inf at 0 and avoids (-inf) - (-inf) = NaN.
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m_run[rr] - m_use);  // 0 when m_run = -inf (O and l are 0 then)
      m_run[rr] = m_new;
      l_run[rr] *= alpha;
#pragma unroll
      for (int dt = 0; dt < kDt; ++dt) {
        o_acc[dt][2 * rr] *= alpha;
        o_acc[dt][2 * rr + 1] *= alpha;
      }
      mx[rr] = m_use;
    }
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[nt][e] - mx[e >> 1]);
        s[nt][e] = p;
        l_run[e >> 1] += p;  // the sum uses fp32 P; only the P V product sees bf16 P
      }
    }

    cp_async_wait<0>();  // V has landed
    __syncthreads();

    // O += P V: P from registers (16 rows x 16 keys per A fragment), V as [key][d] via ldmatrix.trans
#pragma unroll
    for (int kc = 0; kc < kBc / 16; ++kc) {
      uint32_t pa[4];
      acc_to_a(pa, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
      for (int dt = 0; dt < kDt; dt += 2) {
        uint32_t b0[2], b1[2];
        load_b_kn_x2n(b0, b1, Vs + (kc * 16) * kLd + dt * 8, kLd);
        mma_16816(o_acc[dt], pa, b0);
        mma_16816(o_acc[dt + 1], pa, b1);
      }
    }
  }
  cp_async_wait<0>();  // the Q copy is still pending when every key tile was skipped

  constexpr float kLn2 = 0.693147180559945309f;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = l_run[rr];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int64_t gi = i0 + warp * 16 + g + 8 * rr;
    if (gi >= a.p.S_q) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    float* orow = a.p.o + (gi * a.p.H_q + h) * int64_t(a.p.D);
#pragma unroll
    for (int dt = 0; dt < kDt; ++dt) {
      const int d = dt * 8 + 2 * t;
      if (d < a.p.D) *reinterpret_cast<float2*>(orow + d) = make_float2(o_acc[dt][2 * rr] * inv, o_acc[dt][2 * rr + 1] * inv);
    }
    if (t == 0) a.p.lse[gi * a.p.H_q + h] = l > 0.f ? (m_run[rr] + log2f(l)) * kLn2 : -INFINITY;
  }
  if (tid == 0) cnt.flush(a.stats);
}

template <int kD, int kBc>
void launch_fwd(const FwdArgs& fa, int64_t n_qt, cudaStream_t s) {
  using C = FwdCfg<kD, kBc>;
  auto kern = attn_fwd_kernel<kD, kBc>;
  CTXPAR_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
  const dim3 grid(unsigned(fa.p.H_q), unsigned(n_qt));
  CTXPAR_LAUNCH(kern, grid, C::kThreads, C::kSmemBytes, s, fa);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

constexpr int kFwdBr = 64;
constexpr int fwd_key_tile(int kD) { return kD > 128 ? 32 : 64; }

}  // namespace

void attn_fwd(const AttnParams& p) {
  const int kD = check_attn_args(p, false);
  if (p.S_q == 0) return;
  const cudaStream_t s = p.stream;
  const int bc = fwd_key_tile(kD);
  const int64_t n_qt = ceil_div(p.S_q, kFwdBr), n_kt = ceil_div(p.S_k, bc);
  if (n_qt > 65535) throw_arg("S_q too large for one call (grid.y <= 65535 query tiles of 64 rows)");
  Scratch<tiles::Range> qr(n_qt, s), kr(n_kt, s);
  Scratch<unsigned long long> counters(p.stats ? 4 : 0, s);
  tile_ranges(p.q_pos, p.docs() ? p.q_doc : nullptr, p.S_q, kFwdBr, qr.get(), s);
  tile_ranges(p.k_pos, p.docs() ? p.k_doc : nullptr, p.S_k, bc, kr.get(), s);
  if (p.stats) CTXPAR_CUDA_CHECK(cudaMemsetAsync(counters.get(), 0, 4 * sizeof(unsigned long long), s));

  FwdArgs fa;
  fa.p = p;
  fa.p.stats = nullptr;  // a host pointer; the kernel counts into `fa.stats`
  fa.scale_log2 = p.softmax_scale() * 1.4426950408889634f;
  fa.q_ranges = qr.get();
  fa.k_ranges = kr.get();
  fa.stats = counters.get();
  switch (kD) {
    case 32: launch_fwd<32, fwd_key_tile(32)>(fa, n_qt, s); break;
    case 64: launch_fwd<64, fwd_key_tile(64)>(fa, n_qt, s); break;
    case 128: launch_fwd<128, fwd_key_tile(128)>(fa, n_qt, s); break;
    default: launch_fwd<256, fwd_key_tile(256)>(fa, n_qt, s); break;
  }
  if (p.stats) read_stats(counters.get(), p.stats, s);
}

// ---------------------------------------------------------------------------------------------
// lse_merge: one warp per (row, head); weights computed once per warp (every lane the same).

namespace {

__global__ void lse_merge_kernel(float* o, float* lse, const float* o_b, const float* lse_b, int64_t n_rows, int32_t D) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (r >= n_rows) return;  // uniform over the warp
  const float la = lse[r], lb = lse_b[r];
  // Every lane has read lse[r] before lane 0 overwrites it below (lanes of a warp are not in
  // lockstep under independent thread scheduling).
  __syncwarp();
  if (lb == -INFINITY) return;  // b contributes nothing
  float* oa = o + r * D;
  const float* ob = o_b + r * D;
  if (la == -INFINITY) {
    for (int d = lane; d < D; d += 32) oa[d] = ob[d];
    if (lane == 0) lse[r] = lb;
    return;
  }
  const float m = fmaxf(la, lb);
  const float l = m + logf(expf(la - m) + expf(lb - m));
  const float wa = expf(la - l), wb = expf(lb - l);
  for (int d = lane; d < D; d += 32) oa[d] = wa * oa[d] + wb * ob[d];
  if (lane == 0) lse[r] = l;
}

}  // namespace

void lse_merge(float* o, float* lse, const float* o_b, const float* lse_b, int64_t rows, int32_t H, int32_t D,
               cudaStream_t stream) {
  const int64_t n = rows * H;
  if (n == 0) return;
  constexpr int kWarpsPerBlock = 8;
  const int64_t blocks = ceil_div(n, kWarpsPerBlock);
  if (blocks > INT32_MAX) throw_arg("lse_merge: too many rows");
  CTXPAR_LAUNCH(lse_merge_kernel, unsigned(blocks), 32 * kWarpsPerBlock, 0, stream, o, lse, o_b, lse_b, n, D);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------
// mma_selftest: the three fragment paths of the attention kernels on fixed 16/32-sized tiles.

namespace {

__global__ void mma_selftest_kernel(const bf16* A, const bf16* Bt, const bf16* At, const bf16* Bk, const bf16* Bk2,
                                    float* c) {
  // Shared copies with the padded strides the attention kernels use (ld = cols + 8).
  constexpr int kLd32 = 40, kLd16 = 24;
  __shared__ __align__(16) bf16 sA[16 * kLd32], sBt[16 * kLd32], sAt[32 * kLd16], sBk[32 * kLd16], sBk2[16 * kLd16];
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  for (int i = lane; i < 16 * 32; i += 32) {
    sA[(i / 32) * kLd32 + i % 32] = A[i];
    sBt[(i / 32) * kLd32 + i % 32] = Bt[i];
    sAt[(i / 16) * kLd16 + i % 16] = At[i];
    sBk[(i / 16) * kLd16 + i % 16] = Bk[i];
  }
  for (int i = lane; i < 16 * 16; i += 32) sBk2[(i / 16) * kLd16 + i % 16] = Bk2[i];
  __syncwarp();

  float c0[2][4] = {}, c1[2][4] = {}, c2[2][4] = {};
  // c0 = A Bt^T: load_a (row-major) x load_b_nk
  for (int kk = 0; kk < 2; ++kk) {
    uint32_t af[4];
    load_a(af, sA + kk * 16, kLd32);
    for (int nt = 0; nt < 2; ++nt) {
      uint32_t bfr[2];
      load_b_nk(bfr, sBt + (nt * 8) * kLd32 + kk * 16, kLd32);
      mma_16816(c0[nt], af, bfr);
    }
  }
  // c1 = At^T Bk: load_a_trans x load_b_kn_x2n
  for (int kk = 0; kk < 2; ++kk) {
    uint32_t af[4], b0[2], b1[2];
    load_a_trans(af, sAt + (kk * 16) * kLd16, kLd16);
    load_b_kn_x2n(b0, b1, sBk + (kk * 16) * kLd16, kLd16);
    mma_16816(c1[0], af, b0);
    mma_16816(c1[1], af, b1);
  }
  // c2 = bf16(c0) Bk2: acc_to_a x load_b_kn_x2n
  {
    uint32_t pa[4], b0[2], b1[2];
    acc_to_a(pa, c0[0], c0[1]);
    load_b_kn_x2n(b0, b1, sBk2, kLd16);
    mma_16816(c2[0], pa, b0);
    mma_16816(c2[1], pa, b1);
  }
  for (int nt = 0; nt < 2; ++nt)
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1), col = nt * 8 + 2 * t + (e & 1);
      c[0 * 256 + row * 16 + col] = c0[nt][e];
      c[1 * 256 + row * 16 + col] = c1[nt][e];
      c[2 * 256 + row * 16 + col] = c2[nt][e];
    }
}

}  // namespace

void mma_selftest(const bf16* A, const bf16* Bt, const bf16* At, const bf16* Bk, const bf16* Bk2, float* c,
                  cudaStream_t stream) {
  CTXPAR_LAUNCH(mma_selftest_kernel, 1u, 32u, 0, stream, A, Bt, At, Bk, Bk2, c);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

}  // namespace ctxpar::cuda
