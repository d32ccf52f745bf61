// `ctxpar train` — real training steps of the Llama-3-style decoder (src/model) with context
// parallelism: every CP rank holds its shard of one packed sequence (partition from the
// strategy), tp ranks hold head/FFN slices, dp replicas read different samples. Per step: one
// forward+backward, the gradient summed over the CP group and dp (the ranks that share
// parameters), global-norm clipping, AdamW. The rank-0 log prints one line per step (loss, step
// time, tokens/s, TFLOP/s per rank, MFU); the trace gets the same in /steps.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/stats.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "model/numerics.hpp"
#include "model/checkpoint.hpp"
#include "model/coverage.hpp"
#include "model/data.hpp"
#include "model/flops.hpp"
#include "model/model.hpp"
#include "model/optimizer.hpp"
#include "model/state_shard.hpp"
#include "model/transformer.hpp"
#include "perf/cost_model.hpp"
#include "perf/hardware.hpp"
#include "modes/modes.hpp"
#include "modes/oracle_dump.hpp"
#include "modes/device_run.hpp"
#include "modes/workload.hpp"
#include "ops.hpp"
#include "shard/partition.hpp"
#include "shard/placement.hpp"
#include "io/h5_checkpoint.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

namespace {

int tp_size(const Topology& t) { return t.size(Axis::tp); }

// The attention problem of one tp rank (heads / tp of each kind), causal.
CpCall local_attn_problem(const Config& cfg, int tp, bool local_layer = false) {
  const ModelDims d = model_dims(cfg, tp, 0);  // MLA: H_kv = H_q heads of nope + rope
  CpCall p = attn_problem(cfg.seq, d.H_q_loc(), d.H_kv_loc(), d.D, local_layer ? MaskKind::window : MaskKind::causal,
                              local_layer ? cfg.window : 0);
  if (d.mla) p.latent_width = int32_t(d.kv_lora + d.rope);  // K/V come from the latent
  p.fixed_heads = int32_t(cfg.exact_heads);
  return p;
}
// attention = mla: its shapes, one line (kv_heads and head_dim do not apply).
std::string mla_line(const Config& c) {
  return "attention: mla (latent attention; kv_heads, head_dim unused): q_lora_rank " + std::to_string(c.q_lora_rank) +
         ", kv_lora_rank " + std::to_string(c.kv_lora_rank) + ", heads " + std::to_string(c.heads) + " of " +
         std::to_string(c.qk_nope_head_dim) + " + " + std::to_string(c.qk_rope_head_dim) + " (rope) query/key and " +
         std::to_string(c.v_head_dim) + " value dims";
}
// The strategy of the local (L) layers; null without any.
std::unique_ptr<CpStrategy> make_local_strategy(const Config& cfg, Topology& topo) {
  if (cfg.layer_pattern.find('L') == std::string::npos) return nullptr;
  // The configured schedule where local_strategy has a row of it (the visible keys' ring or all-gather;
  // halo's halo is already only what the window sees), else its plain one; with exact numerics the
  // main strategy serves the local layers instead (TrainRun::local_layers_strategy).
  const CpSchedule s = has_schedule(cfg.local_strategy, cfg.cp_schedule()) ? cfg.cp_schedule() : CpSchedule::plain;
  return make_strategy(cfg.local_strategy, topo, cfg.exact ? CpSchedule::plain : s);
}
// The message of a non-finite loss or gradient at step `s`: which, and the first parameter (in
// layout order, over all ranks) whose gradient holds a NaN or Inf. Collective over `world`.
// `grads`: the whole flat gradient, or (`pieces`) this rank's pieces of it (model/state_shard.hpp).
std::string non_finite_message(int64_t s, double loss, const ParamLayout& layout, const float* grads,
                               const StateShard* pieces, Comm& world, int64_t last_checkpoint,
                               const std::string& checkpoint) {
  // `checkpoint` at step `last_checkpoint`: the newest good one (written by this run, or resumed from).
  const auto& info = layout.tensors();
  int32_t first = int32_t(info.size());
  for (size_t u = 0; u < layout.units().size(); ++u)
    for (size_t i = layout.units()[u].first; i < layout.units()[u].last && first == int32_t(info.size()); ++i) {
      int64_t a = info[i].offset, b = a + info[i].loc_elems(), at = a;  // the tensor's part here, at `at`
      if (pieces) {
        const StateShard::Piece& pc = pieces->pieces[u];
        a = std::max(a, pc.lo);
        b = std::min(b, pc.hi);
        at = pc.at + (a - pc.lo);
      }
      for (int64_t j = 0; j < b - a; ++j)
        if (!std::isfinite(grads[at + j])) {
          first = int32_t(i);
          break;
        }
    }
  world.all_reduce(std::span<int32_t>(&first, 1), ReduceOp::min);
  std::ostringstream os;
  os << "step " << s << ": ";
  if (!std::isfinite(loss)) os << "the loss is " << loss << (first < int32_t(info.size()) ? " and " : "");
  if (first < int32_t(info.size())) os << "the gradient of " << info[size_t(first)].name << " holds a non-finite value";
  else if (std::isfinite(loss)) os << "the gradient norm is not finite";
  os << "; stopped before the update (the parameters stay those of step " << s - 1 << ")";
  if (last_checkpoint >= 0) os << "; the last good checkpoint is " << checkpoint << " (step " << last_checkpoint << ")";
  else os << "; there is no checkpoint of this run (checkpoint_every = 0)";
  os << "; valid: a lower lr, grad_clip > 0, or resume from an earlier checkpoint";
  return os.str();
}

// The host's side of a GPU run's training state (initialization, resume, checkpoints, dumps, the
// non-finite message): three host arrays, and the copies between them and the device tensors. On
// the CPU it holds nothing and hands out the tensors themselves.
class HostCopy {
 public:
  // `n`: the elements of the largest of the weights and gradients it copies (the whole layout, or
  // with shard=params and gradients in pieces the shard buffer); `n_moments`: the moments' (this
  // rank's range, shard=).
  // `moments_on_device`: the AdamW moments are device memory (else host memory already: offload).
  // `hp`: offload=params, the master weights in host memory already (else null).
  HostCopy(Device dev, Stream stream, size_t n, size_t n_moments, bool moments_on_device, HostParams* hp)
      : dev_(dev), stream_(stream), hp_(hp) {
    if (dev_ == Device::cpu) return;
    if (!hp_) p_.resize(n, false);
    if (!moments_on_device) return;
    // Zeros: a run that does not resume uploads them as the initial moments.
    m_.resize(n_moments, true);
    v_.resize(n_moments, true);
  }
  // Where the host writes the state before upload(): the tensors on the CPU, the copies on a GPU
  // (the moments themselves when offload keeps them in host memory).
  float* p(Buffer<float>& b) { return on_cpu() ? b.data() : hp_ ? hp_->host() : p_.data(); }
  float* m(AdamW& o) { return on_cpu() || o.offloaded() ? o.m() : m_.data(); }
  float* v(AdamW& o) { return on_cpu() || o.offloaded() ? o.v() : v_.data(); }
  void upload(Buffer<float>& params, AdamW& opt) {
    if (on_cpu()) return;
    if (hp_) hp_->upload();
    else put(params.data(), params.size(), p_);
    if (opt.offloaded()) return;
    put(opt.m(), m_.size(), m_);
    put(opt.v(), v_.size(), v_);
  }
  // The tensor's values on the host (its b.size() elements; download_m / download_v: into the
  // moments' copies, so that a checkpoint holds all three at once); valid until the next download
  // into the same copy.
  const float* download(const Buffer<float>& b) { return get(b.data(), b.size(), p_); }
  // The weights on the host: the master itself with offload=params, once its copies have ended.
  const float* download_params(Buffer<float>& b, AdamW& o) {
    if (!hp_) return download(b);
    o.wait_host();
    return hp_->host();
  }
  const float* download_m(AdamW& o) { return moments(o, o.m(), m_); }
  const float* download_v(AdamW& o) { return moments(o, o.v(), v_); }

