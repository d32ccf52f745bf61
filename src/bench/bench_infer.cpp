// `ctxpar bench infer`: inference with context parallelism on this machine, in the shape of the
// Meta CP paper's tables (measured here, not copied):
//   1. partial prefill TTFT of pass-KV and pass-Q over KV-cache miss rates at a fixed context
//      (Table 4): the cache of P = seq - T tokens is prefilled once per miss rate (ring), then
//      each variant's prefill of the T new tokens is timed bench_iters times on that cache
//      (rolled back in between); medians. Next to it the cost model's prediction of both and its
//      choice, and the crossover (first miss rate at which pass-KV is faster) measured and predicted;
//      the two variants alternate within each iteration, and a row counts as decided only where a
//      paired sign test over the iterations says which is faster (otherwise `tie`).
//   2. decode TTIT against CP size (Table 8): for every power-of-two CP size c dividing the job
//      (with the job's tp), the ranks form dp replicas of c-rank CP groups (all replicas run at once, so every
//      configuration uses the same cores), prefill `seq` tokens and decode warmup + bench_iters
//      steps with pass-Q and all-gather; medians.
//   3. batched variable-length prefill: four prompts of seq/8 .. seq tokens as one packed forward
//      against one forward per prompt (tokens/s, the same run).
//   4. full-prefill TTFT against length (seq/8 .. seq), pass-KV against pass-Q (run it with
//      mesh=tp:2,ring:2 for TP x CP).
//   5. with exact numerics: the exact schedule against the plain one per CP size (prefill,
//      decode TTIT, the slowdown), its logits bit-compared with the CP = 1 run's.
// Correctness column: prefill — both variants' last logits agree (scaled error <= 1e-4) and
// give the same greedy token; decode — every step fed the CP = 1 run's tokens (teacher forcing)
// gives its greedy tokens. With device=cuda (bf16 weights, activations and KV cache on the GPU, as
// `prefill`/`decode` run there) the logits agree within 3e-2 (the variants round different partial
// sums to bf16; a broken path differs by O(1)) and a differing token counts where the
// reference's top two logits are further apart than twice the logits' difference.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "core/config.hpp"
#include "core/log.hpp"
#include "core/random.hpp"
#include "core/stats.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "infer/engine.hpp"
#include "infer/schedule.hpp"
#include "model/numerics.hpp"
#include "model/flops.hpp"
#include "model/model.hpp"
#include "modes/device_run.hpp"
#include "ops.hpp"
#include "perf/prefill_choice.hpp"
#include "shard/partition.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

using namespace infer;

