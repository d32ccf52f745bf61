#include "perf/cost_model.hpp"

#include <algorithm>
#include <cmath>

#include "core/config.hpp"
#include "cp/strategy.hpp"
#include "model/flops.hpp"
#include "model/model.hpp"
#include "model/transformer.hpp"
#include "shard/partition.hpp"

namespace ctxpar {

namespace {

// ModelDims of the model/ FLOP formulas (whole model, no tp split).
ModelDims dims_of(const ModelShape& m, int tp = 1) {
  ModelDims d;
  d.layers = m.layers;
  d.dim = m.dim;
  d.ffn = m.ffn;
  d.vocab = m.vocab;
  d.H_q = int32_t(m.H_q);
  d.H_kv = int32_t(m.H_kv);
  d.D = int32_t(m.D);
  d.tp = tp;
  d.kinds = m.kinds;
  d.gdn_H = int32_t(m.gdn_H), d.gdn_Dk = int32_t(m.gdn_Dk), d.gdn_Dv = int32_t(m.gdn_Dv);
  d.gdn_conv = int32_t(m.gdn_conv), d.gdn_chunk = int32_t(m.gdn_chunk);
  d.gdn_schedule = m.gdn_schedule;
  d.window = m.window;
  if (m.mla) {
    d.mla = true;
    d.q_lora = int32_t(m.q_lora), d.kv_lora = int32_t(m.kv_lora), d.nope = int32_t(m.nope), d.rope = int32_t(m.rope);
    d.v_dim = int32_t(m.v_dim);
  }
  return d;
}

// Bytes per activation element and the peaks one precision uses.
struct Prec {
  double e = 2;             // activation / KV bytes per element
  double w_attn = 2, w_ffn = 2;  // weight bytes per parameter
  double peak = 0, peak_ffn = 0, peak_mfu = 0;  // FLOP/s: attention + projections, FFN, MFU denominator
};
Prec precision_of(const HardwareProfile& hw, Precision p) {
  Prec r;
  if (p == Precision::automatic) p = hw.default_precision;
  if (p == Precision::fp32) {
    r.e = r.w_attn = r.w_ffn = 4;
    r.peak = r.peak_ffn = r.peak_mfu = hw.peak_fp32_flops > 0 ? hw.peak_fp32_flops : hw.peak_bf16_flops;
    return r;
  }
  r.peak = r.peak_ffn = r.peak_mfu = hw.peak_bf16_flops;
  if (p == Precision::fp8_ffn && hw.peak_fp8_flops > 0) {
    r.peak_ffn = hw.peak_fp8_flops;
    r.w_ffn = 1;
  }
  return r;
}

// K/V heads per tensor-parallel rank (a K/V head is replicated when tp exceeds H_kv).
double kv_heads_loc(const ModelShape& m, int64_t tp) { return std::max<double>(1.0, double(m.H_kv) / double(tp)); }

// Compute slowdown of one rank: ranks outnumbering the node's compute units share them (CPU runs
// with more ranks than cores), at shared_core_eff.
double share_factor(const HardwareProfile& hw, const PerfMesh& mesh) {
  const double units = hw.compute_units_per_node > 0 ? hw.compute_units_per_node : double(hw.chips_per_node);
  const double on_node = double(std::min(mesh.chips(), hw.chips_per_node));
  return on_node > units ? on_node / units / hw.shared_core_eff : 1.0;
}

double imbalance(PartitionKind partition, int64_t n) {
  // Contiguous shards under a causal mask: the last rank (or, in a ring, every step's slowest
  // rank) does (2n-1)/n times the mean work; zigzag and striped shards are balanced.
  return partition == PartitionKind::contiguous && n > 1 ? double(2 * n - 1) / double(n) : 1.0;
}

// What the cost model prices for a strategy name: the pattern of its messages (the registry's
// row, cp/strategy.hpp), one formula per pattern below. Training: a training row (allgather,
// ulysses, ring, usp); inference: those, or a value of cp_algo (pass_kv: the ring's row over the
// cache; pass_q: pass_q's). Returns "" when the name is priced in `mode`, else why not.
std::string priced_pattern(const std::string& strategy, PerfMode mode, CommPattern& out) {
  const StrategyRow* row = strategy_row(strategy);
  CpAlgoSetting algo = CpAlgoSetting::automatic;
  if (row && row->use == StrategyUse::training) {
    out = row->comm;
    return "";
  }
  if (parse_in(kCpAlgoNames, strategy, algo) && algo != CpAlgoSetting::automatic) {
    out = prefill_row(algo).comm;
    if (mode != PerfMode::train) return "";
    return strategy + " is an inference pattern (cp_algo); a training step runs " + strategies_with(CpSchedule::plain);
  }
  return "unknown strategy '" + strategy + "' (the cost model knows " + strategies_with(CpSchedule::plain) + ", " +
         name_of(CpAlgoSetting::pass_kv) + " or " + name_of(CpAlgoSetting::pass_q) + ")";
}

// The training rows that move MLA's latent, as a message lists them ("allgather and ring").
std::string latent_movers() {
  std::string out;
  for (const StrategyRow& r : strategy_rows())
    if (r.use == StrategyUse::training && r.schedule == CpSchedule::plain && r.mla == MlaSupport::latent)
      out += (out.empty() ? "" : " and ") + std::string(r.name);
  return out;
}

// Elementwise traffic per token per layer (bytes / element size): norms, residual adds, RoPE,
// SwiGLU, read and written once per op; forward only or forward + backward.
double elementwise_elems(const ModelShape& m, int64_t tp, bool backward) {
  const double qk = double((m.H_q + m.H_kv) * m.D) / double(tp), f = double(m.ffn) / double(tp), d = double(m.dim);
  const double fwd = 10 * d + 2 * qk + 3 * f;  // 2 norms (r+w), 2 residual adds (2r+w), RoPE q,k, SwiGLU (2r+w)
  const double bwd = 14 * d + 2 * qk + 5 * f;  // norm bwd (3r+1w accumulate), residual grads, RoPE^-1, SwiGLU bwd
  return backward ? fwd + bwd : fwd;
}

}  // namespace

double expected_max_normal(int64_t n) {
  if (n <= 1) return 0;
  // E[max] = integral of x n phi(x) Phi(x)^(n-1) dx, trapezoid rule over [-8, 8].
  const double h = 1e-3;
  double sum = 0;
  for (double x = -8; x <= 8; x += h) {
    const double phi = std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI), Phi = 0.5 * std::erfc(-x / std::sqrt(2.0));
    sum += x * double(n) * phi * std::pow(Phi, double(n - 1)) * h;
  }
  return sum;
}

double elementwise_bytes(const ModelShape& m, int64_t tp, double tokens, bool backward, double e) {
  return tokens * double(m.layers) * elementwise_elems(m, tp, backward) * e;
}
double loss_bytes(const ModelShape& m, double tokens, double e) { return tokens * 3.0 * double(m.vocab) * e; }
double optimizer_bytes(double params) { return params * 28.0; }

int64_t ModelShape::gdn_layers() const { return int64_t(std::count(kinds.begin(), kinds.end(), 'D')); }
int64_t ModelShape::local_layers() const { return int64_t(std::count(kinds.begin(), kinds.end(), 'L')); }

