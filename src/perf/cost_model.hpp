// The analytic cost model behind `ctxpar predict`, `strategy=auto` and `cp_algo=auto`
// (perf/prefill_choice.hpp): per strategy and mode
// (training step, full prefill, partial prefill, decode) it predicts the time per rank from
// FLOPs (model/flops.hpp convention) and measured or published kernel efficiencies,
// communication from message sizes and per-axis link bandwidth / latency, overlap per strategy,
// and memory per rank.
//
// Vocabulary (core/config.hpp): S tokens of one sequence, S_loc = S / CP, H_q, H_kv, D; here
// also N = CP group size (ulysses * ring), T new tokens and `cached` tokens (the paper's P) of a partial
// prefill, tp the tensor-parallel size (heads and FFN split over it).
//
// Attention (the kernel model): time = (visible pairs + the causal diagonal's masked pairs) x
// FLOPs per pair / (peak x eff(kappa)), kappa = visible keys per query row of one kernel call
// (ring step: S_loc/2 under zigzag; all-gather: S/2; Ulysses: S/2 over H/U heads).
//
// Overlap rules (the physics, stated once):
//  - ring (pass-KV / pass-Q): N steps per layer; step i computes on the block received at step
//    i-1 while block i+1 is in flight, so a layer costs (N-1) * max(compute_step + overhead,
//    comm_step) + compute_step + overhead (the last step has nothing left to receive).
//  - all-gather, all-to-all, the pass-Q output all-to-all and tensor-parallel all-reduces sit
//    on the critical path (the attention needs all their data before it starts): exposed.
//  - the data-parallel gradient all-reduce is hidden under backward compute when the profile
//    says overlap_collectives (NCCL streams, XLA); exposed otherwise (our CPU runs).
// A collective over an axis group of n ranks with k of them per node: inside a node a ring at
// the collective rate; across nodes NCCL's ring algorithm (k channels, each leaving a node
// through its own NIC) — one pipeline, timed by its busiest link. P2P hops of a ring cost the
// slowest hop.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/settings.hpp"
#include "cp/strategy.hpp"  // the registry: local_strategy_names, the rows predict prices
#include "model/flops.hpp"  // the FLOP convention and partial_prefill_pairs
#include "perf/hardware.hpp"