namespace {

// The coverage audit of the engine's call just made (Engine::audit): a schedule that dropped or
// repeated keys ends the bench (exit 3), every rank of `world` alike (every replica audits its
// call at the same point). Collective over `world`.
void audit_call(Engine& eng, const CallStats& cs, Comm& world) {
  const std::string bad = agree_on_error(world, eng.audit(cs));
  if (!bad.empty()) throw RunFailed("bench infer: " + bad);
}

double med(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int32_t token_at(uint64_t seed, int64_t p, int64_t V) {
  return int32_t(splitmix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(p) * 0x2545f4914f6cdd1dull) % uint64_t(V));
}

// Times fn() on every rank after a barrier of `c`; returns the maximum over `all` (seconds).
template <class F> double timed(Comm& c, Comm& all, F&& fn) {
  all.barrier();
  const double t0 = c.now();
  fn();
  double dt = c.now() - t0;
  all.all_reduce(std::span<double>(&dt, 1), ReduceOp::max);
  return dt;
}

// The check of one position's result against a reference (see the header): on the CPU logits within
// 1e-4 of max(1, max |ref|) and the same greedy token; on a GPU within 3e-2, and a differing token
// counts only where the reference's top two logits are further apart than twice the logits' error.
struct Check {
  bool gpu = false;
  // 1 when the rows of V logits (and their greedy tokens) disagree, else 0.
  int operator()(const float* ref, const float* other, int64_t V, int32_t ref_tok, int32_t other_tok) const {
    double err = 0, scale = 1;
    float top[2] = {-INFINITY, -INFINITY};
    for (int64_t j = 0; j < V; ++j) {
      err = std::max(err, double(std::abs(ref[j] - other[j])));
      scale = std::max(scale, double(std::abs(ref[j])));
      if (ref[j] > top[0]) top[1] = top[0], top[0] = ref[j];
      else if (ref[j] > top[1]) top[1] = ref[j];
    }
    if (err / scale > (gpu ? 3e-2 : 1e-4) || !std::isfinite(err)) return 1;
    return ref_tok != other_tok && (!gpu || double(top[0]) - top[1] > 2 * err);
  }
  std::string note() const {
    return gpu ? " (GPU, bf16: logits beyond 3e-2 of max(1, max|ref|), or a token where the reference's top two logits "
                 "are more than twice the logits' difference apart)"
               : " (logits beyond 1e-4 of max(1, max|ref|), or any token)";
  }
};

// Paired two-sided sign test over the alternating samples (kv[i], q[i]): 1 when pass-KV is faster,
// 0 when pass-Q is, -1 (tie) when the signs do not decide at the 10% level (with 5 pairs that
// takes all 5 alike; with 7, all 7; with 10, 9 of 10; with 21, 15 of 21).
int faster_by_sign_test(const std::vector<double>& kv, const std::vector<double>& q) {
  const int n = int(std::min(kv.size(), q.size()));
  int kv_wins = 0;
  for (int i = 0; i < n; ++i) kv_wins += kv[size_t(i)] < q[size_t(i)];
  if (sign_test_p(kv_wins, n) > 0.10) return -1;
  return 2 * kv_wins > n ? 1 : 0;
}

// The decode and exact tables' meshes: dp replicas of c-rank CP groups with the job's tp
// (all replicas run at once, so every configuration uses the same cores), and this rank's weight
// slice for its tp coordinate there (which depends on the mesh).
struct SubMesh {
  MeshSpec mesh;
  std::unique_ptr<Topology> topo;
  std::unique_ptr<ParamLayout> layout;
  Buffer<float> params;
};
SubMesh sub_mesh(const Config& cfg, Comm& world, int c, int tp) {
  SubMesh m;
  m.mesh.dp = world.size() / (c * tp);
  m.mesh.tp = tp;
  m.mesh.ring = c;
  m.topo = Topology::create(world, m.mesh);
  m.layout = std::make_unique<ParamLayout>(model_dims(cfg, tp, m.topo->coord(Axis::tp)));
  m.params = Buffer<float>(size_t(m.layout->local_elems()));
  m.layout->init(uint64_t(cfg.seed), m.params.data());
  return m;
}

// ---- 5. exact numerics: the exact schedule against the plain one, per CP size ---------------
// For every CP size c of table 2: a full prefill of the `seq` tokens and bench_iters + 1 decode
// steps, each fed the CP = 1 exact run's tokens, by the plain schedule (pass-KV, pass-Q decode) and
// by the exact one (Engine::use_numerics: pass_q's row of the exact schedule), alternating. The exact prefill is
// slow (an exact add per query, key, head and value element): min(bench_iters, 3) timed prefills
// after one untimed. Correctness: every exact logit row (the prefill's last, each step's) has the
// bits of the CP = 1 exact run's, and each plain row agrees with its exact one within `check`.
// Returns the rows that failed (the same on every rank).
int exact_table(BenchContext& ctx, const Check& check, const std::vector<int32_t>& tokens) {
  const Config& cfg = ctx.cfg;
  Comm& world = ctx.topo.world();
  const int tp = ctx.topo.size(Axis::tp);
  const int64_t S = cfg.seq, V = cfg.vocab, iters = cfg.bench_iters, pre_iters = std::min<int64_t>(iters, 3);
  Table t(std::string("ctxpar bench infer — ") + (schedule_key(cfg.cp_schedule()) + "=true") + ": the exact schedule against the plain one, context " +
                   std::to_string(S) + ", batch 1" + (tp > 1 ? ", every CP group x tp:" + std::to_string(tp) : std::string()),
               {{"cp", "CP", "ranks", 6, 0}, {"replicas", "replicas", "dp", 9, 0}, {"prefill_ms", "prefill", "ms", 10, 2},
                {"prefill_det_ms", "prefill:det", "ms", 12, 2}, {"prefill_x", "slower", "x", 7, 1},
                {"ttit_ms", "TTIT", "ms", 9, 3}, {"ttit_det_ms", "TTIT:det", "ms", 9, 3}, {"ttit_x", "slower", "x", 7, 1},
                {"bits", "#bits", "", 6, 0}, {"wrong", "#wrong", "", 7, 0}},
               {"prefill: median of " + std::to_string(pre_iters) + " full prefills of seq tokens after 1 warmup (plain: "
                "pass-KV; :det: the exact schedule, whatever cp_algo says); TTIT: median of bench_iters decode steps "
                "after 1 warmup (plain: pass-Q), each fed the CP = 1 exact run's tokens; plain and exact alternate; "
                "max over all ranks",
                "#bits: exact logit rows (the prefill's last, every decode step's) whose bits differ from the CP = 1 "
                "exact run's; #wrong: plain rows beyond the check's tolerance of the exact ones" + check.note()});
  std::vector<std::vector<float>> ref;  // the CP = 1 exact run's rows: the prefill's, then each step's
  std::vector<int32_t> ref_tok;         // and its greedy tokens
  int failed = 0;
  for (int c = 1; c * tp <= world.size(); c *= 2) {
    if (ctx.tracer.stop_signal() != 0) break;
    if (world.size() % (c * tp) != 0) continue;
    SubMesh m = sub_mesh(cfg, world, c, tp);
    Comm& ccp = m.topo->cp();
    const std::vector<SchedulePhase> sched = {{PhaseKind::prefill, S}, {PhaseKind::decode, iters + 1}};
    const std::vector<std::vector<int64_t>> cap = cache_capacity(sched, c);
    const char* full = prefill_row(CpAlgoSetting::pass_kv).name;
    Engine plain(*m.layout, m.params.data(), *m.topo, cap, full, Device::cpu, nullptr);
    Engine exact(*m.layout, m.params.data(), *m.topo, cap, full, Device::cpu, nullptr);
    ExactNumerics exact_sums(m.layout->dims(), /*grad_elems=*/0, /*block=*/1);
    exact.use_numerics(exact_sums, cfg.cp_schedule());
    Engine* eng[2] = {&plain, &exact};
    std::vector<double> ts[2][2];  // [prefill, decode][plain, exact]
    std::vector<std::vector<float>> rows;
    std::vector<int32_t> toks;
    int wrong = 0;
    StepOutput out[2];
    for (int64_t it = 0; it < pre_iters + 1; ++it)
      for (int k = 0; k < 2; ++k) {
        eng[k]->clear();
        CallStats cs;
        const double dt = timed(ccp, world, [&] { out[k] = eng[k]->prefill({tokens}, CpAlgo::pass_kv, nullptr, cs, true); });
        audit_call(*eng[k], cs, world);
        if (it > 0) ts[0][k].push_back(dt);
      }
    auto keep = [&] {  // the exact row, its token, and the plain row against it
      rows.push_back(out[1].logits);
      toks.push_back(out[1].next_tokens[0]);
      wrong += check(out[1].logits.data(), out[0].logits.data(), V, out[1].next_tokens[0], out[0].next_tokens[0]);
    };
    keep();
    const bool is_ref = ref.empty();
    for (int64_t it = 0; it < iters + 1; ++it) {
      const std::vector<int32_t> last = {is_ref ? toks.back() : ref_tok[size_t(it)]};
      for (int k = 0; k < 2; ++k) {
        CallStats cs;
        const double dt = timed(ccp, world, [&] { out[k] = eng[k]->decode(last, DecodeAlgo::pass_q, nullptr, cs, true); });
        audit_call(*eng[k], cs, world);
        if (it > 0) ts[1][k].push_back(dt);
      }
      keep();
    }
    if (is_ref) {
      ref = rows;
      ref_tok = toks;
    }
    int32_t bad[2] = {0, wrong};
    for (size_t i = 0; i < rows.size(); ++i)
      bad[0] += rows[i].size() != ref[i].size() ||
                std::memcmp(rows[i].data(), ref[i].data(), rows[i].size() * sizeof(float)) != 0;
    world.all_reduce(std::span<int32_t>(bad, 2), ReduceOp::max);  // every replica alike
    failed += bad[0] + bad[1];
    const double p[2] = {med(ts[0][0]), med(ts[0][1])}, d[2] = {med(ts[1][0]), med(ts[1][1])};
    t.add_row({std::to_string(c), std::to_string(m.mesh.dp), t.cell(2, p[0] * 1e3), t.cell(3, p[1] * 1e3),
               t.cell(4, p[1] / p[0]), t.cell(5, d[0] * 1e3), t.cell(6, d[1] * 1e3), t.cell(7, d[1] / d[0]),
               std::to_string(bad[0]), std::to_string(bad[1])});
  }
  if (world.rank() == 0) print_table(t, ctx);
  return failed;
}
// One pass-KV / pass-Q comparison: iters + 1 iterations (the first an untimed warmup), each
// prefilling `tokens` with pass-KV then pass-Q after `reset()` (a rolled-back or emptied cache),
// so that a slow spell of a shared machine lands on both alike. Every call is a trace step
// (`turn`); the timed ones go to ts[algo]; the last call's logits and greedy token to the rest.
struct PairRun {
  std::vector<double> ts[2];
  std::vector<float> logits[2];
  int32_t next[2] = {0, 0};
};
template <class Reset>
PairRun run_pair(BenchContext& ctx, Engine& eng, Comm& cp, const std::vector<int32_t>& tokens, int64_t cached, int32_t turn,
                 int64_t iters, int64_t& step, Reset&& reset) {
  PairRun r;
  const int64_t T = int64_t(tokens.size());
  for (int64_t it = 0; it < iters + 1; ++it) {
    for (CpAlgo a : {CpAlgo::pass_kv, CpAlgo::pass_q}) {
      reset();
      StepOutput out;
      ctx.tracer.begin_step(step);
      CallStats cs;
      const double dt = timed(cp, ctx.topo.world(), [&] { out = eng.prefill({tokens}, a, &ctx.tracer, cs, true); });
      cs.cp.settle();  // GPU: the device waits, timed by their events
      audit_call(eng, cs, ctx.topo.world());
      StepRecord rec;
      rec.step = step++;
      rec.time_s = dt;
      rec.tokens = T;
      rec.turn = turn;
      rec.ttft_s = dt;
      rec.exposed_comm_s = cs.cp.exposed_comm_s;
      rec.model_flops = eng.prefill_flops(T, cached);
      ctx.tracer.end_step(rec);
      if (it > 0) r.ts[int(a)].push_back(dt);
      r.logits[int(a)] = out.logits;
      r.next[int(a)] = out.next_tokens[0];
    }
  }
  return r;
}

// Table 1's KV-cache miss rates.
constexpr double kMisses[] = {0.01, 0.025, 0.05, 0.10, 0.20, 0.50, 1.0};

// What the tables of bench infer share: the job, the device, the check, this rank's weights, the
// cost model and the prompt; and what the tables accumulate (the trace step, the wrong results).
struct InferBench {
  BenchContext& ctx;
  const GpuRun& gpu;
  const Check& check;
  const ParamLayout& layout;
  const Buffer<float>& params;
  const PrefillCostModel& cost;
  const std::vector<int32_t>& seq_tokens;
  const Config& cfg = ctx.cfg;
  Topology& topo = ctx.topo;
  Comm& world = topo.world();
  Comm& cp = topo.cp();
  const bool on_gpu = cfg.device == Device::cuda;
  const int N = cp.size();
  const int64_t S = cfg.seq, V = cfg.vocab, iters = cfg.bench_iters;
  const int tp = topo.size(Axis::tp);
  int wrong_total = 0;
  int64_t step = 0;