double ModelShape::params_total() const {
  const double gdn_extra = double(gdn_conv) * double(2 * gdn_H * gdn_Dk + gdn_H * gdn_Dv) + 2.0 * gdn_H + gdn_Dv;
  return double(attn_layers()) * attn_params_per_layer() + double(gdn_layers()) * (gdn_proj_params_per_layer() + gdn_extra) +
         double(layers) * (ffn_params_per_layer() + 2.0 * dim) + 2.0 * double(vocab) * dim + dim;
}

ModelShape model_shape(const Config& c) {
  ModelShape m;
  m.layers = c.layers;
  m.dim = c.dim;
  m.ffn = c.ffn_dim;
  m.vocab = c.vocab;
  m.H_q = c.heads;
  m.H_kv = c.kv_heads;
  m.D = c.head_dim;
  const ModelDims d = model_dims(c, 1, 0);  // the layer kinds and GDN shapes, as train builds them
  m.kinds = d.kinds;
  m.gdn_H = d.gdn_H, m.gdn_Dk = d.gdn_Dk, m.gdn_Dv = d.gdn_Dv, m.gdn_conv = d.gdn_conv, m.gdn_chunk = d.gdn_chunk;
  m.gdn_schedule = d.gdn_schedule;
  m.window = d.window;
  m.local_strategy = c.local_strategy;
  if (d.mla) {
    m.mla = true;
    m.H_kv = d.H_kv;
    m.D = d.D;
    m.q_lora = d.q_lora, m.kv_lora = d.kv_lora, m.nope = d.nope, m.rope = d.rope, m.v_dim = d.v_dim;
  }
  return m;
}


std::vector<std::string> perf_strategies(PerfMode m) {
  if (m == PerfMode::train) return strategy_names();
  const std::string kv = name_of(CpAlgoSetting::pass_kv), q = name_of(CpAlgoSetting::pass_q);
  if (m == PerfMode::decode) return {q, kv};
  // A prefill: pass-KV and pass-Q, then the other training rows (the ring's is pass-KV); a partial
  // prefill only those that serve a cache (not the head-splitting all-to-all).
  std::vector<std::string> out = {kv, q};
  for (const std::string& n : strategy_names()) {
    const CommPattern comm = strategy_row(n)->comm;
    if (comm != CommPattern::kv_ring && (m == PerfMode::prefill || !splits_heads(comm))) out.push_back(n);
  }
  return out;
}

std::string same_as(const std::string& strategy, const PerfMesh& mesh) {
  const StrategyRow* row = strategy_row(strategy);
  if (!row || row->comm != CommPattern::heads_ring || (mesh.ulysses >= 2 && mesh.ring >= 2)) return "";
  return training_row(mesh.ulysses < 2 ? CommPattern::kv_ring : CommPattern::heads)->name;
}


double ring_pipeline_s(int64_t n, double c, double m, double o) {
  if (n <= 1) return c + o;
  return double(n - 1) * std::max(c + o, m) + c + o;
}

int64_t ranks_per_node(const HardwareProfile& hw, int64_t n, int64_t stride) {
  if (stride >= hw.chips_per_node) return 1;
  return std::max<int64_t>(1, std::min(n, hw.chips_per_node / stride));
}

static double log2_steps(int64_t n) { return n > 1 ? std::ceil(std::log2(double(n))) : 0.0; }

// Collectives over n ranks, k of them per node. Inside one node: a ring at the collective rate.
// Across nodes: NCCL's ring algorithm — one ring per channel through every rank, k channels, each
// leaving a node through its own NIC — is one pipeline, so the busiest link sets the time: a
// rank's NVLink carries the k-1 channels whose next hop stays in the node, its NIC the one that
// leaves (a hierarchical reduce-scatter / all-reduce / all-gather would instead add the levels'
// times). Bus factors as nccl-tests: all-reduce 2(n-1)/n, all-gather (n-1)/n.
namespace {
double ring_bw_s(const HardwareProfile& hw, int64_t n, int64_t k, double bus_bytes, double inter_bps) {
  if (n <= k) return bus_bytes / hw.intra_collective_bps();
  return bus_bytes / double(k) * std::max(double(k - 1) / hw.intra_collective_bps(), 1.0 / inter_bps);
}
// Latency: log2 steps per level (small messages use tree / one-shot algorithms; for large ones
// the bandwidth term dominates whatever the algorithm).
double ring_latency_s(const HardwareProfile& hw, int64_t n, int64_t k) {
  const double nodes = double(n) / double(k);
  return (k > 1 ? log2_steps(k) * hw.intra.latency_s : 0) + (nodes > 1 ? log2_steps(int64_t(nodes)) * hw.inter.latency_s : 0);
}
}  // namespace

// Units of the flat layout on one tp rank: a layer, the embedding or LM head [V, dim], the widest.
double layer_unit(const ModelShape& m, int64_t tp) {
  return (m.attn_params_per_layer() + m.ffn_params_per_layer()) / double(tp);
}
double edge_unit(const ModelShape& m, int64_t tp) { return double(m.vocab) * double(m.dim) / double(tp); }
double widest_unit(const ModelShape& m, int64_t tp) { return std::max(edge_unit(m, tp), layer_unit(m, tp)); }

double state_bytes(const ModelShape& m, ShardLevel level, int64_t n, int64_t tp) {
  const double P = m.params_total() / double(tp), piece = P / double(std::max<int64_t>(n, 1)), wide = widest_unit(m, tp);
  const double two = wide + layer_unit(m, tp);  // a UnitFeed pair: the widest unit and the widest layer
  const bool sharded = level != ShardLevel::none && n > 1;
  if (!sharded) return 16.0 * P;
  switch (level) {  // model/state_shard.hpp, as the train plan counts it (fp32 throughout)
    case ShardLevel::optimizer: return 8.0 * P + 12.0 * piece + 4.0 * wide;          // whole weights, grads; pieces
    case ShardLevel::grads: return 4.0 * P + 16.0 * piece + 4.0 * wide + 4.0 * two;  // whole weights; pieces; 3 units
    default: return 16.0 * piece + 8.0 * two;                                        // pieces; 4 units
  }
}

double state_sync_exposed_s(const HardwareProfile& hw, const ModelShape& m, ShardLevel level, int64_t n, int64_t k,
                            int64_t tp, double compute_s) {
  if (!hw.overlap_collectives) return state_sync_s(hw, m, level, n, k, tp);
  if (n <= 1) return 0;
  const double L = double(std::max<int64_t>(m.layers, 1));
  const double whole = allgather_s(hw, n, k, 4.0 * m.params_total() / double(tp));
  const double layer = allgather_s(hw, n, k, 4.0 * layer_unit(m, tp)), edge = allgather_s(hw, n, k, 4.0 * edge_unit(m, tp));
  const double fwd = compute_s / L / 3.0, bwd = 2.0 * fwd;  // one layer's compute: a third forward
  switch (level) {
    case ShardLevel::none: return 0;  // the all-reduce under the backward
    case ShardLevel::optimizer: return whole;  // + the updated weights' gather, after the step
    case ShardLevel::grads: return whole + edge + L * std::max(0.0, layer - bwd);
    case ShardLevel::params: return 2.0 * edge + L * (std::max(0.0, layer - fwd) + std::max(0.0, 2.0 * layer - bwd));
  }
  return 0;
}

