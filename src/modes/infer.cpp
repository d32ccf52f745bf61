// `ctxpar prefill`, `ctxpar decode`, `ctxpar chat` — inference with context parallelism on the
// training model (src/infer/engine.hpp): a KV cache sharded over the CP ranks, full and partial
// prefills with pass-KV or pass-Q (cp_algo = auto chooses per call from the cost model in
// src/perf/prefill_choice.hpp), and batched greedy decode with pass-Q or all-gather.
//
//   prefill  per step: a fresh cache; `cached` tokens (or seq * (1 - miss_rate)) are prefilled
//            first (setup, untimed), then the measured prefill of the rest: TTFT.
//   decode   a full prefill of `seq` tokens (turn 0), then warmup + steps decode steps: TTIT.
//   chat     the turns of `schedule`: each prefill is a traced step with its TTFT, each decode
//            token a traced step with its TTIT.
// Trace: /steps rows carry turn, ttft_s / ttit_s; /generated [turn, step, batch] the greedy
// token ids (step 0 = the prefill's token, -1 = no token); /infer/calls one row per prefill
// (columns in its attribute) with the choice and both predicted costs; /infer/cache_bytes
// [step, rank] the KV cache bytes each rank holds after every step.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <optional>
#include <span>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/random.hpp"
#include "core/stats.hpp"
#include "dist/topology.hpp"
#include "infer/engine.hpp"
#include "infer/schedule.hpp"
#include "model/numerics.hpp"
#include "model/checkpoint.hpp"
#include "model/flops.hpp"
#include "model/mla_layer.hpp"
#include "modes/device_run.hpp"
#include "model/model.hpp"
#include "modes/modes.hpp"
#include "perf/prefill_choice.hpp"
#include "ops.hpp"
#include "shard/partition.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

using namespace infer;

namespace {

std::string s_(int64_t v) { return std::to_string(v); }

// T and P of `ctxpar prefill`: cached P given, or T = miss_rate * seq rounded to the nearest token
// (at least one; predict rounds the same way). Any T and P shard (the partition pads).
void prefill_split(const Config& cfg, int64_t& T, int64_t& cached) {
  if (cfg.cached > 0) {
    cached = cfg.cached;
    T = cfg.seq - cached;
    return;
  }
  T = std::clamp<int64_t>(std::llround(cfg.miss_rate * double(cfg.seq)), 1, cfg.seq);
  cached = cfg.seq - T;
}

// Schedule of a mode: chat's own; prefill = [prefill P (setup), prefill T]; decode = [prefill
// seq, decode warmup + steps].
std::string mode_schedule(const Config& cfg, int N, std::vector<SchedulePhase>& s) {
  if (cfg.mode == Mode::chat) return parse_schedule(cfg.schedule, N, s);
  s.clear();
  if (cfg.mode == Mode::prefill) {
    int64_t T, cached;
    prefill_split(cfg, T, cached);
    if (cached > 0) s.push_back({PhaseKind::prefill, cached});
    s.push_back({PhaseKind::prefill, T});
  } else {
    s.push_back({PhaseKind::prefill, cfg.seq});
    s.push_back({PhaseKind::decode, cfg.warmup + cfg.steps});
  }
  return "";
}

// Prompt token of sequence b at global position p (same on every rank, any mesh).
int32_t prompt_token(uint64_t seed, int64_t b, int64_t p, int64_t V) {
  return int32_t(splitmix64(splitmix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(b)) ^ uint64_t(p)) % uint64_t(V));
}

struct PrefillCall {
  int64_t turn, T, cached;
  CpAlgo algo;     // the choice on the batch's mean lengths
  double q_share;  // the share of the batch's sequences that ran pass-Q
  Prediction pred;
  double ttft_s;
};

// placement = balanced: where the first (full) prefill's sequences go (infer/schedule.hpp
// prefill_placement), one line.
void log_placement(const SchedulePhase& first, int N, int64_t batch) {
  const Placement p = prefill_placement(first.lengths_of(batch), N);
  std::string spans;
  for (size_t j = 0; j < p.spans.size(); ++j) spans += (j ? "/" : "") + std::to_string(p.spans[j]);
  log0("# placement balanced: the first prefill's sequences placed from their lengths over %d ranks (ranks per "
       "sequence %s; attention work max/mean %.3f), %lld rows per rank as with zigzag\n",
       N, spans.c_str(), p.imbalance(), (long long)p.n);
}