  // ---- 1. pass-KV vs pass-Q over miss rates ----------------------------------------------------
  // Table 1: per miss rate both variants' partial prefill of the new tokens on the same cache,
  // the cost model's prediction and choice; then the crossover.
  void partial_prefill_table() {
    Table t1("ctxpar bench infer — partial prefill TTFT, pass-KV vs pass-Q (shape of Meta CP Table 4), " +
                      std::to_string(N) + " CP ranks" + (tp > 1 ? " x tp:" + std::to_string(tp) : std::string()) +
                      ", context " + std::to_string(S) + ", batch 1",
                  {{"miss_pct", "miss", "%", 7, 2}, {"T", "T", "new", 7, 0}, {"P", "P", "cached", 9, 0},
                   {"pass_kv_ms", "pass-KV", "ms", 10, 2}, {"pass_q_ms", "pass-Q", "ms", 10, 2},
                   {"faster", "faster", "measured", 10, 0}, {"pred_kv_ms", "pred KV", "ms", 10, 2},
                   {"pred_q_ms", "pred Q", "ms", 10, 2}, {"auto", "auto", "choice", 9, 0},
                   {"eq5", "Eq.5", "paper", 9, 0}, {"wrong", "#wrong", "", 7, 0}},
                  {std::string("FLOP convention: ") + kFlopConvention,
                   "TTFT: median of bench_iters prefills of the T new tokens on the same P-token cache (max over ranks)",
                   "pred: cp_algo=auto's cost model (src/perf/prefill_choice.hpp), hardware " + cost.describe()});
    // Crossover: a split index i (pass-Q below miss rate i, pass-KV from i on) that misclassifies
    // the fewest rows; index n_rates = pass-Q everywhere. Measured rows count only where the
    // paired sign test decides (meas_kv = -1 marks a tie: the two variants are within the noise).
    std::vector<int> meas_kv, pred_kv;
    int idx = 0;
    for (double miss : kMisses) {
      if (ctx.tracer.stop_signal() != 0) break;  // a stop signal: the rows measured so far (each row whole)
      const int64_t T = std::clamp<int64_t>(std::llround(miss * double(S)), 1, S), cached = S - T;
      std::vector<SchedulePhase> sched = {{PhaseKind::prefill, T}};  // the cache's prefill, then the measured one
      if (cached > 0) sched.insert(sched.begin(), {PhaseKind::prefill, cached});
      Engine eng(layout, params.data(), topo, cache_capacity(sched, N), cfg.strategy, cfg.device, gpu.stream);
      CallStats st;
      if (cached > 0) {
        eng.prefill({std::vector<int32_t>(seq_tokens.begin(), seq_tokens.begin() + cached)}, CpAlgo::pass_kv, nullptr, st);
        audit_call(eng, st, world);
      }
      const KvCache::Snapshot snap = eng.cache().snapshot();
      const std::vector<int32_t> new_tok(seq_tokens.begin() + cached, seq_tokens.end());
      const PairRun pr_run = run_pair(ctx, eng, cp, new_tok, cached, int32_t(idx), iters, step,
                                      [&] { eng.cache().restore(snap); });
      const std::vector<double>* ts = pr_run.ts;
      const double ms[2] = {med(ts[0]) * 1e3, med(ts[1]) * 1e3};
      const int wrong = check(pr_run.logits[0].data(), pr_run.logits[1].data(), V, pr_run.next[0], pr_run.next[1]);
      wrong_total += wrong;
      const Prediction pr = cost.predict(T, cached);
      const int kv_faster = faster_by_sign_test(ts[0], ts[1]);
      meas_kv.push_back(kv_faster);
      pred_kv.push_back(pr.choice == CpAlgo::pass_kv);
      t1.add_row({t1.cell(0, 100 * double(T) / double(S)), std::to_string(T), std::to_string(cached), t1.cell(3, ms[0]),
                  t1.cell(4, ms[1]), kv_faster < 0 ? "tie" : kv_faster ? "pass_kv" : "pass_q", t1.cell(6, pr.pass_kv_s * 1e3),
                  t1.cell(7, pr.pass_q_s * 1e3), algo_name(pr.choice), pr.eq5_pass_q ? "pass_q" : "pass_kv",
                  std::to_string(wrong)});
      ++idx;
    }
    if (world.rank() == 0) print_table(t1, ctx);
    report_crossover(meas_kv, pred_kv, idx);
  }