double state_sync_s(const HardwareProfile& hw, const ModelShape& m, ShardLevel level, int64_t n, int64_t k, int64_t tp) {
  if (n <= 1) return 0;
  const double bytes = m.params_total() / double(tp) * 4.0;  // fp32 gradients and weights
  // per-unit collectives (grads, params): one latency per unit beyond the first
  const double units = double(m.layers) + 2.0, per_unit = (units - 1.0) * ring_latency_s(hw, n, k);
  const double gather = allgather_s(hw, n, k, bytes);  // a reduce-scatter moves what an all-gather does
  switch (level) {
    case ShardLevel::none: return allreduce_s(hw, n, k, bytes);
    case ShardLevel::optimizer: return allreduce_s(hw, n, k, bytes) + gather;  // + the updated weights
    case ShardLevel::grads: return 2.0 * gather + 2.0 * per_unit;              // reduce-scatter, all-gather
    case ShardLevel::params: return 3.0 * gather + 3.0 * per_unit;             // + the forward's and backward's gathers
  }
  return 0;
}

double allreduce_s(const HardwareProfile& hw, int64_t n, int64_t k, double bytes) {
  if (n <= 1) return 0;
  return ring_bw_s(hw, n, k, 2.0 * double(n - 1) / double(n) * bytes, hw.inter_collective_bps()) + 2.0 * ring_latency_s(hw, n, k);
}

double allgather_s(const HardwareProfile& hw, int64_t n, int64_t k, double out_bytes) {
  if (n <= 1) return 0;
  return ring_bw_s(hw, n, k, double(n - 1) / double(n) * out_bytes, hw.inter_allgather_bps()) + ring_latency_s(hw, n, k);
}

double alltoall_s(const HardwareProfile& hw, int64_t n, int64_t k, double bytes) {
  if (n <= 1) return 0;
  // Of the n equal parts a rank holds, k-1 go over the intra link and n-k over its NIC; both
  // links work at once.
  const double intra = double(k - 1) / double(n) * bytes / hw.intra_alltoall_bps() + (k > 1 ? hw.intra.latency_s * double(k - 1) : 0);
  const double inter = double(n - k) / double(n) * bytes / hw.inter_alltoall_bps() + (n > k ? hw.inter.latency_s * double(n - k) : 0);
  return std::max(intra, inter);
}

double ring_step_loss_s(const HardwareProfile& hw, int64_t n, int64_t k, double bytes) {
  return n > k ? bytes * hw.inter_overlap_loss_s_per_byte : 0.0;
}

double p2p_s(const HardwareProfile& hw, int64_t n, int64_t k, double bytes) {
  if (n <= 1) return 0;
  const Link& l = n > k ? hw.inter : hw.intra;  // a ring spanning nodes waits for its node-crossing hop
  return l.latency_s + bytes / l.bw_bytes_per_s;
}

double pass_kv_miss_rate_threshold(const ModelShape& m) { return 2.0 * double(m.H_kv) / double(m.H_q); }

