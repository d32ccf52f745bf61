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
// The attention call is the ordinary one (H_kv = H_q heads of D). Under CP a strategy that moves
// the latent (ring, allgather: CpStrategy::moves_latent) gets the latent rows lat = [c | k_pe]
// (kv_lora + rope values per token, k_pe after RoPE) and the layer's MlaExpander, and sends the
// latent instead of K and V; the others (halo) move the expanded K and V, whose gradient the
// expander then turns into the latent's here. Either way the backward starts from d lat.
#pragma once
#include <cstdint>
#include <optional>

#include "core/memory.hpp"
#include "cp/strategy.hpp"
#include "model/layer.hpp"
#include "model/model.hpp"

namespace ctxpar {

// What one layer keeps for its backward: the query latent before and after its norm (q_lora > 0),
// the K/V latent before its norm with the norm's rstd, and the latent rows lat [S, kv_lora + rope]
// = [c | RoPE(k_pe)] the keys and values are expanded from.
struct MlaActs {
  Buffer<float> cq_raw, cq_rstd, cq, c_raw, c_rstd, lat;
};
// Scratch of the layer's forward and backward (one set per model).
struct MlaScratch {
  Buffer<float> kpe, rope, ov, dov, dlat, dc, dc_raw, dkpe, dcq, dcq_raw;
};

// K/V from the latent and back for one layer (cp/strategy.hpp KvExpander): K = [c Wkv_b's k_nope
// columns | k_pe] per head, V = c Wkv_b's value columns (zero-padded to D); the backward adds
// c^T [dk_nope | dv] to the layer's dWkv_b and this rank's heads' part of d lat (exact numerics:
// the whole d lat, its tp sum exact). Bound to a layer before each of its attention calls.
// Its GEMMs are traced (phase gemm); their time goes to `times` when set (time_into), else it is
// part of the attention call that runs them (a strategy expanding a visiting block).
class MlaExpander final : public KvExpander {
 public:
  explicit MlaExpander(const ModelDims& d) : d_(d) {}
  void bind(Tracer* tr, int64_t layer, const LayerView& w, LayerView* gw) {
    tr_ = tr;
    layer_ = layer;
    w_ = &w;
    gw_ = gw;
  }
  void time_into(StepTimes* times) { times_ = times; }
  // exact numerics: the GEMMs through layer_gemm of `r` (fixed rows; Wkv_b's gradient to the
  // exact sums), timed there; null: sgemm, timed by time_into.
  void use_run(const LayerRun* r) {
    run_.reset();
    if (r) run_.emplace(*r);
  }
  void expand(const float* latent, int64_t rows, float* k, float* v) override;
  void backward(const float* latent, int64_t rows, const float* dk, const float* dv, float* dlatent) override;
  int32_t width() const { return int32_t(d_.kv_lora + d_.rope); }

 private:
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
            float beta, float* C, int64_t ldc) const;
  // exact numerics: dlat (=) from dK and dV as one product over the heads, summed over tp in fixed
  // parts (layer_tp_sum), so that its bits do not depend on tp.
  void exact_dlat(int64_t rows, const float* dk, const float* dv, float* dlat);
  const ModelDims& d_;
  Tracer* tr_ = nullptr;
  int64_t layer_ = -1;
  const LayerView* w_ = nullptr;
  LayerView* gw_ = nullptr;
  StepTimes* times_ = nullptr;
  std::optional<LayerRun> run_;
  Buffer<float> kvb_;  // [rows, H (nope + v)], grown to the largest block
};
void mla_alloc(const ModelDims& d, int64_t S, MlaActs& a);
void mla_alloc(const ModelDims& d, int64_t S, MlaScratch& s);
double mla_acts_bytes(const ModelDims& d, int64_t S);
double mla_scratch_bytes(const ModelDims& d, int64_t S);

// RMSNorm, the latents, q, k, v of the attention call ([S, H*D] each, v zero-padded; k and v by
// `ex`, bound to this layer), RoPE on the rope dims (cos/sin tables [S, rope/2]).
void mla_in_fwd(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* cos_t,
                const float* sin_t, float* h, float* rstd, MlaActs& a, MlaScratch& s, MlaExpander& ex, float* q,
                float* k, float* v);
// mla_in_fwd's first part: RMSNorm, q [S, H*D] with RoPE on its rope dims, and the latent rows
// a.lat [S, kv_lora + rope] (what inference caches).
void mla_q_latent(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* cos_t,
                  const float* sin_t, float* h, float* rstd, MlaActs& a, MlaScratch& s, float* q);
// Inference: the absorbed form (DeepSeek-V2 §2.1.2). Each head's query moves into the latent
// space, qa [S, H, W] = [q_nope Wuk_h^T | q_rope] (W = kv_lora + rope; Wuk_h: the head's k_nope
// columns of Wkv_b), so the attention is multi-query over the latent rows themselves: keys
// [c | k_pe] and values the same rows, whose first kv_lora output columns are o_lat = P c
// (the last rope columns are dropped); scale 1/sqrt(nope + rope). Per pair it costs 2 H (W + W)
// instead of the expanded 2 H (D + v) FLOPs, and it needs no expanded K/V of the context.
void mla_absorb_queries(const LayerRun& r, const LayerView& w, int64_t S, const float* q, float* qa);
// x1 = x + (o_lat Wuv_h per head) Wo, o [S, H, W] of the absorbed attention.
void mla_absorbed_out(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* o, MlaScratch& s,
                      float* x1);
// x1 = x + o_v Wo (o [S, H*D]).
void mla_out_fwd(const LayerRun& r, const LayerView& w, int64_t S, const float* x, const float* o, MlaScratch& s,
                 float* x1);
// The output projection's backward: dO [S, H*D] (padded columns zero) from dx1, dWo += o_v^T dx1.
void mla_out_bwd(const LayerRun& r, const LayerView& w, LayerView& gw, int64_t S, const float* o, const float* dx1,
                 MlaScratch& s, float* dO);
// The input side's backward from the attention's dq ([S, H*D]; rotated back in place) and the
// latent's gradient dlat [S, kv_lora + rope] (from a strategy that moves the latent, or from
// dK/dV through MlaExpander::backward, which also took Wkv_b's gradient; summed over tp in place):
// dh (overwritten, complete on every tp rank) and the gradients of Wq / Wq_a, q_norm, Wq_b,
// Wkv_a, kv_norm.
//
// Tensor parallelism: the heads are split (Wq / Wq_b and Wkv_b by columns, Wo by rows); the
// latent projections Wq_a, q_norm, Wkv_a, kv_norm are replicated and compute the same on every
// tp rank; the output projection's forward and the latents' gradients are summed over tp.
void mla_in_bwd(const LayerRun& r, const LayerView& w, LayerView& gw, int64_t S, const float* h, const MlaActs& a,
                MlaScratch& s, const float* cos_t, const float* sin_t, float* dq, float* dlat, float* dh);

}  // namespace ctxpar
