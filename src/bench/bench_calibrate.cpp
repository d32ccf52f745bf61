// `ctxpar bench calibrate`: measures this machine and writes the cost model's `local` profile
// (out/hardware/local.toml, which hardware=local reads first, or the path given as hardware=FILE.toml). Run it the way the
// runs it should predict are run — one OpenMP thread per rank, ranks sharing the cores:
//   OMP_NUM_THREADS=1 mpirun -np 2 ctxpar bench calibrate --config inputs/tiny.toml
// The kernels run at the configured model's shapes (dim, ffn_dim, vocab, heads, kv_heads,
// head_dim): calibrate with the model you will predict. Every rank measures at the same time (a
// barrier before each kernel) so shared memory bandwidth and caches are shared as in a real
// run; each time is the max over ranks.
//  - peak: the register-only FMA loop of one rank (the cores' ceiling);
//  - GEMM efficiency vs rows M: one layer's projections forward and backward and the LM head,
//    with the shapes model/transformer.cpp uses, against the peak;
//  - attention efficiency vs kappa (visible keys per query row of a call, 128 … 4096):
//    attn_fwd + attn_bwd of 512 query rows against kappa keys, unmasked, FLOPs by the model/flops.hpp
//    convention, each call after an untimed GEMM that displaces it from the caches; the sizes
//    interleaved over rounds, median per size; and the causal diagonal's masked-but-computed
//    keys per query row, from the kernel's own count of the pairs its tiles compute;
//  - the memory-bound parts (norms, RoPE, SwiGLU, residual adds; the cross-entropy; the
//    optimizer) as rates against the cost model's byte counts;
//  - rank jitter (the spread of the ranks' times for the same work, which every synchronization
//    waits for) and the throughput of two ranks sharing a core (oversubscribed runs);
//  - memory bandwidth: a triad over 3 x 32 MiB arrays;
//  - communication: ranks 0 and 1 exchange messages (both directions at once) of 8 B (latency)
//    and 16 MiB (bandwidth per direction); an all-to-all over every rank (its own rate: on
//    shared-memory MPI it moves bytes slower than a point-to-point exchange).
// The table lists every measured number; the profile's comments name each one's measurement.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/memory.hpp"
#include "cp/strategy.hpp"
#include "dist/comm.hpp"
#include "dist/topology.hpp"
#include "io/atomic_file.hpp"
#include "modes/modes.hpp"
#include "ops.hpp"
#include "model/model.hpp"
#include "model/transformer.hpp"
#include "perf/cost_model.hpp"
#include "perf/hardware.hpp"
#include "core/clock.hpp"