class Session {
 public:
  // `stream`: the GPU's compute stream with device = cuda (GpuRun, made before: it gives topo
  // its device communicators), null on the CPU.
  Session(const Config& cfg, Topology& topo, Tracer& tr, const std::vector<SchedulePhase>& sched, Stream stream)
      : cfg_(cfg), topo_(topo), tr_(tr), cp_(topo.cp()),
        layout_(model_dims(cfg, topo.size(Axis::tp), topo.coord(Axis::tp))),
        params_(size_t(layout_.local_elems())) {
    if (!cfg.resume.empty()) {
      // Trained weights of `ctxpar train` (not its AdamW moments).
      load_checkpoint(cfg.resume, layout_, params_.data(), StateShard::whole(layout_), false, nullptr, nullptr);
    } else {
      layout_.init(uint64_t(cfg.seed), params_.data());
    }
    const int N = cp_.size();
    // The cp_algo model first: a measured profile's buffers (perf/prefill_choice.hpp
    // cost_model_bytes) are freed before the engine allocates its cache.
    cost_ = std::make_unique<PrefillCostModel>(cfg, cp_, topo.size(Axis::tp));
    engine_ = std::make_unique<Engine>(layout_, params_.data(), topo, cache_capacity(sched, N, cfg.batch, cfg.placement),
                                       cfg.strategy, cfg.device, stream);
    num_ = make_numerics(cfg.exact, layout_.dims(), /*grad_elems=*/0, /*block=*/1);
    engine_->use_numerics(*num_, cfg.cp_schedule());
    engine_->use_placement(cfg.placement);
    const ModelDims& d = layout_.dims();
    log0("ctxpar %s: %lld layers, dim %lld, ffn %lld, heads %lld/%lld x %lld, vocab %lld (%.1fM params); batch %lld, "
         "%d CP ranks (mesh %s), full-prefill strategy %s, cp_algo %s, decode_algo %s\n",
         name_of(cfg.mode), (long long)d.layers, (long long)d.dim, (long long)d.ffn, (long long)cfg.heads,
         (long long)cfg.kv_heads, (long long)cfg.head_dim, (long long)d.vocab, double(d.param_count()) / 1e6,
         (long long)cfg.batch, N, cfg.mesh.c_str(), cfg.strategy.c_str(), name_of(cfg.cp_algo), name_of(cfg.decode_algo));
    log0("# weights: %s; KV cache %s allocated on rank 0 (%lld tokens of %lld sequences; %lld on the rank holding "
         "most)\n",
         cfg.resume.empty() ? "seeded init (as train)" : cfg.resume.c_str(),
         fmt_bytes(engine_->cache().allocated_bytes()).c_str(), (long long)engine_->cache().rows(),
         (long long)engine_->cache().batch(), (long long)most_rank_tokens(engine_->cache().capacities()));
    log0("# cp_algo cost model: %s\n", cost_->describe().c_str());
    if (!cost_->warning().empty()) log0("# %s\n", cost_->warning().c_str());
    if (cfg.visible_keys)
      log0("# frugal: full prefills by the %s strategy's visible-keys row (only the K/V rows some query sees move)\n",
           cfg.strategy.c_str());
    if (cfg.placement == PlacementKind::balanced) log_placement(sched.front(), N, cfg.batch);
    if (cfg.exact)
      log0("# %s: every attention by the exact schedule (keys stay, queries all-gathered, exact sums), "
           "whatever cp_algo, decode_algo and strategy say: the same bits on any mesh\n",
           schedule_key(cfg.cp_schedule()).c_str());
    log0("# FLOP convention: %s; prefill/decode FLOPs count projections, MLP, one LM-head row per sequence\n",
         kFlopConvention);
    log0("# coverage audit: every call's attention (query, key) pairs x heads, summed over the CP and tp ranks, "
         "against what its new rows see (a mismatch ends the run; model/coverage.hpp)\n");
    log0("#  step turn  kind      T        P  algo       time_ms    tokens/s  TFLOP/s/rank  exposed_ms  cache_MiB/rank\n");
    const PrefillCostModel& hw = *cost_;
    auto finite = [](double x) { return std::isfinite(x) ? x : 0.0; };
    tr_.write_attr("/", "hw_profile", hw.profile().name);
    tr_.write_attr("/", "hw_attn_flops_per_s", hw.attn_flops_per_s());
    tr_.write_attr("/", "hw_bw_bytes_per_s", finite(hw.bw_bytes_per_s()));
    tr_.write_attr("/", "hw_a2a_bytes_per_s", finite(hw.a2a_bytes_per_s()));
    tr_.write_attr("/", "hw_latency_s", hw.latency_s());
  }

  int64_t V() const { return cfg_.vocab; }
  Engine& engine() { return *engine_; }

  CpAlgo choose(int64_t T, int64_t cached, Prediction& pred) const {
    pred = cost_->predict(T, cached);
    if (cfg_.cp_algo == CpAlgoSetting::pass_kv) return CpAlgo::pass_kv;
    if (cfg_.cp_algo == CpAlgoSetting::pass_q) return CpAlgo::pass_q;
    return pred.choice;
  }