 private:
  bool on_cpu() const { return dev_ == Device::cpu; }
  // n elements between a device tensor and the host copy (at most its size).
  void put(float* dst, size_t n, const Buffer<float>& src) {
    CTXPAR_CHECK(n <= src.size(), "HostCopy: " << n << " elements from a copy of " << src.size());
    copy_to_device(dst, src.data(), n * sizeof(float), dev_, stream_);
  }
  const float* get(const float* src, size_t n, Buffer<float>& dst) {
    if (on_cpu()) return src;
    if (dst.size() < n) dst.resize(n, false);  // with offload=params: gradients for a dump, on first use
    copy_to_host(dst.data(), src, n * sizeof(float), dev_, stream_);
    return dst.data();
  }
  // Offloaded moments are host memory already: once their copies out have ended.
  const float* moments(AdamW& o, const float* src, Buffer<float>& dst) {
    if (!on_cpu() && o.offloaded()) {
      o.wait_host();
      return src;
    }
    return get(src, dst.size(), dst);
  }
  Device dev_;
  Stream stream_;
  HostParams* hp_;
  Buffer<float> p_, m_, v_;
};

// Packed documents: configured for synthetic data, or from eos_id in a token file.
bool train_docs(const Config& cfg) { return packed_docs(cfg) || (!synthetic_data(cfg) && cfg.eos_id >= 0); }

int64_t train_S_loc(const Config& cfg, Topology& topo) {
  return Partition::padded_length(make_strategy(cfg.strategy, topo)->partition(), cfg.seq, topo.cp().size(),
                                  exact_grain(cfg)) / topo.cp().size();
}

// placement=auto: a batch's placement priced by the cost model (perf/cost_model.hpp
// placed_attention_s) with the plan's hardware profile, from the busiest rank's causal pairs and
// the most rows a rank receives, as the frugal ring (or with strategy allgather the frugal
// all-gather) moves them; empty for the other placements.
PlacementPrice make_placement_price(const Config& cfg, Topology& topo) {
  if (cfg.placement != PlacementKind::automatic) return {};
  const HardwareProfile hw = load_hardware(hardware_name(cfg, HardwareUse::plan));
  const PerfMesh mesh{topo.size(Axis::dp), topo.size(Axis::tp), topo.size(Axis::ulysses), topo.size(Axis::ring)};
  PerfWorkload w;
  w.seq = cfg.seq;
  w.precision = cfg.device == Device::cpu ? Precision::fp32 : Precision::bf16;
  w.remat = cfg.remat;
  const ModelShape m = model_shape(cfg);
  // The registry's message pattern of the run's strategy (placement needs its visible-keys row:
  // the ring's or the all-gather's).
  const StrategyRow* row = strategy_row(cfg.strategy, cfg.cp_schedule());
  CTXPAR_CHECK(row, "placement=auto: no row of strategy " << cfg.strategy);
  const CommPattern comm = row->comm;
  return [hw, mesh, w, m, comm](const Placement& p, const std::vector<int64_t>& lengths) {
    const auto top = [](const std::vector<int64_t>& v) { return v.empty() ? 0.0 : double(*std::max_element(v.begin(), v.end())); };
    return placed_attention_s(m, hw, mesh, w, top(p.work), top(rows_received(p, lengths)), comm);
  };
}

// placement=balanced, document or auto (shard/placement.hpp) where the model's layers cannot follow a
// document placed anywhere, or auto without a hardware profile: "" when they can.
std::string placement_refusal(const Config& cfg, PartitionKind kind) {
  if (cfg.placement == PlacementKind::zigzag) return "";
  const std::string pre = std::string("config: placement = ") + name_of(cfg.placement);
  if (cfg.layer_pattern.find('D') != std::string::npos)
    return pre + " with layer_pattern = '" + cfg.layer_pattern + "': Gated DeltaNet layers pass "
           "their state along contiguous pieces of the sequence, not documents placed on any rank; valid: "
           "placement=zigzag, or a pattern of G and L layers";
  if (cfg.layer_pattern.find('L') != std::string::npos && !has_schedule(cfg.local_strategy, CpSchedule::visible))
    return pre + " with local_strategy = " + cfg.local_strategy + ": the local layers' " +
           "exchange assumes neighbouring chunks of positions; valid: local_strategy=" +
           strategies_with(CpSchedule::visible, "") + " (their visible-keys schedule), or placement=zigzag";
  if (kind != PartitionKind::zigzag)
    return pre + " places the rows of a zigzag strategy, and strategy = " + cfg.strategy + " shards " +
           partition_name(kind) + "; valid: placement=zigzag";
  if (cfg.placement == PlacementKind::automatic) {
    try {
      load_hardware(hardware_name(cfg, HardwareUse::plan));
    } catch (const UsageError& e) {
      return pre + " prices each batch's placements with a hardware profile: " + e.what();
    }
  }
  return "";
}

}  // namespace

std::string validate_train_mode(const Config& cfg, Topology& topo) {
  const int tp = tp_size(topo);
  std::string err = validate_model_shape(cfg, tp, /*kv_replication=*/true);
  if (!err.empty()) return err;
  std::unique_ptr<CpStrategy> strat = make_strategy(cfg.strategy, topo);
  if (!strat) return std::string("config: strategy = '") + cfg.strategy + "' is not built into this binary";
  if (cfg.mask != MaskKind::causal) return std::string("config: mask = ") + name_of(cfg.mask) + ": train uses causal attention; valid: mask=causal";
  if (cfg.device == Device::cuda) {
    if (cfg.layer_pattern.find('D') != std::string::npos)
      return "config: layer_pattern = '" + cfg.layer_pattern + "' with device = cuda: Gated DeltaNet (D) layers run on "
             "the CPU only so far; valid: device=cpu, or a pattern of G and L layers";
  }
  err = schedule_refusal(cfg.strategy, cfg.cp_schedule());
  if (!err.empty()) return err;
  const CpCall shape = local_attn_problem(cfg, tp);
  err = make_strategy(cfg.strategy, topo, cfg.cp_schedule())->validate(shape, topo);
  if (!err.empty()) {
    if (tp > 1) err += " (with tp:" + std::to_string(tp) + ", each tp rank attends with heads/tp = " +
                       std::to_string(shape.H_q) + " query and kv_heads/tp = " + std::to_string(shape.H_kv) + " K/V heads)";
    return err;
  }
  err = Partition::check(strat->partition(), cfg.seq, topo.cp().size());
  if (!err.empty()) return "config: " + err;
  if (cfg.exact) {  // exact numerics (model/numerics.hpp)
    err = check_exact_model(cfg, tp, exact_grain(cfg));
    if (!err.empty()) return err;
  }
  if (std::unique_ptr<CpStrategy> local = make_local_strategy(cfg, topo)) {
    err = local->validate(local_attn_problem(cfg, tp, true), topo);
    if (!err.empty()) return "config: local_strategy = " + cfg.local_strategy + " (the L layers): " + err;
    if (local->partition() != strat->partition())  // every strategy shards zigzag today
      return "config: local_strategy = " + cfg.local_strategy + " shards " + partition_name(local->partition()) +
             " and strategy = " + cfg.strategy + " " + partition_name(strat->partition()) +
             "; the layers share one sharding; valid: strategies of the same sharding";
  }
  if (model_dims(cfg, tp, 0).has_gdn()) {
    const PartitionKind kind = strat->partition();
    if (kind != PartitionKind::contiguous && kind != PartitionKind::zigzag)
      return std::string("config: layer_pattern = '") + cfg.layer_pattern + "': Gated DeltaNet layers pass their state " +
             "along contiguous pieces of the sequence, and strategy " + cfg.strategy + " shards " +
             partition_name(kind) + "; valid: a strategy with contiguous or zigzag sharding (ring, allgather, ulysses, usp)";
    const int P = topo.cp().size();
    const int64_t pieces = kind == PartitionKind::zigzag ? 2 * P : P;
    const int64_t piece = Partition::padded_length(kind, cfg.seq, P) / pieces;
    if (piece < cfg.gdn_conv - 1)
      return "config: seq = " + std::to_string(cfg.seq) + " over " + std::to_string(P) + " CP ranks (" +
             partition_name(kind) + ") gives pieces of " + std::to_string(piece) + " tokens, shorter than the GDN " +
             "convolution's halo gdn_conv - 1 = " + std::to_string(cfg.gdn_conv - 1) + "; valid: seq >= " +
             std::to_string(pieces * (cfg.gdn_conv - 1)) + ", or a smaller gdn_conv";
  }
  err = placement_refusal(cfg, strat->partition());
  if (!err.empty()) return err;
  err = check_docs(cfg.docs, cfg.seq, cfg.doc_mean);
  if (!err.empty()) return "config: docs = '" + cfg.docs + "': " + err;
  if (!synthetic_data(cfg) && packed_docs(cfg))
    return "config: docs = '" + cfg.docs + "' applies to synthetic data; a token file's documents come from eos_id; valid: docs=none";
  err = validate_data(cfg);
  if (!err.empty()) return err;
  if (!cfg.dump_init.empty() && topo.size(Axis::dp) != 1)
    return "config: dump_init needs dp:1 (the dump holds one sequence); valid: a mesh without dp";
  if (!cfg.resume.empty()) {
    int64_t first_step = 0;
    const ParamLayout layout(model_dims(cfg, 1, 0));  // the global tensors (metadata only)
    err = check_checkpoint(cfg.resume, cfg, layout, &first_step);
    if (!err.empty()) return err;
    if (first_step >= cfg.warmup + cfg.steps)
      return "config: resume = '" + cfg.resume + "' is at step " + std::to_string(first_step) + ", and this run ends at " +
             "step warmup + steps = " + std::to_string(cfg.warmup + cfg.steps) + ": nothing left to run; valid: steps > " +
             std::to_string(first_step - cfg.warmup);
  }
  return "";
}

