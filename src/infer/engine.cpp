#include "infer/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <span>

#include "core/error.hpp"
#include "cp/common.hpp"  // to_device
#include "dist/topology.hpp"
#include "model/coverage.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "infer/schedule.hpp"  // prefill_placement
#include "shard/partition.hpp"
#include "trace/trace.hpp"
#include "core/clock.hpp"
#include "model/mla_layer.hpp"

namespace ctxpar::infer {

namespace {

// Position shift of sequence b in a packed prefill's attention calls: beyond any context length
// (seq <= 2^40), and 65536 sequences of it stay below kNoPos (2^60).
constexpr int64_t kSeqStride = int64_t(1) << 42;

}  // namespace


int32_t greedy(const float* logits, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (!std::isfinite(logits[i])) return kNonFiniteLogits;
    if (logits[i] > logits[best]) best = i;
  }
  return int32_t(best);
}

Engine::Engine(const ParamLayout& layout, const float* params, Topology& topo,
               const std::vector<std::vector<int64_t>>& capacity,
               const std::string& full_strategy, Device device, Stream stream)
    : layout_(layout), d_(layout.dims()), dev_(device), stream_(stream), w_(layout.view(const_cast<float*>(params))),
      topo_(topo), cp_(topo.cp()),
      cache_(capacity, layout.dims().layers, layout.dims().cache_heads(), layout.dims().cache_dim(), topo.cp().rank(),
             layout.dims().kinds, /*shared_kv=*/layout.dims().mla, device, stream) {
  if (dev_ != Device::cpu) {
    CTXPAR_CHECK(!d_.mla && !d_.has_gdn(),
                 "MLA and Gated DeltaNet layers run on the CPU only so far (config refuses them with device = cuda)");
    const int64_t n = layout.local_elems();
    params_dev_ = Buffer<float>(size_t(n), false, dev_, stream_);
    copy_to_device(params_dev_.data(), params, size_t(n) * sizeof(float), dev_, stream_);
    params_b_ = Buffer<uint16_t>(size_t(n), false, dev_, stream_);
    f32_to_bf16(params_dev_.data(), params_b_.data(), n, dev_, stream_);
    mirror_ = Bf16Mirror{params_dev_.data(), n, params_b_.data()};
    w_ = layout.view(params_dev_.data());
  }
  CTXPAR_CHECK(int(capacity.size()) == cp_.size(), "KV cache capacities of " << capacity.size() << " ranks for a CP group of "
                                                                            << cp_.size());
  full_name_ = full_strategy;
  full_strategy_ = make_strategy(full_strategy, topo);
  CTXPAR_CHECK(full_strategy_ != nullptr, "unknown CP strategy " << full_strategy);
  pass_kv_ = make_strategy(prefill_row(CpAlgoSetting::pass_kv).name, topo);
  pass_q_ = make_strategy(prefill_row(CpAlgoSetting::pass_q).name, topo);
  decode_pass_q_ = make_strategy(decode_row(DecodeAlgo::pass_q).name, topo);
  decode_allgather_ = make_strategy(decode_row(DecodeAlgo::allgather).name, topo);
  if (d_.has_gdn()) gdn_ = std::make_unique<GdnInfer>(d_, topo.cp(), cache_.batch());
  const int32_t RD = d_.rope_dim();  // MLA: the decoupled rope dims
  inv_freq_.resize(size_t(RD / 2));
  rope_inv_freq(RD, d_.rope_theta, d_.rope_factor, d_.rope_low, d_.rope_high, d_.rope_orig_max, inv_freq_.data());
}

Engine::~Engine() = default;

int Engine::N() const { return cp_.size(); }

void Engine::clear() {
  cache_.clear();
  if (gdn_) gdn_->clear();
}

std::string Engine::audit(const CallStats& st) {
  // Per layer, and the call's total beside them (a count outside the layers' calls shows there),
  // less what `st` held before the call.
  std::vector<double> got = st.layer_pair_heads;
  got.resize(size_t(d_.layers), 0.0);
  got.push_back(st.cp.attn_pair_heads[0] + st.cp.attn_pair_heads[1]);
  for (size_t i = 0; i < got.size() && i < audit_base_.size(); ++i) got[i] -= audit_base_[i];
  cp_.all_reduce(std::span<double>(got));
  if (topo_.size(Axis::tp) > 1) topo_.axis(Axis::tp).all_reduce(std::span<double>(got));
  double total = 0;
  for (int64_t l = 0; l <= d_.layers; ++l) {
    const double want = l < d_.layers ? infer_layer_pair_heads(d_, d_.H_q, l, audit_news_, audit_olds_) : total;
    total += l < d_.layers ? want : 0.0;
    if (got[size_t(l)] == want) continue;  // integers below 2^53 in doubles: exact
    const std::string where = l < d_.layers ? "layer " + std::to_string(l) + " (" +
                                                  (d_.is_gdn(l) ? "Gated DeltaNet" : d_.is_local(l) ? "local" : "global") + ")"
                                            : "the call";
    return where + ": the attention computed " + std::to_string(int64_t(got[size_t(l)])) +
           " (query, key) pairs x heads over the CP and tp ranks, and the new tokens see " +
           std::to_string(int64_t(want)) + ": a schedule dropped or repeated keys (coverage audit)";
  }
  return "";
}