  // Table 1's crossover, measured and predicted: a line after the table and two root attributes
  // of the trace. meas_kv, pred_kv: per measured row (idx of them, in kMisses' order) whether
  // pass-KV is faster (measured: -1 for a tie).
  void report_crossover(const std::vector<int>& meas_kv, const std::vector<int>& pred_kv, int idx) {
    // Every split index with the fewest misclassified decisive rows (ties never count).
    auto best_splits = [&](const std::vector<int>& kv) {
      std::vector<int> errs;
      for (int i = 0; i <= int(kv.size()); ++i) {
        int e = 0;
        for (int j = 0; j < int(kv.size()); ++j) e += kv[size_t(j)] >= 0 && (j < i) == bool(kv[size_t(j)]);
        errs.push_back(e);
      }
      const int lo = *std::min_element(errs.begin(), errs.end());
      std::vector<int> best;
      for (int i = 0; i < int(errs.size()); ++i)
        if (errs[size_t(i)] == lo) best.push_back(i);
      return best;
    };
    const std::vector<int> meas_set = best_splits(meas_kv);
    const int pred_cross = best_splits(pred_kv).front();
    int meas_cross = meas_set.front();  // the measured split nearest the prediction
    for (int i : meas_set)
      if (std::abs(i - pred_cross) < std::abs(meas_cross - pred_cross)) meas_cross = i;
    auto name_of = [&](int i) {
      char b[64];
      if (i >= idx) return std::string("none (pass-Q everywhere)");
      std::snprintf(b, sizeof b, "%.1f%% miss", 100 * kMisses[i]);
      return std::string(b);
    };
    const int decided = int(std::count_if(meas_kv.begin(), meas_kv.end(), [](int v) { return v >= 0; }));
    if (decided == 0) meas_cross = -1;  // nothing to compare against: every row within the noise
    if (!cfg.csv) {
      std::string range = name_of(meas_set.front());
      if (meas_set.size() > 1) range = "any of " + range + " .. " + name_of(meas_set.back()) + " (ties between)";
      if (decided == 0)
        log0("# crossover: measured undetermined (every row a tie at the sign test's 10%% level; raise bench_iters), "
             "predicted %s -> not judged\n", name_of(pred_cross).c_str());
      else
        log0("# crossover (pass-Q below, pass-KV from this miss rate on; best split of the %d decided rows): measured "
             "%s, predicted %s -> %s\n",
             decided, range.c_str(), name_of(pred_cross).c_str(),
             std::abs(meas_cross - pred_cross) <= 1 ? "within one miss-rate step" : "NOT within one step");
    }
    ctx.tracer.write_attr("/", "infer_crossover_measured_index", int64_t(meas_cross));
    ctx.tracer.write_attr("/", "infer_crossover_predicted_index", int64_t(pred_cross));
  }

