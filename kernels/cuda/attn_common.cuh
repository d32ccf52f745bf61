// Shared pieces of the CUDA attention kernels (internal): the tile-range kernel, the cp.async
// loader of a tile of rows of a [S, H, D] tensor, work counters and argument checks. The mask
// rule and the tile classification are the host's own (pair_visible in attn_params.hpp,
// tiles::classify in tiles.hpp), compiled for the device.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops_cuda.hpp"
#include "tiles.hpp"

namespace ctxpar::cuda::detail {

// Launches the kernel that fills ranges[ceil(S / tile)] (device) from pos[S] / doc[S] (either may
// be null). Defined in attn_fwd.cu.
void tile_ranges(const int64_t* pos, const int32_t* doc, int64_t S, int tile, tiles::Range* ranges, cudaStream_t s);

// Asynchronously copies rows [row0, row0 + kRows) of head `head` of a token-major [n_rows, H, D]
// bf16 tensor into a shared tile [kRows][ld]; columns D..kD-1 and rows past n_rows are zero-filled
// (so padding contributes 0 to every product). D % 8 == 0 and 16-byte aligned src (checked by
// the host wrappers). All kThreads threads of the block call it.
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_rows_async(bf16* dst, int ld, const bf16* src, int64_t row0, int64_t n_rows,
                                                int64_t src_ld, int head, int D) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per tile row
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks;
    const int64_t row = row0 + r;
    const bool valid = row < n_rows && ch * 8 < D;
    const bf16* g = valid ? src + row * src_ld + int64_t(head) * D + ch * 8 : src;
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
int check_attn_args(const AttnParams& a, bool backward);

}  // namespace ctxpar::cuda::detail