namespace {

std::string check_mesh(const ModelShape& m, const PerfMesh& mesh, const std::string& strategy, CommPattern comm,
                       const PerfWorkload& w) {
  auto s = [](int64_t v) { return std::to_string(v); };
  if (m.H_q % mesh.tp != 0) return "tp:" + s(mesh.tp) + " does not divide heads = " + s(m.H_q);
  if (m.ffn % mesh.tp != 0) return "tp:" + s(mesh.tp) + " does not divide ffn_dim = " + s(m.ffn);
  const int64_t N = mesh.cp();
  const bool uly = splits_heads(comm);
  if (m.mla && uly)
    return strategy + " splits the heads, and MLA's K/V latent is shared by every head (" + latent_movers() +
           " move the latent)";
  if (uly && w.mode != PerfMode::train && w.mode != PerfMode::prefill)
    return strategy + " runs the full prefill only (the partial prefill and decode circulate K/V or Q: " +
           name_of(CpAlgoSetting::pass_kv) + ", " + name_of(CpAlgoSetting::pass_q) + ")";
  if (uly) {
    const int64_t U = comm == CommPattern::heads_ring ? mesh.ulysses : N;
    const int64_t hq = m.H_q / mesh.tp, hkv = std::max<int64_t>(1, m.H_kv / mesh.tp);
    if (hq % U != 0) return "ulysses over " + s(U) + " ranks needs query heads per tp rank (" + s(hq) + ") divisible by " + s(U);
    if (hkv % U != 0 && U % hkv != 0)
      return "ulysses over " + s(U) + " ranks needs K/V heads per tp rank (" + s(hkv) + ") to divide or be divided by " + s(U);
  }
  const int64_t T = w.mode == PerfMode::decode ? 1 : w.T();
  if (w.mode != PerfMode::decode && T < 1) return "no new tokens (T = " + s(T) + ")";
  return "";
}

// Shared pieces of one prediction.
struct Ctx {
  const ModelShape& m;
  const HardwareProfile& hw;
  const PerfMesh& mesh;
  const PerfWorkload& w;
  Prec p;
  double share;
  double hbm_bps() const { return hw.hbm_bytes_per_s * hw.hbm_eff; }
  double rate(double measured_bytes_per_s) const { return measured_bytes_per_s > 0 ? measured_bytes_per_s : hbm_bps(); }
};

// GEMM seconds per rank for `tokens` tokens per rank through every layer's projections (and the
// LM head when given), forward (mult 1) or forward+backward (mult 3), FFN in its own precision.
double gemm_seconds(const Ctx& c, double tokens, double mult, bool lm_head) {
  const double tp = double(c.mesh.tp);
  const double eff = c.hw.gemm_eff.at(tokens);
  // MLA's latent projections are replicated over tp: every tp rank computes them whole.
  const double rep = c.m.attn_replicated_params_per_layer() * double(c.m.attn_layers());
  const double attn = 2.0 *
                      ((c.m.attn_params_per_layer() * double(c.m.attn_layers()) - rep +
                        c.m.gdn_proj_params_per_layer() * double(c.m.gdn_layers())) / tp + rep) *
                      tokens * mult;
  const double ffn = 2.0 * c.m.ffn_params_per_layer() * double(c.m.layers) * tokens / tp * mult;
  const double head = lm_head ? 2.0 * double(c.m.dim) * double(c.m.vocab) * tokens * mult : 0;  // replicated over tp
  return c.share * ((attn + head) / (c.p.peak * eff) + ffn / (c.p.peak_ffn * eff));
}

// Seconds of `flops` of attention (the FLOP convention, model/flops.hpp: visible pairs only) in kernel calls
// whose query rows see `kappa` keys each on average, plus `waste_flops` of masked pairs the
// causal diagonal computes anyway, at the call's rate.
double attn_seconds(const Ctx& c, double flops, double kappa, double waste_flops = 0) {
  return c.share * (flops + waste_flops) / (c.p.peak * c.hw.attn_eff.at(std::max(1.0, kappa)));
}

// FLOPs of the masked pairs computed on the causal diagonal by `diag_rows` query rows (every
// query row meets the diagonal once per layer, whatever the strategy), forward (mult 1) or
// backward (mult attn_bwd_work).
double diag_waste_flops(const Ctx& c, double diag_rows, double mult) {
  return mult * attn_fwd_flops(diag_rows * c.hw.attn_diag_waste_keys, double(c.m.H_q) / double(c.mesh.tp), double(c.m.D));
}

// Ulysses' exchanges per layer on a rank of `tokens` tokens, as src/cp/ulysses_core.cpp runs
// them: one all-to-all in (forward: Q, K, V; backward: Q, K, V, O, dO, LSE — the backward does
// not keep the forward's buffers), one out (forward: O, LSE; backward: dQ, dK, dV), and the
// all-gather of the token positions. K/V heads fewer than U travel replicated (max(H_kv, U)).
struct UlyssesA2a {
  double fwd_s = 0, bwd_s = 0, max_bytes = 0;
};
UlyssesA2a ulysses_a2a(const Ctx& c, int64_t U, int64_t k_u, double tokens, double hq, double hkv) {
  const double De = double(c.m.D) * c.p.e, kvh = std::max(hkv, double(U)), lse = tokens * hq * 4.0;
  const double in_f = tokens * (hq + 2.0 * kvh) * De, out_f = tokens * hq * De + lse;
  const double in_b = tokens * (3.0 * hq + 2.0 * kvh) * De + lse, out_b = tokens * (hq + 2.0 * kvh) * De;
  const double meta = allgather_s(c.hw, U, k_u, tokens * 8.0 * double(U));
  UlyssesA2a a;
  a.fwd_s = alltoall_s(c.hw, U, k_u, in_f) + alltoall_s(c.hw, U, k_u, out_f) + meta;
  a.bwd_s = alltoall_s(c.hw, U, k_u, in_b) + alltoall_s(c.hw, U, k_u, out_b) + meta;
  a.max_bytes = in_b;
  return a;
}

// A synchronous step ends with its slowest rank: E[max of n standard normals] x rank_jitter of
// its compute above the mean, spent by the others waiting in their collectives (exposed).
void add_sync_wait(StrategyPrediction& r, const Ctx& c, double compute_s) {
  const double wait = c.hw.rank_jitter * expected_max_normal(c.mesh.chips()) * std::max(0.0, compute_s);
  r.exposed_comm_s += wait;
  r.time_s += wait;
}

void finish(StrategyPrediction& r, const Ctx& c) {
  const double peak_total = c.p.peak_mfu * double(c.mesh.chips());
  r.mfu = r.time_s > 0 ? r.model_flops / (r.time_s * peak_total) : 0;
  r.mem_bytes = r.mem_weights_bytes + r.mem_state_bytes + r.mem_act_bytes + r.mem_kv_bytes + r.mem_buf_bytes;
  r.fits = r.mem_bytes <= c.hw.hbm_bytes;
}

// One Gated DeltaNet layer's token mixer on a rank of `tokens` tokens, forward + backward, as
// src/cp/gdn_*.cpp run it. The recurrence's FLOPs (model/flops.hpp: gdn_fwd_flops, the backward
// 2x) run as GEMMs of chunk rows; the kernel executes more than the convention counts (the
// forward's (I+A)^-1 products, the backward's recompute and full triangular products):
// kGdnFwdWork and kGdnBwdWork, the ratios of executed to counted multiply-adds per chunk at
// chunk = head dim (kernels/cpu/gdn_cpu.cpp). Under CP (Q pieces: P contiguous, 2P zigzag):
//   scan: every rank runs its pieces from a zero state, ranks past the first add the transition
//     (4 Dk^2 FLOPs per token and head) and the correction (6 Dk Dv forward, ~0.75 of a backward);
//     ceil(log2 Q) exchange rounds of H Dk (Dk + Dv) fp32 values each way (latency exposed);
//   ring: the pieces pass the state on one group of heads at a time, a pipeline: with J pieces
//     per rank and G groups (priced as one head per group: G = H per tp rank) the chain takes
//     (J G + Q - 1) group steps of a piece's work / G, forward and backward alike; Q - 1 hops.
// Both: the convolution's halo, (conv - 1) rows of the q|k|v projections, each way, exposed.
struct GdnLayerCost {
  double time_s = 0, comm_s = 0, exposed_s = 0;
};
constexpr double kGdnFwdWork = 9.2 / 8.0, kGdnBwdWork = 26.0 / 16.0;

GdnLayerCost gdn_layer_cost(const Ctx& c, double tokens) {
  const ModelShape& m = c.m;
  const int64_t N = c.mesh.cp(), tp = c.mesh.tp;
  const double H = double(m.gdn_H) / double(tp), Dk = double(m.gdn_Dk), Dv = double(m.gdn_Dv), C = double(m.gdn_chunk);
  const double eff = c.hw.gemm_eff.at(C);
  const double rate = c.p.peak * eff / c.share;
  const double f_flops = gdn_fwd_flops(tokens, H, Dk, Dv, C);
  const double fw = f_flops * kGdnFwdWork / rate, bw = 2 * f_flops * kGdnBwdWork / rate;
  const double conv = 3 * 2 * double(m.gdn_conv) * double(2 * m.gdn_H * m.gdn_Dk + m.gdn_H * m.gdn_Dv) / double(tp) * tokens /
                      c.rate(c.hw.elementwise_bytes_per_s) * c.p.e;  // memory bound: about 1 byte per FLOP
  GdnLayerCost g;
  g.time_s = fw + bw + conv;
  if (N <= 1) return g;
  const int64_t Q = c.w.partition == PartitionKind::zigzag ? 2 * N : N;
  const int64_t k = ranks_per_node(c.hw, N, tp);
  const double state_bytes = H * Dk * Dv * 4.0;
  const double halo = p2p_s(c.hw, N, k, double(m.gdn_conv - 1) * double(2 * m.gdn_H * m.gdn_Dk + m.gdn_H * m.gdn_Dv) /
                                            double(tp) * c.p.e);
  if (m.gdn_schedule == "ring") {
    const double J = double(Q) / double(N), Gs = std::max(1.0, H);
    const double fill = (J * Gs + double(Q - 1)) / (J * Gs);  // pipeline fill over the chain
    const double hop = p2p_s(c.hw, N, k, state_bytes / Gs);
    const double fwd = fw * fill + double(Q - 1) * hop, bwd = bw * fill + double(Q - 1) * hop;
    g.comm_s = 2 * double(Q - 1) * Gs * hop / double(N) + 2 * halo;
    g.exposed_s = (fwd - fw) + (bwd - bw) + 2 * halo;
    g.time_s = fwd + bwd + conv + 2 * halo;
  } else {
    const double rounds = log2_steps(Q);
    const double msg = p2p_s(c.hw, N, k, H * Dk * (Dk + Dv) * 4.0);
    const double extra = (4 * Dk * Dk + 6 * Dk * Dv) * H * tokens * kGdnFwdWork / rate + 0.75 * bw;
    g.comm_s = 2 * rounds * msg + 2 * halo;
    g.exposed_s = g.comm_s;
    g.time_s = fw + bw + extra + conv + g.comm_s;
  }
  return g;
}

// One attention layer's forward + backward on a rank under strategy `st`, `pairs` visible pairs
// per sequence (causal, or a local layer's window): time (compute and exposed communication),
// all communication, the exposed part, the strategy's buffers.
struct AttnLayerCost {
  double time_s = 0, comm_s = 0, exposed_s = 0, buf = 0;
};

// A ring of n ranks (k per node) that passes a message of `msg` bytes at each step while the step
// computes for cf seconds (forward) or cb (backward; its message carries the gradients too: twice
// the bytes). Every step pays the fixed overhead and what its transfer (send + receive) costs the
// compute. The pipelined passes and their parts.
struct RingPass {
  double m_f = 0, m_b = 0, of = 0, ob = 0, fwd = 0, bwd = 0;
};
RingPass ring_pass(const HardwareProfile& hw, int64_t n, int64_t k, double cf, double cb, double msg) {
  RingPass r;
  r.m_f = p2p_s(hw, n, k, msg);
  r.m_b = p2p_s(hw, n, k, 2 * msg);
  r.of = n > 1 ? hw.step_overhead_s + ring_step_loss_s(hw, n, k, 2 * msg) : 0;
  r.ob = n > 1 ? hw.step_overhead_s + ring_step_loss_s(hw, n, k, 4 * msg) : 0;
  r.fwd = ring_pipeline_s(n, cf, r.m_f, r.of);
  r.bwd = ring_pipeline_s(n, cb, r.m_b, r.ob);
  return r;
}

AttnLayerCost attn_layer_cost(const Ctx& c, CommPattern comm, double pairs) {
  const ModelShape& m = c.m;
  const PerfMesh& mesh = c.mesh;
  const PerfWorkload& w = c.w;
  const int64_t N = mesh.cp(), tp = mesh.tp, S = w.seq, B = w.batch;
  const double S_loc = double(Partition::padded_length(w.partition, S, int(N))) / double(N), e = c.p.e;
  const double tokens = S_loc * double(B);
  const bool remat_attn = w.remat == Remat::attention || w.remat == Remat::full;
  // Attention per layer: forward and backward FLOPs per rank (balanced or not); kappa = visible
  // keys per query row of one kernel call; the diagonal's waste once per layer.
  const double at_fwd_rank = attn_fwd_flops(pairs, double(m.H_q), double(m.D)) * double(B) / double(N * tp);
  const double at_bwd_rank = c.hw.attn_bwd_work * at_fwd_rank;  // the kernel's work (the convention's 2.5 is for FLOPs)
  const double hkv = kv_heads_loc(m, tp), hq = double(m.H_q) / double(tp);
  // One rank's K and V (per layer); MLA: its latent rows, which the receiver expands (xs seconds
  // per block, `c Wkv_b`; its backward two products of that size: dWkv_b and the latent's gradient).
  const double kv_msg = m.mla ? tokens * double(m.latent_width()) * e : tokens * 2.0 * hkv * double(m.D) * e;
  // Under tp every tp rank moves the whole latent (it is replicated) and expands its own heads.
  const double xs = m.mla ? c.share * matmul_flops(tokens, double(m.kv_lora), hq * double(m.nope + m.v_dim)) /
                                (c.p.peak * c.hw.gemm_eff.at(tokens))
                          : 0.0;
  const double remote = double(N - 1) / double(N);  // blocks of other ranks per block step
  double attn_layer = 0, comm_layer = 0, exposed_layer = 0, buf = 0;
  const double recompute = remat_attn ? 1.0 : 0.0;  // attention forward run again in the backward
  const double w_fwd = diag_waste_flops(c, tokens, 1.0), w_bwd = diag_waste_flops(c, tokens, c.hw.attn_bwd_work);
  const double per_seq = pairs / double(N);  // visible pairs of one sequence on a (balanced) rank
  if (comm == CommPattern::gather) {
    // Gather K/V of the whole sequence (forward), reduce-scatter dK/dV (backward); both exposed.
    const int64_t k = ranks_per_node(c.hw, N, tp);
    const double imb = imbalance(w.partition, N), kappa = imb * per_seq / S_loc;  // one call: local queries, all keys
    const double t_c = allgather_s(c.hw, N, k, kv_msg * double(N));
    comm_layer = (2 + recompute) * t_c;
    exposed_layer = comm_layer;
    attn_layer = attn_seconds(c, imb * at_fwd_rank, kappa, w_fwd) * (1 + recompute) +
                 attn_seconds(c, imb * at_bwd_rank, kappa, w_bwd) + exposed_layer +
                 double(N - 1) * xs * (2 + recompute + 2);  // MLA: expanded in both gathers, two products back
    buf = 2.0 * kv_msg * double(N);  // gathered K/V and dK/dV
    if (m.mla) buf += 2.0 * tokens * 2.0 * hkv * double(m.D) * e * double(N);  // the expanded K/V and dK/dV
  } else if (splits_heads(comm)) {
    const bool two_axes = comm == CommPattern::heads_ring;  // usp: the ulysses axis, then a ring
    const int64_t U = two_axes ? mesh.ulysses : N, R = two_axes ? mesh.ring : 1;
    const int64_t k_u = ranks_per_node(c.hw, U, tp);
    const double hkv_u = std::max(hkv, double(U)) / double(U);  // K/V heads per rank after the all-to-all
    const UlyssesA2a a2a = ulysses_a2a(c, U, k_u, tokens, hq, hkv);
    const double t_a2a = (1 + recompute) * a2a.fwd_s + a2a.bwd_s;
    // After the all-to-all a rank holds U*S_loc tokens of H/U heads; a ring over R (usp) passes them.
    const double imb = imbalance(w.partition, R);
    // One call per ring step: the U*S_loc gathered rows of H/U heads against one block of keys.
    const double kappa = imb * pairs / double(R * R) / (S_loc * double(U));
    const double cf = attn_seconds(c, imb * at_fwd_rank, kappa, w_fwd) / double(R);
    const double cb = attn_seconds(c, imb * at_bwd_rank, kappa, w_bwd) / double(R);
    const double msg = tokens * double(U) * 2.0 * hkv_u * double(m.D) * e;
    const RingPass rp = ring_pass(c.hw, R, ranks_per_node(c.hw, R, tp * U), cf, cb, msg);
    attn_layer = rp.fwd * (1 + recompute) + rp.bwd + t_a2a;
    comm_layer = t_a2a + double(R - 1) * ((1 + recompute) * rp.m_f + rp.m_b);
    exposed_layer = t_a2a + (rp.fwd - double(R) * (cf + rp.of)) * (1 + recompute) + (rp.bwd - double(R) * (cb + rp.ob));
    buf = 2.0 * a2a.max_bytes + 3.0 * msg;
  } else if (comm == CommPattern::kv_ring) {
    const int64_t k = ranks_per_node(c.hw, N, tp);
    const double imb = imbalance(w.partition, N), kappa = imb * per_seq / double(N) / S_loc;  // one call per step
    // MLA: a visiting block is expanded before its compute (forward), and again with the two
    // products of its gradient (backward).
    const double cf = attn_seconds(c, imb * at_fwd_rank, kappa, w_fwd) / double(N) + remote * xs;
    const double cb = attn_seconds(c, imb * at_bwd_rank, kappa, w_bwd) / double(N) + remote * 3.0 * xs;
    const RingPass rp = ring_pass(c.hw, N, k, cf, cb, kv_msg);  // backward: K/V and dK/dV travel
    attn_layer = rp.fwd * (1 + recompute) + rp.bwd;
    comm_layer = double(N - 1) * ((1 + recompute) * rp.m_f + rp.m_b);
    exposed_layer = (rp.fwd - double(N) * (cf + rp.of)) * (1 + recompute) + (rp.bwd - double(N) * (cb + rp.ob));
    buf = 3.0 * kv_msg;
    if (m.mla) buf += 4.0 * tokens * hkv * double(m.D) * e;  // the visiting block expanded, its dK/dV
  }
  return {attn_layer, comm_layer, exposed_layer, buf};
}

}  // namespace

