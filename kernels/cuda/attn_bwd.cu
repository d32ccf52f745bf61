// Flash-attention backward on bf16 tensor cores (FlashAttention-2 algorithm: probabilities
// recomputed from the forward's LSE, no S x S matrix stored).
//
// Pre-pass: D_i = dO_i . O_i per (row, head), fp32.
// Main kernel: one CTA per (query head h, key tile of kBc keys); each warp owns 16 keys of the
// tile and keeps their dK, dV in fp32 registers (in shared memory for D > 128, where registers do
// not suffice). The CTA walks every query tile of kBr rows whose position/document ranges admit a
// visible pair with its keys:
//   Q, dO tiles -> shared (cp.async); lse (base 2; +inf for rows out of range or with no key, so
//     that P = exp2(x - lse) = 0 there), D_i, positions, document ids -> shared;
//   S^T = K Q^T and dP^T = V dO^T (warp: 16 keys x kBr queries);
//   P^T = exp2(S^T scale log2e - lse2), masked per element in partial / tail tiles;
//   dS^T = scale * P^T (dP^T - D_i);
//   dV += P^T dO and dK += dS^T Q (P^T, dS^T reused in registers as A operands; dO, Q via
//     ldmatrix.trans);
//   dS^T -> shared (bf16), then dQ_tile = dS K shared out over the warps by (16-row block,
//     64-column chunk) and added to the caller's fp32 dq with atomics (RED).
// At the end the CTA adds its dK, dV to the caller's dk, dv: plain read-add-write when
// H_q == H_kv (the CTA owns those rows), fp32 atomics under GQA/MQA (the query heads of a group
// are different CTAs). Key tiles are launched in increasing order: under a causal mask the first
// key tiles have the most work.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/attn_common.cuh"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops_cuda.hpp"