double Engine::prefill_flops(int64_t T, int64_t cached) const { return ctxpar::prefill_flops(d_, T, cached); }

double Engine::decode_flops(int64_t ctx) const { return ctxpar::prefill_flops(d_, 1, ctx); }

template <class T> Buffer<T> Engine::on_device(const std::vector<T>& a) const {
  return dev_ == Device::cpu || a.empty() ? Buffer<T>{} : cp::to_device(a, dev_, stream_);
}

void Engine::set_device(CpCall& t, const int64_t* q_pos_dev, const int32_t* q_doc_dev, const int64_t* k_pos_dev,
                        const int32_t* k_doc_dev) const {
  if (dev_ == Device::cpu) return;
  t.device = dev_;
  t.stream = stream_;
  t.dtype = DType::bf16;
  t.q_pos_host = t.q_pos;
  t.q_doc_host = t.q_doc;
  t.k_pos_host = t.k_pos;
  t.k_doc_host = t.k_doc;
  t.q_pos = q_pos_dev;
  t.q_doc = q_doc_dev;
  t.k_pos = k_pos_dev;
  t.k_doc = k_doc_dev;
}

void Engine::ensure_rows(int64_t n) {
  if (n <= rows_cap_) return;
  // The attention's query/output width: MLA's absorbed queries are H heads of the latent's width.
  const size_t r = size_t(n), dim = size_t(d_.dim), qw = size_t(d_.q_width()), kw = size_t(d_.kv_width()),
               F = size_t(d_.ffn), aw = size_t(d_.H_q_loc()) * size_t(d_.cache_dim());
  const auto f32 = [&](size_t e) { return Buffer<float>(e, false, dev_, stream_); };
  x_ = f32(r * dim); h_ = f32(r * dim); x1_ = f32(r * dim);
  q_ = f32(r * qw); o_ = f32(r * aw); lse_ = f32(r * size_t(d_.H_q_loc())); rstd_ = f32(r);
  k_ = f32(r * kw); v_ = f32(r * kw);
  g_ = f32(r * F); u_ = f32(r * F); m_ = f32(r * F);
  cos_ = f32(r * size_t(d_.rope_dim() / 2)); sin_ = f32(r * size_t(d_.rope_dim() / 2));
  if (dev_ != Device::cpu) {
    const auto bf = [&](size_t e) { return Buffer<uint16_t>(e, false, dev_, stream_); };
    qb_ = bf(r * qw); kb_ = bf(r * kw); vb_ = bf(r * kw);
    tok_dev_ = Buffer<int32_t>(r, false, dev_, stream_);
  }
  if (d_.mla) {
    qa_.resize(r * aw, false);
    mla_alloc(d_, n, mla_a_);
    mla_alloc(d_, n, mla_s_);
  }
  num_->reserve_tp_sums(int64_t(r * dim));  // exact numerics: the tp sums' scratch
  rows_cap_ = n;
}

void Engine::use_numerics(Numerics& num, CpSchedule sched) {
  CTXPAR_CHECK(!num.exact() || dev_ == Device::cpu, "exact numerics in inference: the CPU");
  if (&num != num_) rows_cap_ = 0;  // the scratch with the next call's rows
  num_ = &num;
  // The full prefill's row: the visible-keys one with that schedule, else the plain one (the
  // exact schedule's strategy is exact_attn_); the other calls as they are.
  const CpSchedule full = sched == CpSchedule::visible ? sched : CpSchedule::plain;
  if (full != full_sched_) {
    CTXPAR_CHECK(full == CpSchedule::plain || dev_ == Device::cpu, "the visible-keys schedule in inference: the CPU");
    full_strategy_ = make_strategy(full_name_, topo_, full);
    CTXPAR_CHECK(full_strategy_ != nullptr, "no " << schedule_key(full) << " row of strategy " << full_name_);
    full_sched_ = full;
  }
  exact_attn_ = sched != CpSchedule::exact ? nullptr : make_strategy(prefill_row(CpAlgoSetting::pass_q).name, topo_, sched);
  CTXPAR_CHECK((num.exact() != nullptr) == (exact_attn_ != nullptr),
               "inference: exact numerics go with their attention schedule, plain with plain");
  CTXPAR_CHECK(placement_ == PlacementKind::zigzag || full_sched_ == CpSchedule::visible,
               "placement = balanced in inference: the visible-keys schedule");
}

void Engine::use_placement(PlacementKind placement) {
  CTXPAR_CHECK(placement == PlacementKind::zigzag || placement == PlacementKind::balanced,
               "inference places with placement = balanced or not at all (zigzag: each sequence on its own)");
  CTXPAR_CHECK(placement == PlacementKind::zigzag ||
                   (full_sched_ == CpSchedule::visible && !gdn_ && !exact_attn_),
               "placement = balanced in inference: the visible-keys schedule, no Gated DeltaNet layer");
  placement_ = placement;
}

int Engine::PrefillSeq::owner(int64_t i) const {
  for (size_t r = 0; r < at.size(); ++r)
    if (std::binary_search(at[r].begin(), at[r].end(), i)) return int(r);
  CTXPAR_CHECK(false, "prefill: new token " << i << " of sequence " << b << " is on no rank");
  return -1;
}

