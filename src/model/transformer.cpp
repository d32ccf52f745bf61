#include "model/transformer.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <span>

#include "core/error.hpp"
#include "dist/topology.hpp"
#include "model/layer.hpp"
#include "ops.hpp"
#include "shard/partition.hpp"
#include "trace/trace.hpp"
#include "core/clock.hpp"

namespace ctxpar {

int64_t Transformer::logits_chunk_rows(int64_t S_loc, int64_t V) {
  // About 32 MiB of logits per chunk, at least 64 rows (GEMM efficiency), at most S_loc.
  const int64_t rows = std::max<int64_t>(64, (int64_t(32) << 20) / (4 * V));
  return std::min(rows, S_loc);
}

double Transformer::activation_bytes(const ModelDims& d, Remat remat, int64_t S, int64_t logits_rows) {
  const double f = 4;
  const double qw = double(d.q_width()), kw = double(d.kv_width()), F = double(d.ffn_loc()), dim = double(d.dim);
  const double attn = S * (dim + 1 + 2 * qw + 2 * kw + d.H_q_loc());    // h, rstd, q, k, v, o, lse
  const double mlp = S * (2 * dim + 1 + 3 * F);                          // x1, h2, rstd, g, u, m
  const double L = double(d.layers), G = double(d.gdn_layers());
  const double n_attn = remat == Remat::none ? L - G : (L > G ? 1 : 0), n_mlp = remat == Remat::full ? 1 : L;
  const double gdn = G > 0 ? G * GdnMixer::acts_bytes(d, S) + GdnMixer::scratch_bytes(d, S) : 0;
  const double mla = d.mla ? n_attn * mla_acts_bytes(d, S) + mla_scratch_bytes(d, S) : 0;
  const double stream = (L + 1) * S * dim;
  const double rope = S * d.D;                                           // cos + sin [S, D/2]
  const double final_ = S * (2 * dim + 1) + double(logits_rows) * d.vocab;  // hf, dhf, rstd, logits
  const double scratch = S * (2 * dim + 2 * qw + 2 * kw + 3 * F);        // dx, dh, dq, do, dk, dv, dm, dg, du
  return f * (stream + n_attn * attn + n_mlp * mlp + rope + final_ + scratch) + gdn + mla;
}

Transformer::Transformer(const ParamLayout& layout, Topology& topo, CpStrategy& strategy, Remat remat,
                         const std::vector<int64_t>& pos, bool has_docs, CpStrategy* local_strategy, Device dev,
                         Stream stream, bool offload_inputs, bool offload_attn_out)
    : layout_(layout), d_(layout.dims()), topo_(topo), strat_(strategy), local_(local_strategy), remat_(remat),
      has_docs_(has_docs), S_loc_(int64_t(pos.size())), pos_(pos),
      xs_(layout.dims().layers + 1, layout.dims().layers, pos.size() * size_t(layout.dims().dim), offload_inputs, dev,
          stream),
      dev_(dev),
      stream_(stream) {
  CTXPAR_CHECK(!d_.has_local() || local_, "a model with local (L) layers needs their strategy");
  attn_pairs_.assign(size_t(2 * d_.layers), 0.0);
  whole_ = std::make_unique<StateShard>(StateShard::whole(layout));
  own_feed_ = std::make_unique<UnitFeed>(layout, *whole_, nullptr, false, dev, stream);
  feed_ = own_feed_.get();
  CTXPAR_CHECK(dev_ == Device::cpu || (!d_.mla && !d_.has_gdn()),
               "MLA and Gated DeltaNet layers run on the CPU only so far (config refuses them with device = cuda)");
  call_ = attn_problem(S_loc_, d_.H_q_loc(), d_.H_kv_loc(), d_.D, MaskKind::causal, 0);
  call_.q_pos = call_.k_pos = pos_.data();
  const size_t n = size_t(S_loc_);
  const size_t dim = size_t(d_.dim), qw = size_t(d_.q_width()), kw = size_t(d_.kv_width()), F = size_t(d_.ffn_loc());
  cos_ = alloc(n * size_t(d_.rope_dim() / 2));
  sin_ = alloc(n * size_t(d_.rope_dim() / 2));
  fill_rope_tables();
  const int64_t n_gdn = d_.gdn_layers();
  attn_.resize(remat_ == Remat::none ? size_t(d_.layers) : 1);
  if (offload_attn_out) {  // config: remat=none, a GPU, attention layers only
    CTXPAR_CHECK(remat_ == Remat::none && dev_ != Device::cpu && n_gdn == 0 && !d_.mla,
                 "offload=attn_out needs remat=none, a GPU and attention layers");
    outs_ = std::make_unique<LayerStash>(d_.layers, d_.layers, n * (qw + size_t(d_.H_q_loc())), true, dev_, stream_);
  }
  for (size_t l = 0; l < attn_.size(); ++l) {
    AttnActs& a = attn_[l];
    // no buffers for a GDN layer (remat none) nor, when every layer is one, for the shared set
    if (attn_.size() > 1 ? d_.is_gdn(int64_t(l)) : n_gdn == d_.layers) continue;
    a.h = alloc(n * dim); a.rstd = alloc(n);
    if (dev_ == Device::cpu) {
      a.q = alloc(n * qw); a.k = alloc(n * kw); a.v = alloc(n * kw);
    } else {
      const auto bf = [&](size_t e) { return Buffer<uint16_t>(e, false, dev_, stream_); };
      a.qb = bf(n * qw); a.kb = bf(n * kw); a.vb = bf(n * kw);
    }
    if (!outs_) a.o = alloc(n * qw), a.lse = alloc(n * size_t(d_.H_q_loc()));
  }
  if (dev_ != Device::cpu) {
    qf_ = alloc(n * qw); kf_ = alloc(n * kw); vf_ = alloc(n * kw);
    do_b_ = Buffer<uint16_t>(n * qw, false, dev_, stream_);
    pos_dev_ = Buffer<int64_t>(n, false, dev_, stream_);
    copy_to_device(pos_dev_.data(), pos_.data(), n * sizeof(int64_t), dev_, stream_);  // again on a change (use_positions)
    tokens_dev_ = Buffer<int32_t>(n, false, dev_, stream_);
    labels_dev_ = Buffer<int32_t>(n, false, dev_, stream_);
    if (has_docs_) doc_dev_ = Buffer<int32_t>(n, false, dev_, stream_);
  }
  if (d_.mla) {
    mla_.resize(attn_.size());
    for (size_t l = 0; l < mla_.size(); ++l)
      if (!(mla_.size() > 1 ? d_.is_gdn(int64_t(l)) : n_gdn == d_.layers)) mla_alloc(d_, S_loc_, mla_[l]);
    mla_alloc(d_, S_loc_, mla_s_);
    mla_x_ = std::make_unique<MlaExpander>(d_);
  }
  mlp_.resize(remat_ == Remat::full ? 1 : size_t(d_.layers));
  for (MlpActs& m : mlp_) {
    m.x1 = alloc(n * dim); m.h2 = alloc(n * dim); m.rstd = alloc(n);
    m.g = alloc(n * F); m.u = alloc(n * F); m.m = alloc(n * F);
  }
  hf_ = alloc(n * dim); rstd_f_ = alloc(n); dhf_ = alloc(n * dim);
  const int64_t C = logits_chunk_rows(S_loc_, d_.vocab);
  logits_ = alloc(size_t(C * d_.vocab));
  chunk_loss_ = Buffer<double>(size_t(S_loc_ > 0 ? (S_loc_ + C - 1) / C : 0), false, dev_, stream_);
  dx_ = alloc(n * dim); dh_ = alloc(n * dim);
  dq_ = alloc(n * qw); do_ = alloc(n * qw); dk_ = alloc(n * kw); dv_ = alloc(n * kw);
  dm_ = alloc(n * F); dg_ = alloc(n * F); du_ = alloc(n * F);
  if (n_gdn > 0) {
    Comm& cp = topo_.cp();
    const PartitionKind kind = strat_.partition();
    CTXPAR_CHECK(kind == PartitionKind::contiguous || kind == PartitionKind::zigzag,
                 "GDN layers need contiguous or zigzag sharding; the strategy shards " << partition_name(kind));
    GdnChain chain = kind == PartitionKind::zigzag ? GdnChain::zigzag(cp.size()) : GdnChain::contiguous(cp.size());
    gdn_ = std::make_unique<GdnMixer>(d_, cp, std::move(chain), d_.gdn_schedule, S_loc_);
    gdn_acts_.resize(size_t(n_gdn));
    for (GdnActs& a : gdn_acts_) gdn_->alloc(a);
    for (int64_t l = 0, k = 0; l < d_.layers; ++l) gdn_index_.push_back(d_.is_gdn(l) ? k++ : -1);
  }
}

LayerRun Transformer::run(int64_t l) {
  return LayerRun{d_, topo_, tr_, *times_, *st_, l, dev_, stream_, dev_ == Device::cpu ? nullptr : &mirror_, num_};
}

void Transformer::use_numerics(Numerics& num) {
  num_ = &num;
  const int64_t block = num.block();
  num.reserve_tp_sums(S_loc_ * exact_tp_sum_cols(d_));
  if (!num.exact()) return;
  CTXPAR_CHECK(dev_ == Device::cpu && S_loc_ % block == 0 &&
                   (!d_.has_gdn() || (d_.gdn_schedule == "ring" && block % d_.gdn_chunk == 0)),
               "exact numerics: the CPU, whole blocks of " << block << " rows (" << S_loc_
                   << " here) and, with GDN layers, the ring schedule and whole chunks per block");
  // the LM head's chunks in whole blocks (forward_backward)
  const int64_t C = std::max(block, logits_chunk_rows(S_loc_, d_.vocab) / block * block);
  logits_ = alloc(size_t(C * d_.vocab));
  chunk_loss_ = Buffer<double>(size_t((S_loc_ + C - 1) / C), false);
  call_.fixed_rows = block;  // dK/dV converted once per block of queries (a multiple of the tile)
  call_.fixed_heads = d_.exact_heads;  // ... and part of a K/V group's heads (0: the whole group)
  if (d_.tp > d_.H_kv) {  // sum_kv_copies: this copy's integers, and every head's for the sum over tp
    kv_copies_ = Buffer<int64_t>(size_t(2 * S_loc_ * d_.kv_width()), false);
    kv_all_ = Buffer<int64_t>(size_t(2 * S_loc_) * d_.D * d_.H_kv, false);
  }
}

void Transformer::sum_kv_copies(int64_t l) {
  // Every tp rank puts its head's integers in that head's place (zeros elsewhere); the sum over tp
  // adds each head's copies, each holding the sums of its share of the group's query heads.
  const size_t w = size_t(S_loc_) * size_t(d_.D), H = size_t(d_.H_kv), g = size_t(d_.kv_head0());
  Buffer<int64_t>& all = kv_all_;
  std::fill_n(all.data(), all.size(), int64_t(0));
  std::copy_n(kv_copies_.data(), w, all.data() + g * w);
  std::copy_n(kv_copies_.data() + w, w, all.data() + (H + g) * w);
  const double t0 = now_s();
  {
    Tracer::Scope sc(tr_, Phase::all_reduce, int32_t(l), -1, 0, double(all.size()) * 8);
    topo_.axis(Axis::tp).all_reduce(all.span());
  }
  times_->tp_comm_s += now_s() - t0;
  st_->exposed_comm_s += now_s() - t0;
  fixed_to_float(all.data() + g * w, dk_.data(), int64_t(w));
  fixed_to_float(all.data() + (H + g) * w, dv_.data(), int64_t(w));
}

// The RoPE tables of this rank's positions pos_ (the dims RoPE rotates; MLA: the decoupled rope dims).
void Transformer::fill_rope_tables() {
  const int32_t RD = d_.rope_dim();
  std::vector<double> inv(size_t(RD / 2));
  rope_inv_freq(RD, d_.rope_theta, d_.rope_factor, d_.rope_low, d_.rope_high, d_.rope_orig_max, inv.data());
  std::vector<float> c(size_t(S_loc_) * size_t(RD / 2)), sn(c.size());
  rope_table(pos_.data(), S_loc_, RD, inv.data(), c.data(), sn.data());
  copy_to_device(cos_.data(), c.data(), c.size() * sizeof(float), dev_, stream_);
  copy_to_device(sin_.data(), sn.data(), sn.size() * sizeof(float), dev_, stream_);
}

// A batch placed on other rows than the last one (placement=balanced, shard/placement.hpp): its
// positions, their RoPE tables, and whether they are a zigzag shard, found again.
void Transformer::use_positions(const std::vector<int64_t>& pos) {
  CTXPAR_CHECK(int64_t(pos.size()) == S_loc_, "batch of " << pos.size() << " rows on a rank of " << S_loc_);
  pos_ = pos;
  call_.q_pos = call_.k_pos = pos_.data();
  zigzag_S_ = -1;
  fill_rope_tables();
  if (dev_ != Device::cpu) copy_to_device(pos_dev_.data(), pos_.data(), pos_.size() * sizeof(int64_t), dev_, stream_);
}

void Transformer::rmsnorm_bwd_any(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                                  float* dw) {
  layer_rmsnorm_bwd(run(-1), dy, x, w, rstd, dx, dw, S_loc_, d_.dim);
}

void Transformer::attn_or_mla_out_fwd(int64_t l, const LayerView& w, const float* x, const float* o, float* x1) {
  if (d_.mla) mla_out_fwd(run(l), w, S_loc_, x, o, mla_s_, x1);
  else attn_out_fwd(run(l), w, S_loc_, x, o, x1);
}

// The strategy's call on one layer's local attention tensors (forward inputs and outputs).
CpCall Transformer::local_attn(int64_t l, AttnActs& a, const Batch& b) {
  CpCall t = call_;
  if (d_.is_local(l)) {
    t.mask = MaskKind::window;
    t.window = d_.window;
  }
  t.q_doc = t.k_doc = has_docs_ ? b.doc.data() : nullptr;  // follows the run's flag (strategy message layout)
  // Every rank's keys are its zigzag shard of the batch's sequence: the ring derives the
  // positions of a visiting block instead of moving them (checked once against this rank's).
  // A placed batch (placement=balanced) never claims it: whether some rank's rows happen to be
  // its zigzag shard differs between ranks, and the ranks must agree.
  if (zigzag_S_ < 0 && !b.placed) {
    const Partition part(PartitionKind::zigzag, b.S, topo_.cp().size());
    zigzag_S_ = part.positions(topo_.cp().rank()) == pos_ ? b.S : 0;
  }
  t.k_pos_zigzag = b.placed ? 0 : zigzag_S_;
  t.batch_id = batch_serial_;  // a visible-keys strategy plans once per batch (cp/visible.hpp)
  t.o = o_of(l, a); t.lse = lse_of(l, a);
  if (dev_ == Device::cpu) {
    t.q = a.q.data(); t.k = a.k.data(); t.v = a.v.data();
  } else {  // bf16 inputs, device positions and document ids beside their host copies
    t.device = dev_;
    t.stream = stream_;
    t.dtype = DType::bf16;
    t.q = a.qb.data(); t.k = a.kb.data(); t.v = a.vb.data();
    t.q_pos_host = t.k_pos_host = pos_.data();
    t.q_pos = t.k_pos = pos_dev_.data();
    t.q_doc_host = t.k_doc_host = t.q_doc;
    t.q_doc = t.k_doc = has_docs_ ? doc_dev_.data() : nullptr;
  }
  // the latent travels instead of K/V (where the strategy moves it)
  if (d_.mla && strategy_of(l).moves_latent()) {
    t.latent_width = mla_x_->width();
    t.latent = mla_of(l).lat.data();
    t.expander = mla_x_.get();
  }
  return t;
}

// RMSNorm → Q, K, V → RoPE → CP attention, into `a`.

void Transformer::attn_part_fwd(int64_t l, const LayerView& w, const float* x, AttnActs& a, const Batch& b) {
  if (d_.mla) {
    mla_x_->bind(tr_, l, w, nullptr);
    const LayerRun rl = run(l);
    mla_x_->use_run(num_->exact() ? &rl : nullptr);  // exact: fixed-row GEMMs
    mla_in_fwd(run(l), w, S_loc_, x, cos_.data(), sin_.data(), a.h.data(), a.rstd.data(), mla_of(l), mla_s_, *mla_x_,
               a.q.data(), a.k.data(), a.v.data());
  } else {
    attn_in_fwd(run(l), w, S_loc_, x, cos_.data(), sin_.data(), a.h.data(), a.rstd.data(), q_of(a), k_of(a), v_of(a));
    if (dev_ != Device::cpu) {  // the attention's bf16 inputs
      const int64_t qn = S_loc_ * d_.q_width(), kn = S_loc_ * d_.kv_width();
      f32_to_bf16(q_of(a), a.qb.data(), qn, dev_, stream_);
      f32_to_bf16(k_of(a), a.kb.data(), kn, dev_, stream_);
      f32_to_bf16(v_of(a), a.vb.data(), kn, dev_, stream_);
    }
  }
  const CpCall t = local_attn(l, a, b);
  const double t0 = now_s(), pairs0 = st_->attn_pair_heads[0];
  strategy_of(l).forward(t, tr_, *st_);
  times_->attn_s += now_s() - t0;
  attn_pairs_[size_t(2 * l)] += st_->attn_pair_heads[0] - pairs0;
}

void Transformer::mlp_bwd(int64_t l, const LayerView& w, LayerView& gw, MlpActs& m, float* dx) {
  const int64_t S = S_loc_, dim = d_.dim, F = d_.ffn_loc();
  // ---- MLP: x_out = x1 + (swiglu(h2 W1, h2 W3)) W2
  layer_gemm(run(l), false, true, S, F, dim, dx, dim, w.w2, dim, 0, dm_.data(), F);       // dm = dx W2^T
  layer_gemm(run(l), true, false, F, dim, S, m.m.data(), F, dx, dim, 1, gw.w2, dim);      // dW2 += m^T dx
  {
    Tracer::Scope sc(tr_, Phase::mlp, int32_t(l), -1, 0, 0);
    swiglu_bwd(dm_.data(), m.g.data(), m.u.data(), dg_.data(), du_.data(), S * F, dev_, stream_);
  }
  // dh2 = dg W1^T + du W3^T: each tp rank holds the part from its FFN columns
  layer_tp_sum(run(l), S, dim, {{dg_.data(), F, w.w1, F, true, F}, {du_.data(), F, w.w3, F, true, F}}, dh_.data());
  layer_gemm(run(l), true, false, dim, F, S, m.h2.data(), dim, dg_.data(), F, 1, gw.w1, F);
  layer_gemm(run(l), true, false, dim, F, S, m.h2.data(), dim, du_.data(), F, 1, gw.w3, F);
  {
    Tracer::Scope sc(tr_, Phase::norm, int32_t(l), -1, 0, 0);
    rmsnorm_bwd_any(dh_.data(), m.x1.data(), w.mlp_norm, m.rstd.data(), dx, gw.mlp_norm);  // dx = d x1
  }
}

// dx holds d(loss)/d(output of layer l) on entry and d(loss)/d(input of layer l) on exit.
void Transformer::layer_bwd(int64_t l, const LayerView& w, LayerView& gw, const Batch& b, float* dx) {
  const int64_t S = S_loc_, dim = d_.dim, qw = d_.q_width(), kw = d_.kv_width();
  const float* x = xs_.at(l);
  MlpActs& m = mlp_of(l);
  if (d_.is_gdn(l)) {
    GdnActs& g = gdn_of(l);
    if (remat_ == Remat::full) {  // the MLP's input and activations (not counted as model FLOPs)
      gdn_->output(run(l), w, x, g, m.x1.data());
      mlp_fwd(run(l), w, S, m.x1.data(), m.h2.data(), m.rstd.data(), m.g.data(), m.u.data(), m.m.data(), nullptr);
    }
    mlp_bwd(l, w, gw, m, dx);
    gdn_->backward(run(l), w, gw, b, x, g, dx);
    return;
  }
  AttnActs& a = attn_of(l);
  // Recompute what remat dropped (not counted as model FLOPs).
  if (remat_ != Remat::none) attn_part_fwd(l, w, x, a, b);
  if (remat_ == Remat::full) {
    attn_or_mla_out_fwd(l, w, x, o_of(l, a), m.x1.data());
    mlp_fwd(run(l), w, S, m.x1.data(), m.h2.data(), m.rstd.data(), m.g.data(), m.u.data(), m.m.data(), nullptr);
  }
  mlp_bwd(l, w, gw, m, dx);
  // ---- attention: x1 = x + attn(rope(h Wq), rope(h Wk), h Wv) Wo
  if (d_.mla) {
    mla_out_bwd(run(l), w, gw, S, o_of(l, a), dx, mla_s_, do_.data());
  } else {
    layer_gemm(run(l), false, true, S, qw, dim, dx, dim, w.wo, dim, 0, do_.data(), qw);    // dO = dx1 Wo^T
    layer_gemm(run(l), true, false, qw, dim, S, o_of(l, a), qw, dx, dim, 1, gw.wo, dim);   // dWo += O^T dx1
  }
  CpCall t = local_attn(l, a, b);
  t.dout = do_.data();
  if (dev_ != Device::cpu) {
    f32_to_bf16(do_.data(), do_b_.data(), S * qw, dev_, stream_);
    t.dout = do_b_.data();
  }
  t.dq = dq_.data(); t.dk = dk_.data(); t.dv = dv_.data();
  if (d_.mla) {
    mla_x_->bind(tr_, l, w, &gw);
    t.dlatent = mla_s_.dlat.data();
  }
  if (kv_copies_.size()) {  // exact, K/V heads replicated over tp: their integer sums
    t.dk_fixed = kv_copies_.data();
    t.dv_fixed = kv_copies_.data() + S * kw;
  }
  const double t0 = now_s(), pairs0 = st_->attn_pair_heads[1];
  strategy_of(l).backward(t, tr_, *st_);
  times_->attn_s += now_s() - t0;
  attn_pairs_[size_t(2 * l + 1)] += st_->attn_pair_heads[1] - pairs0;
  if (kv_copies_.size()) sum_kv_copies(l);
  if (d_.mla) {
    float* dlat = mla_s_.dlat.data();
    if (!t.expander) {  // the strategy moved K/V and returned dK/dV: the latent's gradient from them here
      std::fill_n(dlat, size_t(S) * size_t(mla_x_->width()), 0.0f);
      const LayerRun rl = run(l);
      mla_x_->use_run(num_->exact() ? &rl : nullptr);  // exact: fixed-row GEMMs, Wkv_b's gradient exact
      mla_x_->time_into(times_);
      mla_x_->backward(mla_of(l).lat.data(), S, dk_.data(), dv_.data(), dlat);
      mla_x_->time_into(nullptr);
    }
    mla_in_bwd(run(l), w, gw, S, a.h.data(), mla_of(l), mla_s_, cos_.data(), sin_.data(), dq_.data(), dlat,
               dh_.data());
    Tracer::Scope sc(tr_, Phase::norm, int32_t(l), -1, 0, 0);
    rmsnorm_bwd_any(dh_.data(), x, w.attn_norm, a.rstd.data(), dx, gw.attn_norm);  // dx = d x
    return;
  }
  {
    Tracer::Scope sc(tr_, Phase::rope, int32_t(l), -1, 0, 0);
    rope_apply(dq_.data(), S, d_.H_q_loc(), d_.D, cos_.data(), sin_.data(), true, dev_, stream_);
    rope_apply(dk_.data(), S, d_.H_kv_loc(), d_.D, cos_.data(), sin_.data(), true, dev_, stream_);
  }
  layer_tp_sum(run(l), S, dim,
               {{dq_.data(), qw, w.wq, qw, true, qw}, {dk_.data(), kw, w.wk, kw, true, kw, true},
                {dv_.data(), kw, w.wv, kw, true, kw, true}},
               dh_.data());
  layer_gemm(run(l), true, false, dim, qw, S, a.h.data(), dim, dq_.data(), qw, 1, gw.wq, qw);
  layer_gemm(run(l), true, false, dim, kw, S, a.h.data(), dim, dk_.data(), kw, 1, gw.wk, kw);
  layer_gemm(run(l), true, false, dim, kw, S, a.h.data(), dim, dv_.data(), kw, 1, gw.wv, kw);
  {
    Tracer::Scope sc(tr_, Phase::norm, int32_t(l), -1, 0, 0);
    rmsnorm_bwd_any(dh_.data(), x, w.attn_norm, a.rstd.data(), dx, gw.attn_norm);  // dx = d x
  }
}

ModelView Transformer::weights_of(size_t u) {
  if (ext_view_) return *ext_view_;
  const float* w = feed_->weights(u);
  if (dev_ != Device::cpu && feed_->gathers()) {  // the unit's bf16 copy, after the last unit's work on the stream
    const int64_t len = layout_.units()[u].elems();
    f32_to_bf16(w, params_b_.data(), len, dev_, stream_);
    mirror_ = Bf16Mirror{w, len, params_b_.data()};
  }
  return layout_.unit_view(u, const_cast<float*>(w));
}

double Transformer::forward_backward(const float* params, float* grads, const Batch& b, double loss_scale, Tracer* tr,
                                     CpStats& st, StepTimes& times, float* logits_out) {
  CTXPAR_CHECK(int64_t(b.tokens.size()) == S_loc_,
               "batch of " << b.tokens.size() << " tokens does not match this rank's shard of " << S_loc_);
  if (b.pos != pos_) use_positions(b.pos);
  tr_ = tr;
  st_ = &st;
  times_ = &times;
  ++batch_serial_;  // a new batch: its own visible-keys plans
  attn_pairs_.assign(size_t(2 * d_.layers), 0.0);
  const double t_start = now_s();
  const int64_t S = S_loc_, dim = d_.dim, V = d_.vocab;
  feed_->bind(params, grads, tr, &st);  // zeroes the whole gradient it accumulates into
  num_->begin_step(grads);
  // Where the batch's token ids and labels are read: the host's, or their copies on the GPU; and
  // there, the weights' bf16 copy for this call.
  const int32_t* tokens = b.tokens.data();
  const int32_t* labels = b.labels.data();
  if (dev_ != Device::cpu) {
    const size_t n = size_t(S) * sizeof(int32_t);
    copy_to_device(tokens_dev_.data(), b.tokens.data(), n, dev_, stream_);
    copy_to_device(labels_dev_.data(), b.labels.data(), n, dev_, stream_);
    if (has_docs_) copy_to_device(doc_dev_.data(), b.doc.data(), n, dev_, stream_);
    tokens = tokens_dev_.data();
    labels = labels_dev_.data();
    if (ext_mirror_) {
      mirror_ = *ext_mirror_;
    } else if (feed_->gathers()) {  // shard=params: one unit's bf16 copy at a time (weights_of)
      if (params_b_.size() < size_t(feed_->unit_capacity()))
        params_b_ = Buffer<uint16_t>(size_t(feed_->unit_capacity()), false, dev_, stream_);
    } else {  // the weights' bf16 copy for this call, made on first use
      if (params_b_.size() == 0) params_b_ = Buffer<uint16_t>(size_t(layout_.local_elems()), false, dev_, stream_);
      f32_to_bf16(params, params_b_.data(), layout_.local_elems(), dev_, stream_);
      mirror_ = Bf16Mirror{params, layout_.local_elems(), params_b_.data()};
    }
  }

  {
    const ModelView w = weights_of(ParamLayout::embedding_unit());
    Tracer::Scope sc(tr_, Phase::embed, -1, -1, 0, 0);
    xs_.will_write(0, tr_);
    embedding_fwd(w.emb, tokens, S, dim, xs_.at(0), dev_, stream_);
    xs_.written(0);
  }
  for (int64_t l = 0; l < d_.layers; ++l) {
    const ModelView w = weights_of(ParamLayout::layer_unit(l));
    const LayerView& lw = w.layers[size_t(l)];
    MlpActs& m = mlp_of(l);
    if (d_.is_gdn(l)) {
      gdn_->forward(run(l), lw, b, xs_.at(l), gdn_of(l), m.x1.data());
    } else {
      AttnActs& a = attn_of(l);
      if (outs_) outs_->will_write(l, tr_);
      attn_part_fwd(l, lw, xs_.at(l), a, b);
      if (outs_) outs_->written(l);  // copied out while the output projection and the MLP run
      attn_or_mla_out_fwd(l, lw, xs_.at(l), o_of(l, a), m.x1.data());
    }
    xs_.will_write(l + 1, tr_);
    mlp_fwd(run(l), lw, S, m.x1.data(), m.h2.data(), m.rstd.data(), m.g.data(), m.u.data(), m.m.data(),
            xs_.at(l + 1));
    xs_.written(l + 1);
  }
  // The head (final norm, LM head) from its forward through its backward.
  const size_t head = layout_.head_unit();
  const ModelView w = weights_of(head);
  ModelView gw = grads_of(head);
  {
    Tracer::Scope sc(tr_, Phase::norm, -1, -1, 0, 0);
    rmsnorm_fwd(xs_.at(d_.layers), w.final_norm, hf_.data(), rstd_f_.data(), S, dim, d_.norm_eps, dev_,
                stream_);
  }
  // LM head and loss, fused per row chunk: logits → dlogits in place → dW_lm, dhf.
  // chunks of whole blocks (exact: each row's loss added exactly)
  const int64_t blk = num_->block();
  const int64_t C = std::max(blk, logits_chunk_rows(S, V) / blk * blk);
  for (int64_t r0 = 0, c = 0; r0 < S; r0 += C, ++c) {
    const int64_t rows = std::min(C, S - r0);
    const float* h = hf_.data() + r0 * dim;
    layer_gemm(run(-1), false, false, rows, V, dim, h, dim, w.lm_head, V, 0, logits_.data(), V);
    if (logits_out) copy_to_host(logits_out + r0 * V, logits_.data(), size_t(rows * V) * sizeof(float), dev_, stream_);
    {
      Tracer::Scope sc(tr_, Phase::loss, -1, -1, 0, 0);
      num_->cross_entropy(run(-1), logits_.data(), labels + r0, rows, V, float(loss_scale), chunk_loss_.data() + c);
    }
    layer_gemm(run(-1), true, false, dim, V, rows, h, dim, logits_.data(), V, 1, gw.lm_head, V);
    layer_gemm(run(-1), false, true, rows, dim, V, logits_.data(), V, w.lm_head, V, 0, dhf_.data() + r0 * dim, dim);
  }
  float* dx = dx_.data();
  device_zero(dx, size_t(S * dim) * sizeof(float), dev_, stream_);
  {
    Tracer::Scope sc(tr_, Phase::norm, -1, -1, 0, 0);
    rmsnorm_bwd_any(dhf_.data(), xs_.at(d_.layers), w.final_norm, rstd_f_.data(), dx, gw.final_norm);
  }
  feed_->grads_done(head);
  for (int64_t l = d_.layers - 1; l >= 0; --l) {
    xs_.will_read(l, tr_);
    if (outs_) outs_->will_read(l, tr_);
    const size_t u = ParamLayout::layer_unit(l);
    const ModelView wl = weights_of(u);
    ModelView gl = grads_of(u);
    layer_bwd(l, wl.layers[size_t(l)], gl.layers[size_t(l)], b, dx);
    feed_->grads_done(u);
  }
  xs_.end_step();
  if (outs_) outs_->end_step();
  {
    ModelView ge = grads_of(ParamLayout::embedding_unit());
    Tracer::Scope sc(tr_, Phase::embed, -1, -1, 0, 0);
    num_->embedding_bwd(run(-1), dx, tokens, S, dim, ge.emb);
  }
  feed_->grads_done(ParamLayout::embedding_unit());
  feed_->finish();  // the last reduce-scatters: the gradient (or this rank's pieces of it) complete
  // The chunks' losses summed in chunk order (on a GPU: read back, which waits for the step).
  std::vector<double> chunk(chunk_loss_.size());
  copy_to_host(chunk.data(), chunk_loss_.data(), chunk.size() * sizeof(double), dev_, stream_);
  double loss = 0;
  for (double x : chunk) loss += x;
  times.total_s += now_s() - t_start;
  times.other_s = times.total_s - times.gemm_s - times.attn_s - times.tp_comm_s;
  return loss;
}

}  // namespace ctxpar