double placed_attention_s(const ModelShape& m, const HardwareProfile& hw, const PerfMesh& mesh, const PerfWorkload& w,
                          double pairs_max, double rows_max, CommPattern comm) {
  CTXPAR_CHECK(comm == CommPattern::kv_ring || comm == CommPattern::gather,
               "placed_attention_s: priced for the ring's and the all-gather's patterns only, not " << int(comm));
  const Ctx c{m, hw, mesh, w, precision_of(hw, w.precision), share_factor(hw, mesh)};
  const int64_t N = mesh.cp(), tp = mesh.tp, B = w.batch;
  const double S_loc = double(Partition::padded_length(PartitionKind::zigzag, w.seq, int(N))) / double(N);
  const double tokens = S_loc * double(B), recompute = w.remat == Remat::none ? 0.0 : 1.0;
  // The busiest rank's attention, one kernel call per ring step (as attn_layer_cost's ring).
  const double at_fwd = attn_fwd_flops(pairs_max, double(m.H_q), double(m.D)) * double(B) / double(tp);
  const double kappa = pairs_max / double(N) / S_loc;
  const double w_fwd = diag_waste_flops(c, tokens, 1.0), w_bwd = diag_waste_flops(c, tokens, hw.attn_bwd_work);
  const double cf = attn_seconds(c, at_fwd, kappa, w_fwd) / double(N);
  const double cb = attn_seconds(c, hw.attn_bwd_work * at_fwd, kappa, w_bwd) / double(N);
  // A step's K and V rows (their share of rows_max; MLA: latent rows, their expansion not priced);
  // the backward's carry their dK/dV too.
  const double row = m.mla ? double(m.latent_width()) * c.p.e : 2.0 * kv_heads_loc(m, tp) * double(m.D) * c.p.e;
  const double msg = N > 1 ? rows_max / double(N - 1) * double(B) * row : 0.0;
  const double layers = double(m.attn_layers() - m.local_layers());
  if (comm == CommPattern::gather) {  // the rows at once (all pairs' messages together, priced as an all-gather of as
                   // many bytes per rank), then one kernel call; the backward again, and the rows' dK/dV back (fp32)
    const int64_t k = ranks_per_node(hw, N, tp);
    const auto moved = [&](double bytes_per_row) {
      return N > 1 ? allgather_s(hw, N, k, rows_max * double(B) * bytes_per_row * double(N) / double(N - 1)) : 0.0;
    };
    const double x = moved(row), back = moved(row / c.p.e * 4.0);
    const double fwd = x + cf * double(N), bwd = x + cb * double(N) + back;
    return (fwd * (1 + recompute) + bwd) * layers;
  }
  const RingPass rp = ring_pass(hw, N, ranks_per_node(hw, N, tp), cf, cb, msg);
  return (rp.fwd * (1 + recompute) + rp.bwd) * layers;
}

