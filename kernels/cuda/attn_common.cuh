// Shared pieces of the CUDA attention kernels (internal): the mask test, tile classification from
// per-tile position / document ranges (the device twin of kernels/tiles.hpp), the tile-range
// kernel, and the cp.async loader of a tile of rows of a [S, H, D] tensor.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops_cuda.hpp"

namespace ctxpar::cuda::detail {

// Mask data of one call, passed by value to the kernels (device pointers).
struct MaskArgs {
  const int64_t* q_pos;
  const int64_t* k_pos;
  const int32_t* q_doc;
  const int32_t* k_doc;
  int32_t mask;  // MaskKind as int: 0 none, 1 causal, 2 window
  int64_t window;
  bool docs;     // q_doc and k_doc both set
};

inline MaskArgs mask_args(const CudaAttnArgs& a) {
  MaskArgs m;
  m.q_pos = a.q_pos;
  m.k_pos = a.k_pos;
  m.q_doc = a.q_doc;
  m.k_doc = a.k_doc;
  m.mask = int32_t(a.mask);
  m.window = a.window;
  m.docs = a.q_doc != nullptr && a.k_doc != nullptr;
  return m;
}

// Exactly AttnParams::visible (attn_params.hpp).
__device__ __forceinline__ bool visible(const MaskArgs& m, int64_t qp, int32_t qd, int64_t kp, int32_t kd) {
  if (m.docs && qd != kd) return false;
  if (m.mask == 0) return true;
  const int64_t d = qp - kp;
  if (d < 0) return false;
  return m.mask == 1 || d < m.window;
}

// Range of positions and document ids inside one tile of rows (zeros when the array is absent).
struct TileRange {
  int64_t pos_min, pos_max;
  int32_t doc_min, doc_max;
};

enum : int { kVisEmpty = 0, kVisFull = 1, kVisPartial = 2 };

// Exactly tiles::classify (kernels/tiles.hpp): empty => no visible pair, full => every pair of
// the (in-range) rows visible, else partial. Conservative for any order inside the tiles.
__device__ __forceinline__ int classify(const MaskArgs& m, const TileRange& q, const TileRange& k) {
  bool docs_uniform = true;
  if (m.docs) {
    if (q.doc_max < k.doc_min || k.doc_max < q.doc_min) return kVisEmpty;
    docs_uniform = q.doc_min == q.doc_max && k.doc_min == k.doc_max && q.doc_min == k.doc_min;
  }
  bool pos_all = true;
  if (m.mask != 0) {
    const int64_t d_max = q.pos_max - k.pos_min;
    const int64_t d_min = q.pos_min - k.pos_max;
    if (d_max < 0) return kVisEmpty;
    if (m.mask == 2) {
      if (d_min >= m.window) return kVisEmpty;
      pos_all = d_min >= 0 && d_max < m.window;
    } else {
      pos_all = d_min >= 0;
    }
  }
  return pos_all && docs_uniform ? kVisFull : kVisPartial;
}

// Launches the kernel that fills ranges[ceil(S / tile)] (device) from pos[S] / doc[S] (either may
// be null). Defined in attn_fwd.cu.
void tile_ranges(const int64_t* pos, const int32_t* doc, int64_t S, int tile, TileRange* ranges, cudaStream_t s);

// Asynchronously copies rows [row0, row0 + kRows) of head `head` of a token-major [n_rows, H, D]
// bf16 tensor into a shared tile [kRows][ld]; columns D..kD-1 and rows past n_rows are zero-filled
// (so padding contributes 0 to every product). D % 8 == 0 and 16-byte aligned src (checked by
// the host wrappers). All kThreads threads of the block call it.
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_rows_async(bf16* dst, int ld, const bf16* src, int64_t row0, int64_t n_rows,
                                                int H, int head, int D) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per tile row
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks;
    const int64_t row = row0 + r;
    const bool valid = row < n_rows && ch * 8 < D;
    const bf16* g = valid ? src + (row * H + head) * int64_t(D) + ch * 8 : src;
    cp_async16(dst + r * ld + ch * 8, g, valid);
  }
}

// Work counters (AttnStats order): tiles_total, tiles_skipped, tiles_partial, pairs_computed.
struct TileCounters {
  unsigned long long total = 0, skipped = 0, partial = 0, pairs = 0;
  __device__ __forceinline__ void flush(unsigned long long* out) const {
    if (!out) return;
    atomicAdd(out + 0, total);
    atomicAdd(out + 1, skipped);
    atomicAdd(out + 2, partial);
    atomicAdd(out + 3, pairs);
  }
};

// Host: copies the 4 device counters into *stats (synchronizes the stream).
void read_stats(const unsigned long long* dev, AttnStats* stats, cudaStream_t s);

// Host: argument checks shared by forward and backward; returns the padded head dim (32, 64,
// 128 or 256) the kernels are instantiated for.
int check_attn_args(const CudaAttnArgs& a, bool backward);

}  // namespace ctxpar::cuda::detail