int64_t Engine::PrefillSeq::local_row(int64_t i) const {
  const std::vector<int64_t>& a = at[size_t(owner(i))];
  return int64_t(std::lower_bound(a.begin(), a.end(), i) - a.begin());
}

int64_t Engine::PrefillSeq::real_rows(int rank) const {
  const std::vector<int64_t>& a = at[size_t(rank)];
  return int64_t(std::lower_bound(a.begin(), a.end(), T) - a.begin());
}

LayerRun Engine::run(int64_t l) {
  return LayerRun{d_, topo_, tr_, times_, st_->cp, l, dev_, stream_, dev_ == Device::cpu ? nullptr : &mirror_, num_};
}

void Engine::forward(int64_t n, const int32_t* tokens, const int64_t* pos, const AttnFn& attn, const GdnFn& gdn,
                     const std::vector<int64_t>& logit_rows, float* logits) {
  ensure_rows(std::max<int64_t>(n, 1));
  const int64_t dim = d_.dim;
  float *x = x_.data(), *h = h_.data(), *x1 = x1_.data();
  if (n > 0) {
    Tracer::Scope sc(tr_, Phase::embed, -1, -1, 0, 0);
    if (dev_ == Device::cpu) {
      embedding_fwd(w_.emb, tokens, n, dim, x);
      rope_table(pos, n, d_.rope_dim(), inv_freq_.data(), cos_.data(), sin_.data());
    } else {  // token ids and the RoPE table of the call's positions to the GPU
      copy_to_device(tok_dev_.data(), tokens, size_t(n) * sizeof(int32_t), dev_, stream_);
      embedding_fwd(w_.emb, tok_dev_.data(), n, dim, x, dev_, stream_);
      const size_t half = size_t(n) * size_t(d_.rope_dim() / 2);
      std::vector<float> c(half), sn(half);
      rope_table(pos, n, d_.rope_dim(), inv_freq_.data(), c.data(), sn.data());
      copy_to_device(cos_.data(), c.data(), half * sizeof(float), dev_, stream_);
      copy_to_device(sin_.data(), sn.data(), half * sizeof(float), dev_, stream_);
    }
  }
  // The training model's layer code (model/layer.hpp) around the CP attention; a rank without
  // rows (decode with fewer sequences than ranks) still takes part in the attention's collectives.
  // Layer l's CP attention, timed, its pairs x heads counted for the layer (the coverage audit).
  const auto attend = [&](int64_t l, const void* q, const void* k, const void* v) {
    const double t0 = now_s(), p0 = st_->cp.attn_pair_heads[0] + st_->cp.attn_pair_heads[1];
    attn(l, q, k, v, o_.data(), lse_.data());
    st_->attn_s += now_s() - t0;
    st_->layer_pair_heads[size_t(l)] += st_->cp.attn_pair_heads[0] + st_->cp.attn_pair_heads[1] - p0;
  };
  for (int64_t l = 0, gl = 0; l < d_.layers; ++l) {
    const LayerView& w = w_.layers[size_t(l)];
    const LayerRun r = run(l);
    if (tr_) tr_->set_layer(int32_t(l));
    if (d_.is_gdn(l)) {
      const double t0 = now_s();
      gdn(l, gl++, x, x1);
      st_->attn_s += now_s() - t0;
      if (n > 0) mlp_fwd(r, w, n, x1, h, rstd_.data(), g_.data(), u_.data(), m_.data(), x);
      continue;
    }
    if (d_.mla) {  // the absorbed form over the latent rows (model/mla_layer.hpp): keys = values = latent
      if (n > 0) {
        mla_q_latent(r, w, n, x, cos_.data(), sin_.data(), h, rstd_.data(), mla_a_, mla_s_, q_.data());
        mla_absorb_queries(r, w, n, q_.data(), qa_.data());
      }
      const float* lat = mla_a_.lat.data();
      attend(l, qa_.data(), lat, lat);
      if (n == 0) continue;
      mla_absorbed_out(r, w, n, x, o_.data(), mla_s_, x1);
      mlp_fwd(r, w, n, x1, h, rstd_.data(), g_.data(), u_.data(), m_.data(), x);
      continue;
    }
    if (n > 0) attn_in_fwd(r, w, n, x, cos_.data(), sin_.data(), h, rstd_.data(), q_.data(), k_.data(), v_.data());
    const void *qa = q_.data(), *ka = k_.data(), *va = v_.data();
    if (dev_ != Device::cpu) {  // the attention's bf16 inputs
      if (n > 0) {
        f32_to_bf16(q_.data(), qb_.data(), n * d_.q_width(), dev_, stream_);
        f32_to_bf16(k_.data(), kb_.data(), n * d_.kv_width(), dev_, stream_);
        f32_to_bf16(v_.data(), vb_.data(), n * d_.kv_width(), dev_, stream_);
      }
      qa = qb_.data(), ka = kb_.data(), va = vb_.data();
    }
    attend(l, qa, ka, va);
    if (n == 0) continue;
    attn_out_fwd(r, w, n, x, o_.data(), x1);
    mlp_fwd(r, w, n, x1, h, rstd_.data(), g_.data(), u_.data(), m_.data(), x);
  }
  if (tr_) tr_->set_layer(-1);
  if (logit_rows.empty()) return;
  // Final norm and LM head of the requested rows only (the next token needs one row).
  const int64_t k = int64_t(logit_rows.size());
  for (int64_t i = 0; i < k; ++i)
    device_copy(x1 + i * dim, x + logit_rows[size_t(i)] * dim, size_t(dim) * sizeof(float), dev_, stream_);
  rmsnorm_fwd(x1, w_.final_norm, h, rstd_.data(), k, dim, d_.norm_eps, dev_, stream_);
  float* out = logits;
  if (dev_ != Device::cpu) {
    if (logits_dev_.size() < size_t(k * d_.vocab)) logits_dev_ = Buffer<float>(size_t(k * d_.vocab), false, dev_, stream_);
    out = logits_dev_.data();
  }
  layer_gemm(run(-1), false, false, k, d_.vocab, dim, h, dim, w_.lm_head, d_.vocab, 0, out, d_.vocab);
  if (dev_ != Device::cpu) copy_to_host(logits, out, size_t(k * d_.vocab) * sizeof(float), dev_, stream_);
}

