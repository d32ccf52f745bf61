// `ctxpar bench cp`: per CP strategy and sequence length, one attention forward and backward on
// the mesh's CP group: times, bytes moved, exposed communication, bandwidth, throughput and a
// correctness column against the single-rank kernel on the same global inputs. With D layers in
// layer_pattern, a second table for the Gated DeltaNet op per GDN schedule (bench_cp_gdn.cpp);
// layer_pattern=D alone skips the attention table.
//
// Strategies: cfg.strategy, or every registered one for strategy=all, and with mask=window the
// halo exchange of local layers (cp/halo.cpp) first; a strategy invalid for the
// shape on this mesh gets a "skipped" row and its reason. Lengths: seq/4, seq/2, seq (those the
// zigzag partition accepts). Inputs: the synthetic tensors of `ctxpar run` (seeded per global
// token), documents from cfg.docs. Times: per step the max over ranks; the table shows the
// median over cfg.steps measured steps after cfg.warmup unmeasured ones.
// attention=mla (DeepSeek latent attention): the problem is MLA's (H_q = H_kv = heads of
// qk_nope + qk_rope dims), K/V expanded from seeded latent rows through random Wkv_b weights
// (model/mla_layer.hpp MlaExpander); a strategy that moves the latent (ring, allgather) gets two
// rows: its own (the latent moves, visiting blocks are expanded on arrival) and `<name>:kv`, the
// same strategy moving the expanded K and V (the equivalent MHA step); a note gives the measured
// bytes of one forward ring step of each and their ratio against (kv_lora + rope) / (2 H D).
// Check: each rank recomputes its own rows with the single-rank kernel on the global inputs:
// every row of O, LSE, dQ, dK, dV when S <= kFullCheckSeq, else O, LSE, dQ of kSampleRows rows
// spread over the sequence (dK/dV need every query, too costly at long S). An element is wrong
// when |cp - single| > kWrongRel * max|single| of its tensor (fp32 vs fp32: both round
// differently, ~1e-6 relative; 1e-4 leaves a wide margin yet catches any real error).
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "core/stats.hpp"
#include "core/config.hpp"
#include "core/log.hpp"
#include "core/memory.hpp"
#include "core/random.hpp"
#include "cp/common.hpp"
#include "cp/strategy.hpp"
#include "cp/visible.hpp"
#include "dist/topology.hpp"
#include "model/flops.hpp"
#include "model/mla_layer.hpp"
#include "model/model.hpp"
#include "modes/device_run.hpp"
#include "modes/workload.hpp"
#include "ops.hpp"
#include "shard/partition.hpp"
#include "shard/placement.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