namespace ctxpar {

struct Config;

// Transformer shape for the model (layers, widths, heads); built from a Config's model fields.
struct ModelShape {
  int64_t layers = 0, dim = 0, ffn = 0, vocab = 0;
  int64_t H_q = 0, H_kv = 0, D = 0;
  // One letter per layer: 'G' global attention, 'L' local (sliding-window) attention, 'D' Gated
  // DeltaNet (empty: all global attention).
  std::string kinds;
  int64_t window = 0;                  // of the L layers
  // Of the L layers: the registry's local row (halo) or a training strategy (local_strategy_names).
  std::string local_strategy = local_strategy_names().front();
  int64_t local_layers() const;
  int64_t gdn_H = 0, gdn_Dk = 0, gdn_Dv = 0, gdn_conv = 4, gdn_chunk = 64;
  std::string gdn_schedule = "ring";
  int64_t gdn_layers() const;
  int64_t attn_layers() const { return layers - gdn_layers(); }
  // DeepSeek latent attention (attention = mla; model/mla_layer.hpp): H_kv = H_q, D = nope + rope;
  // ring and allgather move the latent (kv_lora + rope values per token) and expand each block.
  bool mla = false;
  int64_t q_lora = 0, kv_lora = 0, nope = 0, rope = 0, v_dim = 0;
  int64_t latent_width() const { return kv_lora + rope; }
  // MLA: the latent projections (Wq_a, Wkv_a), replicated over tp.
  double attn_replicated_params_per_layer() const {
    return mla ? double(dim) * double(q_lora + kv_lora + rope) : 0.0;
  }
  // Parameters of one attention layer's projections (the GEMMs per token).
  double attn_params_per_layer() const {
    if (mla)
      return double(dim) * double(q_lora > 0 ? q_lora + q_lora * H_q * D : H_q * D) + double(dim) * double(kv_lora + rope) +
             double(kv_lora) * double(H_q * (nope + v_dim)) + double(H_q * v_dim) * double(dim);
    return double(dim) * double((H_q + 2 * H_kv) * D) + double(H_q * D) * dim;
  }
  double ffn_params_per_layer() const { return 3.0 * double(dim) * double(ffn); }
  // A GDN layer's projection parameters (q, k, v, gate, a, b in; o out): the GEMMs per token.
  double gdn_proj_params_per_layer() const {
    return double(dim) * double(2 * gdn_H * gdn_Dk + 2 * gdn_H * gdn_Dv + 2 * gdn_H) + double(gdn_H * gdn_Dv) * dim;
  }
  double params_total() const;  // incl. embedding and LM head (untied)
};
ModelShape model_shape(const Config& cfg);

// The predicted mesh (axes as in docs/DESIGN.md §1: tp fastest, then ulysses, ring, dp).
struct PerfMesh {
  int64_t dp = 1, tp = 1, ulysses = 1, ring = 1;
  int64_t cp() const { return ulysses * ring; }
  int64_t chips() const { return dp * tp * ulysses * ring; }
};

// PerfMode: core/settings.hpp (an enumerated setting).

struct PerfWorkload {
  PerfMode mode = PerfMode::train;
  int64_t seq = 0;     // train/prefill: S; partial prefill and decode: P + T context length
  int64_t cached = 0;  // P: cached tokens (partial prefill, decode: the whole context)
  int64_t batch = 1;   // sequences per model replica per step (train), or per request (infer)
  Precision precision = Precision::bf16;  // bf16 | fp8_ffn (FFN GEMMs in FP8) | fp32 (not automatic)
  Remat remat = Remat::none;               // train
  // train: the training state split over dp*cp (config shard, model/state_shard.hpp): the state's
  // memory and the collectives that keep it (all-reduce; all-gathers; reduce-scatters) per level
  ShardLevel shard = ShardLevel::none;
  PartitionKind partition = PartitionKind::zigzag;  // token partition (contiguous = causal load imbalance)
  int64_t T() const { return seq - cached; }
};

// One strategy's prediction. Times in seconds per step (train) or per request (TTFT / TTIT).
struct StrategyPrediction {
  std::string strategy;      // allgather | ulysses | ring | usp | pass_kv | pass_q | tp
  std::string invalid;       // "" when the strategy runs on this mesh, else why not
  double time_s = 0;
  double gemm_s = 0, attn_s = 0, other_s = 0;  // compute (attn_s includes hidden comm)
  double comm_total_s = 0;   // all communication time, hidden or not
  double exposed_comm_s = 0; // communication on the critical path
  double model_flops = 0;    // whole job, FLOP convention (model/flops.hpp)
  double mfu = 0;            // model_flops / (time * chips * peak of the default precision)
  double mem_bytes = 0;      // per chip
  double mem_weights_bytes = 0, mem_state_bytes = 0, mem_act_bytes = 0, mem_kv_bytes = 0, mem_buf_bytes = 0;
  bool fits = false;
};

// Strategies compared for a mode, from the registry's rows (cp/strategy.hpp): train → the
// training strategies (allgather, ulysses, ring, usp); prefill → pass_kv, pass_q, then the
// training ones but the ring (whose row is pass-KV's); partial prefill → pass_kv, pass_q and those
// that serve a cache (allgather); decode → pass_q (the new token's query visits the ranks) and
// pass_kv (the cache blocks visit it).
std::vector<std::string> perf_strategies(PerfMode m);

// `strategy`: a training strategy, or (inference) a value of cp_algo; priced by its registry row's
// message pattern (StrategyRow::comm), so a strategy is described once.
StrategyPrediction predict(const ModelShape& m, const HardwareProfile& hw, const PerfMesh& mesh, const PerfWorkload& w,
                   const std::string& strategy);

// The strategy `strategy` runs as on `mesh` ("" when itself): the all-to-all + ring with one axis
// of size 1 is the ring or the all-to-all alone.
std::string same_as(const std::string& strategy, const PerfMesh& mesh);

// The lowest-time strategy among the valid ones that fit (else among the valid ones); index
// into `preds`, -1 when none is valid.
int recommend(const std::vector<StrategyPrediction>& preds);

// Partial prefill, pass-KV vs pass-Q (Meta's choice), for `cp_algo=auto`: T new tokens, `cached` ones,
// N ring ranks, tp tensor-parallel ranks per CP rank.
struct PassChoice {
  double pass_kv_s = 0, pass_q_s = 0;
  bool use_pass_q = false;
};
PassChoice predict_partial_prefill(const ModelShape& m, const HardwareProfile& hw, int64_t T, int64_t cached, int64_t N,
                                   int64_t tp = 1, Precision precision = Precision::automatic);

// A training step's attention over one packed batch placed on the CP group (shard/placement.hpp)
// and run on the ring (the visible-keys exchange, frugal): every global attention layer's forward
// (and remat's recompute) and backward on the busiest rank, `pairs_max` causal (query, key) pairs
// within documents, pipelined over the ring's N steps with the transfer of `rows_max` K/V rows (the
// most a rank receives, spread evenly over its N - 1 steps; the backward returns as many dK/dV
// rows). Seconds per step, per sequence of w.batch. The plain ring is rows_max = (N - 1) S/N; with
// pairs_max = S(S+1)/2/N it is predict()'s ring attention time (the rest of a step does not depend
// on where the rows live: every rank holds S/N of them). `comm` = gather: the frugal all-gather
// instead (cp/visible_allgather.cpp): the rows exchanged at once before one kernel call, not
// overlapped with it; the backward exchanges them again and returns their dK/dV in fp32.
double placed_attention_s(const ModelShape& m, const HardwareProfile& hw, const PerfMesh& mesh, const PerfWorkload& w,
                          double pairs_max, double rows_max, CommPattern comm = CommPattern::kv_ring);

// ---- building blocks, exposed for tests --------------------------------------------------------
// Ring pipeline: (n-1) * max(c + o, m) + c + o.
double ring_pipeline_s(int64_t n, double compute_step_s, double comm_step_s, double overhead_s);
// Link-level collective times for an axis group of n ranks, k per node; bytes as named.
// What a ring step's transfer of `bytes` (sent + received) costs the compute when it crosses
// nodes (hw.inter_overlap_loss_s_per_byte); 0 inside a node (n <= k).
double ring_step_loss_s(const HardwareProfile& hw, int64_t n, int64_t k, double bytes);
double allreduce_s(const HardwareProfile& hw, int64_t n, int64_t k, double bytes);        // bytes per rank
// The training state at a shard level (model/state_shard.hpp) over n ranks of dp x CP, per rank on
// tp ranks (fp32 weights, gradients, AdamW m and v as the train plan counts them, with the unit
// buffers of the levels that gather and reduce), and the time of the collectives that keep it per
// step: the gradients' all-reduce (none, optimizer) or per-unit reduce-scatter (grads, params),
// the updated weights' all-gather (optimizer, grads), the per-unit gathers before the forward and
// the backward (params); k of the n per node.
double state_bytes(const ModelShape& m, ShardLevel level, int64_t n, int64_t tp);
double state_sync_s(const HardwareProfile& hw, const ModelShape& m, ShardLevel level, int64_t n, int64_t k, int64_t tp);
// What of state_sync_s the step waits for, given the step's compute `compute_s` (GEMMs and
// attention, a third of it forward). Without hw.overlap_collectives: all of it. With it, as the
// training loop overlaps them (model/state_shard.hpp UnitFeed): none, nothing (the all-reduce under
// the backward); optimizer, the updated weights' all-gather after the step; grads, that too, and
// each layer's reduce-scatter beyond the next layer's backward, and the embedding's after the
// backward; params, each layer's gathers and reduce-scatter beyond its forward's and backward's
// compute, the embedding's gather before the forward and its reduce-scatter after the backward.
double state_sync_exposed_s(const HardwareProfile& hw, const ModelShape& m, ShardLevel level, int64_t n, int64_t k,
                            int64_t tp, double compute_s);
double allgather_s(const HardwareProfile& hw, int64_t n, int64_t k, double out_bytes);    // gathered size
double alltoall_s(const HardwareProfile& hw, int64_t n, int64_t k, double bytes);         // sent+kept per rank
double p2p_s(const HardwareProfile& hw, int64_t n, int64_t k, double bytes);              // one ring hop
// Ranks of an axis group per node: members are `stride` ranks apart.
int64_t ranks_per_node(const HardwareProfile& hw, int64_t n, int64_t stride);
// Bytes the cost model counts for the memory-bound parts (their achieved rates in a profile are
// measured against these counts by `bench calibrate`): every layer's norms, residual adds, RoPE
// and SwiGLU for `tokens` tokens per rank (forward, or forward + backward); the cross-entropy
// over the vocabulary (logits read, exponentiated, gradient written); AdamW over `params`
// (parameter, gradient, m, v read, three written: 28 bytes in fp32).
double elementwise_bytes(const ModelShape& m, int64_t tp, double tokens, bool backward, double e);
double loss_bytes(const ModelShape& m, double tokens, double e);
double optimizer_bytes(double params);
// Expected maximum of n independent standard normal variables (0 for n = 1; 0.564 for 2, 1.029
// for 4): how far the slowest of n jittering ranks lies above the mean, in standard deviations.
double expected_max_normal(int64_t n);
// Paper Eq. 1 threshold (Meta CP, arXiv 2411.01783): pass-KV when T/(T+P) >= 2*H_kv/H_q.
double pass_kv_miss_rate_threshold(const ModelShape& m);

}  // namespace ctxpar