double Engine::begin_call(Tracer* tr, CallStats& st) {
  tr_ = tr;
  st_ = &st;
  if (st.layer_pair_heads.size() != size_t(d_.layers)) st.layer_pair_heads.assign(size_t(d_.layers), 0.0);
  // What `st` held before this call (a CallStats may gather several calls): the audit's baseline.
  audit_base_ = st.layer_pair_heads;
  audit_base_.push_back(st.cp.attn_pair_heads[0] + st.cp.attn_pair_heads[1]);
  times_ = StepTimes{};
  return now_s();
}

void Engine::end_call(double t_start) {
  st_->gemm_s += times_.gemm_s;
  st_->total_s += now_s() - t_start;
}

// This tp rank's heads (tp splits the heads; the CP strategies run within the tp slice).
// A local (L) layer attends within its sliding window.
// MLA: the absorbed form, multi-query over the latent (cache_heads, cache_dim), its softmax scale
// that of the expanded heads' nope + rope dims.
CpCall Engine::call(int64_t n, int64_t l) const {
  const bool local = d_.is_local(l);
  CpCall p = attn_problem(n, d_.H_q_loc(), d_.cache_heads(), d_.cache_dim(),
                              local ? MaskKind::window : MaskKind::causal, local ? d_.window : 0);
  if (d_.mla) p.scale = 1.0f / std::sqrt(float(d_.D));
  return p;
}

StepOutput Engine::prefill(const std::vector<std::vector<int32_t>>& tokens, CpAlgo algo, Tracer* tr, CallStats& st,
                           bool want_logits, bool want_all_logits, PrefillBatching batching) {
  return prefill(tokens, std::vector<CpAlgo>(tokens.size(), algo), tr, st, want_logits, want_all_logits, batching);
}

StepOutput Engine::prefill(const std::vector<std::vector<int32_t>>& tokens, const std::vector<CpAlgo>& algos,
                           Tracer* tr, CallStats& st, bool want_logits, bool want_all_logits,
                           PrefillBatching batching) {
  const double t_start = begin_call(tr, st);
  const int64_t B = cache_.batch(), V = d_.vocab;
  CTXPAR_CHECK(int64_t(tokens.size()) == B && int64_t(algos.size()) == B,
               "prefill needs tokens and an algorithm of " << B << " sequences");
  StepOutput out;
  out.next_tokens.resize(size_t(B));
  out.ready_s.assign(size_t(B), 0.0);
  if (want_logits) out.logits.resize(size_t(B * V));
  if (want_all_logits) out.all_logits.resize(size_t(B));
  audit_news_.assign(size_t(B), 0);
  audit_olds_.assign(size_t(B), 0);
  for (int64_t b = 0; b < B; ++b) {  // padding rows sit after the prompt: they see it, no real row sees them
    const int64_t T = int64_t(tokens[size_t(b)].size());
    audit_news_[size_t(b)] = T == 0 ? 0 : Partition::padded_length(PartitionKind::zigzag, T, cp_.size());
    audit_olds_[size_t(b)] = cache_.seq_len(b);
  }
  for (CpAlgo algo : {CpAlgo::pass_kv, CpAlgo::pass_q}) {
    std::vector<int64_t> seqs;  // the sequences with new tokens and this algorithm
    for (int64_t b = 0; b < B; ++b)
      if (!tokens[size_t(b)].empty() && algos[size_t(b)] == algo) seqs.push_back(b);
    if (batching == PrefillBatching::packed) {
      prefill_seqs(seqs, tokens, algo, want_all_logits, out);
      for (int64_t b : seqs) out.ready_s[size_t(b)] = now_s() - t_start;
    } else {
      for (int64_t b : seqs) {
        prefill_seqs({b}, tokens, algo, want_all_logits, out);
        out.ready_s[size_t(b)] = now_s() - t_start;
      }
    }
  }
  // Sequences without new tokens keep their cache; their next token is not defined by this call.
  for (int64_t b = 0; b < B; ++b)
    if (tokens[size_t(b)].empty()) out.next_tokens[size_t(b)] = -1;
  end_call(t_start);
  return out;
}