  // ---- 2. decode TTIT against CP size ---------------------------------------------------------
  // Table 2: per CP size the pass-Q and all-gather decode, each step fed the CP = 1 run's tokens
  // and checked against them.
  void decode_table() {
    Table t2("ctxpar bench infer — decode TTIT against CP size (shape of Meta CP Table 8), context " +
                      std::to_string(S) + ", batch " + std::to_string(cfg.batch) +
                      (tp > 1 ? ", every CP group x tp:" + std::to_string(tp) : std::string()),
                  {{"cp", "CP", "ranks", 6, 0}, {"replicas", "replicas", "dp", 9, 0}, {"algo", "algo", "", 10, 0},
                   {"ttit_ms", "TTIT", "ms", 9, 3}, {"attn_ms", "attn", "ms/step", 9, 3},
                   {"exposed_ms", "exposed", "ms/step", 9, 3}, {"sent_kb", "sent", "KB/step", 9, 1},
                   {"wrong", "#wrong", "", 7, 0}},
                  {"TTIT: median over bench_iters decode steps after 1 warmup (max over all ranks)",
                   "attn: attention incl. its communication; exposed: time blocked on transfers (max over ranks)",
                   "#wrong: tokens (steps x sequences, each step fed the CP = 1 run's tokens) whose greedy token differs "
                   "from the CP = 1 run's" + (on_gpu ? check.note() : std::string(" (exact)"))});
    // The CP = 1 run's greedy tokens of every step (and on a GPU its logits), [step][b]: the later
    // runs are fed them (teacher forcing) and checked against them.
    std::vector<std::vector<int32_t>> ref_tokens;
    std::vector<std::vector<float>> ref_logits;
    for (int c = 1; c * tp <= world.size(); c *= 2) {
      if (ctx.tracer.stop_signal() != 0) break;
      if (world.size() % (c * tp) != 0) continue;
      SubMesh sub = sub_mesh(cfg, world, c, tp);
      const MeshSpec& mesh = sub.mesh;
      if (on_gpu) gpu.attach(*sub.topo);  // its communicators on the GPU too (released with it)
      Comm& ccp = sub.topo->cp();
      const std::vector<SchedulePhase> sched = {{PhaseKind::prefill, S}, {PhaseKind::decode, iters + 1}};
      Engine eng(*sub.layout, sub.params.data(), *sub.topo, cache_capacity(sched, c, cfg.batch),
                 prefill_row(CpAlgoSetting::pass_kv).name, cfg.device, gpu.stream);
      CallStats st;
      std::vector<std::vector<int32_t>> prompt(size_t(cfg.batch), seq_tokens);
      const std::vector<int32_t> first = eng.prefill(prompt, CpAlgo::pass_kv, nullptr, st).next_tokens;
      audit_call(eng, st, world);
      const KvCache::Snapshot snap = eng.cache().snapshot();
      for (DecodeAlgo a : {DecodeAlgo::pass_q, DecodeAlgo::allgather}) {
        if (ctx.tracer.stop_signal() != 0) break;
        eng.cache().restore(snap);
        const bool is_ref = ref_tokens.empty();
        std::vector<int32_t> last = first;
        std::vector<double> ts, attn, exposed, sent;
        int wrong = 0;
        for (int64_t it = 0; it < iters + 1; ++it) {
          CallStats cs;
          StepOutput out;
          ctx.tracer.begin_step(step);
          const double dt = timed(ccp, world, [&] { out = eng.decode(last, a, &ctx.tracer, cs, on_gpu); });
          audit_call(eng, cs, world);
          cs.cp.settle();
          // The attention incl. its communication: on a GPU from the spans' device marks.
          const double attn_s = on_gpu ? attention_seconds(ctx.tracer.phase_seconds()) : cs.attn_s;
          double vals[3] = {attn_s, cs.cp.exposed_comm_s, cs.cp.bytes_sent};
          world.all_reduce(std::span<double>(vals, 3), ReduceOp::max);
          StepRecord rec;
          rec.step = step++;
          rec.time_s = dt;
          rec.tokens = cfg.batch;
          rec.ttit_s = dt;
          rec.turn = c;
          rec.exposed_comm_s = cs.cp.exposed_comm_s;
          rec.model_flops = double(cfg.batch) * eng.decode_flops(S + it);
          ctx.tracer.end_step(rec);
          if (it > 0) {
            ts.push_back(dt);
            attn.push_back(vals[0]);
            exposed.push_back(vals[1]);
            sent.push_back(vals[2]);
          }
          if (is_ref) {
            ref_tokens.push_back(out.next_tokens);
            ref_logits.push_back(out.logits);
          } else {
            const size_t i = size_t(it);
            for (int64_t b = 0; b < cfg.batch; ++b)
              wrong += on_gpu ? check(ref_logits[i].data() + b * V, out.logits.data() + b * V, V,
                                      ref_tokens[i][size_t(b)], out.next_tokens[size_t(b)])
                              : ref_tokens[i][size_t(b)] != out.next_tokens[size_t(b)];
          }
          last = ref_tokens[size_t(it)];
        }
        // Every replica must agree too (they run the same sequences).
        int32_t w = wrong;
        world.all_reduce(std::span<int32_t>(&w, 1), ReduceOp::max);
        wrong_total += w;
        t2.add_row({std::to_string(c), std::to_string(mesh.dp), ctxpar::name_of(a), t2.cell(3, med(ts) * 1e3),
                    t2.cell(4, med(attn) * 1e3), t2.cell(5, med(exposed) * 1e3), t2.cell(6, med(sent) / 1e3),
                    std::to_string(w)});
      }
    }
    if (world.rank() == 0) print_table(t2, ctx);
  }