std::string scan_train_inputs(const Config& cfg, Topology& topo) {
  const Comm& world = topo.world();
  const ParamLayout layout(model_dims(cfg, 1, 0));
  int64_t first_step = 0;
  if (!cfg.resume.empty()) {
    check_checkpoint(cfg.resume, cfg, layout, &first_step);  // validated before: the step only
    const std::string err = scan_checkpoint(cfg.resume, layout, world.rank(), world.size());
    if (!err.empty()) return err;
  }
  // Every token the run will read, inside the vocabulary (each rank reads a share).
  const int64_t DP = topo.size(Axis::dp);
  return check_data_tokens(cfg, first_step * DP, (cfg.warmup + cfg.steps - first_step) * DP, world.rank(), world.size());
}

namespace {
// Rank 0's pieces of the state under cfg.shard (the first pieces: the longest).
StateShard plan_shard(const Config& cfg, const ParamLayout& layout, Topology& topo) {
  if (cfg.shard == ShardLevel::none) return StateShard::whole(layout);
  return StateShard(layout, cfg.shard, 0, topo.size(Axis::dp) * topo.cp_size());
}
}  // namespace

TrainMemoryPlan plan_train_memory(const Config& cfg, Topology& topo) {
  const int tp = tp_size(topo);
  const ModelDims d = model_dims(cfg, tp, 0);
  const ParamLayout layout(d);
  std::unique_ptr<CpStrategy> strat = make_strategy(cfg.strategy, topo);
  const int64_t S_loc = train_S_loc(cfg, topo);
  TrainMemoryPlan p;
  // The whole weights (not at shard=params), the master pieces (sharded), the gradients (whole, or
  // pieces), AdamW m and v of the pieces, a padded unit to all-gather the updated weights through
  // (optimizer, grads), the model's unit buffers (grads, params: model/state_shard.hpp UnitFeed).
  const StateShard shard = plan_shard(cfg, layout, topo);
  const double n = double(layout.local_elems()), e = double(shard.elems()), widest = double(shard.widest);
  const bool grads_in_pieces = shard.grads_sharded() && !cfg.exact;
  p.state_bytes = 4.0 * (shard.params_sharded() ? 0.0 : n) + 4.0 * (shard.sharded() ? e : 0.0) +
                  4.0 * (grads_in_pieces ? e : n) + 8.0 * e +
                  4.0 * (shard.sharded() && !shard.params_sharded() ? widest : 0.0) +
                  UnitFeed::buffer_bytes(shard, cfg.exact);
  if (cfg.exact) p.state_bytes += exact_state_bytes(layout, S_loc, exact_grain(cfg));
  p.activation_bytes = Transformer::activation_bytes(d, cfg.remat, S_loc,
                                                     Transformer::logits_chunk_rows(S_loc, d.vocab));
  // Each OpenMP thread's Gated DeltaNet scratch (kept across the layers' backward calls; threads
  // are set before the plan: app/startup.cpp).
  if (d.has_gdn())
    p.activation_bytes += 4.0 * omp_get_max_threads() * double(gdn_thread_scratch_bound(S_loc, d.gdn_Dk, d.gdn_Dv, d.gdn_chunk, true));
  // The strategy's transient buffers (gathered / in-flight K/V and their gradients).
  p.strategy_bytes = strat->buffer_bytes(local_attn_problem(cfg, tp), train_docs(cfg), topo);
  if (std::unique_ptr<CpStrategy> local = make_local_strategy(cfg, topo))  // one layer's at a time
    p.strategy_bytes = std::max(p.strategy_bytes, local->buffer_bytes(local_attn_problem(cfg, tp, true), train_docs(cfg), topo));
  // Rank 0 gathers whole tensors to write them (model/checkpoint.cpp): params and both AdamW
  // moments for a checkpoint; every recorded step's state and gradients for the oracle dump.
  const double global = 4.0 * double(ParamLayout(model_dims(cfg, 1, 0)).local_elems());
  // The serial writer: sharded state is first assembled whole on the writer (both moments, and at
  // shard=params the weights, of this tp slice, and every rank's pieces as they arrive). The
  // parallel writer gathers nothing: one tensor's part at a time is copied out to be written.
  // The weights are pieces too at shard=params, and at any level with offload=params on a GPU.
  const bool weights_in_pieces = shard.params_sharded() || (cfg.device == Device::cuda && offloads(cfg, Offload::params));
  if (cfg.checkpoint_every > 0 && cfg.checkpoint_io == CheckpointIo::serial)
    p.gather_bytes = std::max(p.gather_bytes, 3.0 * global + (shard.sharded() ? 4.0 * n * (weights_in_pieces ? 4 : 3) : 0.0));
  if (cfg.checkpoint_every > 0 && cfg.checkpoint_io == CheckpointIo::parallel)
    p.gather_bytes = std::max(p.gather_bytes, 4.0 * widest / double(shard.sharded() ? shard.Z : 1));
  if (!cfg.dump_init.empty()) p.gather_bytes = std::max(p.gather_bytes, OracleDump::gather_bytes(cfg, global));
  p.total_bytes = p.state_bytes + p.activation_bytes + p.strategy_bytes + p.gather_bytes;
  return p;
}

double train_memory(const Config& cfg, Topology& topo) { return plan_train_memory(cfg, topo).total_bytes; }

double train_device_memory(const Config& cfg, Topology& topo) {
  const TrainMemoryPlan t = plan_train_memory(cfg, topo);
  const int tp = tp_size(topo);
  const ModelDims d = model_dims(cfg, tp, 0);
  const double S_loc = double(train_S_loc(cfg, topo));
  const double layers = cfg.remat == Remat::none ? double(d.layers) : 1.0;
  const ParamLayout layout(d);
  // The weights' bf16 copy (shard=params: one unit's at a time, transformer.cpp weights_of).
  const StateShard shard = plan_shard(cfg, layout, topo);
  const double bf16 = 2.0 * double(shard.params_sharded() ? shard.widest : layout.local_elems()) +
                      2.0 * S_loc * double(d.q_width()) +
                      layers * 2.0 * S_loc * double(d.q_width() + 2 * d.kv_width());
  // Offloaded AdamW moments: only their streamed chunks stay on the GPU; offloaded layer inputs
  // and attention outputs: only their slots (model/offload.hpp).
  const bool off_params = offloads(cfg, Offload::params);
  const int64_t n_moments = shard.elems();
  const double moments = AdamW::device_bytes(layout, n_moments, false) -
                         AdamW::device_bytes(layout, n_moments, offloads(cfg, Offload::optimizer), cfg.offload_chunk,
                                             off_params);
  // offload=params: the fp32 master (whole, or with a shard this rank's pieces) in host memory;
  // what stays on the GPU instead: HostParams's copies (the resident tensors, and in pieces its
  // gather's buffers; its bf16 copy is the term above), or at shard=params the feed's piece slots.
  double master = 0;
  if (off_params) {
    const double n = double(layout.local_elems()), e = double(shard.elems());
    const double in_state = shard.params_sharded() ? 4.0 * e
                                                   : 4.0 * n + (shard.sharded() ? 4.0 * (e + double(shard.widest)) : 0.0);
    const double kept = shard.params_sharded() ? UnitFeed::buffer_bytes(shard, cfg.exact, true) -
                                                     UnitFeed::buffer_bytes(shard, cfg.exact)
                                               : HostParams::device_bytes(layout, shard) - 2.0 * n;
    master = in_state - kept;
  }
  const size_t x_elems = size_t(S_loc) * size_t(d.dim), o_elems = size_t(S_loc) * size_t(d.q_width() + d.H_q_loc());
  const double inputs = LayerStash::device_bytes(d.layers + 1, x_elems, false) -
                        LayerStash::device_bytes(d.layers + 1, x_elems, offloads(cfg, Offload::layer_inputs));
  const double outs = offloads(cfg, Offload::attn_out) ? LayerStash::device_bytes(d.layers, o_elems, false) -
                                                             LayerStash::device_bytes(d.layers, o_elems, true)
                                                       : 0.0;
  return t.state_bytes - moments - master + t.activation_bytes - inputs - outs + t.strategy_bytes + bf16;
}