std::vector<std::vector<std::vector<int64_t>>> Engine::layout_rows(const std::vector<int64_t>& seqs,
                                                                   const std::vector<std::vector<int32_t>>& tokens,
                                                                   bool placed, std::vector<int64_t>& pad_pos,
                                                                   std::vector<int64_t>& padding) const {
  const int N = cp_.size();
  pad_pos.clear();
  padding.assign(static_cast<size_t>(N), 0);
  if (!placed) {  // each sequence zigzag-sharded on its own
    std::vector<std::vector<std::vector<int64_t>>> at(seqs.size(), std::vector<std::vector<int64_t>>(size_t(N)));
    for (size_t j = 0; j < seqs.size(); ++j) {
      const Partition part(PartitionKind::zigzag, int64_t(tokens[size_t(seqs[j])].size()), N);
      for (int rr = 0; rr < N; ++rr) at[j][size_t(rr)] = part.positions(rr);
    }
    return at;
  }
  // The batch as one packed sequence of documents, each sequence's new tokens after the previous one's.
  std::vector<int64_t> lengths;
  int64_t S = 0;
  for (int64_t b : seqs) S += lengths.emplace_back(int64_t(tokens[size_t(b)].size()));
  const Placement p = prefill_placement(lengths, N);
  for (int rr = 0; rr < N; ++rr)  // the padding rows: positions past the batch's tokens
    for (int64_t g : p.rows[size_t(rr)])
      if (g >= S) {
        ++padding[size_t(rr)];
        if (rr == cp_.rank()) pad_pos.push_back(g);
      }
  return sequence_rows(p, lengths);
}

Engine::PrefillPlan Engine::plan_prefill(const std::vector<int64_t>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                                         CpAlgo algo) {
  const int N = cp_.size(), r = cp_.rank();
  // Each sequence zigzag-sharded on its own (any T on any N: the padding rows, the last
  // positions of a sequence and a suffix of its rows on each rank, take token 0 at positions
  // after its prompt, so no real query sees them; their K/V are written to the cache for this call
  // and dropped at the commit), or placed (placement = balanced: the padding rows, after every
  // sequence's on each rank, are a document of that rank's own, id = the batch size + the rank,
  // and take no cache row). This rank's rows: every sequence's share, one after the other; with several sequences
  // each is its own document (id = its index), so one call of every layer serves the whole batch.
  PrefillPlan pl;
  std::vector<PrefillSeq>& q = pl.seqs;
  std::vector<int64_t>& pos = pl.pos;
  std::vector<int64_t>& apos = pl.apos;  // the attention's positions (below)
  std::vector<int32_t>& tok = pl.tok;
  std::vector<int32_t>& doc = pl.doc;
  // every cache empty: the configured strategy on the new tokens (exact numerics: their schedule
  // over every rank's cache rows, as pass-Q's keys)
  pl.full = algo == CpAlgo::pass_kv && !exact_attn_ && !seqs.empty();
  for (int64_t b : seqs) pl.full = pl.full && cache_.seq_len(b) == 0;
  pl.placed = pl.full && placement_ == PlacementKind::balanced;
  CTXPAR_CHECK(!pl.placed || int64_t(seqs.size()) == cache_.batch(),
               "a placed prefill takes every sequence of the batch in one packed pass-KV call (the cache's capacity "
               "is the whole batch's placement), not " << seqs.size() << " of " << cache_.batch());
  std::vector<int64_t> pad_pos;
  const std::vector<std::vector<std::vector<int64_t>>> at = layout_rows(seqs, tokens, pl.placed, pad_pos, pl.padding);
  std::vector<int64_t> offs(static_cast<size_t>(N), 0);  // each rank's rows so far
  int64_t& rows = pl.rows;
  int64_t& keys = pl.keys;
  for (size_t j = 0; j < seqs.size(); ++j) {
    const int64_t b = seqs[j], T = int64_t(tokens[size_t(b)].size()), cached = cache_.seq_len(b);
    PrefillSeq s{b, T, cached, 0, 0, rows, 0, keys, at[j], offs};
    s.n = int64_t(s.at[size_t(r)].size());
    for (int rr = 0; rr < N; ++rr) offs[size_t(rr)] += int64_t(s.at[size_t(rr)].size());
    for (int64_t i : s.at[size_t(r)]) {
      pos.push_back(cached + i);
      tok.push_back(i >= T ? 0 : tokens[size_t(b)][size_t(i)]);
      doc.push_back(int32_t(b));
    }
    s.first = cache_.reserve(b, s.n, pos.data() + rows);
    // The attention's positions: sequence b's shifted by b * kSeqStride (the document ids keep
    // the sequences apart; the shift keeps the positions of a tile that straddles two sequences
    // in a narrow range, so the tile classification skips the other sequence's causal future).
    for (int64_t i = 0; i < s.n; ++i) apos.push_back(pos[size_t(rows + i)] + int64_t(b) * kSeqStride);
    // Keys over the cache: pass-Q this rank's own rows; pass-KV every rank's block padded to the
    // longest rank's (a ring message has one size).
    if (algo == CpAlgo::pass_q || exact_attn_) {
      s.S_k = cache_.len(b) + s.n;
    } else {
      for (int rr = 0; rr < N; ++rr) s.S_k = std::max(s.S_k, cache_.len(b, rr) + int64_t(s.at[size_t(rr)].size()));
    }
    rows += s.n;
    keys += s.S_k;
    q.push_back(std::move(s));
  }
  const int64_t pad_doc = cache_.batch() + r;
  for (int64_t g : pad_pos) {  // placed: this rank's padding rows, a document past every sequence
    pos.push_back(g);
    apos.push_back(g + pad_doc * kSeqStride);
    tok.push_back(0);
    doc.push_back(int32_t(pad_doc));
  }
  rows += int64_t(pad_pos.size());
  return pl;
}