  // ---- 3. batched variable-length prefill against one sequence at a time -----------------------
  // Table 3: packed against sequential prefill of the same prompts, and where the strategy has a
  // visible-keys row (bench_infer_places) the packed batch with it (frugal) and placed from the
  // prompts' lengths (placement = balanced).
  struct BatchMode {
    const char* name;
    PrefillBatching batching;
    CpSchedule sched;
    PlacementKind placement;
  };
  void batched_prefill_table() {
    // Two batches, full prefill: four prompts of mixed lengths (seq/8, seq/4, seq/2, seq: none a
    // multiple of anything in particular) and a long tail (one of seq/2, sixteen of seq/32); each
    // mode its own engine, the modes alternating within each iteration.
    const std::vector<int64_t> mixed = bench_infer_lengths(S), tail = bench_infer_tail_lengths(S);
    std::vector<BatchMode> modes = {
        {"sequential", PrefillBatching::sequential, CpSchedule::plain, PlacementKind::zigzag},
        {"packed", PrefillBatching::packed, CpSchedule::plain, PlacementKind::zigzag}};
    if (bench_infer_places(cfg)) {
      modes.push_back({"frugal", PrefillBatching::packed, CpSchedule::visible, PlacementKind::zigzag});
      modes.push_back({"placed", PrefillBatching::packed, CpSchedule::visible, PlacementKind::balanced});
    }
    Table t3("ctxpar bench infer — batched variable-length prefill (mixed: 4 prompts of " + std::to_string(mixed[0]) +
                 ".." + std::to_string(mixed.back()) + " tokens; tail: 1 of " + std::to_string(tail[0]) + " and 16 of " +
                 std::to_string(tail[1]) + "), " + std::to_string(N) + " CP ranks" +
                 (tp > 1 ? " x tp:" + std::to_string(tp) : std::string()) + ", strategy " + cfg.strategy,
             {{"batch", "batch", "", 6, 0}, {"mode", "prefill", "", 11, 0}, {"ttft_ms", "TTFT", "ms (batch)", 11, 2},
              {"tok_s", "throughput", "tokens/s", 11, 0}, {"speedup", "speedup", "x seq.", 8, 2},
              {"sent_mb", "sent", "MB max/rank", 11, 3}, {"imbalance", "attn work", "max/mean", 10, 3},
              {"wrong", "#wrong", "", 7, 0}},
             {"sequential: one forward per prompt; packed: one forward for the batch, each prompt zigzag-sharded on its "
              "own and its own document in one CP attention call per layer" +
                  std::string(modes.size() > 2 ? "; frugal: packed, by the strategy's visible-keys row (only the rows "
                                                 "some query sees move); placed: the prompts' rows placed from their "
                                                 "lengths (placement=balanced: short ones whole on one rank), by the "
                                                 "visible-keys row"
                                               : "; no frugal or placed rows: the strategy has no visible-keys row or "
                                                 "the model does not run it (device=cuda, MLA)"),
              "TTFT: median of bench_iters calls (after 1 warmup) of the max over ranks; the modes alternate within "
              "each iteration; sent: bytes the attention sent, the busiest rank's; attn work: the attention's "
              "(query, key) pairs, max over ranks / mean",
              "#wrong: prompts whose last logits or greedy tokens differ from the sequential mode's" + check.note()});
    // (trace: their steps are turn 100 + 10 x batch (0 mixed, 1 tail) + mode, in the order of the rows)
    for (const auto& [id, name, lens] : {std::tuple{0, "mixed", mixed}, std::tuple{1, "tail", tail}})
      if (ctx.tracer.stop_signal() == 0) batched_prefill_rows(t3, name, id, lens, modes);
    if (world.rank() == 0) print_table(t3, ctx);
  }