namespace {

// A local (sliding-window) layer under the halo exchange (src/cp/halo.cpp): each rank receives
// the window - 1 rows before each of its two zigzag chunks (at most the rest of the sequence),
// while it attends its own keys; the backward fetches them again and returns their dK/dV (fp32)
// at the end (exposed). Compute: the window's pairs, balanced over the ranks.
AttnLayerCost halo_layer_cost(const Ctx& c, double pairs) {
  const ModelShape& m = c.m;
  const int64_t N = c.mesh.cp(), tp = c.mesh.tp, S = c.w.seq, B = c.w.batch;
  const double S_loc = double(Partition::padded_length(c.w.partition, S, int(N))) / double(N);
  const double tokens = S_loc * double(B), recompute = c.w.remat == Remat::none ? 0.0 : 1.0;
  const double at_fwd_rank = attn_fwd_flops(pairs, double(m.H_q), double(m.D)) * double(B) / double(N * tp);
  const double kappa = pairs / double(std::max<int64_t>(S, 1));  // visible keys per query
  const double cf = attn_seconds(c, at_fwd_rank, kappa, diag_waste_flops(c, tokens, 1.0));
  const double cb = attn_seconds(c, c.hw.attn_bwd_work * at_fwd_rank, kappa, diag_waste_flops(c, tokens, c.hw.attn_bwd_work));
  AttnLayerCost a;
  a.time_s = cf * (1 + recompute) + cb;
  if (N <= 1) return a;
  const double rows = double(B) * std::min(2.0 * double(std::max<int64_t>(m.window - 1, 0)), double(S) - S_loc);
  const double row = 2.0 * kv_heads_loc(m, tp) * double(m.D);  // K and V elements per row
  const int64_t k = ranks_per_node(c.hw, N, tp);
  const double t_kv = p2p_s(c.hw, N, k, rows * row * c.p.e), t_back = p2p_s(c.hw, N, k, rows * row * 4.0);
  const double exp_f = std::max(0.0, t_kv - cf), exp_b = std::max(0.0, t_kv - cb) + t_back;
  a.comm_s = (2 + recompute) * t_kv + t_back;
  a.exposed_s = exp_f * (1 + recompute) + exp_b;
  a.time_s += a.exposed_s;
  a.buf = rows * row * (2.0 * c.p.e + 2.0 * 4.0);
  return a;
}

StrategyPrediction predict_train(const Ctx& c, const std::string& strategy, CommPattern comm) {
  const ModelShape& m = c.m;
  const PerfMesh& mesh = c.mesh;
  const PerfWorkload& w = c.w;
  StrategyPrediction r;
  r.strategy = strategy;
  const int64_t N = mesh.cp(), tp = mesh.tp, S = w.seq, B = w.batch;
  // Rows per rank: S rounded up to the partition's unit (shard/partition.hpp pads any S): the
  // padding rows cost GEMMs and attention like real ones.
  const double S_loc = double(Partition::padded_length(w.partition, S, int(N))) / double(N), L = double(m.layers),
               e = c.p.e;
  const ModelDims d = dims_of(m);
  // Model FLOPs (whole job: every dp replica, B sequences each).
  const double pairs = causal_visible_pairs({S});
  const double window_pairs = m.local_layers() > 0 ? window_visible_pairs({S}, m.window) : 0.0;
  const double mm_flops = (train_matmul_flops(d, S) + train_gdn_flops(d, S)) * double(B),
               at_flops = train_attn_flops(d, pairs, window_pairs) * double(B);
  r.model_flops = (mm_flops + at_flops) * double(mesh.dp);

  // Matmuls: split evenly over cp and tp (the LM head is replicated over tp: counted per rank).
  const double tokens = S_loc * double(B);
  r.gemm_s = gemm_seconds(c, tokens, 3.0, true);
  const bool remat_full = w.remat == Remat::full;
  if (remat_full) r.gemm_s += gemm_seconds(c, tokens, 1.0, false);  // recomputed forward projections

  // Global attention layers under `comm`; local ones under the configured local strategy (halo:
  // the window's rows, or a training strategy on the window's pairs); GDN layers their own.
  const int64_t k_tp = ranks_per_node(c.hw, tp, 1);
  const AttnLayerCost ga = attn_layer_cost(c, comm, pairs);
  AttnLayerCost la;
  if (m.local_layers() > 0) {
    const StrategyRow* lr = strategy_row(m.local_strategy);
    const CommPattern lc = lr ? lr->comm : CommPattern::kv_ring;
    la = lc == CommPattern::window ? halo_layer_cost(c, window_pairs) : attn_layer_cost(c, lc, window_pairs);
  }
  const double L_loc = double(m.local_layers()), L_glob = double(m.attn_layers()) - L_loc, G = double(m.gdn_layers());
  const GdnLayerCost g = G > 0 ? gdn_layer_cost(c, tokens) : GdnLayerCost{};
  r.attn_s = ga.time_s * L_glob + la.time_s * L_loc + g.time_s * G;
  // Tensor-parallel all-reduces: 2 forward + 2 backward per layer of [tokens, dim] (exposed).
  double t_tp = 4.0 * L * allreduce_s(c.hw, tp, k_tp, tokens * double(m.dim) * e) * (1 + (remat_full ? 0.5 : 0));
  if (m.mla)  // the latents' gradients, summed over tp in each attention layer's backward
    t_tp += double(m.attn_layers()) * allreduce_s(c.hw, tp, k_tp, tokens * double(m.latent_width() + m.q_lora) * e);
  // The training state over every replica holding other tokens (cp) or other sequences (dp):
  // state_sync_s's collectives (the gradients' all-reduce without shards).
  const int64_t n_grad = mesh.dp * N;
  const double t_grad = state_sync_s(c.hw, m, w.shard, n_grad, ranks_per_node(c.hw, n_grad, tp), tp);
  // Elementwise work (memory bound) and the optimizer (7 fp32 streams per parameter of the pieces).
  const double params_rank = m.params_total() / double(tp) / (w.shard != ShardLevel::none ? double(n_grad) : 1.0);
  r.other_s = c.share * (elementwise_bytes(m, tp, tokens, true, e) / c.rate(c.hw.elementwise_bytes_per_s) +
                         loss_bytes(m, tokens, e) / c.rate(c.hw.loss_bytes_per_s) +
                         optimizer_bytes(params_rank) / c.rate(c.hw.optimizer_bytes_per_s));
  r.comm_total_s = ga.comm_s * L_glob + la.comm_s * L_loc + g.comm_s * G + t_tp + t_grad;
  const double exposed_layers = ga.exposed_s * L_glob + la.exposed_s * L_loc + g.exposed_s * G;
  const double t_grad_exposed =
      state_sync_exposed_s(c.hw, m, w.shard, n_grad, ranks_per_node(c.hw, n_grad, tp), tp, r.gemm_s + r.attn_s);
  r.exposed_comm_s = exposed_layers + t_tp + t_grad_exposed;
  r.time_s = r.gemm_s + r.attn_s + r.other_s + t_tp + t_grad_exposed;
  add_sync_wait(r, c, r.gemm_s + r.attn_s - exposed_layers + r.other_s);
  // Memory: params + grads + AdamW m, v (16 bytes per parameter in mixed precision and in fp32) at
  // the shard level (state_bytes), saved activations (the model's own formula, scaled to the element
  // size), strategy buffers.
  r.mem_state_bytes = state_bytes(m, w.shard, n_grad, tp);
  const ModelDims dl = dims_of(m, int(tp));
  const int64_t tok = int64_t(tokens);
  r.mem_act_bytes = Transformer::activation_bytes(dl, w.remat, tok, Transformer::logits_chunk_rows(tok, m.vocab)) * e / 4.0;
  r.mem_buf_bytes = std::max(L_glob > 0 ? ga.buf : 0.0, L_loc > 0 ? la.buf : 0.0);
  finish(r, c);
  return r;
}

StrategyPrediction predict_infer(const Ctx& c, const std::string& strategy, CommPattern comm) {
  const ModelShape& m = c.m;
  const PerfMesh& mesh = c.mesh;
  const PerfWorkload& w = c.w;
  StrategyPrediction r;
  r.strategy = strategy;
  const int64_t N = mesh.cp(), tp = mesh.tp, B = w.batch;
  const bool decode = w.mode == PerfMode::decode;
  const int64_t cached = decode ? w.seq : (w.mode == PerfMode::prefill ? 0 : w.cached);
  const int64_t T = decode ? 1 : w.seq - cached;
  const double L = double(m.layers), e = c.p.e, hkv = kv_heads_loc(m, tp), hq = double(m.H_q) / double(tp);
  // New tokens per CP rank (decode: one token, on every rank); a prefill's padded zigzag share.
  const double T_loc = double(decode ? T : Partition::padded_length(PartitionKind::zigzag, T, int(N))) * double(B) / double(N);
  const double ctx_loc = double(cached + T) * double(B) / double(N);
  const int64_t k_tp = ranks_per_node(c.hw, tp, 1), k_cp = ranks_per_node(c.hw, N, tp);
  const double o = N > 1 ? c.hw.step_overhead_s : 0;
  // Weights per rank (FFN in FP8 with fp8_ffn), read once per forward.
  const double w_bytes = (m.attn_params_per_layer() * c.p.w_attn + m.ffn_params_per_layer() * c.p.w_ffn) * L / double(tp) +
                         2.0 * double(m.vocab) * double(m.dim) * c.p.w_attn / double(tp);
  const double pairs = decode ? double(cached + 1) : partial_prefill_pairs(T, cached);
  const double at_flops_rank = attn_fwd_flops(pairs, double(m.H_q), double(m.D)) * double(B) / double(N * tp);
  r.model_flops = (2.0 * (m.attn_params_per_layer() + m.ffn_params_per_layer()) * L * double(T) +
                   attn_fwd_flops(pairs, double(m.H_q), double(m.D)) * L) * double(B) * double(mesh.dp);
  const double kv_bytes_rank = ctx_loc * 2.0 * hkv * double(m.D) * e;  // one layer's K/V cache on a rank
  double attn_layer = 0, comm_layer = 0, exposed_layer = 0, buf = 0;
  if (decode) {
    // Memory bound: weights and this rank's K/V cache streamed once per token; the new token's
    // query visits every CP rank (pass-Q) or the cache blocks visit it (pass-KV), then (pass-Q)
    // an all-to-all returns the partial outputs.
    const double t_w = w_bytes / c.hbm_bps();
    const double c_step = kv_bytes_rank / c.hbm_bps();
    r.gemm_s = t_w;
    if (comm == CommPattern::q_ring) {
      const double q_msg = double(B) * hq * double(m.D) * e;
      const double m_q = p2p_s(c.hw, N, k_cp, q_msg);
      const double a2a = alltoall_s(c.hw, N, k_cp, double(B) * hq * (double(m.D) + 1) * 4.0);
      // Each step reads the local cache against the visiting query.
      const double os = o + ring_step_loss_s(c.hw, N, k_cp, 2 * q_msg);
      attn_layer = ring_pipeline_s(N, c_step, m_q, os) + a2a;
      comm_layer = double(N - 1) * m_q + a2a;
      exposed_layer = attn_layer - double(N) * (c_step + os);
    } else {
      const double m_kv = p2p_s(c.hw, N, k_cp, kv_bytes_rank);
      const double os = o + ring_step_loss_s(c.hw, N, k_cp, 2 * kv_bytes_rank);
      attn_layer = ring_pipeline_s(N, c_step, m_kv, os);
      comm_layer = double(N - 1) * m_kv;
      exposed_layer = attn_layer - double(N) * (c_step + os);
    }
    r.attn_s = attn_layer * L;
    const double t_tp = 2.0 * L * allreduce_s(c.hw, tp, k_tp, double(B) * double(m.dim) * e);
    r.other_s = 0;
    r.comm_total_s = comm_layer * L + t_tp;
    r.exposed_comm_s = std::max(0.0, exposed_layer) * L + t_tp;
    r.time_s = r.gemm_s + r.attn_s + t_tp;
    add_sync_wait(r, c, r.gemm_s + r.attn_s - std::max(0.0, exposed_layer) * L);
  } else {
    r.gemm_s = gemm_seconds(c, T_loc, 1.0, false) + c.share * 2.0 * double(m.dim) * double(m.vocab) * double(B) /
                                                       (c.p.peak * c.hw.gemm_eff.at(1));  // LM head: last token only
    r.gemm_s = std::max(r.gemm_s, w_bytes / c.hbm_bps());  // a short prompt cannot beat reading the weights
    // kappa: a ring step's call (pass-KV, pass-Q) has this rank's T_loc query rows against one
    // rank's keys; all-gather one call against all keys. The diagonal's waste once per layer.
    const double kappa_step = pairs / double(N * N) / (double(T) / double(N));
    const double waste = diag_waste_flops(c, T_loc, 1.0);
    const double c_all = attn_seconds(c, at_flops_rank, kappa_step, waste);
    if (comm == CommPattern::kv_ring) {
      const double m_kv = p2p_s(c.hw, N, k_cp, kv_bytes_rank);
      const double os = o + ring_step_loss_s(c.hw, N, k_cp, 2 * kv_bytes_rank);
      const double ring = ring_pipeline_s(N, c_all / double(N), m_kv, os);
      attn_layer = ring;
      comm_layer = double(N - 1) * m_kv;
      exposed_layer = ring - c_all - double(N) * os;
      buf = 2.0 * kv_bytes_rank;
    } else if (comm == CommPattern::q_ring) {
      const double q_bytes = T_loc * hq * double(m.D) * e;
      const double m_q = p2p_s(c.hw, N, k_cp, q_bytes);
      const double os = o + ring_step_loss_s(c.hw, N, k_cp, 2 * q_bytes);
      const double ring = ring_pipeline_s(N, c_all / double(N), m_q, os);
      // Partial outputs (fp32 O and LSE) of every visiting query block go home in one all-to-all.
      const double a2a = alltoall_s(c.hw, N, k_cp, T_loc * hq * (double(m.D) + 1) * 4.0);
      attn_layer = ring + a2a;
      comm_layer = double(N - 1) * m_q + a2a;
      exposed_layer = ring - c_all - double(N) * os + a2a;
      buf = 2.0 * T_loc * hq * double(m.D) * (e + 4.0);
    } else if (splits_heads(comm)) {
      // Full prefill: all-to-all of Q, K, V in and O out (exposed), then a rank holds U*T_loc
      // tokens of H/U heads; usp passes them around a ring of R (as the training forward).
      const bool two_axes = comm == CommPattern::heads_ring;  // usp: the ulysses axis, then a ring
      const int64_t U = two_axes ? mesh.ulysses : N, R = two_axes ? mesh.ring : 1;
      const int64_t k_u = ranks_per_node(c.hw, U, tp), k_r = ranks_per_node(c.hw, R, tp * U);
      const UlyssesA2a a2a = ulysses_a2a(c, U, k_u, T_loc, hq, hkv);
      const double t_a2a = a2a.fwd_s;
      const double kappa = pairs / double(R) / double(T);  // one step: U*T_loc rows of H/U heads vs one block
      const double cf = attn_seconds(c, at_flops_rank, kappa, waste) / double(R);
      const double msg = T_loc * double(U) * 2.0 * (std::max(hkv, double(U)) / double(U)) * double(m.D) * e;
      const double oo = R > 1 ? c.hw.step_overhead_s + ring_step_loss_s(c.hw, R, k_r, 2 * msg) : 0;
      const double m_f = p2p_s(c.hw, R, k_r, msg);
      const double ring = ring_pipeline_s(R, cf, m_f, oo);
      attn_layer = ring + t_a2a;
      comm_layer = t_a2a + double(R - 1) * m_f;
      exposed_layer = t_a2a + ring - double(R) * (cf + oo);
      buf = 2.0 * T_loc * (hq + 2.0 * std::max(hkv, double(U))) * double(m.D) * e + 2.0 * msg;  // the forward's send + receive
    } else {  // allgather: every rank gathers the whole K/V, then attends locally
      const double g = allgather_s(c.hw, N, k_cp, kv_bytes_rank * double(N));
      attn_layer = attn_seconds(c, at_flops_rank, pairs / double(T), waste) + g;
      comm_layer = g;
      exposed_layer = g;
      buf = kv_bytes_rank * double(N);
    }
    r.attn_s = attn_layer * L;
    const double t_tp = 2.0 * L * allreduce_s(c.hw, tp, k_tp, T_loc * double(m.dim) * e);
    r.other_s = c.share * elementwise_bytes(m, tp, T_loc, false, e) / c.rate(c.hw.elementwise_bytes_per_s);
    r.comm_total_s = comm_layer * L + t_tp;
    r.exposed_comm_s = std::max(0.0, exposed_layer) * L + t_tp;
    r.time_s = r.gemm_s + r.attn_s + r.other_s + t_tp;
    add_sync_wait(r, c, r.gemm_s + r.attn_s - std::max(0.0, exposed_layer) * L + r.other_s);
  }
  r.mem_weights_bytes = w_bytes;
  r.mem_kv_bytes = kv_bytes_rank * L;
  // Working activations of one layer (residual, Q/K/V/O, SwiGLU) for the new tokens.
  r.mem_act_bytes = T_loc * (3.0 * double(m.dim) + (2.0 * hq + 2.0 * hkv) * double(m.D) + 3.0 * double(m.ffn) / double(tp)) * e;
  r.mem_buf_bytes = buf;
  finish(r, c);
  return r;
}

}  // namespace

