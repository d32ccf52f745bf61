// Forward and hand-written backward of the decoder on this rank's shard of one packed sequence:
// embedding → L × [RMSNorm → Q/K/V → RoPE (global positions) → CP attention (the configured
// strategy) → output projection (+ tp all-reduce) → residual → RMSNorm → SwiGLU MLP (+ tp
// all-reduce) → residual] → final RMSNorm → LM head → cross-entropy. The layer's forward is
// model/layer.hpp's, which the inference engine runs too.
//
// The loss is fused with the LM head: logits are made in row chunks and turned into their
// gradient at once (the loss scale 1/N, N the labelled tokens of the global batch, is known
// before the forward), so [S_loc, V] logits never exist in full.
//
// Activation recompute (remat): none keeps every activation of every layer; attention keeps the
// layer input and the MLP activations and recomputes norm, Q/K/V, RoPE and the CP attention
// forward in the backward; full keeps only each layer's input and recomputes the whole layer.
//
// Hybrid models (layer_pattern with 'D'): a GDN layer's token mixer is model/gdn_layer.hpp's in
// place of the attention; it keeps its activations under every remat (full recomputes its MLP).
// Local layers ('L'): the same layer with a sliding-window mask, through the local strategy
// (halo by default).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "cp/strategy.hpp"
#include "model/data.hpp"
#include "model/gdn_layer.hpp"
#include "model/layer.hpp"
#include "model/offload.hpp"
#include "model/mla_layer.hpp"
#include "model/model.hpp"
#include "model/state_shard.hpp"

namespace ctxpar {

class Topology;
class Tracer;

// Remat: core/settings.hpp (an enumerated setting).

class Transformer {
 public:
  // `pos` / has_docs: the global positions of this rank's tokens (fixed for the run).
  // `local_strategy`: the CP attention of the local ('L', sliding-window) layers; needed when the
  // layout has any (it may be the same object as `strategy`).
  // `dev` = Device::cuda: every tensor on the GPU, every op ordered on `stream` (the topology's
  // communicators device ones on that stream, modes/device_run.hpp GpuRun); params and grads
  // of forward_backward are then device pointers. GEMMs in bf16 with fp32 accumulation (weights
  // through a bf16 copy made at each call), attention on bf16 Q/K/V/dO, everything else fp32.
  // Attention (G and L) layers only: MLA and GDN layers are refused there so far.
  Transformer(const ParamLayout& layout, Topology& topo, CpStrategy& strategy, Remat remat,
              const std::vector<int64_t>& pos, bool has_docs, CpStrategy* local_strategy = nullptr,
              Device dev = Device::cpu, Stream stream = nullptr, bool offload_inputs = false,
              bool offload_attn_out = false);
  // offload_inputs (offload=layer_inputs, a GPU run): the layer inputs in pinned host memory
  // between the forward and the backward; offload_attn_out (offload=attn_out, remat=none): each
  // attention layer's output O and LSE there (model/offload.hpp); the same bits as without.

  // Overwrites `grads` (layout.local_elems()) with d(loss)/d(params) for loss = loss_scale *
  // sum of token losses, and returns this rank's unscaled sum of token losses. `logits_out`
  // (optional, [S_loc, V]) receives the logits (oracle dumps). With a UnitFeed (use_feed) the
  // weights and gradients are the feed's: `params` and `grads` are what it binds (sharded state:
  // this rank's pieces), and it hands the model each unit's weights and gradient accumulator,
  // asked for in UnitFeed::step_order (so the next unit's gather overlaps this one's compute).
  double forward_backward(const float* params, float* grads, const Batch& b, double loss_scale, Tracer* tr,
                          CpStats& st, StepTimes& times, float* logits_out = nullptr);