  // One traced prefill of ph.length(b) new tokens of every sequence b (one packed forward for the
  // batch); `record`: a TTFT step (else the setup of a cache for `ctxpar prefill`, turn -1, no
  // TTFT). cp_algo=auto chooses per sequence (pass-KV and pass-Q sequences then run as two packed
  // forwards); the log and /infer/calls show the batch's mean T and P, the prediction on them and
  // the share of sequences on pass-Q; /infer/call_lengths every sequence's T, P, algorithm, TTFT,
  // predictions and the paper's verdicts.
  std::vector<int32_t> prefill(int64_t turn, const SchedulePhase& ph, bool record) {
    const int64_t B = cfg_.batch;
    std::vector<std::vector<int32_t>> tok(static_cast<size_t>(B));
    std::vector<int32_t> q_algo(static_cast<size_t>(B));  // 1: pass-Q (an int32 to broadcast)
    std::vector<Prediction> own(static_cast<size_t>(B));    // each sequence's prediction and the paper's rules
    int64_t T_sum = 0, cached_sum = 0;
    double flops = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t T = ph.length(b), cached = engine_->cache().seq_len(b);
      // Replica d (dp) serves its own stream: sequences d * batch + b.
      const int64_t id = topo_.coord(Axis::dp) * B + b;
      for (int64_t i = 0; i < T; ++i) tok[size_t(b)].push_back(prompt_token(uint64_t(cfg_.seed), id, cached + i, V()));
      T_sum += T;
      cached_sum += cached;
      flops += engine_->prefill_flops(T, cached);
      q_algo[size_t(b)] = choose(std::max<int64_t>(T, 1), cached, own[size_t(b)]) == CpAlgo::pass_q;
    }
    // One decision for the whole job: a measured profile differs between CP groups (tp slices, dp
    // replicas), and the tp slices of a sequence must run the same forwards; world rank 0 decides.
    topo_.world().broadcast(std::span<int32_t>(q_algo), 0);
    std::vector<CpAlgo> algos(static_cast<size_t>(B));
    int64_t q_seqs = 0;
    std::vector<double> seq_row;  // per sequence: the columns of /infer/call_lengths but its TTFT (below)
    for (int64_t b = 0; b < B; ++b) {
      algos[size_t(b)] = q_algo[size_t(b)] ? CpAlgo::pass_q : CpAlgo::pass_kv;
      q_seqs += q_algo[size_t(b)];
      const Prediction& p = own[size_t(b)];
      seq_row.insert(seq_row.end(), {double(ph.length(b)), double(engine_->cache().seq_len(b)), double(q_algo[size_t(b)]),
                                     0.0, p.pass_kv_s, p.pass_q_s, p.eq1_pass_kv ? 1.0 : 0.0, p.eq5_pass_q ? 1.0 : 0.0,
                                     p.fitted_pass_kv ? 1.0 : 0.0});
    }
    const int64_t T = (T_sum + B / 2) / B, cached = (cached_sum + B / 2) / B;  // the batch's means
    Prediction pred;
    const CpAlgo algo = choose(std::max<int64_t>(T, 1), cached, pred);
    const double q_share = double(q_seqs) / double(B);
    const std::string algo_text = q_seqs == 0 ? "pass_kv" : q_seqs == B ? "pass_q" : "mixed";
    CallStats st;
    double dt = 0;
    StepOutput out = timed_step([&] { return engine_->prefill(tok, algos, &tr_, st, cfg_.save_logits); }, dt);
    st.cp.settle();  // GPU: the device waits, timed by their events
    check_call(out);
    audit(st, dt, 0);
    if (cfg_.save_logits) keep_logits(out, tok);
    finish_step(turn, record ? StepKind::prefill : StepKind::setup, T, cached, algo_text.c_str(), dt, T_sum, flops, st);
    if (record) {
      // Each sequence's TTFT: when its forward ended on the job's slowest rank.
      topo_.world().all_reduce(std::span<double>(out.ready_s), ReduceOp::max);
      for (int64_t b = 0; b < B; ++b) seq_row[size_t(b) * kSeqColumns + 3] = out.ready_s[size_t(b)];
      call_lengths_.insert(call_lengths_.end(), seq_row.begin(), seq_row.end());
      calls_.push_back({turn, T, cached, algo, q_share, pred, dt});
    }
    return out.next_tokens;
  }

  std::vector<int32_t> decode(int64_t turn, const std::vector<int32_t>& last) {
    const int64_t B = cfg_.batch;
    int64_t ctx_sum = 0;
    double flops = 0;
    for (int64_t b = 0; b < B; ++b) {
      ctx_sum += engine_->cache().seq_len(b);
      flops += engine_->decode_flops(engine_->cache().seq_len(b));
    }
    const DecodeAlgo algo = cfg_.decode_algo == DecodeAlgo::allgather ? DecodeAlgo::allgather : DecodeAlgo::pass_q;
    CallStats st;
    double dt = 0;
    StepOutput out = timed_step([&] { return engine_->decode(last, algo, &tr_, st, cfg_.save_logits); }, dt);
    st.cp.settle();
    check_call(out);
    audit(st, dt, 1);
    if (cfg_.save_logits) {
      std::vector<std::vector<int32_t>> fed(last.size());
      for (size_t b = 0; b < last.size(); ++b) fed[b] = {last[b]};
      keep_logits(out, fed);
    }
    finish_step(turn, StepKind::decode, 1, (ctx_sum + B / 2) / B, name_of(algo), dt, B, flops, st);
    return out.next_tokens;
  }

  bool stop() const { return stop_; }

  // /generated [turn, step, dp * batch] (every replica's sequences, replica-major; -1 where a turn
  // has fewer steps), /infer/calls, cache bytes (this rank's replica).
  void write_outputs(const std::vector<std::vector<std::vector<int32_t>>>& gen) {
    const int64_t B = cfg_.batch, DP = topo_.size(Axis::dp);
    size_t steps = 0;
    for (const auto& t : gen) steps = std::max(steps, t.size());
    std::vector<int32_t> g(gen.size() * steps * size_t(B), -1);
    for (size_t t = 0; t < gen.size(); ++t)
      for (size_t s = 0; s < gen[t].size(); ++s)
        for (int64_t b = 0; b < B; ++b) g[(t * steps + s) * size_t(B) + size_t(b)] = gen[t][s][size_t(b)];
    if (DP > 1) {  // [replica][turn, step, b] -> [turn, step, replica * B + b]
      std::vector<int32_t> all(g.size() * size_t(DP));
      topo_.axis(Axis::dp).all_gather(std::span<const int32_t>(g), std::span<int32_t>(all));
      g.assign(all.size(), -1);
      for (int64_t d = 0; d < DP; ++d)
        for (size_t ts = 0; ts < gen.size() * steps; ++ts)
          for (int64_t b = 0; b < B; ++b)
            g[ts * size_t(DP * B) + size_t(d * B + b)] = all[size_t(d) * gen.size() * steps * size_t(B) + ts * size_t(B) + size_t(b)];
    }
    if (!g.empty()) tr_.write_dataset("/generated", g, {uint64_t(gen.size()), uint64_t(steps), uint64_t(DP * B)});
    std::vector<double> c;
    for (const PrefillCall& k : calls_) {
      const double row[] = {double(k.turn), double(k.T), double(k.cached), k.q_share,
                            k.pred.pass_kv_s, k.pred.pass_q_s,
                            k.pred.choice == CpAlgo::pass_q ? 1.0 : 0.0, k.pred.eq1_pass_kv ? 1.0 : 0.0,
                            k.pred.eq5_pass_q ? 1.0 : 0.0, k.pred.fitted_pass_kv ? 1.0 : 0.0, k.ttft_s};
      c.insert(c.end(), std::begin(row), std::end(row));
    }
    if (!calls_.empty()) {
      tr_.write_dataset("/infer/call_lengths", call_lengths_, {uint64_t(calls_.size()), uint64_t(B), kSeqColumns});
      tr_.write_attr("/infer/call_lengths", "columns",
                     std::string("T,P,algo(0=pass_kv;1=pass_q),ttft_s,pred_pass_kv_s,pred_pass_q_s,eq1_pass_kv,"
                                 "eq5_pass_q,fitted_pass_kv"));
      tr_.write_dataset("/infer/calls", c, {uint64_t(calls_.size()), 11});
      tr_.write_attr("/infer/calls", "columns",
                     std::string("turn,T,P,algo(0=pass_kv;1=pass_q),pred_pass_kv_s,pred_pass_q_s,"
                                 "model_choice(1=pass_q),eq1_pass_kv,eq5_pass_q,fitted_pass_kv,ttft_s"));
    }
    if (cfg_.save_logits && !logits_.empty()) {  // this replica's (dp coordinate 0 on the trace's rank)
      const uint64_t calls = logits_.size() / size_t(B * V());
      tr_.write_dataset("/infer/logits", std::vector<double>(logits_.begin(), logits_.end()), {calls, uint64_t(B), uint64_t(V())});
      size_t len = 0;
      for (const auto& f : fed_) len = std::max(len, f.size());
      std::vector<int32_t> t(size_t(B) * len, -1);
      for (size_t b = 0; b < fed_.size(); ++b) std::copy(fed_[b].begin(), fed_[b].end(), t.begin() + b * len);
      if (len > 0) tr_.write_dataset("/infer/tokens", t, {uint64_t(B), uint64_t(len)});
      tr_.write_dataset("/infer/context", context_, {calls, uint64_t(B)});
    }
    if (!cache_bytes_.empty())
      tr_.write_dataset("/infer/cache_bytes", cache_bytes_,
                        {uint64_t(cache_bytes_.size() / size_t(cp_.size())), uint64_t(cp_.size())});
  }

  // Log lines of the prefill decisions (rank 0): the batch's mean T and P, and with sequences of
  // different lengths a line per sequence (cp_algo=auto chose per sequence).
  void log_calls() const {
    const int64_t B = cfg_.batch;
    for (size_t c = 0; c < calls_.size(); ++c) {
      const PrefillCall& k = calls_[c];
      char ran[64];
      if (k.q_share == 0 || k.q_share == 1) std::snprintf(ran, sizeof ran, "%s", k.q_share == 1 ? "pass_q" : "pass_kv");
      else std::snprintf(ran, sizeof ran, "mixed (%.0f%% of the sequences pass_q)", 100 * k.q_share);
      log0("# turn %lld prefill T=%lld P=%lld (miss %.4f): %s; predicted pass_kv %.3f ms, pass_q %.3f ms (%s); "
           "Yang et al., \"Context Parallelism for Scalable Million-Token Inference\" (MLSys 2025): Eq. 1 %s, "
           "Eq. 5 %s, App. D %s\n",
           (long long)k.turn, (long long)k.T, (long long)k.cached, double(k.T) / double(k.T + k.cached), ran,
           k.pred.pass_kv_s * 1e3, k.pred.pass_q_s * 1e3, choice_text(k.pred).c_str(), k.pred.eq1_pass_kv ? "pass_kv" : "pass_q",
           k.pred.eq5_pass_q ? "pass_q" : "pass_kv", k.pred.fitted_pass_kv ? "pass_kv" : "pass_q");
      const double* rows = call_lengths_.data() + c * size_t(B) * kSeqColumns;
      bool same = true;
      for (int64_t b = 1; b < B; ++b)
        same = same && rows[b * kSeqColumns] == rows[0] && rows[b * kSeqColumns + 1] == rows[1];
      if (same) continue;
      for (int64_t b = 0; b < B; ++b) {
        const double* x = rows + b * kSeqColumns;
        log0("#   sequence %lld: T=%.0f P=%.0f: %s, TTFT %.3f ms; predicted pass_kv %.3f ms, pass_q %.3f ms; Yang et al. "
             "Eq. 1 %s, Eq. 5 %s, App. D %s\n",
             (long long)b, x[0], x[1], x[2] != 0 ? "pass_q" : "pass_kv", x[3] * 1e3, x[4] * 1e3, x[5] * 1e3,
             x[6] != 0 ? "pass_kv" : "pass_q", x[7] != 0 ? "pass_q" : "pass_kv", x[8] != 0 ? "pass_kv" : "pass_q");
      }
    }
  }

  std::vector<double> ttft, ttit;

  // The audit's summary line and trace attributes (rank 0's timings): its time per call against
  // the call's, for prefill and decode calls apart (medians).
  void log_audit() const {
    std::string text;
    const char* kinds[2] = {"prefill", "decode"};
    for (int k = 0; k < 2; ++k) {
      if (audit_s_[k].empty()) continue;
      std::vector<double> share;
      for (size_t i = 0; i < audit_s_[k].size(); ++i) share.push_back(audit_s_[k][i] / call_s_[k][i]);
      char b[160];
      std::snprintf(b, sizeof b, "%s%s calls %.3f ms (%.3f %% of the call)", text.empty() ? "" : "; ", kinds[k],
                    median(audit_s_[k]) * 1e3, 100 * median(share));
      text += b;
      tr_.write_attr("/", std::string("coverage_audit_s_per_") + kinds[k], median(audit_s_[k]));
      tr_.write_attr("/", std::string("coverage_audit_share_of_") + kinds[k], median(share));
    }
    if (text.empty()) return;  // no call was made (a stop before the first)
    tr_.write_attr("/", "coverage_audit", std::string("passed every call"));
    log0("# coverage audit: passed every call; the check per call, median over calls (rank 0): %s\n", text.c_str());
  }

 private:
  // Opens the trace step and runs one prefill or decode call between a barrier and the slowest
  // rank's finish; dt = that wall time (max over the CP group).
  // Every replica's call at once: the step time is the slowest rank's of the whole job.
  template <class Call> StepOutput timed_step(Call&& call, double& dt) {
    Comm& world = topo_.world();
    tr_.begin_step(step_);
    world.barrier();
    const double t0 = world.now();
    StepOutput out = call();
    dt = world.now() - t0;
    world.all_reduce(std::span<double>(&dt, 1), ReduceOp::max);
    return out;
  }

  // A prefill (a TTFT step), the setup of a cache for `ctxpar prefill` (no TTFT), a decode (TTIT).
  enum class StepKind { prefill, setup, decode };
  void finish_step(int64_t turn, StepKind kind, int64_t T, int64_t cached, const char* algo, double dt, int64_t tokens,
                   double flops, const CallStats& st) {
    const bool setup = kind == StepKind::setup, is_prefill = kind == StepKind::prefill;
    const char* kind_name = is_prefill ? "prefill" : setup ? "setup" : "decode";
    // The whole job: every dp replica runs the same schedule on its own sequences.
    const int64_t DP = topo_.size(Axis::dp);
    tokens *= DP;
    flops *= double(DP);
    StepRecord rec;
    rec.step = step_;
    rec.time_s = dt;
    rec.tokens = tokens;
    rec.model_flops = flops;
    rec.exposed_comm_s = st.cp.exposed_comm_s;
    rec.peak_bytes = mem_peak_bytes();
    rec.turn = int32_t(turn);
    if (!setup) {
      (is_prefill ? rec.ttft_s : rec.ttit_s) = dt;
      (is_prefill ? ttft : ttit).push_back(dt);
    }
    stop_ = tr_.end_step(rec) || stop_;
    double exposed = st.cp.exposed_comm_s, mine = engine_->cache().used_bytes();
    cp_.all_reduce(std::span<double>(&exposed, 1), ReduceOp::max);
    std::vector<double> all(size_t(cp_.size()));
    cp_.all_gather(std::span<const double>(&mine, 1), std::span<double>(all));
    cache_bytes_.insert(cache_bytes_.end(), all.begin(), all.end());
    const double mx = *std::max_element(all.begin(), all.end());
    log0("  %5lld %4lld  %-7s %6lld %8lld  %-8s %9.2f  %10.1f  %12.4f  %10.2f  %14.2f\n", (long long)step_,
         (long long)turn, kind_name, (long long)T, (long long)cached, algo, dt * 1e3, double(tokens) / dt,
         flops / dt / topo_.world().size() / 1e12, exposed * 1e3, mx / (1 << 20));
    ++step_;
  }

  // save_logits: the call's last-position logits of every sequence and the tokens it fed.
  // Every rank alike (collective): a call whose logits are not finite (weights whose products
  // overflow fp32) ends the run, exit 3, before a token chosen from them or the logits are used
  // or written.
  void check_call(const StepOutput& out) {
    std::string bad;
    if (!out.logits.empty())  // save_logits: the first bad value, with its index
      if (const std::string at = first_non_finite(out.logits.data(), {cfg_.batch, int64_t(out.logits.size()) / cfg_.batch});
          !at.empty())
        bad = "the logits have " + at + " ([sequence, vocab])";
    for (size_t b = 0; b < out.next_tokens.size() && bad.empty(); ++b)
      if (out.next_tokens[b] == kNonFiniteLogits) bad = "sequence " + std::to_string(b) + "'s logits are not finite";
    bad = agree_on_error(topo_.world(), bad);
    if (!bad.empty())
      throw RunFailed("call " + std::to_string(step_) + ": " + bad + ", from finite inputs and weights (a product " +
                      "overflowed fp32); no token chosen from them" + (cfg_.save_logits ? ", /infer/logits not written" : ""));
  }

  // The coverage audit of a call (Engine::audit: model/coverage.hpp's rule of a training step,
  // over the layers at once): every attention call counts the visible (query, key) pairs x heads
  // it computed; summed over the CP and tp ranks they must equal what the new tokens see. A
  // schedule that drops or repeats keys ends the run (exit 3), naming the call. `dt`: the call's
  // time, `kind`: 0 prefill, 1 decode (the check's own time is recorded against it).
  void audit(const CallStats& st, double dt, int kind) {
    const double t0 = topo_.world().now();
    std::string bad = engine_->audit(st);
    if (!bad.empty()) bad = "call " + std::to_string(step_) + ": " + bad;
    bad = agree_on_error(topo_.world(), bad);
    if (!bad.empty()) throw RunFailed(bad);
    audit_s_[kind].push_back(topo_.world().now() - t0);
    call_s_[kind].push_back(dt);
  }

  void keep_logits(const StepOutput& out, const std::vector<std::vector<int32_t>>& fed) {
    logits_.insert(logits_.end(), out.logits.begin(), out.logits.end());
    for (int64_t b = 0; b < cfg_.batch; ++b) context_.push_back(int32_t(engine_->cache().seq_len(b)));
    fed_.resize(fed.size());
    for (size_t b = 0; b < fed.size(); ++b) fed_[b].insert(fed_[b].end(), fed[b].begin(), fed[b].end());
  }

  const Config& cfg_;
  Topology& topo_;
  Tracer& tr_;
  Comm& cp_;
  std::vector<float> logits_;              // save_logits: [call][b][V]
  std::vector<std::vector<int32_t>> fed_;  // save_logits: every token each sequence was fed
  std::vector<int32_t> context_;           // save_logits: [call][b] context length after the call
  ParamLayout layout_;
  Buffer<float> params_;
  std::unique_ptr<Numerics> num_;  // plain, or exact
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<PrefillCostModel> cost_;
  std::vector<PrefillCall> calls_;
  std::vector<double> audit_s_[2], call_s_[2];  // the coverage audit's time and its call's: prefill, decode
  // [call][b][kSeqColumns]: every sequence's T, P, algorithm, TTFT, predictions and the paper's rules
  static constexpr uint64_t kSeqColumns = 9;
  std::vector<double> call_lengths_;
  std::vector<double> cache_bytes_;
  int64_t step_ = 0;
  bool stop_ = false;
};


}  // namespace