namespace ctxpar {

namespace {


// How many of the job's hosts run on rank 0's machine: hosts that report the same kernel boot id
// are network namespaces (or containers) of one machine and share its cores. 1 where the id
// cannot be read.
int hosts_sharing_this_machine(Comm& world, const std::vector<int>& node) {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  const uint64_t h = id.empty() ? uint64_t(world.rank()) + 1 : std::hash<std::string>{}(id);
  // Two exact 32-bit halves per rank (a double holds them exactly); max-reduce fills every slot.
  std::vector<double> ids(2 * size_t(world.size()), 0.0);
  ids[2 * size_t(world.rank())] = double(h >> 32);
  ids[2 * size_t(world.rank()) + 1] = double(h & 0xffffffffu);
  world.all_reduce(std::span<double>(ids), ReduceOp::max);
  std::vector<int> hosts_here;
  for (size_t r = 0; r < size_t(world.size()); ++r)
    if (ids[2 * r] == ids[0] && ids[2 * r + 1] == ids[1] &&
        std::find(hosts_here.begin(), hosts_here.end(), node[r]) == hosts_here.end())
      hosts_here.push_back(node[r]);
  return std::max<int>(1, int(hosts_here.size()));
}

// Best-of-`reps` time of fn() on every rank at once; the slowest rank's time.
template <class F>
double timed(Comm& world, int reps, F&& fn) {
  fn();  // warm up (page faults, library init)
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    world.barrier();
    const double t0 = now_s();
    fn();
    best = std::min(best, now_s() - t0);
  }
  world.all_reduce(std::span<double>(&best, 1), ReduceOp::max);
  return best;
}

// Kernels as a run calls them: once per layer between other phases that displace their data
// from the caches. `rounds` rounds, each timing every fn once after one warm-up (evict() untimed
// before each; the slowest rank's time); the median per fn over the rounds. Interleaving the sizes makes the
// machine's slow drifts (other tenants of a shared VM) hit every size alike instead of
// bending the curve; back-to-back calls with warm caches read 15-25% faster than the kernels
// inside a training step or prefill (measured with papers/local-validation).
std::vector<double> interleaved_medians(Comm& world, int rounds, const std::vector<std::function<void()>>& fns,
                                        const std::function<void()>& evict) {
  std::vector<std::vector<double>> t(fns.size());
  for (const auto& fn : fns) fn();  // warm up (page faults, packing buffers)
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < fns.size(); ++i) {
      evict();
      world.barrier();
      const double t0 = now_s();
      fns[i]();
      double dt = now_s() - t0;
      world.all_reduce(std::span<double>(&dt, 1), ReduceOp::max);
      t[i].push_back(dt);
    }
  std::vector<double> med;
  for (auto& v : t) {
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

Buffer<float> filled(size_t n, float scale) {
  Buffer<float> b(n, false);
  for (size_t i = 0; i < n; ++i) b[i] = scale * (float((i * 7) % 17) * 0.01f - 0.08f);
  return b;
}

// The GEMMs of one decoder layer of `d` at M rows, forward and backward, with the shapes and
// transposes model/transformer.cpp uses, and the LM head over M rows in its row chunks.
class LayerGemms {
 public:
  // allocate = false records the shapes only (for flops(), before committing the memory).
  LayerGemms(const ModelDims& d, int64_t M, bool allocate = true) : alloc_(allocate) {
    const int64_t dim = d.dim, qw = d.q_width(), kw = d.kv_width(), F = d.ffn_loc(), V = d.vocab;
    const int64_t C = Transformer::logits_chunk_rows(M, V);
    auto act = [&](int64_t cols) { return add(alloc_ ? filled(size_t(M * cols), 1.f) : Buffer<float>()); };
    auto wgt = [&](int64_t rows, int64_t cols) { return add(alloc_ ? filled(size_t(rows * cols), 0.1f) : Buffer<float>()); };
    float *h = act(dim), *q = act(qw), *k = act(kw), *v = act(kw), *o = act(qw), *x1 = act(dim), *g = act(F), *u = act(F),
          *m = act(F), *x = act(dim), *dx = act(dim), *dm = act(F), *dh = act(dim), *dO = act(qw), *dq = act(qw),
          *dk = act(kw), *dv = act(kw);
    float *wq = wgt(dim, qw), *wk = wgt(dim, kw), *wv = wgt(dim, kw), *wo = wgt(qw, dim), *w1 = wgt(dim, F),
          *w3 = wgt(dim, F), *w2 = wgt(F, dim), *gq = wgt(dim, qw), *gk = wgt(dim, kw), *gv = wgt(dim, kw),
          *go = wgt(qw, dim), *g1 = wgt(dim, F), *g3 = wgt(dim, F), *g2 = wgt(F, dim), *lm = wgt(dim, V), *glm = wgt(dim, V);
    float* logits = add(alloc_ ? filled(size_t(C * V), 1.f) : Buffer<float>());
    // forward
    op(false, false, M, qw, dim, h, dim, wq, qw, 0, q, qw);
    op(false, false, M, kw, dim, h, dim, wk, kw, 0, k, kw);
    op(false, false, M, kw, dim, h, dim, wv, kw, 0, v, kw);
    op(false, false, M, dim, qw, o, qw, wo, dim, 0, x1, dim);
    op(false, false, M, F, dim, h, dim, w1, F, 0, g, F);
    op(false, false, M, F, dim, h, dim, w3, F, 0, u, F);
    op(false, false, M, dim, F, m, F, w2, dim, 0, x, dim);
    // backward
    op(false, true, M, F, dim, dx, dim, w2, dim, 0, dm, F);
    op(true, false, F, dim, M, m, F, dx, dim, 1, g2, dim);
    op(false, true, M, dim, F, g, F, w1, F, 0, dh, dim);
    op(false, true, M, dim, F, u, F, w3, F, 1, dh, dim);
    op(true, false, dim, F, M, h, dim, g, F, 1, g1, F);
    op(true, false, dim, F, M, h, dim, u, F, 1, g3, F);
    op(false, true, M, qw, dim, dx, dim, wo, dim, 0, dO, qw);
    op(true, false, qw, dim, M, o, qw, dx, dim, 1, go, dim);
    op(false, true, M, dim, qw, dq, qw, wq, qw, 0, dh, dim);
    op(false, true, M, dim, kw, dk, kw, wk, kw, 1, dh, dim);
    op(false, true, M, dim, kw, dv, kw, wv, kw, 1, dh, dim);
    op(true, false, dim, qw, M, h, dim, dq, qw, 1, gq, qw);
    op(true, false, dim, kw, M, h, dim, dk, kw, 1, gk, kw);
    op(true, false, dim, kw, M, h, dim, dv, kw, 1, gv, kw);
    // LM head, chunked as the transformer fuses it with the loss
    for (int64_t r0 = 0; r0 < M; r0 += C) {
      const int64_t rows = std::min(C, M - r0);
      op(false, false, rows, V, dim, h ? h + r0 * dim : h, dim, lm, V, 0, logits, V);
      op(true, false, dim, V, rows, h ? h + r0 * dim : h, dim, logits, V, 1, glm, V);
      op(false, true, rows, dim, V, logits, V, lm, V, 0, dh ? dh + r0 * dim : dh, dim);
    }
  }
  void run() const {
    for (const G& g : ops_) sgemm(g.ta, g.tb, g.M, g.N, g.K, 1.f, g.A, g.lda, g.B, g.ldb, g.beta, g.C, g.ldc);
  }
  double flops() const {
    double f = 0;
    for (const G& g : ops_) f += 2.0 * double(g.M) * double(g.N) * double(g.K);
    return f;
  }

 private:
  struct G {
    bool ta, tb;
    int64_t M, N, K;
    const float* A;
    int64_t lda;
    const float* B;
    int64_t ldb;
    float beta;
    float* C;
    int64_t ldc;
  };
  float* add(Buffer<float>&& b) {
    if (!alloc_) return nullptr;
    bufs_.push_back(std::move(b));
    return bufs_.back().data();
  }
  void op(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
          float beta, float* C, int64_t ldc) {
    ops_.push_back({ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc});
  }
  bool alloc_;
  std::vector<Buffer<float>> bufs_;
  std::vector<G> ops_;
};

// One attention call of S_q query rows against S_k keys (positions 0.., so `causal` gives the
// causal block), forward + backward.
struct AttnBlock {
  Buffer<float> q, k, v, o, lse, dout, dq, dk, dv;
  std::vector<int64_t> qpos, kpos;
  AttnParams p;
  AttnBlock(int64_t S_q, int64_t S_k, int32_t Hq, int32_t Hkv, int32_t D, MaskKind mask, int threads)
      : q(filled(size_t(S_q * Hq * D), 1.f)), k(filled(size_t(S_k * Hkv * D), 0.6f)), v(filled(size_t(S_k * Hkv * D), 0.6f)),
        o(size_t(S_q * Hq * D)), lse(size_t(S_q * Hq)), dout(filled(size_t(S_q * Hq * D), 1.f)), dq(size_t(S_q * Hq * D)),
        dk(size_t(S_k * Hkv * D)), dv(size_t(S_k * Hkv * D)), qpos(size_t(S_q)), kpos(size_t(S_k)) {
    for (int64_t i = 0; i < S_q; ++i) qpos[size_t(i)] = i;
    for (int64_t i = 0; i < S_k; ++i) kpos[size_t(i)] = i;
    p.q = q.data(); p.k = k.data(); p.v = v.data(); p.o = o.data(); p.lse = lse.data();
    p.dout = dout.data(); p.dq = dq.data(); p.dk = dk.data(); p.dv = dv.data();
    p.S_q = S_q; p.S_k = S_k; p.H_q = Hq; p.H_kv = Hkv; p.D = D;
    p.q_pos = qpos.data(); p.k_pos = kpos.data();
    p.mask = mask;
    p.threads = threads;
  }
  void run() {
    attn_fwd(p);
    attn_bwd(p);
  }
};

// The elementwise ops of one decoder layer at M tokens, forward and backward, as
// model/transformer.cpp calls them (norms, RoPE on Q and K, residual adds, SwiGLU).
struct LayerElementwise {
  const ModelDims d;
  const int64_t M;
  Buffer<float> x, x1, h, h2, rstd, rstd2, nw, dnw, q, k, cs, sn, g, u, m, dm, dg, du, dh, dx;
  LayerElementwise(const ModelDims& dims, int64_t rows)
      : d(dims), M(rows), x(filled(size_t(M * d.dim), 1.f)), x1(filled(size_t(M * d.dim), 1.f)), h(size_t(M * d.dim)),
        h2(size_t(M * d.dim)), rstd(size_t(M)), rstd2(size_t(M)), nw(filled(size_t(d.dim), 1.f)), dnw(size_t(d.dim)),
        q(filled(size_t(M * d.q_width()), 1.f)), k(filled(size_t(M * d.kv_width()), 1.f)), cs(filled(size_t(M * d.D / 2), 1.f)),
        sn(filled(size_t(M * d.D / 2), 1.f)), g(filled(size_t(M * d.ffn_loc()), 1.f)), u(filled(size_t(M * d.ffn_loc()), 1.f)),
        m(size_t(M * d.ffn_loc())), dm(filled(size_t(M * d.ffn_loc()), 1.f)), dg(size_t(M * d.ffn_loc())),
        du(size_t(M * d.ffn_loc())), dh(filled(size_t(M * d.dim), 1.f)), dx(size_t(M * d.dim)) {}
  void run() {
    const int64_t n = M * d.dim, F = M * d.ffn_loc();
    rmsnorm_fwd(x.data(), nw.data(), h.data(), rstd.data(), M, d.dim, 1e-5f);
    rope_apply(q.data(), M, d.H_q_loc(), d.D, cs.data(), sn.data(), false);
    rope_apply(k.data(), M, d.H_kv_loc(), d.D, cs.data(), sn.data(), false);
    add_into(x1.data(), x.data(), n);
    rmsnorm_fwd(x1.data(), nw.data(), h2.data(), rstd2.data(), M, d.dim, 1e-5f);
    swiglu_fwd(g.data(), u.data(), m.data(), F);
    add_into(x.data(), x1.data(), n);
    swiglu_bwd(dm.data(), g.data(), u.data(), dg.data(), du.data(), F);
    rmsnorm_bwd(dh.data(), x1.data(), nw.data(), rstd2.data(), dx.data(), dnw.data(), M, d.dim);
    rope_apply(q.data(), M, d.H_q_loc(), d.D, cs.data(), sn.data(), true);
    rope_apply(k.data(), M, d.H_kv_loc(), d.D, cs.data(), sn.data(), true);
    rmsnorm_bwd(dh.data(), x.data(), nw.data(), rstd.data(), dx.data(), dnw.data(), M, d.dim);
  }
  static void add_into(float* y, const float* a, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] += a[i];
  }
};

// The cross-entropy (forward + gradient, in place as the transformer runs it) of M rows.
struct LossBlock {
  const int64_t M, V, C;
  Buffer<float> logits;
  std::vector<int32_t> labels;
  LossBlock(int64_t rows, int64_t vocab)
      : M(rows), V(vocab), C(Transformer::logits_chunk_rows(rows, vocab)), logits(filled(size_t(C * V), 1.f)), labels(size_t(rows)) {
    for (int64_t i = 0; i < M; ++i) labels[size_t(i)] = int32_t((i * 31) % V);
  }
  void run() {
    for (int64_t r0 = 0; r0 < M; r0 += C)
      (void)cross_entropy_fwd_bwd(logits.data(), labels.data() + r0, std::min(C, M - r0), V, 1e-3f, logits.data());
  }
};

// The optimizer step of n parameters: the gradient norm, then AdamW.
struct OptimizerBlock {
  const int64_t n;
  Buffer<float> p, g, m, v;
  explicit OptimizerBlock(int64_t count) : n(count), p(filled(size_t(n), 1.f)), g(filled(size_t(n), 1.f)), m(size_t(n)), v(size_t(n)) {}
  void run() {
    AdamWStep hp;
    hp.lr = 1e-6;
    hp.grad_scale = 1.0 / std::sqrt(sum_squares(g.data(), n) + 1.0);
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, hp);
  }
};

}  // namespace

