// DeepSeek-V2/V3 multi-head latent attention (MLA) around the CP attention: the projections of an
// attention layer when attention = mla (model/model.hpp ModelDims::mla).
//
//   h = RMSNorm(x)
//   queries: q = RMSNorm(h Wq_a) Wq_b (q_lora > 0) or h Wq, per head [nope | rope], RoPE on `rope`
//   keys and values: [c_raw | k_pe] = h Wkv_a, c = RMSNorm(c_raw) (the latent c_kv), k_pe = RoPE(k_pe)
//     one rope key shared by every head; [k_nope | v] = c Wkv_b per head; k = [k_nope | k_pe]
//   attention over D = nope + rope (softmax scale 1/sqrt(D)); the kernel takes one head dim for
//     K and V, so v is zero-padded from v_dim to D and the output's padded columns are dropped
//   x1 = x + o_v Wo, o_v the first v_dim columns of each head's output
//
// RoPE is ctxpar's (rotate-half, Llama 3 frequency scaling over `rope` dims), not DeepSeek's YaRN.
// The attention call is the ordinary one (H_kv = H_q heads of D), so every CP strategy serves it;
// the strategies move the expanded K and V (not the latent) so far.
#pragma once
#include <cstdint>

#include "core/memory.hpp"
#include "model/layer.hpp"
#include "model/model.hpp"

namespace ctxpar {

// What one layer keeps for its backward: the query latent before and after its norm (q_lora > 0)
// and the K/V latent before and after its norm, with the norms' rstd.
struct MlaActs {
  Buffer<float> cq_raw, cq_rstd, cq, c_raw, c_rstd, c;
};
// Scratch of the layer's forward and backward (one set per model).
struct MlaScratch {
  Buffer<float> kvb, kpe, rope, ov, dkv, dc, dc_raw, dkpe, dcq, dcq_raw;
};
void mla_alloc(const ModelDims& d, int64_t S, MlaActs& a);
void mla_alloc(const ModelDims& d, int64_t S, MlaScratch& s);
double mla_acts_bytes(const ModelDims& d, int64_t S);
double mla_scratch_bytes(const ModelDims& d, int64_t S);

// RMSNorm, the latents, q, k, v of the attention call ([S, H*D] each, v zero-padded), RoPE on the
// rope dims (cos/sin tables [S, rope/2]).
void mla_in_fwd(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* cos_t,
                const float* sin_t, float* h, float* rstd, MlaActs& a, MlaScratch& s, float* q, float* k, float* v);
// x1 = x + o_v Wo (o [S, H*D]).
void mla_out_fwd(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* o, MlaScratch& s,
                 float* x1);
// The output projection's backward: dO [S, H*D] (padded columns zero) from dx1, dWo += o_v^T dx1.
void mla_out_bwd(const LayerRun& r, const LayerView& w, LayerView& gw, int64_t S, const float* o, const float* dx1,
                 MlaScratch& s, float* dO);
// The input side's backward from the attention's dq, dk, dv ([S, H*D]; dq is rotated back in
// place): dh (overwritten) and the gradients of Wq / Wq_a, q_norm, Wq_b, Wkv_a, kv_norm, Wkv_b.
void mla_in_bwd(const LayerRun& r, const LayerView& w, LayerView& gw, int64_t S, const float* h, const MlaActs& a,
                MlaScratch& s, const float* cos_t, const float* sin_t, float* dq, const float* dk, const float* dv,
                float* dh);

}  // namespace ctxpar