void Engine::prefill_seqs(const std::vector<int64_t>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                          CpAlgo algo, bool want_all_logits, StepOutput& out) {
  if (seqs.empty()) return;
  const int N = cp_.size(), r = cp_.rank();
  const int64_t V = d_.vocab, kw = cache_.row_elems();
  PrefillPlan pl = plan_prefill(seqs, tokens, algo);
  const std::vector<PrefillSeq>& q = pl.seqs;
  const std::vector<int64_t>& pos = pl.pos;
  const std::vector<int32_t>& doc = pl.doc;
  const int64_t rows = pl.rows, keys = pl.keys;
  const bool full = pl.full;
  // A pass-KV key block padded past some rank's slab of its sequence (a cache placed unevenly: a
  // prompt kept whole on another rank) is packed with the batch's layout below, and padded on the
  // ranks whose slab is shorter (decided alike on every rank).
  bool short_slab = false;
  if (!full && algo == CpAlgo::pass_kv && !exact_attn_)
    for (const PrefillSeq& s : q)
      for (int rr = 0; rr < N; ++rr) short_slab = short_slab || s.S_k > cache_.capacity(s.b, rr);
  const bool docs = q.size() > 1 || pl.placed || short_slab;  // placed: the padding rows are a document too
  CTXPAR_CHECK(!pl.placed || !gdn_, "a placed prefill with Gated DeltaNet layers");
  if (pl.placed) {  // the audit's rows: each sequence's own (no padding of its own), each rank's padding document
    for (const PrefillSeq& s : q) audit_news_[size_t(s.b)] = s.T;
    audit_news_.insert(audit_news_.end(), pl.padding.begin(), pl.padding.end());
    audit_olds_.resize(audit_news_.size(), 0);
  }
  if (full) ++visible_batch_;  // the visible-keys row plans this call once, for every layer
  // Several sequences over their caches: their key rows packed into one block per layer, with
  // positions and document ids (the positions of the new rows were reserved above).
  // (Bytes: the cache's element type, f32 on the CPU, bf16 on a GPU.)
  const size_t eb = cache_.elem_bytes(), row_b = size_t(kw) * eb;
  Buffer<std::byte> kp, vp;
  std::vector<int64_t> kpos;
  std::vector<int32_t> kdoc;
  // A sequence's rows past this rank's slab (kept_rows): zero K/V at position kNoPos, seen by nothing.
  const auto kept_rows = [&](const PrefillSeq& s) { return std::min(s.S_k, cache_.capacity(s.b)); };
  if (docs && !full) {
    kp = Buffer<std::byte>(size_t(keys) * row_b, short_slab, dev_, stream_);
    if (!d_.mla) vp = Buffer<std::byte>(size_t(keys) * row_b, short_slab, dev_, stream_);  // MLA: values are the keys' rows
    for (const PrefillSeq& s : q) {
      for (int64_t i = 0; i < s.S_k; ++i) {
        const int64_t p = i < kept_rows(s) ? cache_.pos(s.b)[i] : kNoPos;
        kpos.push_back(p == kNoPos ? p : p + s.b * kSeqStride);
      }
      kdoc.insert(kdoc.end(), size_t(s.S_k), int32_t(s.b));
    }
  }
  // GPU: the call's positions and document ids on the device (the cache's positions as well).
  cache_.sync_positions();
  const std::vector<int64_t>& qpos = docs ? pl.apos : pos;
  const Buffer<int64_t> qpos_d = on_device(qpos), kpos_d = on_device(kpos);
  const Buffer<int32_t> doc_d = docs ? on_device(doc) : Buffer<int32_t>{}, kdoc_d = on_device(kdoc);
  const auto at = [](const void* base, size_t bytes) { return static_cast<const char*>(base) + bytes; };
  AttnFn attn = [&](int64_t l, const void* qx, const void* k, const void* v, float* o, float* lse) {
    for (const PrefillSeq& s : q) {
      device_copy(static_cast<char*>(cache_.k(s.b, l)) + size_t(s.first) * row_b, at(k, size_t(s.off) * row_b),
                  size_t(s.n) * row_b, dev_, stream_);
      if (cache_.v(s.b, l) != cache_.k(s.b, l))  // MLA: one array, written above
        device_copy(static_cast<char*>(cache_.v(s.b, l)) + size_t(s.first) * row_b, at(v, size_t(s.off) * row_b),
                    size_t(s.n) * row_b, dev_, stream_);
    }
    CpCall t = call(rows, l);
    t.q = qx;
    t.q_pos = qpos.data();
    t.q_doc = docs ? doc.data() : nullptr;
    t.o = o;
    t.lse = lse;
    if (full) {  // the configured CP strategy on the new tokens alone
      t.k = k;
      t.v = v;
      t.k_pos = t.q_pos;
      t.k_doc = t.q_doc;
      t.batch_id = visible_batch_;
      set_device(t, qpos_d.data(), doc_d.data(), qpos_d.data(), doc_d.data());
      full_strategy_->forward(t, tr_, st_->cp);
      return;
    }
    const int64_t* kpos_dev = nullptr;
    if (docs) {
      for (const PrefillSeq& s : q) {
        device_copy(kp.data() + size_t(s.k_off) * row_b, cache_.k(s.b, l), size_t(kept_rows(s)) * row_b, dev_, stream_);
        if (!d_.mla)
          device_copy(vp.data() + size_t(s.k_off) * row_b, cache_.v(s.b, l), size_t(kept_rows(s)) * row_b, dev_, stream_);
      }
      t.k = kp.data();
      t.v = d_.mla ? kp.data() : vp.data();
      t.k_pos = kpos.data();
      t.k_doc = kdoc.data();
      kpos_dev = kpos_d.data();
    } else {
      t.k = cache_.k(q[0].b, l);
      t.v = cache_.v(q[0].b, l);
      t.k_pos = cache_.pos(q[0].b);
      kpos_dev = cache_.pos_all_device() + cache_.first_row(q[0].b);
    }
    set_device(t, qpos_d.data(), doc_d.data(), kpos_dev, kdoc_d.data());
    t.S_k = keys;
    if (exact_attn_) return exact_attn_->forward(t, tr_, st_->cp);
    (algo == CpAlgo::pass_q ? *pass_q_ : *pass_kv_).forward(t, tr_, st_->cp);
  };
  GdnFn gdn = [&](int64_t l, int64_t gl, const float* x, float* x1) {
    const int64_t dim = d_.dim;
    for (const PrefillSeq& s : q)
      gdn_->prefill(run(l), w_.layers[size_t(l)], gl, s.b, s.cached, Partition(PartitionKind::zigzag, s.T, cp_.size()),
                    s.n, x + s.off * dim, x1 + s.off * dim);  // (never placed: use_placement refuses GDN layers)
  };
  // Logits: each sequence's last prompt token's row (on its owner rank), or every local row (tests).
  // (Every row: a placed prefill's padding rows too, so every rank gives the same count.)
  std::vector<int64_t> logit_rows;
  if (want_all_logits)
    for (int64_t i = 0; i < rows; ++i) logit_rows.push_back(i);
  std::vector<int64_t> last_row(q.size(), -1);  // index into logit_rows, on the owner rank
  for (size_t j = 0; j < q.size(); ++j) {
    const PrefillSeq& s = q[j];
    if (want_all_logits) {
      if (s.owner(s.T - 1) == r) last_row[j] = s.off + s.local_row(s.T - 1);
    } else if (s.owner(s.T - 1) == r) {
      last_row[j] = int64_t(logit_rows.size());
      logit_rows.push_back(s.off + s.local_row(s.T - 1));
    }
  }
  Buffer<float> lg(size_t(std::max<int64_t>(int64_t(logit_rows.size()), 1) * V), false);
  forward(rows, pl.tok.data(), pos.data(), attn, gdn, logit_rows, lg.data());
  std::vector<int64_t> added(static_cast<size_t>(N));
  for (const PrefillSeq& s : q) {
    for (int rr = 0; rr < N; ++rr) added[size_t(rr)] = s.real_rows(rr);
    cache_.commit(s.b, added, false);
  }
  share_prefill_logits(pl, last_row, lg.data(), want_all_logits, out);
}