namespace {

constexpr int64_t kFullCheckSeq = 2048;
constexpr int64_t kSampleRows = 64;
constexpr double kWrongRel = 1e-4;
// device=cuda: the GPU kernels compute on bf16 inputs and round P and dS to bf16 (kernels/cuda);
// against the CPU kernel on the same bf16-rounded inputs they differ by about 1e-3 of max|tensor|
// (docs/GPU.md), a broken device path by O(1).
constexpr double kWrongRelDevice = 3e-2;

struct Inputs {
  std::vector<int64_t> pos;
  std::vector<int32_t> doc;         // local ids (empty: no documents)
  std::vector<int32_t> global_doc;  // every token's id (empty: no documents)
  Buffer<float> q, k, v, dout, o, lse, dq, dk, dv;
  Buffer<float> latent, dlatent;    // attention=mla
  // This rank's shard of the problem `s`, as the strategy's call (with the latent when `ex`).
  CpCall local(const CpCall& s, KvExpander* ex) {
    CpCall t = s;
    t.S_q = t.S_k = int64_t(pos.size());
    t.q_pos = t.k_pos = pos.data();
    t.q_doc = t.k_doc = doc.empty() ? nullptr : doc.data();
    t.q = q.data(); t.k = k.data(); t.v = v.data(); t.dout = dout.data();
    t.o = o.data(); t.lse = lse.data(); t.dq = dq.data(); t.dk = dk.data(); t.dv = dv.data();
    if (ex) {
      t.latent = latent.data();
      t.dlatent = dlatent.data();
      t.expander = ex;
    } else {
      t.latent_width = 0;
    }
    return t;
  }
};

// attention=mla: the latent's expansion with seeded Wkv_b weights (scaled as the model's init).
struct MlaBench {
  ModelDims d;
  Buffer<float> wkv_b, gwkv_b;
  LayerView w{}, gw{};
  std::unique_ptr<MlaExpander> ex;
  MlaBench(const Config& cfg, uint64_t seed, Tracer* tr) : d(model_dims(cfg, 1, 0)) {
    const int64_t kl = d.kv_lora, cols = int64_t(d.H_q) * (d.nope + d.v_dim);
    std::vector<int64_t> rows(static_cast<size_t>(kl));
    for (int64_t i = 0; i < kl; ++i) rows[size_t(i)] = i;
    wkv_b.resize(size_t(kl * cols), false);
    gwkv_b.resize(size_t(kl * cols));
    fill_rows(seed, 101, rows, cols, float(1.0 / std::sqrt(double(kl))), wkv_b.data());
    w.wkv_b = wkv_b.data();
    gw.wkv_b = gwkv_b.data();
    ex = std::make_unique<MlaExpander>(d);
    ex->bind(tr, -1, w, &gw);
  }
  int32_t width() const { return ex->width(); }
};

// Single-rank kernel on the global inputs for this rank's rows (all, or the sampled ones). With
// `mla`, K/V are the expansion of the global latent rows, and `latent_row` compares the latent's
// gradient (the reference dK/dV through the expansion) where the full check compares dK/dV.
int64_t check_rows(const CpCall& s, Inputs& in, uint64_t seed, bool full, MlaBench* mla, bool latent_row,
                   bool bf16_inputs) {
  const int64_t S = s.S_q, wq = int64_t(s.H_q) * s.D, wk = int64_t(s.H_kv) * s.D;
  std::vector<int64_t> all(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) all[size_t(i)] = i;
  Buffer<float> K(size_t(S * wk), false), V(size_t(S * wk), false), X;
  if (mla) {
    X.resize(size_t(S) * mla->width(), false);
    fill_rows(seed, kTensorK, all, mla->width(), 1.0f, X.data());
    mla->ex->expand(X.data(), S, K.data(), V.data());
  } else {
    fill_rows(seed, kTensorK, all, wk, 1.0f, K.data());
    fill_rows(seed, kTensorV, all, wk, 1.0f, V.data());
  }
  if (bf16_inputs) {  // a device row: the values the GPU computed on
    round_to_bf16(K.data(), K.size());
    round_to_bf16(V.data(), V.size());
  }
  // Query rows of the reference: every token (full: dK/dV need every query), else the sampled
  // local rows. ref_row[i] = row of the reference that local row rows[i] is.
  std::vector<int64_t> rows, ref_row, qpos;
  const int64_t stride = std::max<int64_t>(1, S / kSampleRows);
  for (int64_t i = 0; i < int64_t(in.pos.size()); ++i)
    if (in.pos[size_t(i)] < S && (full || in.pos[size_t(i)] % stride == stride / 2)) {  // padding rows: no result
      rows.push_back(i);
      ref_row.push_back(full ? in.pos[size_t(i)] : int64_t(qpos.size()));
      if (!full) qpos.push_back(in.pos[size_t(i)]);
    }
  if (full) qpos = all;
  const size_t nq = qpos.size(), n = rows.size();
  std::vector<int32_t> qdoc(nq);
  if (!in.global_doc.empty())
    for (size_t i = 0; i < nq; ++i) qdoc[i] = in.global_doc[size_t(qpos[i])];
  Buffer<float> Q(nq * wq, false), dO(nq * wq, false), O(nq * wq, false), L(nq * s.H_q, false), dQ(nq * wq),
      dK(size_t(S * wk)), dV(size_t(S * wk));
  fill_rows(seed, kTensorQ, qpos, wq, 1.0f, Q.data());
  fill_rows(seed, kTensorDout, qpos, wq, 1.0f, dO.data());
  if (bf16_inputs) {
    round_to_bf16(Q.data(), Q.size());
    round_to_bf16(dO.data(), dO.size());
  }
  CpCall p = s;
  p.q = Q.data(); p.k = K.data(); p.v = V.data(); p.o = O.data(); p.lse = L.data();
  p.dout = dO.data(); p.dq = dQ.data(); p.dk = dK.data(); p.dv = dV.data();
  p.S_q = int64_t(nq);
  p.q_pos = qpos.data();
  p.k_pos = all.data();
  if (!in.global_doc.empty()) {
    p.q_doc = qdoc.data();
    p.k_doc = in.global_doc.data();
  }
  attn_fwd(p);
  attn_bwd(p);
  // The same rows of this rank's CP results and of the reference, side by side.
  auto pick = [&](const float* x, int64_t w, const std::vector<int64_t>& idx) {
    std::vector<float> y(n * size_t(w));
    for (size_t i = 0; i < n; ++i) std::copy_n(x + idx[i] * w, w, y.data() + i * size_t(w));
    return y;
  };
  auto both = [&](const float* mine, const float* ref, int64_t w) {
    return count_wrong(pick(mine, w, rows).data(), pick(ref, w, ref_row).data(), n * size_t(w),
                       bf16_inputs ? kWrongRelDevice : kWrongRel);
  };
  int64_t wrong = both(in.o.data(), O.data(), wq) + both(in.lse.data(), L.data(), s.H_q) + both(in.dq.data(), dQ.data(), wq);
  if (full && latent_row) {
    Buffer<float> dX(X.size());
    mla->ex->backward(X.data(), S, dK.data(), dV.data(), dX.data());
    wrong += both(in.dlatent.data(), dX.data(), mla->width());
  } else if (full) {
    wrong += both(in.dk.data(), dK.data(), wk) + both(in.dv.data(), dV.data(), wk);
  }
  return wrong;
}

// The least a pass-KV schedule must move for this rank's keys (the visible keys' `min` column):
// each of its rows some query of another rank can see goes there once per pass (forward: K and V;
// backward: K and V again, the strategies keeping nothing between calls), and each row of another
// rank it sees returns that row's dK and dV (fp32). No positions or document ids.
// Every rank's rows of a layout in rank order: positions, and document ids where the calls get them
// (padding rows -1 where documents or mask=none need one).
struct LayoutRows {
  std::vector<int64_t> pos;
  std::vector<int32_t> doc;  // empty without documents
  LayoutRows(const CpCall& shape, const std::vector<std::vector<int64_t>>& layout, int64_t S,
             const std::vector<int32_t>& global_doc) {
    const int64_t padded = int64_t(layout[0].size() * layout.size());
    for (const std::vector<int64_t>& rows : layout) {
      pos.insert(pos.end(), rows.begin(), rows.end());
      const std::vector<int32_t> d = doc_ids_at(rows, S, padded > S, global_doc, shape.mask);
      doc.insert(doc.end(), d.begin(), d.end());
    }
  }
};

double visible_minimum_bytes(const CpCall& shape, const std::vector<std::vector<int64_t>>& layout, int64_t S,
                             const std::vector<int32_t>& global_doc, int r) {
  const int P = int(layout.size());
  const int64_t n = int64_t(layout[0].size());
  const LayoutRows all(shape, layout, S, global_doc);
  const std::vector<int64_t>& pos = all.pos;
  const std::vector<int32_t>& doc = all.doc;
  const cp::VisiblePlan plan =
      cp::visible_plan(pos.data(), doc.empty() ? nullptr : doc.data(), n, P, r, shape.mask, shape.window);
  const double kv = 2.0 * double(cp::kv_row_bytes(shape)), grad = 2.0 * double(cp::grad_row_bytes(shape));
  return double(plan.send_rows()) * 2.0 * kv + double(plan.recv_rows()) * grad;
}

// Visible pairs of a whole layout (every rank's rows; padding rows with their document id -1
// where documents or mask=none need one, as the calls get them): what the ranks' calls must
// compute between them, once each.
int64_t layout_visible_pairs(const CpCall& shape, const std::vector<std::vector<int64_t>>& layout, int64_t S,
                             const std::vector<int32_t>& global_doc) {
  const LayoutRows all(shape, layout, S, global_doc);
  CpCall p = shape;
  p.S_q = p.S_k = int64_t(all.pos.size());
  p.q_pos = p.k_pos = all.pos.data();
  p.q_doc = p.k_doc = all.doc.empty() ? nullptr : all.doc.data();
  p.device = Device::cpu;
  return visible_pairs(p);
}

// CPU seconds (user + system, every thread) this process has used: with other jobs on the cores,
// FLOPs per CPU-second measure a configuration's efficiency independently of how much of the
// machine it got; wall-time throughput does not.
double cpu_seconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// One row kind of the attention table: a strategy, and the variant of it the row runs.
struct RowKind {
  std::string label, strategy;
  bool latent;
  // the configured schedule's row `<name><schedule_suffix>` (cp/strategy.hpp), e.g. `ring:det`
  CpSchedule schedule = CpSchedule::plain;
  bool exact = false;  // its exact sums: the layout in whole query tiles, exact_heads per dK/dV part
  // zigzag: the partition's rows; balanced or document: rows placed from the documents
  // (shard/placement.hpp)
  PlacementKind placement = PlacementKind::zigzag;
  bool placed() const { return placement != PlacementKind::zigzag; }
  bool scheduled() const { return schedule != CpSchedule::plain; }
};

// The attention table's rows: per strategy its own, and with mla or a configured schedule
// (Config::cp_schedule) the variants the strategy serves.
std::vector<RowKind> row_kinds(const Config& cfg, Topology& topo, bool mla) {
  // strategy=all compares every registered strategy (where the config accepts "all"); otherwise
  // the configured one: at long S one strategy's forward + backward takes minutes on a CPU.
  std::vector<std::string> names = {cfg.strategy};
  if (cfg.strategy == "all") names = strategy_names();
  // A sliding window (a local layer's attention): the registry's local row (the halo exchange)
  // first, beside the configured strategies (the ring by default), which move every block past
  // every rank.
  if (cfg.mask == MaskKind::window) names.insert(names.begin(), local_strategy_names().front());
  std::vector<RowKind> rows;
  for (const std::string& name : names) {
    const std::unique_ptr<CpStrategy> s = make_strategy(name, topo);
    const bool moves = mla && s->moves_latent();
    rows.push_back({name, name, moves});
    if (moves) rows.push_back({name + ":kv", name, false});
    const CpSchedule sched = cfg.cp_schedule();
    if (sched != CpSchedule::plain && has_schedule(name, sched))
      rows.push_back({name + schedule_suffix(sched), name, false, sched, cfg.exact});
    if (cfg.placement != PlacementKind::zigzag && has_schedule(name, CpSchedule::visible))
      rows.push_back({name + ":" + name_of(cfg.placement), name, false, CpSchedule::visible, false, cfg.placement});
  }
  return rows;
}

// The attention table's notes: the mesh and problem, the conventions, the check, and the notes
// of device=cuda, P = 1 and the configured schedule.
std::vector<std::string> table_notes(const Config& cfg, Topology& topo, const MlaBench* mla, const GpuRun& gpu) {
  const int P = topo.cp().size();
  const int U = topo.size(Axis::ulysses), R = topo.size(Axis::ring);
  const bool on_gpu = cfg.device == Device::cuda;
  std::vector<std::string> notes = {
      "mesh ulysses:" + std::to_string(U) + ",ring:" + std::to_string(R) + " (P = " + std::to_string(P) + "), H_q=" +
          std::to_string(cfg.heads) + " H_kv=" + std::to_string(cfg.kv_heads) + " D=" + std::to_string(cfg.head_dim) +
          " mask=" + name_of(cfg.mask) + (cfg.mask == MaskKind::window ? "(" + std::to_string(cfg.window) + ")" : "") +
          " docs=" + cfg.docs + ", " + std::to_string(cfg.threads) + " threads/rank (0 = OpenMP default)" +
          (mla ? "; attention=mla: H_q = H_kv = " + std::to_string(mla->d.H_q) + " heads of D = " +
                     std::to_string(mla->d.D) + " (values " + std::to_string(mla->d.v_dim) + ", zero-padded to D), latent " +
                     std::to_string(mla->width()) + " = kv_lora_rank " + std::to_string(mla->d.kv_lora) + " + rope " +
                     std::to_string(mla->d.rope) + "; <name>:kv rows move the expanded K/V"
               : std::string()),
      std::string("FLOP convention: ") + kFlopConvention + "; TFLOP/s per rank = model FLOPs / (time * ranks)",
      "time: median over " + std::to_string(cfg.steps) + " steps (after " + std::to_string(cfg.warmup) +
          " warmup) of the max over ranks",
      "fwd/cpu, bwd/cpu: model GFLOP per CPU-second (user + system, all threads, summed over ranks; spin-waits "
      "included): efficiency independent of other jobs on the cores",
      "bytes: sent per rank, forward + backward; exposed: time blocked in communication (waits and blocking "
      "collectives), max over ranks; busbw = bytes / (fwd + bwd time); work: the forward's (query, key) pairs x heads "
      "computed per rank, max / mean over ranks (1 = balanced); audited: in every step the ranks' pairs x heads, "
      "forward and backward, add up to the layout's visible pairs x H_q (a mismatch is listed and fails the verdict)",
      on_gpu ? "#wrong: elements off the single-rank CPU kernel on the same bf16-rounded inputs by > 3e-2 * max|tensor| "
               "(the GPU's bf16 P and dS give ~1e-3); check: full = all rows of O, LSE, dQ, dK, dV; sample = O, LSE, dQ "
               "of ~" + std::to_string(kSampleRows) + " rows"
             : "#wrong: elements off the single-rank kernel by > 1e-4 * max|tensor|; check: full = all rows of O, LSE, "
               "dQ, dK, dV; sample = O, LSE, dQ of ~" + std::to_string(kSampleRows) + " rows"};
  if (on_gpu)
    notes.push_back("device=cuda (" + gpu.description + ", " + gpu.comm + " communicators): bf16 inputs, fp32 outputs; "
                    "times after synchronizing the stream; exposed: the compute stream's waits, timed by CUDA events; "
                    "fwd/cpu, bwd/cpu count host CPU time only");
  if (P == 1) notes.push_back("P = 1: every strategy is one kernel call (the single-rank baseline)");
  const CpSchedule sched = cfg.cp_schedule();
  const std::string rows = schedule_key(sched) + "=true: <name>" + schedule_suffix(sched) + " rows ";
  if (cfg.exact)
    notes.push_back(rows + "run the exact schedule (every rank "
                    "attends to all keys in position order, dK/dV summed exactly as integers, the layout padded to "
                    "whole " + std::to_string(attn_query_block(int32_t(cfg.head_dim))) +
                    "-token query tiles per chunk): bits independent of P, strategy and threads (tests/mpi/test_cp.cpp)");
  if (cfg.placement == PlacementKind::balanced)
    notes.push_back("placement=balanced: <name>:balanced rows run the frugal schedule on rows placed from the document "
                    "lengths (shard/placement.hpp: short documents whole on one rank, long ones zigzag over the fewest "
                    "ranks within " + std::to_string(kBalanceSlackPercent) + "% of the mean causal work); x_plain "
                    "against the strategy's plain (zigzag) row");
  if (cfg.placement == PlacementKind::document)
    notes.push_back("placement=document: <name>:document rows run the frugal schedule on every document zigzag over "
                    "all ranks on its own (shard/placement.hpp: the packed-sequence layout of Transformer Engine and "
                    "Megatron-LM, each document's remainder rows dealt to the chunks in turn instead of padding it); "
                    "x_plain against the strategy's plain (zigzag) row");
  if (cfg.visible_keys)
    notes.push_back(
        rows + "move only the key/value rows some query of the receiver can see (cp/visible.hpp); "
        "min: the visible rows' bytes, each moved once per pass (forward K/V; backward K/V and their dK/dV in fp32), "
        "no metadata, max over ranks; x_min = bytes / min; x_plain = bytes / the plain row's bytes");
  return notes;
}

// The attention table's columns (the visible keys' rows add min, x_min and x_plain).
std::vector<TableColumn> table_columns(const Config& cfg) {
  std::vector<TableColumn> cols = {
      {"strategy", "strategy", "", cfg.cp_schedule() != CpSchedule::plain ? 17 : 10, 0}, {"seq", "seq", "tokens", 9, 0},
      {"fwd_ms", "fwd", "ms", 11, 1}, {"bwd_ms", "bwd", "ms", 11, 1},
      {"bytes_mb", "bytes", "MB", 10, 1}, {"exposed_ms", "exposed", "ms", 10, 2},
      {"exposed_pct", "exposed", "%", 9, 2}, {"busbw_gbs", "busbw", "GB/s", 8, 3},
      {"fwd_tflops", "fwd", "TFLOP/s", 10, 4}, {"bwd_tflops", "bwd", "TFLOP/s", 10, 4},
      {"fwd_gflops_cpu", "fwd/cpu", "GFLOP/cs", 10, 2}, {"bwd_gflops_cpu", "bwd/cpu", "GFLOP/cs", 10, 2},
      {"wrong", "#wrong", "", 8, 0}, {"check", "check", "", 8, 0}, {"work_imbalance", "work", "max/mean", 9, 3}};
  if (cfg.visible_keys) {
    cols.push_back({"min_mb", "min", "MB", 10, 2});
    cols.push_back({"x_min", "x_min", "", 7, 3});
    cols.push_back({"x_plain", "x_plain", "", 8, 3});
  }
  return cols;
}

// One row's timed calls at one length: the strategy, its call on this rank, and what the steps record.
struct TimedCall {
  CpStrategy& strat;
  const CpCall& run;    // the call (on the GPU with device=cuda)
  const CpCall& shape;  // the problem (the real tokens' FLOPs)
  int64_t S;
  double real_pairs;        // the real tokens' visible pairs over every replica; < 0: no padding rows
  const std::string& label;
};

// The measured iterations of one row at one length: per step the max over ranks (times, bytes,
// exposed) and the sum (CPU seconds), and the last step's model FLOPs.
struct Samples {
  std::vector<double> fwd_s, bwd_s, bytes, exposed, fwd_cpu, bwd_cpu;
  double flops_fwd = 0, flops_bwd = 0;
  double work_imbalance = 1;  // the forward's pairs x heads, max / mean over ranks
  std::vector<double> pairs_fwd, pairs_bwd;  // every step's pairs x heads summed over ranks (warmup included)
};

// The attention rows: the job, the device, MLA's expansion, the table, and what the rows
// accumulate (the trace step, wrong elements, skipped cases, bytes that later rows compare with).
struct CpBench {
  BenchContext& ctx;
  const Config& cfg;
  Topology& topo;
  Comm& world;
  const int P, r;
  const uint64_t seed;
  const bool on_gpu;
  const GpuRun& gpu;
  MlaBench* mla;
  Table& table;
  int64_t wrong_total = 0;
  int64_t step = 0;
  std::vector<std::string> skipped;
  std::vector<std::string> audit_failures;  // coverage audit mismatches (audit())
  std::map<int64_t, double> plain_bytes;  // visible keys: seq -> bytes of the plain row of the same strategy (last seen)
  std::map<std::pair<int64_t, PlacementKind>, double> least_bytes;  // visible keys: (seq, layout) -> the visible minimum (max over ranks)
  std::map<std::string, double> step_bytes;  // MLA: label -> bytes of one forward ring step