double train_host_memory_on_gpu(const Config& cfg, Topology& topo) {
  // HostCopy's fp32 copy of the parameters and either its copies of the moments or the offloaded
  // moments themselves (pinned): 4 bytes per parameter element and 8 per element of this rank's
  // range (shard=; the parameters too at shard=params with gradients in pieces); offloaded layer
  // inputs (pinned, L of them); and a checkpoint's gather.
  const TrainMemoryPlan t = plan_train_memory(cfg, topo);
  const ModelDims d = model_dims(cfg, tp_size(topo), 0);
  const ParamLayout layout(d);
  const StateShard shard = plan_shard(cfg, layout, topo);
  const bool pieces = shard.params_sharded() && shard.grads_sharded() && !cfg.exact;
  const double S_loc = double(train_S_loc(cfg, topo));
  const double inputs = offloads(cfg, Offload::layer_inputs) ? double(d.layers) * S_loc * double(d.dim) * 4.0 : 0.0;
  const double outs =
      offloads(cfg, Offload::attn_out) ? double(d.layers) * S_loc * double(d.q_width() + d.H_q_loc()) * 4.0 : 0.0;
  const bool off_params = offloads(cfg, Offload::params);  // the master itself, whole or this rank's pieces
  return 4.0 * double(pieces || off_params ? shard.elems() : layout.local_elems()) + 8.0 * double(shard.elems()) +
         inputs + outs + t.gather_bytes;
}

std::string train_plan(const Config& cfg, Topology& topo) {
  const TrainMemoryPlan t = plan_train_memory(cfg, topo);
  std::ostringstream os;
  os << "model: " << cfg.layers << " layers, dim " << cfg.dim << ", ffn " << cfg.ffn_dim << ", heads " << cfg.heads;
  if (cfg.attention == "mla") os << " (mla)";
  else os << "/" << cfg.kv_heads << " x " << cfg.head_dim;
  os << ", vocab " << cfg.vocab << "; S=" << cfg.seq << ", strategy "
     << cfg.strategy << ", remat " << name_of(cfg.remat) << "\n";
  if (cfg.attention == "mla") os << mla_line(cfg) << "\n";
  if (cfg.layer_pattern != "G") {
    os << "layers: pattern " << cfg.layer_pattern;
    if (cfg.layer_pattern.find('L') != std::string::npos)
      os << "; local (L) layers: window " << cfg.window << ", local_strategy " << cfg.local_strategy;
    os << "\n";
  }
  if (std::unique_ptr<CpStrategy> strat = make_strategy(cfg.strategy, topo)) {
    const Partition part(strat->partition(), cfg.seq, topo.cp().size(), exact_grain(cfg));
    if (part.padding() > 0) os << "padding: " << part.padding_note() << "\n";
  }
  if (cfg.device == Device::cuda) {
    // The GPU's share without offload and with each step of it: the prefixes of this run's list,
    // or without one the order MaxText advises (optimizer states, layer inputs, with remat=none
    // the attention outputs, then the parameters).
    std::vector<std::string> items = offload_items(cfg.offload);
    if (items.empty()) {
      items = {"optimizer", "layer_inputs"};
      if (cfg.remat == Remat::none) items.push_back("attn_out");
      items.push_back("params");
    }
    Config c = cfg;
    c.offload = "none";
    os << "GPU memory per rank: " << fmt_bytes(train_device_memory(c, topo)) << " without offload";
    std::string step;
    for (const std::string& i : items) {
      step += (step.empty() ? "" : ",") + i;
      c.offload = step;
      os << "; offload=" << step << ": " << fmt_bytes(train_device_memory(c, topo))
         << (cfg.offload == step ? " (this run)" : "");
    }
    os << "\n";
  }
  {  // the training state at every level (params+grads+AdamW, and the all-gather's copy)
    Config c = cfg;
    os << "training state per rank (params+grads+AdamW over the " << topo.size(Axis::dp) * topo.cp_size()
       << " ranks of a tp slice):";
    for (const auto& [level, name] : kShardNames) {
      c.shard = level;
      os << (level == ShardLevel::none ? " " : "; ") << "shard=" << name << " "
         << fmt_bytes(plan_train_memory(c, topo).state_bytes) << (level == cfg.shard ? " (this run)" : "");
    }
    os << "\n";
  }
  os << "memory estimate per rank: " << fmt_bytes(t.total_bytes) << " (params+grads+AdamW " << fmt_bytes(t.state_bytes)
     << ", activations+scratch " << fmt_bytes(t.activation_bytes) << ", strategy buffers " << fmt_bytes(t.strategy_bytes)
     << (t.gather_bytes > 0 ? (cfg.checkpoint_io == CheckpointIo::parallel && cfg.dump_init.empty()
                                   ? ", a tensor's part copied out to write "
                                   : ", whole tensors gathered on rank 0 to write ") + fmt_bytes(t.gather_bytes)
                             : std::string())
     << ")\n";
  return os.str();
}

namespace {
// Whether this process's MFU peak per thread came from bench calibrate's profile (peak_note says so).
bool& core_peak_calibrated() {
  static bool calibrated = false;
  return calibrated;
}
}  // namespace

double train_peak_flops_per_rank(const Config& cfg, Topology& topo) {
  if (cfg.peak_tflops_per_rank > 0) return cfg.peak_tflops_per_rank * 1e12;  // no time spent measuring
  // Measured once per process (main passes it to the tracer, run_train logs it); every rank
  // calls this at the same points, so the collective inside stays matched.
  static double core = 0;
  if (core == 0) {
    // bench calibrate's one-core rate when it measured this host and CPU (rank 0 reads it: every
    // rank takes the same branch), else measured now.
    double calibrated = topo.world().rank() == 0 ? calibrated_core_peak_flops() : 0;
    topo.world().broadcast(std::span<double>(&calibrated, 1), 0);
    core_peak_calibrated() = calibrated > 0;
    core = calibrated > 0 ? calibrated : measure_core_peak_flops(topo.world());
  }
  // The run's sgemm rate too, now: measured before the run's memory is tracked (main calls this
  // before the trace starts).
  if (cfg.device != Device::cuda) train_sgemm_flops_per_rank(topo);
  return core * omp_get_max_threads();
}

double train_sgemm_flops_per_rank(Topology& topo) {
  static double measured = 0;  // once per process, as the peak
  if (measured == 0) measured = measure_sgemm_peak_flops(topo.world());
  return measured;
}