  void batched_prefill_rows(Table& t3, const char* batch_name, int64_t batch_id, const std::vector<int64_t>& lens,
                            const std::vector<BatchMode>& modes) {
    const int64_t nb = int64_t(lens.size()), nm = int64_t(modes.size());
    int64_t total = 0;
    std::vector<std::vector<int32_t>> batch(static_cast<size_t>(nb));
    for (int64_t b = 0; b < nb; ++b) {
      total += lens[size_t(b)];
      for (int64_t i = 0; i < lens[size_t(b)]; ++i) batch[size_t(b)].push_back(token_at(uint64_t(cfg.seed) + uint64_t(b), i, V));
    }
    // One engine for the batch, its cache the largest any mode needs; each call sets its mode's
    // schedule and placement (the memory plan counts one engine: modes/infer.cpp run_engines).
    const std::vector<SchedulePhase> sched = {{PhaseKind::prefill, *std::max_element(lens.begin(), lens.end()), lens}};
    std::vector<PlacementKind> placements;
    for (const BatchMode& m : modes) placements.push_back(m.placement);
    Engine e(layout, params.data(), topo, cache_capacity(sched, N, nb, placements), cfg.strategy, cfg.device, gpu.stream);
    const size_t count = size_t(nm);
    std::vector<std::vector<double>> ts(count), sent(count), imb(count);
    std::vector<StepOutput> outs(static_cast<size_t>(nm));
    for (int64_t it = 0; it < iters + 1 && ctx.tracer.stop_signal() == 0; ++it)
      for (int64_t k = 0; k < nm; ++k) {
        e.use_placement(PlacementKind::zigzag);  // (balanced needs the visible-keys row: set after it)
        e.use_numerics(plain_numerics(), modes[size_t(k)].sched);
        e.use_placement(modes[size_t(k)].placement);
        e.clear();
        CallStats cs;
        ctx.tracer.begin_step(step);
        const double dt = timed(cp, world, [&] {
          outs[size_t(k)] = e.prefill(batch, CpAlgo::pass_kv, &ctx.tracer, cs, true, false, modes[size_t(k)].batching);
        });
        cs.cp.settle();
        audit_call(e, cs, world);
        double w[3] = {cs.cp.bytes_sent, cs.cp.attn_pair_heads[0], cs.cp.attn_pair_heads[0]};  // max, max, sum
        cp.all_reduce(std::span<double>(w, 2), ReduceOp::max);
        cp.all_reduce(std::span<double>(w + 2, 1), ReduceOp::sum);
        StepRecord rec;
        rec.step = step++;
        rec.time_s = dt;
        rec.tokens = total;
        rec.turn = 100 + 10 * batch_id + k;
        rec.ttft_s = dt;
        rec.exposed_comm_s = cs.cp.exposed_comm_s;
        for (int64_t b = 0; b < nb; ++b) rec.model_flops += e.prefill_flops(lens[size_t(b)], 0);
        ctx.tracer.end_step(rec);
        if (it == 0) continue;
        ts[size_t(k)].push_back(dt);
        sent[size_t(k)].push_back(w[0]);
        imb[size_t(k)].push_back(w[2] > 0 ? w[1] * N / w[2] : 1.0);
      }
    if (ts[size_t(nm - 1)].empty()) return;
    const StepOutput& ref = outs[0];  // sequential
    for (int64_t k = 0; k < nm; ++k) {
      int wrong = 0;
      for (int64_t b = 0; k > 0 && b < nb; ++b)
        wrong += check(ref.logits.data() + b * V, outs[size_t(k)].logits.data() + b * V, V, ref.next_tokens[size_t(b)],
                       outs[size_t(k)].next_tokens[size_t(b)]);
      wrong_total += wrong;
      const double sec = med(ts[size_t(k)]);
      t3.add_row({batch_name, modes[size_t(k)].name, t3.cell(2, sec * 1e3), t3.cell(3, double(total) / sec),
                  t3.cell(4, med(ts[0]) / sec), t3.cell(5, med(sent[size_t(k)]) / 1e6), t3.cell(6, med(imb[size_t(k)])),
                  std::to_string(wrong)});
    }
  }