std::string validate_infer_mode(const Config& cfg, Topology& topo) {
  if (cfg.mode == Mode::bench && topo.size(Axis::dp) != 1)
    return "config: mesh = '" + cfg.mesh + "': bench infer forms its own dp replicas (its decode table); valid: tp, "
           "ring and/or ulysses axes (e.g. mesh=ring:" + s_(topo.world().size()) + ")";
  const int tp = topo.size(Axis::tp);
  std::string err = validate_model_shape(cfg, tp, true);
  if (!err.empty()) return err;
  if (cfg.attention == "mla" && cfg.cp_algo == CpAlgoSetting::automatic && hardware_name(cfg, HardwareUse::live_choice) != "measured")
    return "config: attention = mla with cp_algo = auto and hardware = " + cfg.hardware + ": the cost model prices " +
           "MLA's absorbed inference from this job's measured rates only; valid: hardware=auto (the default) or measured, or " +
           "cp_algo=pass_kv / pass_q";
  if (cfg.device == Device::cuda && cfg.layer_pattern.find('D') != std::string::npos)
    return "config: layer_pattern = '" + cfg.layer_pattern + "' with device = cuda: Gated DeltaNet (D) layers run on " +
           "the CPU only so far; valid: device=cpu, or a pattern of G and L layers";
  if (cfg.mode == Mode::bench && cfg.layer_pattern.find('D') != std::string::npos)
    return "config: layer_pattern = '" + cfg.layer_pattern + "': bench infer repeats its calls on a saved KV cache, " +
           "which does not save the Gated DeltaNet layers' states yet; valid: layer_pattern=G (prefill, decode and " +
           "chat serve D layers)";
  if (hardware_name(cfg, HardwareUse::live_choice) != "measured") {
    try {
      (void)load_hardware(cfg.hardware);
    } catch (const UsageError& e) {
      return "config: hardware = '" + cfg.hardware + "': " + e.what() + " (or hardware=measured)";
    }
  }
  if (cfg.exact) {
    err = check_exact_model(cfg, tp, /*block=*/0);
    if (!err.empty()) return err;
  }
  if (cfg.visible_keys) {  // the full prefill's visible-keys row
    err = schedule_refusal(cfg.strategy, CpSchedule::visible);
    if (!err.empty()) return err;
    if (cfg.cp_algo == CpAlgoSetting::pass_q)
      return "config: frugal = true moves only the visible rows in a full prefill by pass-KV, and with cp_algo = "
             "pass_q no prefill runs by pass-KV; valid: cp_algo=pass_kv or auto, or frugal=false";
  }
  if (cfg.placement == PlacementKind::balanced) {
    const std::string pre = "config: placement = balanced places a batch's full prefill by pass-KV";
    if (cfg.layer_pattern.find('D') != std::string::npos)
      return pre + ", and layer_pattern = '" + cfg.layer_pattern + "' holds Gated DeltaNet layers, whose state " +
             "passes along contiguous pieces of a sequence; valid: placement=zigzag, or a pattern of G and L layers";
    if (cfg.cp_algo != CpAlgoSetting::pass_kv)
      return pre + ", and cp_algo = " + name_of(cfg.cp_algo) + " may run it by pass-Q; valid: cp_algo=pass_kv, or " +
             "placement=zigzag";
  }
  if (cfg.mask != MaskKind::causal || packed_docs(cfg))
    return "config: inference uses one causal document per sequence; valid: mask=causal, docs=none";
  const int N = topo.cp().size();
  std::vector<SchedulePhase> sched;
  if (cfg.mode == Mode::prefill) {
    if (cfg.cached > 0 && cfg.miss_rate != 1)
      return "config: cached = " + s_(cfg.cached) + " and miss_rate = " + std::to_string(cfg.miss_rate) +
             " both set; valid: one of them";
    if (cfg.cached > 0 && cfg.cached >= cfg.seq)
      return "config: cached = " + s_(cfg.cached) + ": needs 0 < cached < seq = " + s_(cfg.seq) +
             " (the partial prefill's new tokens are seq - cached)";
  }
  err = mode_schedule(cfg, N, sched);
  if (!err.empty()) return err;
  for (const SchedulePhase& ph : sched)
    if (!ph.lengths.empty() && int64_t(ph.lengths.size()) != cfg.batch)
      return "config: schedule = '" + cfg.schedule + "': a prefill with " + s_(int64_t(ph.lengths.size())) +
             " lengths for batch = " + s_(cfg.batch) + "; valid: one length per sequence (batch = " +
             s_(int64_t(ph.lengths.size())) + "), or one length for all";
  // The full prefill's CP strategy (first prefill of the schedule).
  std::unique_ptr<CpStrategy> strat = make_strategy(cfg.strategy, topo);
  if (!strat) return std::string("config: strategy = '") + cfg.strategy + "' is not built into this binary";
  const ModelDims dt = model_dims(cfg, tp, 0);  // the attention call of one tp rank (MLA: multi-query over the latent)
  err = strat->validate(attn_problem(sched.front().count, dt.H_q_loc(), dt.cache_heads(), dt.cache_dim(), MaskKind::causal, 0),
                        topo);
  if (!err.empty())
    return tp > 1 ? err + " (with tp:" + s_(tp) + ", each tp rank attends with heads/tp = " + s_(dt.H_q_loc()) +
                        " query and " + s_(dt.cache_heads()) + " K/V heads)"
                  : err;
  if (!cfg.resume.empty()) {
    const ParamLayout layout(model_dims(cfg, 1, 0));
    err = check_checkpoint(cfg.resume, cfg, layout);
    if (!err.empty()) return err;
  }
  return "";
}