namespace {

// One training run's state (train_loop): this rank's GPU, the model's shards, parameters,
// gradients and optimizer, their host copies, the data and the oracle dump, built in this order.
struct TrainRun {
  const Config& cfg;
  Topology& topo;
  Tracer& tracer;
  // device=cuda: this rank's GPU and device communicators before anything binds to them (the
  // strategies); params, grads, AdamW moments and every activation on the GPU (`dev`, ordered on
  // gpu.stream).
  const bool on_gpu;
  const GpuRun gpu;
  const Device dev;
  Comm& world;
  Comm& cp;
  Comm& dp;
  const int tp, DP;
  const ModelDims d;
  const ParamLayout layout;
  // shard=: this rank's pieces of the flat layout, whose AdamW moments and master weights it keeps
  // and updates (model/state_shard.hpp; the whole layout with shard=none); whether its gradient
  // is held as those pieces too (shard=grads, params with the plain numerics; the exact ones sum
  // whole integer gradients).
  const StateShard shard;
  const bool grads_in_pieces;
  std::unique_ptr<CpStrategy> strat;
  const Partition part;
  const std::vector<int64_t> pos;
  const bool peak_reset;  // the tracked memory's peak counts from here (before the first buffer)
  // offload=params: the fp32 master weights in pinned host memory (made before the optimizer,
  // whose copies into it end when the optimizer does), none on the GPU.
  // With a shard it holds this rank's pieces (model/offload.hpp).
  std::unique_ptr<HostParams> hparams;
  // The master weights this rank holds are its pieces (shard=params, or any shard with
  // offload=params), else the whole flat weights.
  const bool held_in_pieces;
  // params: the whole flat weights the model reads (none with shard=params or offload=params);
  // master_pieces: shard= without offload=params, this rank's pieces of the fp32 master weights;
  // grads: whole, or grads_in_pieces.
  Buffer<float> params, master_pieces, grads;
  GatherStage gather_stage;  // shard=optimizer, grads: a unit's pieces all-gathered
  double piece_upload_bytes = 0;  // offload=params with shard=optimizer, grads: the pieces copied in after updates
  float* const master;         // what update takes: this rank's master weights
  const float* const weights;  // what forward_backward takes (the feed's params)
  AdamW opt;
  const bool any_offload;
  // On a GPU the host keeps a copy for initialization, checkpoints and dumps (HostCopy).
  HostCopy host;
  double read_s = 0;  // resume: the checkpoint's read, slowest rank
  TrainState state;  // resumed, or the seeded initialization at step 0
  std::unique_ptr<CpStrategy> local_strat;
  std::unique_ptr<Numerics> num;  // plain, or exact (model/numerics.hpp)
  Transformer model;
  UnitFeed feed;  // the model's weights and gradients, unit by unit (gathered and reduced with shard=)
  const std::unique_ptr<TokenSource> src;
  const PlacementPrice price;  // placement=auto: the cost model's price of a batch's placement
  // Oracle dump (modes/oracle_dump.hpp): each recorded step's state before it, its gradients, and
  // the state after the last.
  OracleDump dump;