  // ---- 4. full-prefill TTFT against length, pass-KV vs pass-Q ---------------------------------
  // Table 4: per prompt length both variants' full prefill on an empty cache.
  void full_prefill_table() {
    const std::vector<int64_t> lens = bench_infer_lengths(S);  // seq/8, seq/4, seq/2, seq (as table 3)
    // One prompt of seq/8, seq/4, seq/2 and seq tokens on an empty cache: pass-KV (the configured
    // full-prefill strategy) against pass-Q (queries circulate over each rank's own new keys),
    // alternating within each iteration; with mesh=tp:2,ring:2 the TTFT-vs-length sweep.
    Table t4("ctxpar bench infer — full prefill TTFT against length, pass-KV vs pass-Q, " + std::to_string(N) +
                      " CP ranks" + (tp > 1 ? " x tp:" + std::to_string(tp) : std::string()) + ", strategy " +
                      cfg.strategy + ", batch 1",
                  {{"T", "T", "tokens", 8, 0}, {"pass_kv_ms", "pass-KV", "ms", 10, 2}, {"pass_q_ms", "pass-Q", "ms", 10, 2},
                   {"kv_tok_s", "pass-KV", "tokens/s", 11, 0}, {"q_tok_s", "pass-Q", "tokens/s", 11, 0},
                   {"faster", "faster", "measured", 10, 0}, {"wrong", "#wrong", "", 7, 0}},
                  {"TTFT: median of bench_iters prefills (after 1 warmup) of the max over ranks; the two variants "
                   "alternate within each iteration; faster: a paired sign test decides, else tie",
                   "#wrong: the two variants' last logits or greedy tokens differ" + check.note()});
    for (int64_t T : lens) {
      if (ctx.tracer.stop_signal() != 0) break;
      Engine eng(layout, params.data(), topo, uniform_capacity(N, 1, Partition::padded_length(PartitionKind::zigzag, T, N) / N),
                 cfg.strategy, cfg.device, gpu.stream);
      const std::vector<int32_t> tok(seq_tokens.begin(), seq_tokens.begin() + T);
      const PairRun r = run_pair(ctx, eng, cp, tok, 0, int32_t(200 + T), iters, step, [&] { eng.clear(); });
      const int wrong = check(r.logits[0].data(), r.logits[1].data(), V, r.next[0], r.next[1]);
      wrong_total += wrong;
      const double sec[2] = {med(r.ts[0]), med(r.ts[1])};
      const int kv_faster = faster_by_sign_test(r.ts[0], r.ts[1]);
      t4.add_row({std::to_string(T), t4.cell(1, sec[0] * 1e3), t4.cell(2, sec[1] * 1e3), t4.cell(3, double(T) / sec[0]),
                  t4.cell(4, double(T) / sec[1]), kv_faster < 0 ? "tie" : kv_faster ? "pass_kv" : "pass_q",
                  std::to_string(wrong)});
    }
    if (world.rank() == 0) print_table(t4, ctx);
  }
};

}  // namespace

int bench_infer(BenchContext& ctx) {
  const Config& cfg = ctx.cfg;
  Topology& topo = ctx.topo;
  Comm& cp = topo.cp();
  // device=cuda: this rank's GPU, a compute stream and device communicators (first: every device
  // buffer of the engines below is released before it), as `prefill` and `decode` run there.
  const bool on_gpu = cfg.device == Device::cuda;
  const GpuRun gpu(on_gpu ? &topo : nullptr, &ctx.tracer);
  const Check check{on_gpu};
  gpu.log_inference();
  const int64_t S = cfg.seq, V = cfg.vocab;
  // With tp: this rank's slice of the heads and FFN (the CP strategies run within each tp slice).
  const int tp = topo.size(Axis::tp);
  const ParamLayout layout(model_dims(cfg, tp, topo.coord(Axis::tp)));
  Buffer<float> params(size_t(layout.local_elems()));
  layout.init(uint64_t(cfg.seed), params.data());
  const PrefillCostModel cost(cfg, cp, tp);
  std::vector<int32_t> seq_tokens(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) seq_tokens[size_t(i)] = token_at(uint64_t(cfg.seed), i, V);
  InferBench b{.ctx = ctx, .gpu = gpu, .check = check, .layout = layout, .params = params, .cost = cost,
               .seq_tokens = seq_tokens};
  b.partial_prefill_table();
  b.decode_table();
  b.batched_prefill_table();
  b.full_prefill_table();
  int wrong_total = b.wrong_total;
  if (cfg.exact) wrong_total += exact_table(ctx, check, seq_tokens);
  print_verdict("bench infer", wrong_total, cfg.csv);
  return wrong_total;
}

}  // namespace ctxpar