void Engine::share_prefill_logits(const PrefillPlan& pl, const std::vector<int64_t>& last_row, const float* lg,
                                  bool want_all_logits, StepOutput& out) {
  const int N = cp_.size(), r = cp_.rank();
  const int64_t V = d_.vocab, rows = pl.rows;
  const std::vector<PrefillSeq>& q = pl.seqs;
  // The last row of every sequence to every rank: one broadcast per owner rank.
  Buffer<float> last(size_t(V) * q.size(), false);
  for (int owner = 0; owner < N; ++owner) {
    std::vector<size_t> mine;
    for (size_t j = 0; j < q.size(); ++j)
      if (q[j].owner(q[j].T - 1) == owner) mine.push_back(j);
    if (mine.empty()) continue;
    Buffer<float> msg(mine.size() * size_t(V), false);
    if (r == owner)
      for (size_t i = 0; i < mine.size(); ++i)
        std::memcpy(msg.data() + i * V, lg + last_row[mine[i]] * V, size_t(V) * sizeof(float));
    cp_.broadcast(msg.span(), owner);
    for (size_t i = 0; i < mine.size(); ++i)
      std::memcpy(last.data() + mine[i] * V, msg.data() + i * V, size_t(V) * sizeof(float));
  }
  for (size_t j = 0; j < q.size(); ++j) {
    const float* row = last.data() + j * V;
    out.next_tokens[size_t(q[j].b)] = greedy(row, V);
    if (!out.logits.empty()) std::memcpy(out.logits.data() + q[j].b * V, row, size_t(V) * sizeof(float));
  }
  if (want_all_logits) {  // every rank's rows (the same count on each), each sequence in global order
    std::vector<float> all(static_cast<size_t>(rows * V * N));
    cp_.all_gather(std::span<const float>(lg, size_t(rows * V)), std::span<float>(all));
    for (const PrefillSeq& s : q) {
      std::vector<float>& g = out.all_logits[size_t(s.b)];
      g.assign(size_t(s.T * V), 0.f);
      for (int rr = 0; rr < N; ++rr) {
        const float* from = all.data() + size_t((rr * rows + s.offs[size_t(rr)]) * V);
        for (size_t i = 0; i < s.at[size_t(rr)].size(); ++i)
          if (const int64_t t = s.at[size_t(rr)][i]; t < s.T)
            std::memcpy(g.data() + size_t(t * V), from + i * size_t(V), size_t(V) * sizeof(float));
      }
    }
  }
}