std::string scan_infer_inputs(const Config& cfg, Topology& topo) {
  if (cfg.resume.empty()) return "";
  return scan_checkpoint(cfg.resume, ParamLayout(model_dims(cfg, 1, 0)), topo.world().rank(), topo.world().size());
}

namespace {

// One engine's memory on the rank holding most (infer/engine.hpp): its KV cache and its
// activations, in bytes with fp32 cache elements (`cache_elem` = 2: the GPU's bf16 cache), and the
// cache's tokens there (every sequence's).
struct EnginePlan {
  double cache = 0, act = 0;
  int64_t rows = 0, batch = 1;
};
EnginePlan plan_engine(const ModelDims& d, const std::vector<SchedulePhase>& sched, int N, int64_t batch,
                       const std::vector<PlacementKind>& placements, double cache_elem, bool exact) {
  const double f = sizeof(float);
  EnginePlan e;
  e.batch = batch;
  // The KV cache: K and V of every attention layer for the batch (MLA: the latent rows once), and
  // positions (infer/kv_cache.hpp).
  // The cache serves every placement of `placements` (bench infer's batched engine switches them).
  const std::vector<std::vector<int64_t>> cap = cache_capacity(sched, N, batch, placements);
  e.rows = most_rank_tokens(cap);
  const double attn_layers = double(d.layers - d.gdn_layers());
  e.cache = double(e.rows) * ((d.mla ? 1.0 : 2.0) * cache_elem * attn_layers * double(d.cache_width()) + 8.0);
  // Hybrid models: per sequence and GDN layer its state and convolution tail (infer/gdn_infer.hpp),
  // on its owner (ceil(batch / N) sequences) or, replicated, every sequence on every rank.
  if (d.has_gdn()) {
    const double held = d.gdn_replicated ? double(batch) : double((batch + N - 1) / N);
    e.cache += held * double(d.gdn_layers()) * f *
               (double(d.gdn_H) * d.gdn_Dv * d.gdn_Dk + double(d.gdn_conv - 1) * double(d.gdn_conv_width()));
  }
  // One call's rows on this rank (infer/engine.cpp ensure_rows) and its logits row; the pass-KV
  // ring's transfer buffers (two blocks of K and V in flight).
  int64_t rows = 1;  // a prefill runs the whole batch as one forward (infer/engine.hpp)
  for (const SchedulePhase& ph : sched) {
    if (ph.kind != PhaseKind::prefill) continue;
    int64_t n = 0;
    for (int64_t b = 0; b < batch; ++b) n += Partition::padded_length(PartitionKind::zigzag, ph.length(b), N) / N;
    rows = std::max(rows, n);
  }
  e.act = f * double(rows) * double(3 * d.dim + 2 * d.q_width() + d.H_q + 4 * d.kv_width() + 3 * d.ffn + d.D) +
          f * double(d.vocab);
  // The CP algorithm's transfer buffers, the larger of the two (cp_algo=auto may take either):
  // pass-Q's two query blocks in flight, and the partial outputs and their lse of every rank's
  // block, sent and received (cp/query_ring.cpp: 2 + 2N (q_width + H_q) floats a row; measured at
  // 2 ranks, chat batch 4, prefill 8K: 25.5 MiB above the rest; at 4 ranks, batch 2, prefill 4K
  // then 1K: the 6 of 2 ranks left the plan 2.6 MiB short); pass-KV's K and V blocks in flight (at
  // most 3 kv_width a row).
  e.act += f * double(rows) * double(std::max((2 + 2 * int64_t(N)) * (d.q_width() + d.H_q), 3 * d.kv_width()));
  // A later pass-KV prefill sends ring blocks of each sequence's cached and new rows, padded to the
  // rank holding most of it (placement = balanced: a prompt kept whole on one rank, its whole
  // length), and with several sequences (or a cache placed unevenly) packs them into keys
  // (engine.cpp kp, vp): at most the cache's capacity of each sequence on the rank holding most of
  // it, 2 + 3 K/V rows of cache elements per such token.
  bool later_prefill = false;
  for (size_t i = 1; i < sched.size(); ++i) later_prefill |= sched[i].kind == PhaseKind::prefill;
  if (later_prefill) {
    double keys = 0;
    for (int64_t b = 0; b < batch; ++b) {
      int64_t most = 0;
      for (const std::vector<int64_t>& on_rank : cap) most = std::max(most, on_rank[size_t(b)]);
      keys += double(most);
    }
    e.act += cache_elem * keys * 5.0 * double(d.kv_width());
  }
  if (d.has_gdn())  // each OpenMP thread's scratch of the prefill's recurrence
    e.act += f * omp_get_max_threads() * double(gdn_thread_scratch_bound(rows, d.gdn_Dk, d.gdn_Dv, d.gdn_chunk, false));
  if (d.mla)  // the absorbed queries and outputs, the latents and their scratch
    e.act += f * double(rows) * 2.0 * double(d.H_q_loc()) * d.cache_dim() + mla_acts_bytes(d, rows) +
             mla_scratch_bytes(d, rows);
  if (exact) {  // the exact inference schedule (Engine::use_numerics): the group's rows (Q and a decode
    // step's new K/V, gathered), their maxima and exact sums (two int64 per head and value
    // element, and the weight); the tp sums' integers and part (model/layer.hpp layer_tp_sum)
    const double all = double(N) * double(rows);
    e.act += all * (f * double(d.q_width() + 2 * d.kv_width()) + 12.0 + f * d.H_q_loc() +
                    16.0 * double(d.H_q_loc()) * double(d.D + 1)) +
             (exact_tp_units(d) > 1 ? 20.0 * double(rows) * double(d.dim) : 0.0);
  }
  return e;
}

// The engines a run holds one at a time: the mode's, or bench infer's (bench/bench_infer.cpp):
// its miss-rate and length tables' (batch 1 on the job's CP ranks), its decode table's CP = 1
// replica (the whole context of `batch` sequences on every rank) and its batched table's (four
// prompts of seq/8 .. seq, then the long tail: one engine each, its cache serving its zigzag and,
// where the table places, its placed modes). Empty on a schedule error (validated before).
struct EngineShape {
  std::vector<SchedulePhase> sched;
  int N;  // CP ranks it spans
  int64_t batch;
  std::vector<PlacementKind> placements = {PlacementKind::zigzag};  // of its first prefill, each call's
};
std::vector<EngineShape> run_engines(const Config& cfg, int N) {
  std::vector<SchedulePhase> sched;
  if (cfg.mode != Mode::bench) {
    if (!mode_schedule(cfg, N, sched).empty()) return {};
    return {{sched, N, cfg.batch, {cfg.placement}}};
  }
  const int64_t S = cfg.seq;
  std::vector<EngineShape> shapes = {{{{PhaseKind::prefill, S}}, N, 1},
                                     {{{PhaseKind::prefill, S}, {PhaseKind::decode, cfg.bench_iters + 1}}, 1, cfg.batch}};
  std::vector<PlacementKind> batched = {PlacementKind::zigzag};
  if (bench_infer_places(cfg)) batched.push_back(PlacementKind::balanced);  // the table's placed mode
  for (const std::vector<int64_t>& l : {bench_infer_lengths(S), bench_infer_tail_lengths(S)})
    shapes.push_back({{{PhaseKind::prefill, *std::max_element(l.begin(), l.end()), l}}, N, int64_t(l.size()), batched});
  return shapes;
}

// The largest engine of the run (cache + activations) with `cache_elem` bytes per cache element;
// none on a schedule error.
std::optional<EnginePlan> largest_engine(const Config& cfg, const ModelDims& d, int N, double cache_elem) {
  const std::vector<EngineShape> shapes = run_engines(cfg, N);
  if (shapes.empty()) return std::nullopt;
  EnginePlan best;
  for (const EngineShape& s : shapes) {
    const EnginePlan e = plan_engine(d, s.sched, s.N, s.batch, s.placements, cache_elem, cfg.exact);
    if (e.cache + e.act > best.cache + best.act) best = e;
  }
  return best;
}

// fp32 copies of the weights the host holds: one, and while a checkpoint loads its AdamW moments
// beside it; bench infer keeps the job's weights beside its decode table's sub-mesh copy.
double host_weight_copies(const Config& cfg) { return cfg.mode == Mode::bench ? 2 : cfg.resume.empty() ? 1 : 3; }

}  // namespace