  int64_t S_loc() const { return S_loc_; }
  // The last forward_backward's attention work on this rank, per layer: [2l] the forward's (and
  // remat's recompute) visible (query, key) pairs x heads, [2l + 1] the backward's
  // (CpStats::attn_pair_heads; train's coverage audit, model/coverage.hpp).
  const std::vector<double>& attn_pair_heads() const { return attn_pairs_; }
  // shard= (model/state_shard.hpp): the weights and gradients one unit at a time through `feed`
  // (it must outlive this object); without one, the whole flat buffers forward_backward is given.
  void use_feed(UnitFeed* feed) { feed_ = feed ? feed : own_feed_.get(); }
  // offload=params (model/offload.hpp HostParams): forward_backward reads the weights through
  // `view` (embedding and norms on the GPU, the GEMM weights' fp32 pointers on the host, never
  // read there) and their bf16 copy `mirror`, kept current by AdamW, instead of the `params` it is
  // given. Both must outlive this object.
  void use_weights(const ModelView* view, const Bf16Mirror* mirror) {
    ext_view_ = view;
    ext_mirror_ = mirror;
  }
  // How the step's sums are taken (model/numerics.hpp; plain until this is called), for every
  // call after; `num` must outlive this object. Exact (CPU): every GEMM of token rows in blocks of
  // num.block() rows (the layout gives every rank whole blocks), the CP attention's dK/dV
  // converted per block and per ModelDims::exact_heads query heads of a K/V group
  // (CpCall::fixed_rows, fixed_heads: the strategy must be a registry row of the exact schedule),
  // K/V heads replicated over tp summed over their copies as integers; forward_backward's results
  // then do not depend on the mesh (tp included), the strategy or the threads, and `grads` holds
  // them only after num.sum_over_ranks.
  void use_numerics(Numerics& num);
  // Bytes of activations and scratch this object holds (for the dry-run estimate check).
  static double activation_bytes(const ModelDims& d, Remat remat, int64_t S_loc, int64_t logits_rows);
  static int64_t logits_chunk_rows(int64_t S_loc, int64_t V);
  // Bytes offload=layer_inputs and offload=attn_out copied so far (0 without them).
  double offload_bytes() const { return xs_.offload_bytes() + (outs_ ? outs_->offload_bytes() : 0.0); }
  double offload_bytes_attn_out() const { return outs_ ? outs_->offload_bytes() : 0.0; }

 private:
  // q, k, v: fp32 after RoPE (on a GPU one shared set, qf_/kf_/vf_); qb, kb, vb: their bf16
  // copies, the attention's inputs on a GPU (kept per layer there instead).
  struct AttnActs { Buffer<float> h, rstd, q, k, v, o, lse; Buffer<uint16_t> qb, kb, vb; };
  struct MlpActs { Buffer<float> x1, h2, rstd, g, u, m; };
  AttnActs& attn_of(int64_t l) { return attn_.size() == 1 ? attn_[0] : attn_[size_t(l)]; }
  GdnActs& gdn_of(int64_t l) { return gdn_acts_[size_t(gdn_index_[size_t(l)])]; }
  // MLP backward of layer l: dx holds d(loss)/d(layer output) on entry, d(loss)/d(x1) on exit.
  void mlp_bwd(int64_t l, const LayerView& w, LayerView& gw, MlpActs& m, float* dx);
  MlpActs& mlp_of(int64_t l) { return mlp_.size() == 1 ? mlp_[0] : mlp_[size_t(l)]; }

  CpCall local_attn(int64_t l, AttnActs& a, const Batch& b);
  CpStrategy& strategy_of(int64_t l) { return d_.is_local(l) ? *local_ : strat_; }
  // The layer code's context for layer l (model/layer.hpp) in the current call.
  LayerRun run(int64_t l);
  // attn_in_fwd (model/layer.hpp) and the CP attention, into `a`.
  void attn_part_fwd(int64_t l, const LayerView& w, const float* x, AttnActs& a, const Batch& b);
  void layer_bwd(int64_t l, const LayerView& w, LayerView& gw, const Batch& b, float* dx);
  // x1 = x + attention output projection (model/layer.hpp's, or MLA's).
  void attn_or_mla_out_fwd(int64_t l, const LayerView& w, const float* x, const float* o, float* x1);