StrategyPrediction predict(const ModelShape& m, const HardwareProfile& hw, const PerfMesh& mesh, const PerfWorkload& w,
                   const std::string& strategy) {
  Ctx c{m, hw, mesh, w, precision_of(hw, w.precision), share_factor(hw, mesh)};
  CommPattern comm = CommPattern::kv_ring;
  StrategyPrediction r;
  r.strategy = strategy;
  r.invalid = priced_pattern(strategy, w.mode, comm);
  if (r.invalid.empty()) r.invalid = check_mesh(m, mesh, strategy, comm, w);
  if (!r.invalid.empty()) return r;
  if (w.mode == PerfMode::train) return predict_train(c, strategy, comm);
  return predict_infer(c, strategy, comm);
}

int recommend(const std::vector<StrategyPrediction>& preds) {
  int best = -1;
  bool best_fits = false;
  for (size_t i = 0; i < preds.size(); ++i) {
    const StrategyPrediction& p = preds[i];
    if (!p.invalid.empty()) continue;
    const bool better = best < 0 || (p.fits && !best_fits) || (p.fits == best_fits && p.time_s < preds[size_t(best)].time_s);
    if (better) {
      best = int(i);
      best_fits = p.fits;
    }
  }
  return best;
}

PassChoice predict_partial_prefill(const ModelShape& m, const HardwareProfile& hw, int64_t T, int64_t cached, int64_t N,
                                   int64_t tp, Precision precision) {
  PerfMesh mesh;
  mesh.tp = tp;
  mesh.ring = N;
  PerfWorkload w;
  w.mode = PerfMode::partial_prefill;
  w.seq = T + cached;
  w.cached = cached;
  w.precision = precision == Precision::automatic ? hw.default_precision : precision;
  PassChoice ch;
  ch.pass_kv_s = predict(m, hw, mesh, w, "pass_kv").time_s;
  ch.pass_q_s = predict(m, hw, mesh, w, "pass_q").time_s;
  ch.use_pass_q = ch.pass_q_s < ch.pass_kv_s;
  return ch;
}

}  // namespace ctxpar