double plan_infer_memory(const Config& cfg, Topology& topo, std::string* parts) {
  const ModelDims d = model_dims(cfg, topo.size(Axis::tp), 0);  // this rank's slice (heads, ffn over tp)
  const std::optional<EnginePlan> plan = largest_engine(cfg, d, topo.cp().size(), sizeof(float));
  if (!plan) return 0;
  const EnginePlan& e = *plan;
  const double weights = sizeof(float) * double(ParamLayout(d).local_elems()) * host_weight_copies(cfg);
  // The start-up measurement of a measured profile runs before the engine is allocated.
  const double probe = cost_model_bytes(cfg, topo.cp().size(), topo.size(Axis::tp)).host;
  const double total = weights + std::max(e.cache + e.act, probe);
  if (parts)
    *parts = "weights " + fmt_bytes(weights) + ", KV cache " + fmt_bytes(e.cache) + " (" + s_(e.rows) + " tokens of " + s_(e.batch) +
             " sequences), activations " + fmt_bytes(e.act) +
             (probe > 0 ? ", or before them the links' and attention's start-up measurement " + fmt_bytes(probe) : "");
  return total;
}

double infer_memory(const Config& cfg, Topology& topo) { return plan_infer_memory(cfg, topo); }

double infer_host_memory_on_gpu(const Config& cfg, Topology& topo) {
  const double elems = double(ParamLayout(model_dims(cfg, topo.size(Axis::tp), 0)).local_elems());
  return 4.0 * elems * host_weight_copies(cfg);
}