std::string calibrate_path(const Config& cfg) {
  const std::string h = hardware_name(cfg, HardwareUse::plan);
  if (h.size() > 5 && h.compare(h.size() - 5, 5, ".toml") == 0) return h;
  if (h.empty() || h == "local") return kCalibratedProfile;  // outside the tracked tree; hardware=local reads it
  return hardware_dir() + "/" + h + ".toml";
}

double calibrate_memory(const Config& cfg, Topology& topo) {
  // Its largest pieces are a training step's: the model's parameters with gradients and AdamW
  // moments (the optimizer rate), one layer's GEMMs and the LM head at 2048 rows, attention up to
  // 4096-token blocks: priced as training the configured model with 4096 tokens per rank.
  Config c = cfg;
  c.seq = 4096 * int64_t(topo.cp().size());
  c.strategy = training_row(CommPattern::kv_ring)->name;
  c.remat = Remat::none;
  c.checkpoint_every = 0;
  c.dump_init.clear();
  return train_memory(c, topo);
}

std::string validate_calibrate(const Config& cfg, Topology& topo) {
  if (topo.world().size() < 2)
    return "bench calibrate measures communication between ranks 0 and 1 and needs ≥ 2 ranks; run e.g. "
           "OMP_NUM_THREADS=1 mpirun -np 2 ctxpar bench calibrate";
  if (cfg.heads % cfg.kv_heads != 0) return "config: heads must be a multiple of kv_heads";
  try {
    // The profile is a NAME (inputs/hardware/NAME.toml) or a PATH.toml, nothing else: a path
    // without .toml would land inside inputs/hardware.
    const std::string h = hardware_name(cfg, HardwareUse::plan);
    const bool toml = h.size() > 5 && h.compare(h.size() - 5, 5, ".toml") == 0;
    bool plain_name = !h.empty();
    for (char ch : h) plain_name = plain_name && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_');
    if (!toml && !plain_name)
      return "config: hardware = '" + h + "': bench calibrate writes a TOML profile; valid: a name of letters, digits, "
             "'-' and '_' (written to inputs/hardware/NAME.toml), or a path ending in .toml";
    (void)calibrate_path(cfg);
  } catch (const UsageError& e) {
    return std::string("config: ") + e.what();
  }
  return "";
}