  CpBench(BenchContext& c, const GpuRun& g, MlaBench* m, Table& t)
      : ctx(c), cfg(c.cfg), topo(c.topo), world(c.topo.world()), P(c.topo.cp().size()), r(c.topo.cp().rank()),
        seed(uint64_t(c.cfg.seed)), on_gpu(c.cfg.device == Device::cuda), gpu(g), mla(m), table(t) {}

  // The row `name` at seq S as "skipped", and its reason for the list after the table.
  void add_skipped(const std::string& name, int64_t S, const std::string& why) {
    std::vector<std::string> cells = {name, std::to_string(S), "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "skipped", "-"};
    if (cfg.visible_keys) cells.insert(cells.end(), {"-", "-", "-"});
    table.add_row(cells);
    skipped.push_back(name + " at seq " + std::to_string(S) + ": " + why);
  }

  // This rank's shard of the global inputs (seeded per token; padding rows cleared); with MLA,
  // K/V expanded from the latent rows.
  void fill_inputs(Inputs& in, const CpCall& shape, const std::vector<std::vector<int64_t>>& layout, int64_t S) {
    in.pos = layout[size_t(r)];
    const bool padded = int64_t(in.pos.size()) * P > S;
    in.doc = doc_ids_at(in.pos, S, padded, in.global_doc, shape.mask);
    const size_t n = in.pos.size(), wq = size_t(shape.H_q) * shape.D, wk = size_t(shape.H_kv) * shape.D;
    in.q.resize(n * wq, false); in.dout.resize(n * wq, false); in.o.resize(n * wq); in.dq.resize(n * wq);
    in.k.resize(n * wk, false); in.v.resize(n * wk, false); in.dk.resize(n * wk); in.dv.resize(n * wk);
    in.lse.resize(n * shape.H_q);
    fill_rows(seed, kTensorQ, in.pos, int64_t(wq), 1.0f, in.q.data());
    if (mla) {  // K/V from the latent rows, as the layer computes them
      const int64_t W = mla->width();
      in.latent.resize(n * size_t(W), false);
      in.dlatent.resize(n * size_t(W));
      fill_rows(seed, kTensorK, in.pos, W, 1.0f, in.latent.data());
      clear_rows_at(in.pos, S, {{in.latent.data(), W}});
      mla->ex->expand(in.latent.data(), int64_t(n), in.k.data(), in.v.data());
    } else {
      fill_rows(seed, kTensorK, in.pos, int64_t(wk), 1.0f, in.k.data());
      fill_rows(seed, kTensorV, in.pos, int64_t(wk), 1.0f, in.v.data());
    }
    fill_rows(seed, kTensorDout, in.pos, int64_t(wq), 1.0f, in.dout.data());
    clear_rows_at(in.pos, S, {{in.q.data(), int64_t(wq)}, {in.k.data(), int64_t(wk)}, {in.v.data(), int64_t(wk)},
                              {in.dout.data(), int64_t(wq)}});
  }

  // cfg.warmup + cfg.steps forward + backward calls, each a traced step; the measured ones'
  // samples (fewer where a stop signal ends the row early).
  Samples measure(const TimedCall& call) {
    Samples m;
    for (int64_t it = 0; it < cfg.warmup + cfg.steps; ++it) {
      ctx.tracer.begin_step(step);
      CpStats fst, bst;
      world.barrier();
      const double t0 = world.now(), c0 = cpu_seconds();
      call.strat.forward(call.run, &ctx.tracer, fst);
      stream_synchronize(gpu.stream, cfg.device);
      const double c1 = cpu_seconds();
      const double t1 = world.now();
      world.barrier();
      const double t2 = world.now(), c2 = cpu_seconds();
      call.strat.backward(call.run, &ctx.tracer, bst);
      stream_synchronize(gpu.stream, cfg.device);
      const double c3 = cpu_seconds();
      const double t3 = world.now();
      fst.settle();  // device waits, timed on the device
      bst.settle();
      // Per rank: fwd time, bwd time, bytes, exposed (max over ranks); FLOPs (sum over ranks).
      double mx[5] = {t1 - t0, t3 - t2, fst.bytes_sent + bst.bytes_sent, fst.exposed_comm_s + bst.exposed_comm_s,
                      fst.attn_pair_heads[0]};
      double sum[6] = {fst.attn_flops, bst.attn_flops, c1 - c0, c3 - c2, fst.attn_pair_heads[0], bst.attn_pair_heads[1]};
      world.all_reduce(std::span<double>(mx, 5), ReduceOp::max);
      world.all_reduce(std::span<double>(sum, 6), ReduceOp::sum);  // + CPU seconds, pairs x heads
      m.pairs_fwd.push_back(sum[4]);
      m.pairs_bwd.push_back(sum[5]);
      if (call.real_pairs >= 0) {  // model FLOPs of the real tokens' pairs (the padding rows' are work, not model)
        sum[0] = attn_fwd_flops(call.real_pairs, call.shape.H_q, call.shape.D);
        sum[1] = attn_bwd_flops(call.real_pairs, call.shape.H_q, call.shape.D);
      }
      StepRecord rec;
      rec.step = step++;
      rec.time_s = mx[0] + mx[1];
      rec.tokens = call.S;
      rec.model_flops = sum[0] + sum[1];
      rec.tflops_per_rank = rec.model_flops / (rec.time_s * world.size()) / 1e12;
      rec.exposed_comm_s = mx[3];
      const bool stop = ctx.tracer.end_step(rec);
      if (it >= cfg.warmup) {
        m.fwd_s.push_back(mx[0]);
        m.fwd_cpu.push_back(sum[2]);
        m.bwd_cpu.push_back(sum[3]);
        m.bwd_s.push_back(mx[1]);
        m.bytes.push_back(mx[2]);
        m.exposed.push_back(mx[3]);
        m.flops_fwd = sum[0];
        m.flops_bwd = sum[1];
        m.work_imbalance = sum[4] > 0 ? mx[4] * double(world.size()) / sum[4] : 1.0;
        if (mla && fst.messages > 0) step_bytes[call.label] = fst.bytes_sent / double(fst.messages);
      }
      if (stop) break;  // a stop signal: this row keeps the iterations measured so far
    }
    return m;
  }

  // The coverage audit of a row (as train's, model/coverage.hpp): every step's pairs x heads over
  // the ranks, forward and backward, against the layout's visible pairs x H_q x replicas. A
  // mismatch is listed after the table and fails the verdict.
  void audit(const std::string& name, int64_t S, const Samples& m, double want) {
    for (size_t i = 0; i < m.pairs_fwd.size(); ++i) {
      if (m.pairs_fwd[i] == want && m.pairs_bwd[i] == want) continue;
      char msg[300];
      std::snprintf(msg, sizeof msg, "%s at seq %lld, step %zu: computed %.0f (forward) and %.0f (backward) pairs x heads "
                    "over the ranks, the layout has %.0f visible", name.c_str(), (long long)S, i, m.pairs_fwd[i],
                    m.pairs_bwd[i], want);
      audit_failures.push_back(msg);
      ++wrong_total;
      return;
    }
  }

  // Every rank's rows for the row: the partition's, or placed from the documents' lengths.
  static std::vector<std::vector<int64_t>> layout_of(const RowKind& row, const Partition& part,
                                                     const std::vector<int32_t>& global_doc) {
    if (!row.placed()) {
      std::vector<std::vector<int64_t>> rows;
      for (int j = 0; j < part.P(); ++j) rows.push_back(part.positions(j));
      return rows;
    }
    const std::vector<int64_t> lengths = global_doc.empty() ? std::vector<int64_t>{part.S()} : document_lengths(global_doc);
    return place_documents(row.placement, lengths, part.P(), part.local_size(0)).rows;
  }

  // The row `row` at seq S: validate, fill the inputs, time, check against the single-rank
  // kernel, add the table row. false: stopped before any measured iteration (no row; the row's
  // longer lengths are not run).
  bool run_case(const RowKind& row, CpStrategy& strat, int64_t S) {
    const std::string& name = row.label;
    KvExpander* ex = row.latent ? mla->ex.get() : nullptr;
    Config c = cfg;
    c.seq = S;
    CpCall shape = attn_problem(c);  // MLA: heads of nope + rope and the latent's width (modes/workload.hpp)
    shape.fixed_heads = row.exact ? int32_t(cfg.exact_heads) : 0;  // exact dK/dV parts (ulysses replicas)
    std::string err = strat.validate(shape, topo);  // with the latent: ulysses, usp refuse
    if (!row.latent) shape.latent_width = 0;
    Inputs in;
    std::string derr;
    if (err.empty()) derr = parse_docs(cfg.docs, S, cfg.doc_mean, seed, in.global_doc);
    if (!err.empty() || !derr.empty()) {
      add_skipped(name, S, err.empty() ? derr : err);
      return true;
    }
    const Partition part(strat.partition(), S, P, row.exact ? attn_query_block(shape.D) : 1);
    const std::vector<std::vector<int64_t>> layout = layout_of(row, part, in.global_doc);
    fill_inputs(in, shape, layout, S);
    CpCall t = in.local(shape, ex);
    // As in training: every rank's keys are its zigzag shard, so the ring derives positions.
    if (strat.partition() == PartitionKind::zigzag && !row.exact && !row.placed()) t.k_pos_zigzag = S;
    DeviceTensors dev;  // device=cuda: the call's tensors on the GPU
    const CpCall run = on_gpu ? dev.upload(t, gpu.stream) : t;
    const double real_pairs =
        part.padding() > 0 ? double(problem_visible_pairs(shape, in.global_doc)) * double(world.size() / P) : -1;

    const Samples m = measure({strat, run, shape, S, real_pairs, name});
    if (m.fwd_s.empty()) return false;  // stopped before any measured iteration: no row
    const bool full = S <= kFullCheckSeq;
    if (on_gpu) dev.download(t, gpu.stream);
    int64_t wrong = check_rows(shape, in, seed, full, mla, row.latent, on_gpu);
    world.all_reduce(std::span<int64_t>(&wrong, 1), ReduceOp::sum);
    wrong_total += wrong;
    audit(name, S, m, double(layout_visible_pairs(shape, layout, S, in.global_doc)) * shape.H_q * double(world.size() / P));
    const double tf = median(m.fwd_s), tb = median(m.bwd_s), exposed = median(m.exposed), by = median(m.bytes);
    const double ranks = world.size();
    std::vector<std::string> cells = {
        name, std::to_string(S), table.cell(2, tf * 1e3), table.cell(3, tb * 1e3), table.cell(4, by / 1e6),
        table.cell(5, exposed * 1e3), table.cell(6, 100.0 * exposed / (tf + tb)), table.cell(7, by / (tf + tb) / 1e9),
        table.cell(8, m.flops_fwd / (tf * ranks) / 1e12), table.cell(9, m.flops_bwd / (tb * ranks) / 1e12),
        table.cell(10, m.flops_fwd / median(m.fwd_cpu) / 1e9), table.cell(11, m.flops_bwd / median(m.bwd_cpu) / 1e9),
        std::to_string(wrong), full ? "full" : "sample", table.cell(14, m.work_imbalance)};
    if (cfg.visible_keys) {
      // the same for every strategy's rows at this length and layout (zigzag, or placed): computed once
      auto [at, fresh] = least_bytes.try_emplace({S, row.placement}, 0.0);
      if (fresh) {
        at->second = visible_minimum_bytes(shape, layout, S, in.global_doc, r);
        world.all_reduce(std::span<double>(&at->second, 1), ReduceOp::max);
      }
      const double least = at->second;
      if (!row.scheduled()) plain_bytes[S] = by;
      const auto plain = plain_bytes.find(S);
      cells.push_back(table.cell(15, least / 1e6));
      cells.push_back(least > 0 ? table.cell(16, by / least) : "-");
      cells.push_back(row.scheduled() && plain != plain_bytes.end() ? table.cell(17, by / plain->second) : "-");
    }
    table.add_row(cells);
    return true;
  }
};

// attention=mla, after the table: one forward ring step's message (rank 0's, last length),
// latent vs K/V, for each strategy with both rows.
void print_mla_steps(const Config& cfg, const MlaBench& mla, const std::map<std::string, double>& step_bytes) {
  for (const auto& [label, bytes] : step_bytes) {
    const auto kv = step_bytes.find(label + ":kv");
    if (kv == step_bytes.end()) continue;
    const double goal = double(mla.width()) / (2.0 * mla.d.H_q * mla.d.D);
    log0("# MLA %s step: %.0f bytes with the latent vs %.0f with K/V: ratio %.5f (latent / (2 H D) = %.5f; "
         "positions derived on arrival%s)\n",
         label.c_str(), bytes, kv->second, bytes / kv->second, goal,
         has_docs(cfg) ? ", document ids travel in both" : "");
  }
}

}  // namespace

int bench_cp(BenchContext& ctx) {
  const Config& cfg = ctx.cfg;
  Topology& topo = ctx.topo;
  Comm& world = topo.world();
  const int P = topo.cp().size();
  const uint64_t seed = uint64_t(cfg.seed);
  // device=cuda: every row's call on this rank's GPU (bf16 inputs), the strategies on device
  // communicators; declared before the strategies, which bind to the communicators.
  const bool on_gpu = cfg.device == Device::cuda;
  const GpuRun gpu(on_gpu ? &topo : nullptr, &ctx.tracer);

  // seq/4, seq/2 and seq; a list of document lengths (docs=L1,L2,...: one batch) only seq, which they sum to.
  std::vector<int64_t> lengths;
  const bool doc_list = cfg.docs != "none" && cfg.docs != "random";
  for (int64_t S : {cfg.seq / 4, cfg.seq / 2, cfg.seq})
    if (S >= 2 * P && (!doc_list || S == cfg.seq)) lengths.push_back(S);
  // attention=mla: the latent rows of a strategy that moves it, and its K/V baseline `<name>:kv`.
  std::unique_ptr<MlaBench> mla;
  if (cfg.attention == "mla") mla = std::make_unique<MlaBench>(cfg, seed, &ctx.tracer);
  std::vector<RowKind> rows = row_kinds(cfg, topo, mla != nullptr);

  Table table("ctxpar bench cp — context-parallel attention forward + backward", table_columns(cfg),
                   table_notes(cfg, topo, mla.get(), gpu));
  CpBench bench(ctx, gpu, mla.get(), table);
  // layer_pattern chooses the tables: attention rows for G, Gated DeltaNet rows for D.
  const bool attn_rows = cfg.layer_pattern.find('G') != std::string::npos;
  if (!attn_rows) rows.clear();
  for (const RowKind& row : rows) {
    std::unique_ptr<CpStrategy> strat = make_strategy(row.strategy, topo, row.schedule);
    for (int64_t S : lengths) {
      if (ctx.tracer.stop_signal() != 0) break;  // a stop signal: report the rows measured so far
      if (!bench.run_case(row, *strat, S)) break;
    }
  }
  if (attn_rows && world.rank() == 0) print_table(table, ctx);
  if (mla && !cfg.csv)  // one forward ring step's message (rank 0's, last length), latent vs K/V
    print_mla_steps(cfg, *mla, bench.step_bytes);
  if (!cfg.csv)
    for (const std::string& m : bench.skipped) log0("# skipped %s\n", m.c_str());
  for (const std::string& m : bench.audit_failures) log0("# coverage audit failed: %s\n", m.c_str());
  int64_t wrong_total = bench.wrong_total;
  if (cfg.layer_pattern.find('D') != std::string::npos) {
    std::vector<int64_t> gdn_lengths;
    for (int64_t S : {cfg.seq / 4, cfg.seq / 2, cfg.seq})
      if (S >= P) gdn_lengths.push_back(S);
    wrong_total += bench_cp_gdn(ctx, gdn_lengths);
  }
  print_verdict("bench cp", int(std::min<int64_t>(wrong_total, 1 << 30)), cfg.csv);
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace ctxpar