double infer_device_memory(const Config& cfg, Topology& topo) {
  // The host plan's parts with the GPU's types: the weights in fp32 beside their bf16 copy (one
  // engine's at a time), the KV cache in bf16, the activations as planned plus the attention's bf16
  // q, k, v rows; the strategies' scratch is within the activations' margin of the host plan.
  const ModelDims d = model_dims(cfg, topo.size(Axis::tp), 0);
  const std::optional<EnginePlan> e = largest_engine(cfg, d, topo.cp().size(), 2.0);
  if (!e) return 0;
  const double probe = cost_model_bytes(cfg, topo.cp().size(), topo.size(Axis::tp)).device;  // before the engine
  return 6.0 * double(ParamLayout(d).local_elems()) + std::max(e->cache + 1.5 * e->act, probe);
}

std::string infer_plan(const Config& cfg, Topology& topo) {
  std::string parts;
  const double total = plan_infer_memory(cfg, topo, &parts);
  return "memory estimate per rank: " + fmt_bytes(total) + " (" + parts + ")\n";
}

int run_infer(const Config& cfg, Topology& topo, Tracer& tracer) {
  const int N = topo.cp().size();
  std::vector<SchedulePhase> sched;
  mode_schedule(cfg, N, sched);  // validated before
  // device=cuda: this rank's GPU and device communicators before anything binds to topo's comms.
  const GpuRun gpu(cfg.device == Device::cuda ? &topo : nullptr, &tracer);
  gpu.log_inference();
  Session s(cfg, topo, tracer, sched, gpu.stream);
  std::vector<std::vector<std::vector<int32_t>>> gen;  // [turn][step][b]
  if (cfg.mode == Mode::prefill) {
    // Every step on a fresh cache: the setup prefill of P tokens (traced, turn -1), then the
    // measured prefill of T tokens (turn = step).
    for (int64_t step = 0; step < cfg.warmup + cfg.steps && !s.stop(); ++step) {
      s.engine().clear();
      if (sched.size() == 2) s.prefill(-1, sched[0], false);
      gen.push_back({s.prefill(step, sched.back(), true)});
    }
  } else {
    int64_t turn = -1;
    std::vector<int32_t> last;
    for (const SchedulePhase& ph : sched) {
      if (s.stop()) break;
      if (ph.kind == PhaseKind::prefill) {
        last = s.prefill(++turn, ph, true);
        gen.push_back({last});
        continue;
      }
      for (int64_t i = 0; i < ph.count && !s.stop(); ++i) {
        last = s.decode(turn, last);
        gen.back().push_back(last);
      }
    }
  }
  s.write_outputs(gen);
  s.log_calls();
  s.log_audit();
  // Summary: medians (prefill mode and decode mode skip their warmup steps).
  std::vector<double> ttft = s.ttft, ttit = s.ttit;
  if (cfg.mode == Mode::prefill && int64_t(ttft.size()) > cfg.warmup) ttft.erase(ttft.begin(), ttft.begin() + cfg.warmup);
  if (cfg.mode == Mode::decode && int64_t(ttit.size()) > cfg.warmup) ttit.erase(ttit.begin(), ttit.begin() + cfg.warmup);
  char ttit_text[64] = "";
  if (!ttit.empty()) std::snprintf(ttit_text, sizeof ttit_text, ", TTIT median %.3f ms", median(ttit) * 1e3);
  log0("\n# summary: %zu prefills, TTFT median %.2f ms; %zu decode steps%s (batch %lld%s)\n", ttft.size(),
       median(ttft) * 1e3, ttit.size(), ttit_text, (long long)cfg.batch,
       topo.size(Axis::dp) > 1 ? (" per replica, " + std::to_string(topo.size(Axis::dp)) + " dp replicas").c_str() : "");
  bool valid = true;
  for (const auto& t : gen)
    for (const auto& st : t)
      for (int32_t x : st) valid = valid && x >= 0 && x < cfg.vocab;
  log0("# %s: %s on %d CP ranks\n", valid ? "VALID" : "INVALID (token out of range)", name_of(cfg.mode), N);
  return valid ? 0 : 1;
}

}  // namespace ctxpar