namespace {

// What every calibration step reads: the job, the configured model's dimensions, the threads per
// rank and the untimed GEMM that displaces a kernel's data from the caches before each call.
struct CalibrateJob {
  BenchContext& ctx;
  Comm& world;
  const ModelDims& d;
  int threads;
  const std::function<void()>& evict;
};

// One link level between rank 0 and a peer: latency and bandwidth per direction.
struct Link {
  double lat_s = 0, bw_bps = 0;
};

// Every number bench calibrate measures: the table's rows and the profile's values.
struct Calibration {
  double peak = 0, peak_used = 0;                // FLOP/s per rank: the FMA loop, the peak the efficiencies use
  double core_fma = 0;                           // one core's FMA loop, rank 0 alone (train's MFU peak per thread)
  std::vector<double> g_rows, g_eff;             // GEMM rows M; FLOP/s until normalize_to_peak, then of peak
  double jitter = 0, shared_eff = 1;
  std::vector<double> a_keys, a_eff;             // attention kappa; FLOP/s until normalize_to_peak, then of peak
  double diag_waste_keys = 0;
  double ew_bps = 0, loss_bps = 0, opt_bps = 0;  // the memory-bound parts
  double mem_bps = 0;                            // triad, per rank
  int intra_peer = -1, inter_peer = -1;          // rank 0's first peer on its host / on another host (-1: none)
  Link intra_link, inter_link;
  int hosts = 1, hosts_sharing = 1;
  double a2a_bps = 0;
  // Across hosts only: the collectives' measured times and message size, the ring's overlap loss.
  double allreduce_meas_s = 0, allgather_meas_s = 0, alltoall_meas_s = 0, coll_mib = 0;
  double overlap_loss_s_per_byte = 0, overlap_msg_bytes = 0;
  // The level the job lacks takes the other's numbers (said in the profile's notes).
  const Link& in_host() const { return intra_peer > 0 ? intra_link : inter_link; }
  const Link& across() const { return inter_peer > 0 ? inter_link : intra_link; }
};

// GEMM efficiency vs M (rows = tokens per rank): the projections of one layer of the configured
// model, forward and backward, as model/transformer.cpp runs them, plus the LM head (skipped
// when one measurement would exceed ~40 GFLOP: larger M then reads the last measured value).
void measure_gemm_rates(const CalibrateJob& job, Calibration& cal) {
  std::vector<LayerGemms> blocks;
  for (int64_t M : {128, 512, 2048, 8192}) {
    const double flops = LayerGemms(job.d, M, false).flops();
    if (!cal.g_rows.empty() && flops > 40e9) break;
    blocks.emplace_back(job.d, M);
    cal.g_rows.push_back(double(M));
    cal.g_eff.push_back(flops);
  }
  std::vector<std::function<void()>> fns;
  for (const LayerGemms& b : blocks) fns.push_back([&b] { b.run(); });
  const std::vector<double> t = interleaved_medians(job.world, 7, fns, job.evict);
  for (size_t i = 0; i < t.size(); ++i) cal.g_eff[i] /= t[i];  // FLOP/s for now; divided by the peak in normalize_to_peak
}

// Rank jitter: one layer's GEMMs at 512 rows on every rank at once after a barrier, 61 times;
// sigma^2 = the variance of the ranks' times within a repetition (over P-1), relative to its
// mean, averaged over repetitions: the spread a synchronization point waits for.
// Two ranks on one core: then each rank runs `copies` of the same block on as many threads at
// once (twice as many busy threads as cores when ranks = cores); shared_core_eff = the
// throughput they get against the ideal of half a core each.
void measure_rank_sharing(const CalibrateJob& job, Calibration& cal) {
  Comm& world = job.world;
  const int P_ranks = world.size();
  const unsigned hw_threads = std::max(1u, std::thread::hardware_concurrency());
  const bool measure_shared = job.threads <= 1 && unsigned(P_ranks) <= hw_threads;
  const int copies = measure_shared ? int(std::max<unsigned>(2, 2 * hw_threads / unsigned(P_ranks))) : 1;
  std::vector<LayerGemms> g512;  // ~50 ms each here
  for (int i = 0; i < copies; ++i) g512.emplace_back(job.d, 512);
  {
    g512[0].run();
    std::vector<double> all(static_cast<size_t>(P_ranks), 0.0);
    double var_sum = 0;
    const int reps = 61;
    for (int r = 0; r < reps; ++r) {
      world.barrier();
      const double t0 = now_s();
      g512[0].run();
      double dt = now_s() - t0;
      world.all_gather(std::span<double>(&dt, 1), std::span<double>(all));
      double mean = 0, var = 0;
      for (double v : all) mean += v / double(P_ranks);
      for (double v : all) var += (v - mean) * (v - mean) / double(P_ranks - 1);
      var_sum += var / (mean * mean);
    }
    cal.jitter = std::sqrt(var_sum / reps);
  }
  if (measure_shared) {
    const std::vector<double> t = interleaved_medians(world, 5,
        {[&] { g512[0].run(); },
         [&] {
           std::vector<std::thread> ts;
           for (int i = 0; i < copies; ++i) ts.emplace_back([&, i] { g512[size_t(i)].run(); });
           for (std::thread& th : ts) th.join();
         }},
        [] {});
    const double ideal = t[0] * double(copies) * double(P_ranks) / double(hw_threads);
    cal.shared_eff = std::clamp(ideal / t[1], 0.05, 1.0);
  }
}

// Attention efficiency vs kappa (visible keys per query row of a call): unmasked blocks of 512
// query rows against kappa keys, forward + backward, each call after an untimed GEMM that
// displaces it from the caches; 9 interleaved rounds, median.
void measure_attn_rates(const CalibrateJob& job, Calibration& cal) {
  const Config& cfg = job.ctx.cfg;
  const int32_t Hq = int32_t(cfg.heads), Hkv = int32_t(cfg.kv_heads), D = int32_t(cfg.head_dim);
  const double flops_per_pair = attn_train_flops(1.0, Hq, D);  // forward + backward (model/flops.hpp)
  std::vector<std::unique_ptr<AttnBlock>> blocks;
  std::vector<std::function<void()>> fns;
  for (int64_t kappa : {128, 256, 512, 1024, 2048, 4096}) {
    blocks.push_back(std::make_unique<AttnBlock>(512, kappa, Hq, Hkv, D, MaskKind::none, job.threads));
    AttnBlock* b = blocks.back().get();
    fns.push_back([b] { b->run(); });
    cal.a_keys.push_back(double(kappa));
  }
  const std::vector<double> t = interleaved_medians(job.world, 9, fns, job.evict);
  for (size_t i = 0; i < t.size(); ++i) cal.a_eff.push_back(flops_per_pair * double(visible_pairs(blocks[i]->p)) / t[i]);
}

// The diagonal's waste, from the kernel's own count of the pairs it computes (every pair of
// its non-skipped tiles) on a causal block of 2048 tokens, forward and backward weighted 1 : 2.5.
void measure_diag_waste(const CalibrateJob& job, Calibration& cal) {
  const Config& cfg = job.ctx.cfg;
  const int32_t Hq = int32_t(cfg.heads), Hkv = int32_t(cfg.kv_heads), D = int32_t(cfg.head_dim);
  const int64_t b = 2048;
  AttnBlock blk(b, b, Hq, Hkv, D, MaskKind::causal, job.threads);
  AttnStats st_f, st_b;
  blk.p.stats = &st_f;
  attn_fwd(blk.p);
  blk.p.stats = &st_b;
  attn_bwd(blk.p);
  const double vis = double(visible_pairs(blk.p)) * Hq;  // stats count (query head, key) pairs
  cal.diag_waste_keys = std::max(0.0, ((double(st_f.pairs_computed) - vis) + kAttnBwdFactor * (double(st_b.pairs_computed) - vis)) /
                                          (1 + kAttnBwdFactor) /
                                          (double(b) * Hq));
}

// The memory-bound parts, each against the cost model's byte count (perf/cost_model.hpp):
// one layer's norms, RoPE, SwiGLU and residual adds forward and backward at 2048 tokens; the
// cross-entropy of 2048 tokens over the vocabulary; AdamW (with the gradient norm) over the
// model's parameters (at most 64 Mi).
void measure_memory_bound(const CalibrateJob& job, Calibration& cal) {
  const ModelDims& d = job.d;
  const int64_t M_ew = 2048, n_opt = std::min<int64_t>(d.param_count(), int64_t(64) << 20);
  LayerElementwise ew(d, M_ew);
  LossBlock lb(M_ew, d.vocab);
  OptimizerBlock ob(n_opt);
  ModelShape one_layer = model_shape(job.ctx.cfg);
  one_layer.layers = 1;
  const std::vector<double> t_mem =
      interleaved_medians(job.world, 5, {[&] { ew.run(); }, [&] { lb.run(); }, [&] { ob.run(); }}, [] {});
  cal.ew_bps = elementwise_bytes(one_layer, 1, double(M_ew), true, 4.0) / t_mem[0];
  cal.loss_bps = loss_bytes(one_layer, double(M_ew), 4.0) / t_mem[1];
  cal.opt_bps = optimizer_bytes(double(n_opt)) / t_mem[2];
}

// The peak: the FMA loop, unless a kernel ran faster (the loop reads low when other jobs load
// the cores while it runs); efficiencies are rates over this peak, so they stay <= 1.
void normalize_to_peak(Calibration& cal) {
  cal.peak_used = cal.peak;
  for (double r : cal.g_eff) cal.peak_used = std::max(cal.peak_used, r);
  for (double r : cal.a_eff) cal.peak_used = std::max(cal.peak_used, r);
  for (double& e : cal.g_eff) e /= cal.peak_used;
  for (double& e : cal.a_eff) e /= cal.peak_used;
}

// Memory bandwidth: triad, every rank at once (per-rank share of the node's bandwidth).
void measure_triad(Comm& world, Calibration& cal) {
  const size_t n = size_t(32) << 18;  // 8 Mi floats = 32 MiB per array
  Buffer<float> A(n), B(n), C(n);
  for (size_t i = 0; i < n; ++i) B[i] = 1.f, C[i] = 2.f;
  const double t_triad = timed(world, 3, [&] {
    for (size_t i = 0; i < n; ++i) A[i] = B[i] + 0.5f * C[i];
  });
  cal.mem_bps = 3.0 * double(n) * sizeof(float) / t_triad;
}

// The pair exchanges back to back after one exchange that absorbs how far apart the two left
// the barrier (across hosts that skew reaches milliseconds); mean time per exchange.
double exchange_time(Comm& world, int peer, size_t bytes, int reps) {
  std::vector<uint8_t> s(bytes, 1), r(bytes, 0);
  const int me = world.rank();
  double per = 0;
  world.barrier();
  if (me == 0 || me == peer) {
    const int other = me == 0 ? peer : 0;
    auto once = [&] {
      Request q = world.send_recv_async(std::span<uint8_t>(s), other, std::span<uint8_t>(r), other);
      world.wait(q);
    };
    once();
    const double t0 = now_s();
    for (int i = 0; i < reps; ++i) once();
    per = (now_s() - t0) / reps;
  }
  world.all_reduce(std::span<double>(&per, 1), ReduceOp::max);
  return per;
}

// Communication between rank 0 and a peer (both directions at once, as a ring hop does), once
// for each link level the job has: a peer on rank 0's host (inside a host) and a peer on
// another host (host to host). A job on one host measures the first only, a job of one rank
// per host the second only. Then the job's hosts, and how many of them share rank 0's machine.
void measure_links(const CalibrateJob& job, Calibration& cal) {
  Comm& world = job.world;
  const std::vector<int>& node = job.ctx.topo.node_of_rank();
  for (int r = 1; r < world.size(); ++r) {
    if (node[size_t(r)] == node[0] && cal.intra_peer < 0) cal.intra_peer = r;
    if (node[size_t(r)] != node[0] && cal.inter_peer < 0) cal.inter_peer = r;
  }
  const size_t big = size_t(16) << 20;
  auto measure_link = [&](int peer) {
    Link l;
    l.lat_s = exchange_time(world, peer, 8, 20);
    l.bw_bps = rate_after_latency(double(big), exchange_time(world, peer, big, 5), l.lat_s);
    return l;
  };
  cal.intra_link = cal.intra_peer > 0 ? measure_link(cal.intra_peer) : Link{};
  cal.inter_link = cal.inter_peer > 0 ? measure_link(cal.inter_peer) : Link{};
  cal.hosts = *std::max_element(node.begin(), node.end()) + 1;
  cal.hosts_sharing = hosts_sharing_this_machine(world, node);
}

// The profile's machine: name, peak, memory bandwidth, hosts and cores, the links inside and
// across hosts (what the across-host collective fit starts from).
HardwareProfile machine_profile(const CalibrateJob& job, const Calibration& cal) {
  Comm& world = job.world;
  const int threads = job.threads, hosts = cal.hosts;
  HardwareProfile h;
  h.name = "local";
  h.measured_host = this_host();  // rank 0's, which writes the profile and compares it when reading
  h.measured_cpu = this_cpu();
  h.measured_shapes = calibrated_shapes(job.ctx.cfg);
  h.description = "this machine, measured by ctxpar bench calibrate (" + std::to_string(world.size()) +
                  " ranks x " + std::to_string(threads > 0 ? threads : 0) + " threads; 0 = OpenMP default; " +
                  std::to_string(hosts) + " host(s))";
  h.peak_fp32_flops = cal.peak_used;
  h.core_fma_flops = cal.core_fma;
  h.peak_bf16_flops = 0;
  h.default_precision = Precision::fp32;
  h.hbm_bytes_per_s = cal.mem_bps;
  h.hbm_eff = 1.0;  // measured achieved bandwidth
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // Ranks per host (block placement, as mpirun and srun place them by default); one host: every
  // rank of the job is on it.
  h.chips_per_node = hosts > 1 ? int64_t(world.size() / hosts) : 1024;
  // Hosts that are one machine (network namespaces of tests/cluster) share its cores.
  h.compute_units_per_node =
      double(std::max<int64_t>(1, int64_t(cores) / std::max(1, threads))) / double(cal.hosts_sharing);
  h.intra = {cal.in_host().bw_bps, cal.in_host().lat_s};
  h.intra_alltoall_bytes_per_s = cal.a2a_bps;
  h.inter = {cal.across().bw_bps, cal.across().lat_s};
  return h;
}

// Across hosts, each collective as the strategies run it over every rank: its node-crossing
// rate is the one that makes the cost model's formula give the measured time (bisection in log
// space; the formulas fall as the rate grows). Over TCP, MPI's collectives reach their own
// fractions of a point-to-point stream (algorithm, one NIC shared by a node's ranks).
void fit_collectives(Comm& world, HardwareProfile& h, Calibration& cal) {
  const size_t P = size_t(world.size());
  auto fit = [&](double meas_s, double HardwareProfile::*rate, auto&& model) {
    HardwareProfile probe = h;
    auto at = [&](double bps) {
      probe.*rate = bps;
      return model(probe);
    };
    double lo = 1e5, hi = 1e13;
    if (!(at(hi) < meas_s && at(lo) > meas_s)) return;  // outside what the rate can explain: default
    for (int i = 0; i < 60; ++i) {
      const double mid = std::sqrt(lo * hi);
      (at(mid) > meas_s ? lo : hi) = mid;
    }
    h.*rate = std::sqrt(lo * hi);
  };
  const int64_t n = int64_t(P), k = h.chips_per_node;
  // 4 MiB of floats per rank (all-gather) or per destination (all-to-all), less on large jobs
  // so the gathered buffers stay within 64 MiB.
  const size_t n_el = std::clamp<size_t>((size_t(16) << 20) / P, size_t(16) << 10, size_t(1) << 20);
  cal.coll_mib = double(n_el * sizeof(float)) / double(1 << 20);
  std::vector<float> grad(size_t(4) << 20, 1.0f), part(n_el, 1.0f), whole(n_el * P, 0.0f);
  cal.allreduce_meas_s = timed(world, 3, [&] { world.all_reduce(std::span<float>(grad), ReduceOp::sum); });
  fit(cal.allreduce_meas_s, &HardwareProfile::inter_collective_bytes_per_s,
      [&](const HardwareProfile& x) { return allreduce_s(x, n, k, double(grad.size()) * sizeof(float)); });
  cal.allgather_meas_s = timed(world, 3, [&] { world.all_gather(std::span<float>(part), std::span<float>(whole)); });
  fit(cal.allgather_meas_s, &HardwareProfile::inter_allgather_bytes_per_s,
      [&](const HardwareProfile& x) { return allgather_s(x, n, k, double(whole.size()) * sizeof(float)); });
  std::vector<float> a2a_in(n_el * P, 1.0f), a2a_out(n_el * P, 0.0f);
  cal.alltoall_meas_s = timed(world, 3, [&] { world.all_to_all(std::span<float>(a2a_in), std::span<float>(a2a_out)); });
  fit(cal.alltoall_meas_s, &HardwareProfile::inter_alltoall_bytes_per_s,
      [&](const HardwareProfile& x) { return alltoall_s(x, n, k, double(a2a_in.size()) * sizeof(float)); });
}

// What a ring step's transfer costs the compute across hosts: every rank runs 64 blocks of one
// layer's GEMMs at 32 rows, alone and then with a message to the next rank and from the
// previous in flight (test() between blocks, as the ring progresses its transfers), in
// alternation, 9 pairs; loss = median over pairs of (slowest rank with) - (slowest alone), per
// byte sent + received. The message is sized so the link carries it in a third of the
// compute: what remains is the cost of moving it, not the wait for the wire.
void measure_overlap_loss(const CalibrateJob& job, Calibration& cal) {
  Comm& world = job.world;
  const size_t P = size_t(world.size());
  LayerGemms work(job.d, 32);
  const int me = world.rank(), next = (me + 1) % int(P), prev = (me + int(P) - 1) % int(P);
  auto blocks = [&](Request* q) {
    for (int b = 0; b < 64; ++b) {
      work.run();
      if (q && q->pending()) world.test(*q);
    }
    if (q) world.wait(*q);
  };
  const double t_alone0 = timed(world, 1, [&] { blocks(nullptr); });
  const size_t msg = size_t(std::clamp(cal.across().bw_bps * t_alone0 / 3.0, double(64 << 10), double(4 << 20)));
  cal.overlap_msg_bytes = double(msg);
  std::vector<uint8_t> sb(msg, 1), rb(msg, 0);
  std::vector<double> loss;
  for (int rep = 0; rep < 10; ++rep) {
    const double alone = timed(world, 1, [&] { blocks(nullptr); });
    const double with = timed(world, 1, [&] {
      Request q = world.send_recv_async(std::span<uint8_t>(sb), next, std::span<uint8_t>(rb), prev);
      blocks(&q);
    });
    if (rep > 0) loss.push_back(with - alone);  // the first pair warms the connections
  }
  std::sort(loss.begin(), loss.end());
  cal.overlap_loss_s_per_byte = std::max(0.0, loss[loss.size() / 2]) / (2.0 * double(msg));
}

// Memory capacity: the machine's RAM (ranks share it; the model compares one rank's need).
double machine_ram_bytes() {
  double ram = 0;
  std::ifstream mi("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (mi >> key >> kb >> unit)
    if (key == "MemTotal:") { ram = kb * 1024; break; }
  return ram > 0 ? ram : 16e9;
}

// The profile's measured kernel and memory rates, efficiencies and capacity.
void set_measured_rates(HardwareProfile& h, const Calibration& cal) {
  h.inter_overlap_loss_s_per_byte = cal.overlap_loss_s_per_byte;
  h.gemm_eff.x = cal.g_rows;
  h.gemm_eff.eff = cal.g_eff;
  h.attn_eff.x = cal.a_keys;
  h.attn_eff.eff = cal.a_eff;
  h.attn_diag_waste_keys = cal.diag_waste_keys;
  h.elementwise_bytes_per_s = cal.ew_bps;
  h.rank_jitter = cal.jitter;
  h.shared_core_eff = cal.shared_eff;
  h.loss_bytes_per_s = cal.loss_bps;
  h.optimizer_bytes_per_s = cal.opt_bps;
  h.step_overhead_s = 0;
  h.overlap_collectives = false;  // ctxpar's CPU training reduces gradients with a blocking all-reduce
  h.hbm_bytes = machine_ram_bytes();
}

// The table: every measured number (the across-host rows only with a second host).
Table calibrate_table(const Config& cfg, const Calibration& cal, const HardwareProfile& h) {
  Table t("ctxpar bench calibrate — measured profile of this machine (max over ranks, all ranks at once)",
               {{"quantity", "quantity", "", 30, 0}, {"value", "value", "", 14, 4}, {"unit", "unit", "", 10, 0}},
               {"written to " + calibrate_path(cfg)});
  t.add_row({"fma_peak_per_rank", t.cell(1, cal.peak / 1e9), "GFLOP/s"});
  t.add_row({"peak_used", t.cell(1, cal.peak_used / 1e9), "GFLOP/s"});
  for (size_t i = 0; i < cal.g_rows.size(); ++i)
    t.add_row({"gemm_eff_M" + std::to_string(int64_t(cal.g_rows[i])), t.cell(1, cal.g_eff[i]), "of peak"});
  for (size_t i = 0; i < cal.a_keys.size(); ++i)
    t.add_row({"attn_eff_keys" + std::to_string(int64_t(cal.a_keys[i])), t.cell(1, cal.a_eff[i]), "of peak"});
  t.add_row({"attn_diag_waste_keys", t.cell(1, cal.diag_waste_keys), "keys/row"});
  t.add_row({"rank_jitter", t.cell(1, cal.jitter), "rel. std"});
  t.add_row({"shared_core_eff", t.cell(1, cal.shared_eff), "of ideal"});
  t.add_row({"elementwise_rate", t.cell(1, cal.ew_bps / 1e9), "GB/s"});
  t.add_row({"loss_rate", t.cell(1, cal.loss_bps / 1e9), "GB/s"});
  t.add_row({"optimizer_rate", t.cell(1, cal.opt_bps / 1e9), "GB/s"});
  t.add_row({"triad_bandwidth_per_rank", t.cell(1, cal.mem_bps / 1e9), "GB/s"});
  if (cal.intra_peer > 0) {
    t.add_row({"p2p_latency (inside a host)", t.cell(1, cal.intra_link.lat_s * 1e6), "us"});
    t.add_row({"p2p_bandwidth_per_dir (inside a host)", t.cell(1, cal.intra_link.bw_bps / 1e9), "GB/s"});
  }
  if (cal.inter_peer > 0) {
    t.add_row({"p2p_latency (host to host)", t.cell(1, cal.inter_link.lat_s * 1e6), "us"});
    t.add_row({"p2p_bandwidth_per_dir (host to host)", t.cell(1, cal.inter_link.bw_bps / 1e9), "GB/s"});
    t.add_row({"allreduce_16MiB (all ranks)", t.cell(1, cal.allreduce_meas_s * 1e3), "ms"});
    t.add_row({"allreduce_rate (host to host)", t.cell(1, h.inter_collective_bytes_per_s / 1e9), "GB/s"});
    t.add_row({"allgather (all ranks)", t.cell(1, cal.allgather_meas_s * 1e3), "ms"});
    t.add_row({"allgather_rate (host to host)", t.cell(1, h.inter_allgather_bytes_per_s / 1e9), "GB/s"});
    t.add_row({"alltoall (all ranks)", t.cell(1, cal.alltoall_meas_s * 1e3), "ms"});
    t.add_row({"alltoall_rate (host to host)", t.cell(1, h.inter_alltoall_bytes_per_s / 1e9), "GB/s"});
    t.add_row({"ring_overlap_loss (host to host)", t.cell(1, cal.overlap_loss_s_per_byte * 1e9), "ns/byte"});
  }
  t.add_row({"alltoall_bandwidth_per_rank", t.cell(1, cal.a2a_bps / 1e9), "GB/s"});
  return t;
}

// The wrong results: measured numbers that are not positive and finite.
int invalid_measurements(const Calibration& cal) {
  int wrong = 0;
  for (double e : cal.g_eff) wrong += !(e > 0 && std::isfinite(e));
  for (double e : cal.a_eff) wrong += !(e > 0 && std::isfinite(e));
  wrong += !(cal.mem_bps > 0 && cal.in_host().bw_bps > 0 && cal.a2a_bps > 0 && cal.in_host().lat_s > 0);
  wrong += !(cal.ew_bps > 0 && cal.loss_bps > 0 && cal.opt_bps > 0 && std::isfinite(cal.diag_waste_keys) &&
             std::isfinite(cal.jitter));
  return wrong;
}

// The profile's TOML text: notes on the run and the model's shapes, and each key's measurement.
std::string profile_text(const CalibrateJob& job, const Calibration& cal, const HardwareProfile& h) {
  const Config& cfg = job.ctx.cfg;
  const Topology& topo = job.ctx.topo;
  const ModelDims& d = job.d;
  const int32_t Hq = int32_t(cfg.heads), Hkv = int32_t(cfg.kv_heads), D = int32_t(cfg.head_dim);
  const size_t P = size_t(job.world.size());
  const int hosts = cal.hosts, hosts_sharing = cal.hosts_sharing, intra_peer = cal.intra_peer,
            inter_peer = cal.inter_peer;
  return hardware_toml(
      h,
      {"Written by `ctxpar bench calibrate` (src/bench/bench_calibrate.cpp) on " + topo.hosts()[0] + "; rerun to refresh.",
       "Peak: register-only FMA loop per rank; efficiencies are measured rates / that peak.",
       "Measured with the configured model's shapes: dim=" + std::to_string(d.dim) + " ffn_dim=" + std::to_string(d.ffn) +
           " vocab=" + std::to_string(d.vocab) + " H_q=" + std::to_string(Hq) + " H_kv=" + std::to_string(Hkv) +
           " D=" + std::to_string(D) + " (GEMMs, attention and elementwise ops run at these shapes)."},
      {{"peak_tflops_fp32", "max(FMA loop min over ranks, best measured kernel rate)"},
       {"core_fma_tflops", "one core's FMA loop, rank 0 alone: train's MFU peak per thread on this host"},
       {"hbm_tb_s", "triad over 3 x 32 MiB, all ranks at once (per-rank share)"},
       {"hbm_gb", "MemTotal of /proc/meminfo"},
       {"intra_gb_s", intra_peer > 0 ? "16 MiB exchange between ranks 0 and " + std::to_string(intra_peer) +
                                           " (one host), per direction"
                                     : std::string("no two ranks on one host: same as inter")},
       {"intra_latency_us", intra_peer > 0 ? "8 B exchange between ranks 0 and " + std::to_string(intra_peer)
                                           : std::string("no two ranks on one host: same as inter")},
       {"intra_alltoall_gb_s", "all-to-all of 4 MiB per destination over all " + std::to_string(P) +
                                   " ranks, bytes leaving a rank" + (hosts > 1 ? " (across the hosts too)" : "")},
       {"inter_gb_s", inter_peer > 0 ? "16 MiB exchange between ranks 0 (" + topo.hosts()[0] + ") and " +
                                           std::to_string(inter_peer) + " (" +
                                           topo.hosts()[size_t(inter_peer)] + "), per direction"
                                     : std::string("no second host: same as intra")},
       {"inter_latency_us", inter_peer > 0 ? "8 B exchange between ranks 0 and " + std::to_string(inter_peer)
                                           : std::string("no second host: same as intra")},
       {"inter_collective_gb_s", "all-reduce of 16 MiB over all ranks: the node-crossing rate that makes the "
                                 "cost model's all-reduce time match the measured one"},
       {"inter_allgather_gb_s", "all-gather of " + fmt_bytes(cal.coll_mib * (1 << 20)) +
                                    " per rank over all ranks, fitted as the all-reduce"},
       {"inter_alltoall_gb_s", "all-to-all of " + fmt_bytes(cal.coll_mib * (1 << 20)) +
                                   " per destination over all ranks, fitted as the all-reduce"},
       {"inter_overlap_loss_ns_per_byte",
        "ring of " + std::to_string(int64_t(cal.overlap_msg_bytes) >> 10) +
            " KiB messages (next/previous rank) while one layer's GEMMs run, test() between 64 blocks, vs "
            "the GEMMs alone: median extra time of the slowest rank per byte sent + received (9 pairs)"},
       {"chips_per_node", hosts > 1 ? std::to_string(hosts) + " hosts, ranks per host" : std::string("one host")},
       {"compute_units_per_node", hosts_sharing > 1 ? "hardware threads / threads per rank / " +
                                                            std::to_string(hosts_sharing) +
                                                            " hosts on this machine (one kernel boot id)"
                                                      : std::string("hardware threads / threads per rank")},
       {"gemm_eff_values", "one layer's projections (forward + backward) and the LM head at M rows, 7 interleaved rounds, median"},
       {"attn_eff_values", "attn_fwd+attn_bwd of 512 query rows x kappa keys, unmasked, 9 interleaved rounds, median"},
       {"attn_diag_waste_keys", "pairs the kernel computes on a causal 2048 block beyond the visible ones, per query row"},
       {"elementwise_gb_s", "one layer's norms, RoPE, SwiGLU, residual adds (fwd+bwd) at 2048 tokens, cost-model bytes"},
       {"loss_gb_s", "cross-entropy of 2048 tokens, cost-model bytes"},
       {"optimizer_gb_s", "gradient norm + AdamW over the model's parameters, cost-model bytes"},
       {"rank_jitter", "spread of the ranks' times for one layer's GEMMs at 512 rows, run at once (61 repetitions)"},
       {"shared_core_eff", "the same GEMMs on twice as many threads as cores, against half a core each"},
       {"overlap_collectives", "the CPU training loop all-reduces gradients blocking"}});
}

// Writes the profile to `path`; 1 (a wrong result, the error on stderr) where it cannot, else 0.
int write_profile(const std::string& path, const std::string& text) {
  // Written as PATH.partial and renamed when complete (io/atomic_file), as every output.
  try {
    AtomicFile out(path, /*keep_abandoned=*/false);
    std::ofstream f(out.partial_path());
    f << text;
    f.close();
    if (!f) throw std::runtime_error("cannot write '" + out.partial_path() + "'");
    out.commit();
  } catch (const std::exception& e) {
    err0("ctxpar: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int bench_calibrate(BenchContext& ctx) {
  const Config& cfg = ctx.cfg;
  Comm& world = ctx.topo.world();
  const int threads = int(cfg.threads);
  Calibration cal;
  // Peak: every rank runs the FMA loop at once; the smallest is what a rank can count on.
  cal.peak = measure_fma_peak(ctx, threads, ReduceOp::min).gflops * 1e9;
  cal.core_fma = measure_core_peak_flops(world);

  // The kernels run at the configured model's shapes, each timed call after an untimed GEMM that
  // displaces its data from the caches.
  const ModelDims d = model_dims(cfg, 1, 0);
  Buffer<float> ev_a(size_t(1) << 20), ev_b(size_t(1) << 20), ev_c(size_t(1) << 20);
  const std::function<void()> evict = [&] {
    sgemm(false, false, 1024, 1024, 1024, 1.f, ev_a.data(), 1024, ev_b.data(), 1024, 0.f, ev_c.data(), 1024);
  };
  const CalibrateJob job{ctx, world, d, threads, evict};
  measure_gemm_rates(job, cal);
  measure_rank_sharing(job, cal);
  measure_attn_rates(job, cal);
  measure_diag_waste(job, cal);
  measure_memory_bound(job, cal);
  normalize_to_peak(cal);
  measure_triad(world, cal);
  measure_links(job, cal);

  // All-to-all over every rank, as Ulysses and pass-Q run it: 4 MiB per destination; rate =
  // bytes leaving a rank per second, the convention of the cost model's alltoall_s().
  const size_t P = size_t(world.size());
  cal.a2a_bps = measure_alltoall_rate(world, size_t(4) << 20, double(P - 1) * cal.in_host().lat_s, 5);

  HardwareProfile h = machine_profile(job, cal);
  if (cal.hosts > 1) fit_collectives(world, h, cal);
  if (cal.hosts > 1) measure_overlap_loss(job, cal);
  set_measured_rates(h, cal);

  const Table t = calibrate_table(cfg, cal, h);
  int wrong = invalid_measurements(cal);
  if (world.rank() == 0) {
    t.print(cfg.csv);
    const std::string path = calibrate_path(cfg);
    const std::string text = profile_text(job, cal, h);
    const int unwritten = write_profile(path, text);
    wrong += unwritten;
    if (!unwritten) try {  // what it wrote must pass the checks every reader applies
      (void)load_hardware(path);
    } catch (const UsageError& e) {
      err0("ctxpar: bench calibrate: the profile it wrote fails its own check (a measurement out of range; "
           "rerun on a quieter machine): %s\n", e.what());
      ++wrong;
    }
  }
  world.all_reduce(std::span<int32_t>(reinterpret_cast<int32_t*>(&wrong), 1), ReduceOp::max);
  print_verdict("bench calibrate", wrong, cfg.csv);
  return wrong;
}

}  // namespace ctxpar