StepOutput Engine::decode(const std::vector<int32_t>& tokens, DecodeAlgo algo, Tracer* tr, CallStats& st,
                          bool want_logits) {
  const double t_start = begin_call(tr, st);
  const int N = cp_.size(), r = cp_.rank();
  const int64_t B = cache_.batch(), V = d_.vocab;
  CTXPAR_CHECK(int64_t(tokens.size()) == B, "decode needs one token for each of " << B << " sequences");
  // Rows of this rank: sequences r*Bq .. r*Bq + Bq - 1 (those < B); blocks padded to Bq rows.
  const int64_t Bq = (B + N - 1) / N, b0 = r * Bq, n = std::max<int64_t>(0, std::min(Bq, B - b0));
  // The KV cache as the decode call's keys: every sequence's rows here, and where this rank
  // stores a sequence's new token (its round-robin target), -1 where another rank does.
  std::vector<int64_t> seq_pos(static_cast<size_t>(B)), doc_begin(static_cast<size_t>(B)), doc_len(static_cast<size_t>(B)),
      new_slot(static_cast<size_t>(B), -1);
  audit_news_.assign(size_t(B), 1);
  audit_olds_.assign(size_t(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    seq_pos[size_t(b)] = cache_.seq_len(b);
    audit_olds_[size_t(b)] = seq_pos[size_t(b)];
    doc_begin[size_t(b)] = cache_.first_row(b);
    doc_len[size_t(b)] = cache_.len(b);
    if (cache_.decode_target(b) == r) new_slot[size_t(b)] = cache_.first_row(b) + cache_.reserve(b, 1, &seq_pos[size_t(b)]);
  }
  std::vector<int32_t> tok(size_t(std::max<int64_t>(n, 1)));
  std::vector<int64_t> pos(size_t(std::max<int64_t>(Bq, 1)));  // padding rows: 0, seen by nothing
  std::vector<int32_t> seq(size_t(Bq), -1);  // the query rows' sequences (-1: padding row)
  for (int64_t i = 0; i < n; ++i) {
    tok[size_t(i)] = tokens[size_t(b0 + i)];
    pos[size_t(i)] = seq_pos[size_t(b0 + i)];
    seq[size_t(i)] = int32_t(b0 + i);
  }
  CpStrategy& strategy = algo == DecodeAlgo::allgather ? *decode_allgather_ : *decode_pass_q_;
  cache_.sync_positions();  // GPU: the reserved slots' positions, and the call's, on the device
  const Buffer<int64_t> pos_d = on_device(pos);
  const Buffer<int32_t> seq_d = on_device(seq);
  AttnFn attn = [&](int64_t l, const void* q, const void* k, const void* v, float* o, float* lse) {
    CpCall t = call(Bq, l);
    t.q = q;
    t.q_pos = pos.data();
    t.q_doc = seq.data();
    t.k_new = k;
    t.v_new = v;
    t.k = t.k_cache = cache_.k_layer(l);
    t.v = t.v_cache = cache_.v_layer(l);
    t.k_pos = cache_.pos_all();
    t.S_k = cache_.rows();
    t.k_doc_begin = doc_begin.data();
    t.k_doc_len = doc_len.data();
    t.k_new_slot = new_slot.data();
    t.o = o;
    t.lse = lse;
    set_device(t, pos_d.data(), seq_d.data(), cache_.pos_all_device(), nullptr);
    if (exact_attn_) return exact_attn_->forward(t, tr_, st_->cp);
    strategy.forward(t, tr_, st_->cp);
  };
  std::vector<int64_t> row_seqs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) row_seqs[size_t(i)] = b0 + i;  // their GDN states live here (home)
  GdnFn gdn = [&](int64_t l, int64_t gl, const float* x, float* x1) {
    gdn_->decode(run(l), w_.layers[size_t(l)], gl, row_seqs, n, x, x1);
  };
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = i;
  Buffer<float> lg(size_t(Bq * V), true);
  forward(n, tok.data(), pos.data(), attn, gdn, rows, lg.data());
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> added(size_t(N), 0);
    added[size_t(cache_.decode_target(b))] = 1;
    cache_.commit(b, added, true);
  }
  StepOutput out;
  std::vector<int32_t> mine(size_t(Bq), -1), all(size_t(Bq * N));
  for (int64_t i = 0; i < n; ++i) mine[size_t(i)] = greedy(lg.data() + i * V, V);
  cp_.all_gather(std::span<const int32_t>(mine), std::span<int32_t>(all));
  out.next_tokens.assign(all.begin(), all.begin() + B);
  if (want_logits) {
    std::vector<float> g(static_cast<size_t>(Bq * N * V));
    cp_.all_gather(std::span<const float>(lg.data(), size_t(Bq * V)), std::span<float>(g));
    out.logits.assign(g.begin(), g.begin() + B * V);
  }
  end_call(t_start);
  return out;
}

}  // namespace ctxpar::infer