  TrainRun(const Config& c, Topology& t, Tracer& tr)
      : cfg(c), topo(t), tracer(tr), on_gpu(c.device == Device::cuda), gpu(on_gpu ? &t : nullptr, &tr),
        dev(c.device), world(t.world()), cp(t.cp()), dp(t.axis(Axis::dp)), tp(tp_size(t)), DP(t.size(Axis::dp)),
        d(model_dims(c, tp, t.coord(Axis::tp))), layout(d),
        shard(make_state_shard(c.shard, layout, t.shard())), grads_in_pieces(shard.grads_sharded() && !c.exact),
        strat(make_strategy(c.strategy, t, c.cp_schedule())),
        part(strat->partition(), c.seq, cp.size(), exact_grain(c)), pos(part.positions(cp.rank())),
        peak_reset((mem_reset_peak(), true)),
        hparams(on_gpu && offloads(c, Offload::params)
                    ? std::make_unique<HostParams>(layout, shard, shard.sharded() ? &t.shard() : nullptr, dev, gpu.stream)
                    : nullptr),
        held_in_pieces(shard.params_sharded() || (hparams && shard.sharded())),
        params(hparams || shard.params_sharded() ? 0 : size_t(layout.local_elems()), true, dev, gpu.stream),
        master_pieces(shard.sharded() && !hparams ? size_t(shard.elems()) : 0, true, dev, gpu.stream),
        grads(size_t(grads_in_pieces ? shard.elems() : layout.local_elems()), true, dev, gpu.stream),
        master(hparams ? hparams->host() : shard.sharded() ? master_pieces.data() : params.data()),
        weights(hparams ? hparams->host() : shard.params_sharded() ? master_pieces.data() : params.data()),
        opt(layout, AdamWConfig{c.lr, c.beta1, c.beta2, c.adam_eps, c.weight_decay, c.grad_clip}, shard, &t.shard(),
            grads_in_pieces, dev, gpu.stream, offloads(c, Offload::optimizer), c.offload_chunk),
        any_offload(attach_offload()),
        host(dev, gpu.stream, size_t(shard.params_sharded() && grads_in_pieces ? shard.elems() : layout.local_elems()),
             size_t(shard.elems()), !opt.offloaded(), hparams.get()),
        state(start_state()), local_strat(make_local_strategy(c, t)),
        num(make_numerics(c.exact, d, layout.local_elems(), exact_grain(c))),
        model(layout, t, *strat, c.remat, pos, train_docs(c), local_layers_strategy(), dev, gpu.stream,
              offloads(c, Offload::layer_inputs), offloads(c, Offload::attn_out)),
        feed(layout, shard, &t.shard(), c.exact, dev, gpu.stream, hparams != nullptr), src(make_token_source(c)),
        price(make_placement_price(c, t)),
        dump(c, layout, t, state.step == 0) {
    model.use_numerics(*num);
    model.use_feed(&feed);
    if (hparams && hparams->mirrors()) model.use_weights(&hparams->view(), &hparams->mirror());
    if (dump.records(0)) record_state();
  }
  // The local (L) layers' strategy: local_strategy's, or with exact numerics the main strategy (its
  // schedule of the exact sums) with the window mask, which gathers every key row as for the global layers.
  CpStrategy* local_layers_strategy() {
    if (!d.has_local()) return nullptr;
    return cfg.exact ? strat.get() : local_strat.get();
  }
  // offload=params: the optimizer streams the weights with the moments.
  bool attach_offload() {
    if (hparams) opt.attach(hparams.get());
    return on_gpu && !offload_items(cfg.offload).empty();
  }
  // The checkpoint resumed from, or the seeded initialization; on the device.
  TrainState start_state() {
    TrainState st;
    // shard=params: this rank's pieces only; else the whole weights, then its pieces of them
    Buffer<float>& first = shard.params_sharded() ? master_pieces : params;
    float* p = host.p(first);
    if (!cfg.resume.empty()) {
      const double t0 = world.now();
      st = load_checkpoint(cfg.resume, layout, p, shard, held_in_pieces, host.m(opt), host.v(opt));
      read_s = world.now() - t0;
      world.all_reduce(std::span<double>(&read_s, 1), ReduceOp::max);
      opt.set_step(st.step);
    } else if (held_in_pieces) {
      init_pieces(layout, shard, uint64_t(cfg.seed), p);
    } else {
      layout.init(uint64_t(cfg.seed), p);
    }
    host.upload(first, opt);
    // the device copies (the whole weights just uploaded) into this rank's pieces
    if (shard.sharded() && !held_in_pieces) take_pieces(shard, params.data(), master_pieces.data(), dev, gpu.stream);
    return st;
  }
  // The whole weights (whole_weights) and gradients (whole_gradients) where checkpoints and dumps
  // gather tensors (shard group rank 0: dp 0, CP rank 0), host memory; collective over the shard
  // group when sharded.
  const float* whole_weights(std::vector<float>& keep) {
    return held_in_pieces ? whole(held_weights(), keep) : held_weights();
  }
  // The weights as this rank holds them, host memory: its pieces (held_in_pieces), else whole.
  const float* held_weights() { return host.download_params(shard.params_sharded() ? master_pieces : params, opt); }
  const float* whole_gradients(std::vector<float>& keep) {
    return grads_in_pieces ? whole(host.download(grads), keep) : host.download(grads);
  }
  // `mine`: this rank's pieces (host memory), assembled in `keep` from every rank's; `mine`
  // itself without sharding.
  const float* whole(const float* mine, std::vector<float>& keep) {
    if (!shard.sharded()) return mine;
    keep = gather_pieces(mine, shard, topo.host_shard());
    return keep.data();
  }
  void record_state() {
    std::vector<float> p, m, v;
    dump.state(whole_weights(p), whole(host.download_m(opt), m), whole(host.download_v(opt), v));
  }
  void save(const std::string& path, const TrainState& st) {
    if (cfg.checkpoint_io == CheckpointIo::parallel) {  // every rank its part, no gather
      save_checkpoint_parallel(path, cfg, layout, shard, held_in_pieces, held_weights(), host.download_m(opt),
                               host.download_v(opt), st, topo);
      return;
    }
    std::vector<float> p, m, v;
    save_checkpoint(path, cfg, layout, whole_weights(p), whole(host.download_m(opt), m),
                    whole(host.download_v(opt), v), st, topo);
  }
  // shard=optimizer, grads: every rank's updated pieces into every rank's whole weights (with
  // offload=params their GPU copies, from the pieces the update copied out; traced as phase
  // state_gather, blocking).
  void gather_params(CpStats& st) {
    if (!shard.sharded() || shard.params_sharded()) return;
    Tracer::Scope sc(&tracer, Phase::state_gather, -1, -1, 0, 4.0 * double(shard.elems() * (shard.Z - 1)));
    const double t0 = world.now();
    if (hparams) {
      opt.wait_host();
      hparams->upload();
      piece_upload_bytes += 4.0 * double(shard.elems());
    } else {
      gather_weights(master_pieces.data(), params.data(), shard, topo.shard(), gather_stage, dev, gpu.stream);
    }
    stream_synchronize(gpu.stream, dev);
    st.exposed_comm_s += world.now() - t0;
  }
};

// What MFU divides by, for the header and the trace (peak_source); on the CPU, where the peak was
// measured, also this run's sgemm rate (sgemm_flops_per_rank: how near the GEMM library comes to
// that peak; a measurement of the run, never the denominator). Collective then.
std::string peak_note(const Config& cfg, bool on_gpu, Topology& topo, Tracer& tr) {
  std::string note = cfg.peak_tflops_per_rank > 0 ? "peak_tflops_per_rank"
                     : on_gpu                     ? "the GPU's dense bf16 peak"
                     : core_peak_calibrated()     ? std::string("one core's FMA loop from bench calibrate (") +
                                                       kCalibratedProfile + ") x " + std::to_string(omp_get_max_threads()) +
                                                       " thread(s)"
                                                  : std::string("one core's ") + fma_isa_name(fma_isa_available()) +
                                           " FMA loop x " + std::to_string(omp_get_max_threads()) + " thread(s)";
  tr.write_attr("/", "peak_source", note);
  if (on_gpu || cfg.peak_tflops_per_rank > 0) return note;
  const double sgemm = train_sgemm_flops_per_rank(topo);
  tr.write_attr("/", "sgemm_flops_per_rank", sgemm);
  char b[96];
  std::snprintf(b, sizeof b, "; this run's sgemm %.1f GFLOP/s per rank", sgemm / 1e9);
  return note + b;
}

// The run's header lines (rank 0).
void log_train_header(const TrainRun& r, double peak) {
  const Config& cfg = r.cfg;
  const ModelDims& d = r.d;
  const MeshSpec& m = r.topo.mesh();
  log0("ctxpar train: %lld layers, dim %lld, ffn %lld, heads %lld/%lld x %lld, vocab %lld (%.1fM params); S = %lld, "
       "%d ranks (dp:%lld,tp:%lld,ulysses:%lld,ring:%lld), strategy %s, remat %s\n",
       (long long)d.layers, (long long)d.dim, (long long)d.ffn, (long long)cfg.heads, (long long)cfg.kv_heads,
       (long long)cfg.head_dim, (long long)d.vocab, double(d.param_count()) / 1e6, (long long)cfg.seq, r.world.size(),
       (long long)m.dp, (long long)m.tp, (long long)m.ulysses, (long long)m.ring, cfg.strategy.c_str(),
       name_of(cfg.remat));
  if (cfg.attention == "mla") log0("# %s\n", mla_line(cfg).c_str());
  log0("# data: %s; trace %s\n", r.src->describe().c_str(), r.tracer.path().c_str());
  log0("# MFU peak %.1f GFLOP/s per rank (%s)\n", peak / 1e9, peak_note(r.cfg, r.on_gpu, r.topo, r.tracer).c_str());
  if (r.on_gpu)
    log0("# device=cuda: %s, %s communicators; bf16 GEMM and attention inputs, fp32 accumulation, fp32 master "
         "weights and AdamW moments%s\n", r.gpu.description.c_str(), r.gpu.comm.c_str(),
         r.any_offload ? (" (offload=" + cfg.offload + ": in pinned host memory)").c_str() : "");
  log0("# FLOP convention: %s; attention on visible causal pairs (sum L_i(L_i+1)/2 per document; local layers the window's); recompute not counted\n",
       kFlopConvention);
  if (cfg.layer_pattern != "G")
    log0("# layers: pattern %s (G global attention, L local over window %lld with local_strategy %s, D Gated DeltaNet): %s\n",
         cfg.layer_pattern.c_str(), (long long)cfg.window, cfg.local_strategy.c_str(), d.kinds.c_str());
  if (r.part.padding() > 0) log0("# %s\n", r.part.padding_note().c_str());
  if (cfg.placement == PlacementKind::document)
    log0("# placement document: every document of each batch zigzag over all %d ranks on its own (the packed-sequence "
         "layout of Transformer Engine and Megatron-LM), %lld rows per rank; the frugal exchange moves only visible "
         "rows\n", r.part.P(), (long long)r.model.S_loc());
  else if (cfg.placement != PlacementKind::zigzag)
    log0("# placement %s: each batch's documents placed from their lengths (short ones whole on one rank, long "
         "ones zigzag over the fewest ranks within %lld%% of the mean causal work)%s, %lld rows per rank; the frugal "
         "exchange moves only visible rows\n", name_of(cfg.placement), (long long)kBalanceSlackPercent,
         cfg.placement == PlacementKind::automatic
             ? (" where the cost model (hardware " + hardware_name(cfg, HardwareUse::plan) + ") prices the batch's "
                "attention there below zigzag's: the busiest rank's pairs and the rows it receives, as the frugal ring")
                   .c_str()
             : "",
         (long long)r.model.S_loc());
  if (r.shard.sharded())
    log0("# shard=%s: AdamW moments and master weights of %lld of the %lld elements of this tp slice per rank (a "
         "piece of each unit, %d ranks of dp x CP); %s\n", name_of(cfg.shard), (long long)r.shard.elems(),
         (long long)r.shard.n, r.shard.Z,
         r.shard.params_sharded() ? "each unit's weights all-gathered while the unit before it computes, its "
                                    "gradient reduce-scattered while the next one does (phases state_gather, "
                                    "state_reduce)"
         : r.shard.grads_sharded() ? "each unit's gradient reduce-scattered in the backward, the updated pieces "
                                     "all-gathered after the update (phases state_reduce, state_gather)"
                                   : "the updated pieces all-gathered after the update (phase state_gather)");
  if (r.state.step > 0)
    log0("# resumed from %s at step %lld (read in %.3f s, slowest rank)\n", cfg.resume.c_str(), (long long)r.state.step,
         r.read_s);
  log0("#  step         loss  grad_norm   time_ms    tokens/s  TFLOP/s/rank    MFU%%  exposed_ms  peak_MiB\n");
}

// Parameters are shared by the CP group and the dp replicas: sum their gradients (and the loss)
// there, as the numerics policy takes its sums (exact: integers, whose sum has one result in any order).
void sum_gradients(TrainRun& r, double& loss_sum, CpStats& st) {
  // (shard=grads, params with the plain numerics: the model reduce-scattered the gradients already)
  const double bytes = r.grads_in_pieces ? 8.0 : double(r.layout.local_elems()) * r.num->bytes_per_grad();
  Tracer::Scope sc(&r.tracer, Phase::all_reduce, -1, -1, 0, bytes);
  const double tc = r.world.now();
  r.num->sum_over_ranks(r.layout, r.grads.data(), loss_sum,
                        GradGroups{&r.cp, &r.dp, &r.topo.axis(Axis::tp), r.grads_in_pieces ? &r.shard : nullptr}, r.dev,
                        r.gpu.stream);
  st.exposed_comm_s += r.world.now() - tc;
}

// The medians and first/last losses of the measured steps, for the summary.
struct TrainTotals {
  std::vector<double> times, tflops, mfus, tok_s, gemm_sh, attn_sh;
  std::vector<double> offload_s;  // offload: seconds of copies per step not hidden by compute
  std::vector<double> losses;
  std::vector<double> work;       // every step's attention pairs x heads on this rank (imbalance())
  std::vector<double> audit_s;    // every step's coverage audit, seconds (rank 0)
  std::vector<double> coverage;   // per step: step, pairs x heads computed (all ranks, layers, fwd + bwd), expected
  int64_t batches = 0, placed = 0;  // placement=auto: batches run, of them on the balanced placement
  double first_loss = NAN, last_loss = NAN;
};

// The coverage audit (model/coverage.hpp) of step s: `got`, every layer's attention pairs x heads
// summed over every rank (finish_step's all-reduce carries them), against the batch's visible
// pairs (`pairs`: causal, window; summed over dp). "" when the step passes.
std::string audit_step(TrainRun& r, const std::vector<double>& got, const double pairs[2], int64_t s, TrainTotals& tot) {
  const double t0 = r.world.now();
  // Padding rows (a seq the partition does not split evenly, shard/partition.hpp) are one more
  // document of every replica: their pairs are computed (and never read).
  const int64_t pad = r.part.padding();
  const double pad_causal = pad > 0 ? causal_visible_pairs({pad}) : 0.0,
               pad_window = pad > 0 && r.d.has_local() ? window_visible_pairs({pad}, r.d.window) : 0.0;
  const double causal = pairs[0] + double(r.DP) * pad_causal, window = pairs[1] + double(r.DP) * pad_window;
  std::string bad = coverage_audit(got, r.d, causal, window, r.cfg.remat, s);
  tot.audit_s.push_back(r.world.now() - t0);
  const std::vector<double> want = coverage_expected(r.d, causal, window, r.cfg.remat);
  tot.coverage.insert(tot.coverage.end(), {double(s), std::accumulate(got.begin(), got.end(), 0.0),
                                           std::accumulate(want.begin(), want.end(), 0.0)});
  return bad;
}

// One step's time and rates, once the update is done: the GPU's own times, the shares of GEMMs and
// attention, the trace's record and the log line. Returns whether a stop signal ends the run.
bool finish_step(TrainRun& r, int64_t s, int64_t trace_step0, double t0, double loss, double norm,
                 const double (&pairs)[2], CpStats& st, StepTimes& tm, double peak, TrainTotals& tot,
                 std::string& audit) {
  const Config& cfg = r.cfg;
  double dt = r.world.now() - t0;
  if (r.on_gpu) {
    // The host's clocks saw only launches: the device waits timed by their events, and the
    // GEMM and attention times from the spans' device marks (Tracer::time_on_device).
    st.settle();
    const auto ph = r.tracer.phase_seconds();
    const auto sec = [&](std::initializer_list<Phase> p) {
      double x = 0;
      for (Phase q : p) x += ph[size_t(q)];
      return x;
    };
    tm.gemm_s = sec({Phase::gemm});
    tm.attn_s = attention_seconds(ph);
    // Offload: the compute stream's waits for chunks of the moments (the copy time not hidden).
    if (r.any_offload) tot.offload_s.push_back(sec({Phase::offload}));
  }
  // Shares of this rank's step in GEMMs and in CP attention (with its communication), averaged
  // over ranks; the rest is norms, RoPE, SwiGLU, loss, optimizer, gradient and tp all-reduces.
  // With them, in the same all-reduce, each layer's attention pairs x heads for the coverage audit.
  const int P_world = r.world.size();
  std::vector<double> sums = r.model.attn_pair_heads();
  double mine = 0;
  for (double g : sums) mine += g;
  tot.work.push_back(mine);
  sums.push_back(tm.gemm_s / dt);
  sums.push_back(tm.attn_s / dt);
  r.world.all_reduce(std::span<double>(sums));
  const double shares[2] = {sums[sums.size() - 2], sums.back()};
  sums.resize(sums.size() - 2);
  audit = audit_step(r, sums, pairs, s, tot);
  r.world.all_reduce(std::span<double>(&dt, 1), ReduceOp::max);
  double exposed = st.exposed_comm_s;
  r.world.all_reduce(std::span<double>(&exposed, 1), ReduceOp::max);
  // Whole job: every dp replica's projections, and the visible pairs summed over dp above.
  const ModelDims dg = model_dims(cfg, 1, 0);
  const double step_flops =
      double(r.DP) * (train_matmul_flops(dg, cfg.seq) + train_gdn_flops(dg, cfg.seq)) + train_attn_flops(dg, pairs[0], pairs[1]);
  StepRecord rec;
  rec.step = s + trace_step0;
  rec.time_s = dt;
  rec.tokens = cfg.seq * r.DP;
  rec.model_flops = step_flops;
  rec.exposed_comm_s = st.exposed_comm_s;
  rec.peak_bytes = mem_peak_bytes();
  rec.loss = loss;
  const bool stop = r.tracer.end_step(rec);
  const double tflops = step_flops / dt / P_world / 1e12;
  const double mfu = peak > 0 ? step_flops / (dt * peak * P_world) : 0;
  const double tps = double(rec.tokens) / dt;
  int64_t peak_b = mem_peak_bytes();
  r.world.all_reduce(std::span<int64_t>(&peak_b, 1), ReduceOp::max);
  log0("  %5lld  %11.6f  %9.4f  %8.1f  %10.1f  %12.4f  %6.2f  %10.1f  %8.1f%s\n", (long long)s, loss, norm, dt * 1e3,
       tps, tflops, 100 * mfu, exposed * 1e3, double(peak_b) / (1 << 20), s < cfg.warmup ? "  (warmup)" : "");
  tot.losses.push_back(loss);
  if (std::isnan(tot.first_loss)) tot.first_loss = loss;
  tot.last_loss = loss;
  if (s >= cfg.warmup) {
    tot.times.push_back(dt);
    tot.tflops.push_back(tflops);
    tot.mfus.push_back(mfu);
    tot.tok_s.push_back(tps);
    tot.gemm_sh.push_back(shares[0] / P_world);
    tot.attn_sh.push_back(shares[1] / P_world);
  }
  return stop;
}

// How evenly the ranks shared the attention work, per step: max / mean over the ranks of their
// pairs x heads (collective, once at the end: the steps' audit needs only the sums).
std::vector<double> imbalance(TrainRun& r, const TrainTotals& tot) {
  std::vector<double> most = tot.work, sum = tot.work;
  r.world.all_reduce(std::span<double>(most), ReduceOp::max);
  r.world.all_reduce(std::span<double>(sum));
  std::vector<double> out;
  for (size_t i = 0; i < sum.size(); ++i) out.push_back(sum[i] > 0 ? most[i] * double(r.world.size()) / sum[i] : 1.0);
  return out;
}

// The summary lines after the last step (and the offload attributes of the trace).
void log_train_summary(TrainRun& r, const TrainTotals& tot, int64_t first_step) {
  const Config& cfg = r.cfg;
  const double tmed = median(tot.times);
  if (!tot.offload_s.empty()) {
    const double steps_run = double(std::max<int64_t>(r.opt.step() - first_step, 1));
    const double mib = steps_run * double(1 << 20), outs = r.model.offload_bytes_attn_out();
    // With a shard, offload=params also copies the master's pieces in: for the all-gathers after
    // each update (optimizer, grads) or before each unit's use (params).
    const double pieces = r.piece_upload_bytes + r.feed.host_bytes();
    const double moved = r.opt.offload_bytes() + r.model.offload_bytes() + pieces;
    char piece_text[64] = "";
    if (pieces > 0) std::snprintf(piece_text, sizeof piece_text, ", the master's pieces in %.1f", pieces / mib);
    log0("# offload=%s: %.1f MiB moved per step (AdamW moments%s %.1f%s, layer inputs %.1f, attention outputs %.1f), "
         "%.2f ms per step of copies not hidden by compute (median, rank 0; spans of phase offload)\n",
         cfg.offload.c_str(), moved / mib, r.hparams ? " and weights" : "", r.opt.offload_bytes() / mib, piece_text,
         (r.model.offload_bytes() - outs) / mib, outs / mib, median(tot.offload_s) * 1e3);
    // The trace: what moved and what compute did not hide (rank 0's, per step).
    r.tracer.write_attr("/", "offload", cfg.offload);
    r.tracer.write_attr("/", "offload_bytes_per_step", moved / steps_run);
    r.tracer.write_attr("/", "offload_unhidden_s_per_step", median(tot.offload_s));
  }
  if (cfg.placement == PlacementKind::automatic) {
    log0("# placement auto: %lld of %lld batches (warmup included) ran on the balanced placement, the rest on zigzag "
         "rows\n", (long long)tot.placed, (long long)tot.batches);
    r.tracer.write_attr("/", "placement_auto_balanced_batches", double(tot.placed));
    r.tracer.write_attr("/", "placement_auto_batches", double(tot.batches));
  }
  log0("\n# summary (median over %zu measured steps, %lld warmup excluded)\n", tot.times.size(), (long long)cfg.warmup);
  log0("#   loss               %.6f -> %.6f\n", tot.first_loss, tot.last_loss);
  log0("#   step time          %10.2f ms\n", tmed * 1e3);
  log0("#   tokens/s           %10.1f\n", median(tot.tok_s));
  log0("#   TFLOP/s per rank   %10.4f\n", median(tot.tflops));
  log0("#   MFU                %10.2f %%\n", 100 * median(tot.mfus));
  log0("#   peak tracked mem   %10.1f MiB per rank (rank 0)\n", double(mem_peak_bytes()) / (1 << 20));
  log0("#   time in GEMMs      %10.1f %% (attention %.1f %%, other %.1f %%)\n", 100 * median(tot.gemm_sh),
       100 * median(tot.attn_sh), 100 * (1 - median(tot.gemm_sh) - median(tot.attn_sh)));
  const std::vector<double> imbs = imbalance(r, tot);  // collective
  const double imb = median(imbs);
  log0("#   attention work     %10.3f max/mean over ranks; every visible pair computed once, audited every step "
       "(16 B a layer on the step's all-reduce; the check %.3f ms)\n",
       imb, median(tot.audit_s) * 1e3);
  r.tracer.write_attr("/", "attn_work_imbalance", imb);
  r.tracer.write_attr("/", "coverage_audit", std::string("passed every step"));
  std::vector<double> rows;
  for (size_t i = 0; i < imbs.size(); ++i)
    rows.insert(rows.end(), {tot.coverage[3 * i], tot.coverage[3 * i + 1], tot.coverage[3 * i + 2], imbs[i]});
  if (!rows.empty()) {
    r.tracer.write_dataset("/coverage", rows, {uint64_t(imbs.size()), 4});
    r.tracer.write_attr("/coverage", "columns",
                        std::string("step,attn_pair_heads_computed,attn_pair_heads_expected,attn_work_imbalance"));
  }
  const bool finite = std::isfinite(tot.last_loss);
  if (r.tracer.stop_signal() != 0)
    log0("# TRUNCATED (%s after step %lld; the summary covers the completed steps): %s training on %d ranks\n",
         signal_name(r.tracer.stop_signal()), (long long)r.tracer.stop_step(), cfg.strategy.c_str(), r.world.size());
  else
    log0("# %s: %s training on %d ranks\n", finite ? "VALID" : "INVALID (non-finite loss)", cfg.strategy.c_str(),
         r.world.size());
}

}  // namespace

