// The CPU backend of the attention ops (kernels/ops.hpp dispatches here for Device::cpu):
// attn_cpu.cpp. Same contracts as the ops of kernels/ops.hpp; fp32 tensors (dtype f32).
#pragma once
#include <cstdint>

#include "attn_params.hpp"

namespace ctxpar::cpu {

// log2(e): the CPU kernels' scores are in base 2 (t = softmax_scale log2(e) q.k, then 2^t).
inline constexpr float kLog2e = 1.4426950408889634f;

void attn_fwd(const AttnParams& p);
void attn_bwd(const AttnParams& p);
void attn_bwd_exact(const AttnParams& p);
int64_t attn_query_block(int32_t D);  // the backward's query tile rows (ops.hpp)
void lse_merge(float* o, float* lse, const float* o_b, const float* lse_b, int64_t rows, int32_t H, int32_t D);

}  // namespace ctxpar::cpu