  const ParamLayout& layout_;
  ModelDims d_;
  Topology& topo_;
  CpStrategy& strat_;
  CpStrategy* local_;  // the L layers' (null without any)
  Remat remat_;
  CpCall call_;  // the strategy's call on this rank's shard (tensors set per layer)
  int64_t batch_serial_ = 0;  // forward_backward calls so far: CpCall::batch_id
  bool has_docs_;
  int64_t S_loc_;
  std::vector<int64_t> pos_;  // this rank's rows' global positions: the constructor's, or the last batch's
  void fill_rope_tables();
  void use_positions(const std::vector<int64_t>& pos);
  int64_t zigzag_S_ = -1;  // the sequence length whose zigzag shard pos_ is (0: not one; -1: not known yet)
  Buffer<float> cos_, sin_;  // RoPE tables [S_loc, D/2]
  LayerStash xs_;  // residual stream: input of layer l, l = 0..L (at(L) = final), model/offload.hpp
  // offload=attn_out: every layer's O [S_loc, q_width] and LSE [S_loc, H_q] (one entry each),
  // replacing AttnActs::o and lse; null without it.
  std::unique_ptr<LayerStash> outs_;
  float* o_of(int64_t l, AttnActs& a) { return outs_ ? outs_->at(l) : a.o.data(); }
  float* lse_of(int64_t l, AttnActs& a) { return outs_ ? outs_->at(l) + S_loc_ * d_.q_width() : a.lse.data(); }
  std::vector<AttnActs> attn_;
  std::vector<MlaActs> mla_;  // attention = mla: the latents, alongside attn_ (same indexing)
  MlaScratch mla_s_;
  std::unique_ptr<MlaExpander> mla_x_;  // attention = mla: K/V from the latent and back, bound per layer
  MlaActs& mla_of(int64_t l) { return mla_.size() == 1 ? mla_[0] : mla_[size_t(l)]; }
  std::vector<MlpActs> mlp_;
  std::unique_ptr<GdnMixer> gdn_;     // hybrid models: the GDN layers' mixer (null without 'D' layers)
  std::vector<GdnActs> gdn_acts_;     // one per GDN layer, always kept (remat recomputes attention layers)
  std::vector<int64_t> gdn_index_;    // layer -> its GdnActs (-1: an attention layer)
  Buffer<float> hf_, rstd_f_, logits_, dhf_, dx_, dh_, dq_, dk_, dv_, do_, dm_, dg_, du_;
  // where the tensors live (LayerRun)
  Device dev_ = Device::cpu;
  Stream stream_ = nullptr;
  Buffer<float> alloc(size_t n) const { return Buffer<float>(n, false, dev_, stream_); }
  float* q_of(AttnActs& a) { return dev_ == Device::cpu ? a.q.data() : qf_.data(); }
  float* k_of(AttnActs& a) { return dev_ == Device::cpu ? a.k.data() : kf_.data(); }
  float* v_of(AttnActs& a) { return dev_ == Device::cpu ? a.v.data() : vf_.data(); }
  // GPU only: the shared fp32 Q/K/V, dO in bf16, positions, this batch's tokens, labels and
  // document ids, the loss of each LM-head chunk, and the weights' bf16 copy.
  Buffer<float> qf_, kf_, vf_;
  Buffer<uint16_t> do_b_, params_b_;
  Bf16Mirror mirror_;
  const ModelView* ext_view_ = nullptr;   // use_weights
  std::unique_ptr<StateShard> whole_;     // the unsharded state, for own_feed_
  std::unique_ptr<UnitFeed> own_feed_;    // the whole flat buffers
  UnitFeed* feed_ = nullptr;              // use_feed's, or own_feed_
  // Unit u's weights and gradient accumulator, as views (only unit u's pointers set; with
  // use_weights the external view whole).
  ModelView weights_of(size_t u);
  ModelView grads_of(size_t u) { return layout_.unit_view(u, feed_->grads(u)); }
  const Bf16Mirror* ext_mirror_ = nullptr;
  Buffer<int64_t> pos_dev_;
  Buffer<int32_t> tokens_dev_, labels_dev_, doc_dev_;
  Buffer<double> chunk_loss_;
  Numerics* num_ = &plain_numerics();
  // exact numerics with K/V heads replicated over tp: this rank's dK | dV integer sums (its share of
  // the group's query heads), and every head's place for their sum over the copies (kv_all_),
  // which sum_kv_copies rounds into dk_ and dv_
  Buffer<int64_t> kv_copies_, kv_all_;
  void sum_kv_copies(int64_t l);
  void rmsnorm_bwd_any(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw);
  // per-call state
  Tracer* tr_ = nullptr;
  CpStats* st_ = nullptr;
  std::vector<double> attn_pairs_;  // attn_pair_heads()
  StepTimes* times_ = nullptr;
};

}  // namespace ctxpar