namespace ctxpar::cuda {

using namespace detail;

namespace {

// D_i = sum_d dO[i, h, d] * O[i, h, d]: one warp per (row, head).
__global__ void attn_bwd_dot_kernel(const bf16* dout, int64_t dout_ld, const float* o, float* di, int64_t n_rows,
                                    int32_t H, int32_t D) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // row r / H, head r % H
  if (r >= n_rows) return;
  const bf16* g = dout + (r / H) * dout_ld + (r % H) * int64_t(D);
  const float* x = o + r * D;
  float acc = 0.f;
  for (int d = threadIdx.x & 31; d < D; d += 32) acc += __bfloat162float(g[d]) * x[d];
  acc = warp_sum(acc);
  if ((threadIdx.x & 31) == 0) di[r] = acc;
}

struct BwdArgs {
  AttnParams p;      // the call (device pointers; q, k, v, dout bf16)
  const float* di;   // D_i = dO_i . O_i per (row, head)
  float scale;       // softmax scale (dS carries it)
  float scale_log2;  // scale * log2(e)
  const tiles::Range* q_ranges;
  const tiles::Range* k_ranges;
  unsigned long long* stats;
};

template <int kD>
struct BwdCfg {
  static constexpr bool kAccSmem = kD > 128;   // dK/dV accumulators in shared memory
  static constexpr int kBc = kD > 128 ? 32 : 64;  // keys per CTA
  static constexpr int kWarps = kBc / 16;         // one warp per 16 keys
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBr = kD > 64 ? 32 : 64;   // queries per inner tile (register budget)
  static constexpr int kLd = kD + 8;              // padded row of the Q, dO, K, V tiles
  static constexpr int kLdS = kBr + 8;            // padded row of dS^T [key][query]
  static constexpr int kDC = kD < 64 ? kD : 64;   // column chunk of the dQ (and smem dK/dV) products
  // shared layout: bf16 tiles, then int64, then fp32 / int32 (each region keeps its alignment)
  static constexpr size_t kTileBytes = size_t(2 * kBc + 2 * kBr) * kLd * 2 + size_t(kBc) * kLdS * 2;
  static constexpr size_t kSmemBytes = kTileBytes + size_t(kBr + kBc) * 8 + size_t(2 * kBr) * 4 +
                                       size_t(kBr + kBc) * 4 + (kAccSmem ? size_t(2 * kBc) * kD * 4 : 0);
  static_assert(kBr % 16 == 0 && kD % kDC == 0 && (kDC / 8) % 2 == 0, "tile shapes");
};

template <int kD>
__global__ void __launch_bounds__(BwdCfg<kD>::kThreads) attn_bwd_kernel(const BwdArgs a) {
  using C = BwdCfg<kD>;
  constexpr int kLd = C::kLd, kLdS = C::kLdS, kBr = C::kBr, kBc = C::kBc, kDC = C::kDC;
  constexpr int kQt = kBr / 8;                  // 8-query column tiles of S^T
  constexpr int kDt = C::kAccSmem ? 1 : kD / 8;  // register accumulator tiles (1 = unused)
  CTXPAR_DYNAMIC_SMEM(smem_raw);
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* Vs = Ks + kBc * kLd;
  bf16* Qs = Vs + kBc * kLd;
  bf16* dOs = Qs + kBr * kLd;
  bf16* dSs = dOs + kBr * kLd;  // dS^T [kBc keys][kBr queries], row stride kLdS
  int64_t* qpos_s = reinterpret_cast<int64_t*>(smem_raw + C::kTileBytes);
  int64_t* kpos_s = qpos_s + kBr;
  float* lse2_s = reinterpret_cast<float*>(kpos_s + kBc);
  float* di_s = lse2_s + kBr;
  int32_t* qdoc_s = reinterpret_cast<int32_t*>(di_s + kBr);
  int32_t* kdoc_s = qdoc_s + kBr;
  float* dk_sm = reinterpret_cast<float*>(kdoc_s + kBc);  // [kBc][kD], only when kAccSmem
  float* dv_sm = dk_sm + kBc * kD;

  const int h = blockIdx.x;
  const int64_t kt = blockIdx.y, j0 = kt * kBc;
  const int group = a.p.H_q / a.p.H_kv, hk = h / group;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int kw = warp * 16;  // this warp's first key (tile-local)

  load_rows_async<kBc, kD, C::kThreads>(Ks, kLd, a.p.k_as<bf16>(), j0, a.p.S_k, a.p.k_ld(), hk, a.p.D);
  load_rows_async<kBc, kD, C::kThreads>(Vs, kLd, a.p.v_as<bf16>(), j0, a.p.S_k, a.p.v_ld(), hk, a.p.D);
  cp_async_commit();
  for (int c = tid; c < kBc; c += C::kThreads) {
    const int64_t j = j0 + c;
    kpos_s[c] = (j < a.p.S_k && a.p.k_pos) ? a.p.k_pos[j] : 0;
    kdoc_s[c] = (j < a.p.S_k && a.p.docs()) ? a.p.k_doc[j] : 0;
  }
  if constexpr (C::kAccSmem) {
    for (int c = tid; c < 2 * kBc * kD; c += C::kThreads) dk_sm[c] = 0.f;  // dk_sm, dv_sm contiguous
  }

  float dk_acc[kDt][4], dv_acc[kDt][4];
#pragma unroll
  for (int i = 0; i < kDt; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.f;

  const tiles::Range kr = a.k_ranges[kt];
  const bool tail_k = j0 + kBc > a.p.S_k;
  const int64_t n_qt = (a.p.S_q + kBr - 1) / kBr;
  const int keys_here = int(imin64(kBc, a.p.S_k - j0));
  constexpr float kLog2e = 1.4426950408889634f;
  TileCounters cnt;
  cnt.total = (unsigned long long)n_qt;

  for (int64_t qt = 0; qt < n_qt; ++qt) {
    const tiles::Vis vis = tiles::classify(a.p.mask, a.p.window, a.p.docs(), a.q_ranges[qt], kr);  // uniform over the block
    if (vis == tiles::Vis::empty) {
      ++cnt.skipped;
      continue;
    }
    const int64_t i0 = qt * kBr;
    const bool need_mask = vis == tiles::Vis::partial || tail_k || i0 + kBr > a.p.S_q;
    if (need_mask) ++cnt.partial;
    cnt.pairs += (unsigned long long)imin64(kBr, a.p.S_q - i0) * (unsigned long long)keys_here;

    // Not required by the present data flow (every buffer written below was last read before the
    // previous tile's barrier ahead of its dQ phase, and dSs is rewritten only after the next
    // barrier), kept so that a change that reads Q or dO in the dQ phase stays race-free.
    __syncthreads();
    load_rows_async<kBr, kD, C::kThreads>(Qs, kLd, a.p.q_as<bf16>(), i0, a.p.S_q, a.p.q_ld(), h, a.p.D);
    load_rows_async<kBr, kD, C::kThreads>(dOs, kLd, a.p.dout_as<bf16>(), i0, a.p.S_q, a.p.dout_ld(), h, a.p.D);
    cp_async_commit();
    for (int c = tid; c < kBr; c += C::kThreads) {
      const int64_t i = i0 + c;
      const bool ok = i < a.p.S_q;
      const float L = ok ? a.p.lse[i * a.p.H_q + h] : -INFINITY;
      lse2_s[c] = L == -INFINITY ? INFINITY : L * kLog2e;  // +inf: P = 0 for the whole row
      di_s[c] = ok ? a.di[i * a.p.H_q + h] : 0.f;
      qpos_s[c] = (ok && a.p.q_pos) ? a.p.q_pos[i] : 0;
      qdoc_s[c] = (ok && a.p.docs()) ? a.p.q_doc[i] : 0;
    }
    cp_async_wait<0>();
    __syncthreads();

    // S^T = K Q^T and dP^T = V dO^T: this warp's 16 keys x kBr queries
    float st[kQt][4], dpt[kQt][4];
#pragma unroll
    for (int i = 0; i < kQt; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t ak[4], av[4];
      load_a(ak, Ks + kw * kLd + kk * 16, kLd);
      load_a(av, Vs + kw * kLd + kk * 16, kLd);
#pragma unroll
      for (int nt = 0; nt < kQt; ++nt) {
        uint32_t bq[2], bo[2];
        load_b_nk(bq, Qs + (nt * 8) * kLd + kk * 16, kLd);
        mma_16816(st[nt], ak, bq);
        load_b_nk(bo, dOs + (nt * 8) * kLd + kk * 16, kLd);
        mma_16816(dpt[nt], av, bo);
      }
    }

    // P^T and dS^T (fp32), in place
#pragma unroll
    for (int nt = 0; nt < kQt; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + 2 * t + (e & 1);   // query (tile-local)
        const int r = kw + g + 8 * (e >> 1);      // key (tile-local)
        float p = exp2f(st[nt][e] * a.scale_log2 - lse2_s[c]);
        if (need_mask && !(j0 + r < a.p.S_k && pair_visible(a.p.mask, a.p.window, qdoc_s[c] == kdoc_s[r], qpos_s[c] - kpos_s[r]))) p = 0.f;
        st[nt][e] = p;
        dpt[nt][e] = a.scale * p * (dpt[nt][e] - di_s[c]);
      }
    }

    // dV += P^T dO, dK += dS^T Q (contraction over this tile's queries)
    if constexpr (!C::kAccSmem) {
#pragma unroll
      for (int qc = 0; qc < kBr / 16; ++qc) {
        uint32_t ap[4], ads[4];
        acc_to_a(ap, st[2 * qc], st[2 * qc + 1]);
        acc_to_a(ads, dpt[2 * qc], dpt[2 * qc + 1]);
#pragma unroll
        for (int dt = 0; dt < kD / 8; dt += 2) {
          uint32_t b0[2], b1[2];
          load_b_kn_x2n(b0, b1, dOs + (qc * 16) * kLd + dt * 8, kLd);
          mma_16816(dv_acc[dt], ap, b0);
          mma_16816(dv_acc[dt + 1], ap, b1);
          load_b_kn_x2n(b0, b1, Qs + (qc * 16) * kLd + dt * 8, kLd);
          mma_16816(dk_acc[dt], ads, b0);
          mma_16816(dk_acc[dt + 1], ads, b1);
        }
      }
    } else {
      // Column chunks of kDC: products into temporaries, added to this warp's own rows of the
      // shared accumulators (each element belongs to exactly one lane: no synchronization).
#pragma unroll 1
      for (int dc = 0; dc < kD / kDC; ++dc) {
        float tv[kDC / 8][4], tk[kDC / 8][4];
#pragma unroll
        for (int i = 0; i < kDC / 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) tv[i][e] = tk[i][e] = 0.f;
#pragma unroll
        for (int qc = 0; qc < kBr / 16; ++qc) {
          uint32_t ap[4], ads[4];
          acc_to_a(ap, st[2 * qc], st[2 * qc + 1]);
          acc_to_a(ads, dpt[2 * qc], dpt[2 * qc + 1]);
#pragma unroll
          for (int dt = 0; dt < kDC / 8; dt += 2) {
            uint32_t b0[2], b1[2];
            load_b_kn_x2n(b0, b1, dOs + (qc * 16) * kLd + dc * kDC + dt * 8, kLd);
            mma_16816(tv[dt], ap, b0);
            mma_16816(tv[dt + 1], ap, b1);
            load_b_kn_x2n(b0, b1, Qs + (qc * 16) * kLd + dc * kDC + dt * 8, kLd);
            mma_16816(tk[dt], ads, b0);
            mma_16816(tk[dt + 1], ads, b1);
          }
        }
#pragma unroll
        for (int dt = 0; dt < kDC / 8; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int idx = (kw + g + 8 * (e >> 1)) * kD + dc * kDC + dt * 8 + 2 * t + (e & 1);
            dv_sm[idx] += tv[dt][e];
            dk_sm[idx] += tk[dt][e];
          }
      }
    }

    // dS^T -> shared as bf16 [key][query] (one 32-bit store per accumulator row pair)
#pragma unroll
    for (int nt = 0; nt < kQt; ++nt) {
      *reinterpret_cast<uint32_t*>(dSs + (kw + g) * kLdS + nt * 8 + 2 * t) = pack_bf16(dpt[nt][0], dpt[nt][1]);
      *reinterpret_cast<uint32_t*>(dSs + (kw + g + 8) * kLdS + nt * 8 + 2 * t) = pack_bf16(dpt[nt][2], dpt[nt][3]);
    }
    __syncthreads();

    // dQ[i0 .. i0 + kBr) += dS K: work items (16-row block, kDC-column chunk) over the warps
    constexpr int kChunks = kD / kDC, kItems = (kBr / 16) * kChunks;
#pragma unroll 1
    for (int item = warp; item < kItems; item += C::kWarps) {
      const int rb = item / kChunks, dc = item % kChunks;
      float acc[kDC / 8][4];
#pragma unroll
      for (int i = 0; i < kDC / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
      for (int kc = 0; kc < kBc / 16; ++kc) {
        uint32_t ad[4];
        load_a_trans(ad, dSs + (kc * 16) * kLdS + rb * 16, kLdS);  // A(query, key) = dS^T[key][query]
#pragma unroll
        for (int dt = 0; dt < kDC / 8; dt += 2) {
          uint32_t b0[2], b1[2];
          load_b_kn_x2n(b0, b1, Ks + (kc * 16) * kLd + dc * kDC + dt * 8, kLd);
          mma_16816(acc[dt], ad, b0);
          mma_16816(acc[dt + 1], ad, b1);
        }
      }
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const int64_t i = i0 + rb * 16 + g + 8 * e2;
        if (i >= a.p.S_q) continue;
        float* row = a.p.dq + (i * a.p.H_q + h) * int64_t(a.p.D);
#pragma unroll
        for (int dt = 0; dt < kDC / 8; ++dt) {
          const int d = dc * kDC + dt * 8 + 2 * t;
          if (d < a.p.D) {
            atomicAdd(row + d, acc[dt][2 * e2]);
            atomicAdd(row + d + 1, acc[dt][2 * e2 + 1]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();  // the K/V copy is still pending when every query tile was skipped
  // The epilogue below reads other warps' rows of the shared dK/dV (kAccSmem). Today the barrier
  // ahead of the last tile's dQ phase already orders those updates, and with no tile each thread
  // reads only what it zeroed itself; this barrier keeps the epilogue independent of both facts.
  __syncthreads();

  // dK, dV of this CTA's keys -> the caller's fp32 accumulators
  const bool owner = group == 1;
  if constexpr (!C::kAccSmem) {
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
      const int64_t j = j0 + kw + g + 8 * e2;
      if (j >= a.p.S_k) continue;
      float* dkr = a.p.dk + (j * a.p.H_kv + hk) * int64_t(a.p.D);
      float* dvr = a.p.dv + (j * a.p.H_kv + hk) * int64_t(a.p.D);
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        const int d = dt * 8 + 2 * t;
        if (d >= a.p.D) continue;
        if (owner) {
          dkr[d] += dk_acc[dt][2 * e2];
          dkr[d + 1] += dk_acc[dt][2 * e2 + 1];
          dvr[d] += dv_acc[dt][2 * e2];
          dvr[d + 1] += dv_acc[dt][2 * e2 + 1];
        } else {
          atomicAdd(dkr + d, dk_acc[dt][2 * e2]);
          atomicAdd(dkr + d + 1, dk_acc[dt][2 * e2 + 1]);
          atomicAdd(dvr + d, dv_acc[dt][2 * e2]);
          atomicAdd(dvr + d + 1, dv_acc[dt][2 * e2 + 1]);
        }
      }
    }
  } else {
    for (int c = tid; c < kBc * kD; c += C::kThreads) {
      const int r = c / kD, d = c % kD;
      const int64_t j = j0 + r;
      if (j >= a.p.S_k || d >= a.p.D) continue;
      const int64_t idx = (j * a.p.H_kv + hk) * int64_t(a.p.D) + d;
      if (owner) {
        a.p.dk[idx] += dk_sm[c];
        a.p.dv[idx] += dv_sm[c];
      } else {
        atomicAdd(a.p.dk + idx, dk_sm[c]);
        atomicAdd(a.p.dv + idx, dv_sm[c]);
      }
    }
  }
  if (tid == 0) cnt.flush(a.stats);
}

template <int kD>
void launch_bwd(const BwdArgs& ba, int64_t n_kt, cudaStream_t s) {
  using C = BwdCfg<kD>;
  auto kern = attn_bwd_kernel<kD>;
  CTXPAR_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
  const dim3 grid(unsigned(ba.p.H_q), unsigned(n_kt));
  CTXPAR_LAUNCH(kern, grid, C::kThreads, C::kSmemBytes, s, ba);
  CTXPAR_CUDA_LAUNCH_CHECK();
}

}  // namespace

void attn_bwd(const AttnParams& p) {
  const int kD = check_attn_args(p, true);
  if (p.S_q == 0 || p.S_k == 0) return;  // no pair: nothing to accumulate
  const cudaStream_t s = p.stream;
  const int bc = kD > 128 ? BwdCfg<256>::kBc : BwdCfg<128>::kBc;
  const int br = kD == 32 ? BwdCfg<32>::kBr : kD == 64 ? BwdCfg<64>::kBr : kD == 128 ? BwdCfg<128>::kBr : BwdCfg<256>::kBr;
  const int64_t n_qt = ceil_div(p.S_q, br), n_kt = ceil_div(p.S_k, bc);
  if (n_kt > 65535) throw_arg("S_k too large for one backward call (grid.y <= 65535 key tiles)");
  const int64_t n_rows = p.S_q * p.H_q;
  Scratch<float> di(n_rows, s);
  Scratch<tiles::Range> qr(n_qt, s), kr(n_kt, s);
  Scratch<unsigned long long> counters(p.stats ? 4 : 0, s);
  tile_ranges(p.q_pos, p.docs() ? p.q_doc : nullptr, p.S_q, br, qr.get(), s);
  tile_ranges(p.k_pos, p.docs() ? p.k_doc : nullptr, p.S_k, bc, kr.get(), s);
  if (p.stats) CTXPAR_CUDA_CHECK(cudaMemsetAsync(counters.get(), 0, 4 * sizeof(unsigned long long), s));
  {
    constexpr int kWarpsPerBlock = 8;
    const int64_t blocks = ceil_div(n_rows, kWarpsPerBlock);
    if (blocks > INT32_MAX) throw_arg("attn_bwd: too many rows");
    CTXPAR_LAUNCH(attn_bwd_dot_kernel, unsigned(blocks), 32 * kWarpsPerBlock, 0, s, p.dout_as<bf16>(), p.dout_ld(), p.o,
                  di.get(), n_rows, p.H_q, p.D);
    CTXPAR_CUDA_LAUNCH_CHECK();
  }

  BwdArgs ba;
  ba.p = p;
  ba.p.stats = nullptr;  // a host pointer; the kernel counts into `ba.stats`
  ba.di = di.get();
  ba.scale = p.softmax_scale();
  ba.scale_log2 = ba.scale * 1.4426950408889634f;
  ba.q_ranges = qr.get();
  ba.k_ranges = kr.get();
  ba.stats = counters.get();
  switch (kD) {
    case 32: launch_bwd<32>(ba, n_kt, s); break;
    case 64: launch_bwd<64>(ba, n_kt, s); break;
    case 128: launch_bwd<128>(ba, n_kt, s); break;
    default: launch_bwd<256>(ba, n_kt, s); break;
  }
  if (p.stats) read_stats(counters.get(), p.stats, s);
}

}  // namespace ctxpar::cuda