int train_loop(const Config& cfg, Topology& topo, Tracer& tracer, TrainSummary& sum, int64_t trace_step0) {
  TrainRun r(cfg, topo, tracer);
  const int64_t total = cfg.warmup + cfg.steps;
  const double peak = r.on_gpu ? gpu_peak_flops_per_rank(cfg, topo) : train_peak_flops_per_rank(cfg, topo);
  log_train_header(r, peak);
  TrainTotals tot;
  const int64_t first_step = r.state.step;
  // The newest good checkpoint: the one resumed from, then each one this run writes.
  int64_t last_checkpoint = cfg.resume.empty() ? -1 : r.state.step;
  std::string last_checkpoint_path = cfg.resume;
  for (int64_t s = r.state.step; s < total; ++s) {
    tracer.begin_step(s + trace_step0);
    r.opt.prefetch();  // offload: the first chunks of the moments come in under the forward
    r.world.barrier();
    const double t0 = r.world.now();
    const int64_t sample = s * r.DP + topo.coord(Axis::dp);
    Batch b = make_batch(*r.src, sample, r.part, r.cp.rank(), cfg.placement, &r.price);
    ++tot.batches;
    tot.placed += b.placed;
    // Labelled tokens of the whole global batch: the loss is their mean.
    int64_t counts[2] = {b.labelled_tokens, 0};
    double pairs[2] = {causal_visible_pairs(b.doc_lengths),
                       r.d.has_local() ? window_visible_pairs(b.doc_lengths, r.d.window) : 0.0};
    if (r.DP > 1) {
      r.dp.all_reduce(std::span<int64_t>(counts, 1));
      r.dp.all_reduce(std::span<double>(pairs, 2));
    }
    const int64_t N = std::max<int64_t>(counts[0], 1);
    CpStats st;
    StepTimes tm;
    Buffer<float> logits_full;
    if (r.dump.on() && s == 0) logits_full.resize(size_t(r.model.S_loc() * r.d.vocab), false);
    double loss_sum = r.model.forward_backward(r.weights, r.grads.data(), b, 1.0 / double(N), &tracer, st, tm,
                                               logits_full.size() ? logits_full.data() : nullptr);
    sum_gradients(r, loss_sum, st);
    const double loss = loss_sum / double(N);
    if (r.dump.records(s)) {
      std::vector<float> keep;
      r.dump.gradients(r.whole_gradients(keep));
    }
    if (r.dump.on() && s == 0 && topo.coord(Axis::tp) == 0)
      r.dump.logits(gather_rows_at(r.cp, b.pos, b.S, logits_full.span(), r.d.vocab));
    double norm;
    {
      Tracer::Scope sc(&tracer, Phase::optimizer, -1, -1, 0, 0);
      Comm* tp_comm = r.tp > 1 ? &topo.axis(Axis::tp) : nullptr;
      norm = r.num->grad_norm(r.opt, r.grads.data(), tp_comm);
    }
    // A non-finite loss or gradient stops the run before the update: the parameters (and any
    // checkpoint written) stay those of the last good step. The loss and the norm are the same
    // on every rank, so every rank stops here.
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      const std::string msg = non_finite_message(s, loss, r.layout, r.host.download(r.grads),
                                                 r.grads_in_pieces ? &r.shard : nullptr, r.world, last_checkpoint,
                                                 last_checkpoint_path);
      err0("ctxpar: %s\n", msg.c_str());
      tracer.fail(msg);
      return kExitFault;
    }
    {
      Tracer::Scope sc(&tracer, Phase::optimizer, -1, -1, 0, 0);
      r.opt.update(r.master, r.grads.data(), norm, &tracer);
      stream_synchronize(r.gpu.stream, r.dev);  // the step's time includes the GPU's work
    }
    r.gather_params(st);
    if (r.dump.records(s)) r.record_state();  // after the update: the state before step s + 1
    std::string audit;  // the step's coverage audit (finish_step): "" when it passed
    const bool stop = finish_step(r, s, trace_step0, t0, loss, norm, pairs, st, tm, peak, tot, audit);
    if (!audit.empty()) {  // a bug of a CP schedule: no checkpoint of this step, the run INVALID
      err0("ctxpar: %s\n", audit.c_str());
      log0("# INVALID: %s\n", audit.c_str());
      tracer.fail(audit);
      return kExitBug;
    }
    r.state.step = s + 1;
    r.state.next_sample = (s + 1) * r.DP;
    if (cfg.checkpoint_every > 0 && r.state.step % cfg.checkpoint_every == 0) {
      Tracer::Scope sc(&tracer, Phase::other, -1, -1, 0, 0);
      const double t_ck = r.world.now();
      r.save(cfg.checkpoint, r.state);
      last_checkpoint = r.state.step;
      last_checkpoint_path = cfg.checkpoint;
      log0("# checkpoint: step %lld written to %s in %.3f s (%s writer)\n", (long long)r.state.step,
           cfg.checkpoint.c_str(), r.world.now() - t_ck, name_of(cfg.checkpoint_io));
    }
    if (stop) {
      log0("# stop signal: ending after step %lld\n", (long long)s);
      break;
    }
  }
  if (r.dump.on()) r.dump.write(tot.losses, *r.src);
  log_train_summary(r, tot, first_step);
  sum.steps = int64_t(tot.times.size());
  sum.step_s = median(tot.times);
  sum.tokens_per_s = median(tot.tok_s);
  sum.tflops_per_rank = median(tot.tflops);
  sum.mfu = median(tot.mfus);
  sum.gemm_share = median(tot.gemm_sh);
  sum.attn_share = median(tot.attn_sh);
  sum.first_loss = tot.first_loss;
  sum.last_loss = tot.last_loss;
  sum.peak_flops_per_rank = peak;
  sum.finite = std::isfinite(tot.last_loss);
  return sum.finite ? 0 : 1;
}

int run_train(const Config& cfg, Topology& topo, Tracer& tracer) {
  TrainSummary sum;
  return train_loop(cfg, topo, tracer, sum);
}

}  // namespace ctxpar
