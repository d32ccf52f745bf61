// `ctxpar bench calibrate`: measures this machine and writes the cost model's `local` profile
// (inputs/hardware/local.toml, or the path given as hardware=FILE.toml). Run it the way the
// runs it should predict are run — one OpenMP thread per rank, ranks sharing the cores:
//   OMP_NUM_THREADS=1 mpirun -np 2 ctxpar bench calibrate heads=8 kv_heads=2 head_dim=64
// Every rank measures at the same time (a barrier before each kernel) so shared memory
// bandwidth and caches are shared as in a real run; each time is the max over ranks.
//  - peak: the register-only FMA loop of one rank (the cores' ceiling);
//  - GEMM efficiency vs rows M: the three products of a training projection (Y = X W,
//    dX = dY W^T, dW = X^T dY) with K = N = 1024, per M, against the peak;
//  - attention efficiency vs block size b (256 … 4096): attn_fwd + attn_bwd of one causal block
//    of b tokens with the configured heads / kv_heads / head_dim, FLOPs by the DESIGN.md
//    convention, each call after an untimed GEMM that displaces it from the caches (median of 7);
//  - memory bandwidth: a triad over 3 x 32 MiB arrays;
//  - communication: ranks 0 and 1 exchange messages (both directions at once) of 8 B (latency)
//    and 16 MiB (bandwidth per direction); an all-to-all over every rank (its own rate: on
//    shared-memory MPI it moves bytes slower than a point-to-point exchange).
// The table lists every measured number; the profile's comments name each one's measurement.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <span>
#include <thread>
#include <vector>

#include "bench/bench.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/memory.hpp"
#include "dist/comm.hpp"
#include "dist/topology.hpp"
#include "modes/modes.hpp"
#include "ops.hpp"
#include "perf/hardware.hpp"

namespace ctxpar {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

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

// Attention as a run calls it: once per layer between other phases that displace its data from
// the caches. Before each repetition evict() runs untimed; the slowest rank's time per
// repetition, median over `reps` (back-to-back calls with warm caches read 15-25% faster than
// the kernels run inside a training step or prefill; measured with papers/local-validation).
template <class F, class G>
double timed_cold(Comm& world, int reps, F&& fn, G&& evict) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    evict();
    world.barrier();
    const double t0 = now_s();
    fn();
    double dt = now_s() - t0;
    world.all_reduce(std::span<double>(&dt, 1), ReduceOp::max);
    t.push_back(dt);
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[size_t(reps / 2)];
}

std::string calibrate_path(const Config& cfg) {
  const std::string& h = cfg.hardware;
  if (h.size() > 5 && h.compare(h.size() - 5, 5, ".toml") == 0) return h;
  return hardware_dir() + "/" + (h.empty() ? std::string("local") : h) + ".toml";
}

}  // namespace

std::string validate_calibrate(const Config& cfg, Topology& topo) {
  if (topo.world().size() < 2)
    return "bench calibrate measures communication between ranks 0 and 1 and needs ≥ 2 ranks; run e.g. "
           "OMP_NUM_THREADS=1 mpirun -np 2 ctxpar bench calibrate";
  if (cfg.heads % cfg.kv_heads != 0) return "config: heads must be a multiple of kv_heads";
  (void)calibrate_path(cfg);
  return "";
}

int bench_calibrate(BenchContext& ctx) {
  const Config& cfg = ctx.cfg;
  Comm& world = ctx.topo.world();
  const int threads = int(cfg.threads);
  // Peak: every rank runs the FMA loop at once; the smallest is what a rank can count on.
  double peak_gflops = fma_peak_gflops(threads);
  world.all_reduce(std::span<double>(&peak_gflops, 1), ReduceOp::min);
  const double peak = peak_gflops * 1e9;

  // GEMM efficiency vs M (rows = tokens per rank).
  const int64_t K = 1024, N = 1024;
  std::vector<double> g_rows, g_eff;
  for (int64_t M : {128, 512, 2048, 8192}) {
    Buffer<float> x(size_t(M * K)), w(size_t(K * N)), y(size_t(M * N)), dx(size_t(M * K)), dw(size_t(K * N));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 13) * 0.01f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(i % 7) * 0.01f;
    const double t = timed(world, 2, [&] {
      sgemm(false, false, M, N, K, 1.f, x.data(), K, w.data(), N, 0.f, y.data(), N);   // Y = X W
      sgemm(false, true, M, K, N, 1.f, y.data(), N, w.data(), N, 0.f, dx.data(), K);   // dX = dY W^T
      sgemm(true, false, K, N, M, 1.f, x.data(), K, y.data(), N, 0.f, dw.data(), N);   // dW = X^T dY
    });
    g_rows.push_back(double(M));
    g_eff.push_back(3 * 2.0 * double(M) * N * K / t);  // FLOP/s for now; divided by the peak below
  }

  // Attention efficiency vs block size (one causal block, forward + backward), each call after
  // a 1024^3 GEMM on other data (a projection's worth of cache traffic, as between two layers'
  // attention in a run).
  Buffer<float> ev_a(size_t(1) << 20), ev_b(size_t(1) << 20), ev_c(size_t(1) << 20);
  auto evict = [&] { sgemm(false, false, 1024, 1024, 1024, 1.f, ev_a.data(), 1024, ev_b.data(), 1024, 0.f, ev_c.data(), 1024); };
  const int32_t Hq = int32_t(cfg.heads), Hkv = int32_t(cfg.kv_heads), D = int32_t(cfg.head_dim);
  std::vector<double> a_tok, a_eff;
  for (int64_t b : {256, 512, 1024, 2048, 4096}) {
    const size_t nq = size_t(b) * Hq * D, nk = size_t(b) * Hkv * D;
    Buffer<float> q(nq), k(nk), v(nk), o(nq), lse(size_t(b) * Hq), dout(nq), dq(nq), dk(nk), dv(nk);
    for (size_t i = 0; i < nq; ++i) q[i] = dout[i] = float((i * 7) % 17) * 0.01f - 0.08f;
    for (size_t i = 0; i < nk; ++i) k[i] = v[i] = float((i * 5) % 11) * 0.01f - 0.05f;
    std::vector<int64_t> pos(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) pos[size_t(i)] = i;
    AttnParams p;
    p.q = q.data(); p.k = k.data(); p.v = v.data(); p.o = o.data(); p.lse = lse.data();
    p.dout = dout.data(); p.dq = dq.data(); p.dk = dk.data(); p.dv = dv.data();
    p.S_q = p.S_k = b; p.H_q = Hq; p.H_kv = Hkv; p.D = D;
    p.q_pos = p.k_pos = pos.data();
    p.mask = MaskKind::causal;
    p.threads = threads;
    const double t = timed_cold(
        world, 7,
        [&] {
          attn_fwd(p);
          attn_bwd(p);
        },
        evict);
    const double flops = 3.5 * 4.0 * double(Hq) * D * double(visible_pairs(p));
    a_tok.push_back(double(b));
    a_eff.push_back(flops / t);
  }

  // The peak: the FMA loop, unless a kernel ran faster (the loop reads low when other jobs load
  // the cores while it runs); efficiencies are rates over this peak, so they stay <= 1.
  double peak_used = peak;
  for (double r : g_eff) peak_used = std::max(peak_used, r);
  for (double r : a_eff) peak_used = std::max(peak_used, r);
  for (double& e : g_eff) e /= peak_used;
  for (double& e : a_eff) e /= peak_used;

  // Memory bandwidth: triad, every rank at once (per-rank share of the node's bandwidth).
  const size_t n = size_t(32) << 18;  // 8 Mi floats = 32 MiB per array
  Buffer<float> A(n), B(n), C(n);
  for (size_t i = 0; i < n; ++i) B[i] = 1.f, C[i] = 2.f;
  const double t_triad = timed(world, 3, [&] {
    for (size_t i = 0; i < n; ++i) A[i] = B[i] + 0.5f * C[i];
  });
  const double mem_bps = 3.0 * double(n) * sizeof(float) / t_triad;

  // Communication between ranks 0 and 1 (both directions at once, as a ring hop does).
  auto exchange = [&](size_t bytes, int reps) {
    std::vector<uint8_t> s(bytes, 1), r(bytes, 0);
    const int me = world.rank();
    double best = 1e30;
    for (int i = 0; i < reps + 1; ++i) {
      world.barrier();
      const double t0 = now_s();
      if (me < 2) {
        Request q = world.send_recv_async(std::span<uint8_t>(s), 1 - me, std::span<uint8_t>(r), 1 - me);
        world.wait(q);
      }
      if (i > 0) best = std::min(best, now_s() - t0);
    }
    if (me >= 2) best = 0;
    world.all_reduce(std::span<double>(&best, 1), ReduceOp::max);
    return best;
  };
  const double lat_s = exchange(8, 20);
  const size_t big = size_t(16) << 20;
  const double bw_bps = double(big) / std::max(1e-9, exchange(big, 5) - lat_s);

  // All-to-all over every rank, as Ulysses and pass-Q run it: 4 MiB per destination; rate =
  // bytes leaving a rank per second, the convention of the cost model's alltoall_s().
  const size_t P = size_t(world.size());
  const double a2a_bps = measure_alltoall_rate(world, size_t(4) << 20, double(P - 1) * lat_s, 5);

  HardwareProfile h;
  h.name = "local";
  h.description = "this machine, measured by ctxpar bench calibrate (" + std::to_string(world.size()) +
                  " ranks x " + std::to_string(threads > 0 ? threads : 0) + " threads; 0 = OpenMP default)";
  h.peak_fp32_flops = peak_used;
  h.peak_bf16_flops = 0;
  h.default_precision = "fp32";
  h.hbm_bytes_per_s = mem_bps;
  h.hbm_eff = 1.0;  // measured achieved bandwidth
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  h.chips_per_node = 1024;  // every rank of a local run is on this node
  h.compute_units_per_node = std::max<int64_t>(1, int64_t(cores) / std::max(1, threads));
  h.intra = {bw_bps, lat_s};
  h.intra_alltoall_bytes_per_s = a2a_bps;
  h.inter = h.intra;  // no second node here: across-node traffic is not measured
  h.gemm_eff.x = g_rows;
  h.gemm_eff.eff = g_eff;
  h.attn_eff.x = a_tok;
  h.attn_eff.eff = a_eff;
  h.step_overhead_s = 0;
  h.overlap_collectives = false;  // ctxpar's CPU training reduces gradients with a blocking all-reduce

  // Memory capacity: the machine's RAM (ranks share it; the model compares one rank's need).
  double ram = 0;
  {
    std::ifstream mi("/proc/meminfo");
    std::string key;
    double kb = 0;
    std::string unit;
    while (mi >> key >> kb >> unit)
      if (key == "MemTotal:") { ram = kb * 1024; break; }
  }
  h.hbm_bytes = ram > 0 ? ram : 16e9;

  BenchTable t("ctxpar bench calibrate — measured profile of this machine (max over ranks, all ranks at once)",
               {{"quantity", "quantity", "", 30, 0}, {"value", "value", "", 14, 4}, {"unit", "unit", "", 10, 0}},
               {"written to " + calibrate_path(cfg)});
  t.add_row({"fma_peak_per_rank", t.cell(1, peak / 1e9), "GFLOP/s"});
  t.add_row({"peak_used", t.cell(1, peak_used / 1e9), "GFLOP/s"});
  for (size_t i = 0; i < g_rows.size(); ++i)
    t.add_row({"gemm_eff_M" + std::to_string(int64_t(g_rows[i])), t.cell(1, g_eff[i]), "of peak"});
  for (size_t i = 0; i < a_tok.size(); ++i)
    t.add_row({"attn_eff_block" + std::to_string(int64_t(a_tok[i])), t.cell(1, a_eff[i]), "of peak"});
  t.add_row({"triad_bandwidth_per_rank", t.cell(1, mem_bps / 1e9), "GB/s"});
  t.add_row({"p2p_latency", t.cell(1, lat_s * 1e6), "us"});
  t.add_row({"p2p_bandwidth_per_dir", t.cell(1, bw_bps / 1e9), "GB/s"});
  t.add_row({"alltoall_bandwidth_per_rank", t.cell(1, a2a_bps / 1e9), "GB/s"});
  int wrong = 0;
  for (double e : g_eff) wrong += !(e > 0 && std::isfinite(e));
  for (double e : a_eff) wrong += !(e > 0 && std::isfinite(e));
  wrong += !(mem_bps > 0 && bw_bps > 0 && a2a_bps > 0 && lat_s > 0);
  if (world.rank() == 0) {
    t.print(cfg.csv);
    const std::string path = calibrate_path(cfg);
    const std::string text = hardware_toml(
        h,
        {"Written by `ctxpar bench calibrate` (src/bench/bench_calibrate.cpp) on " + ctx.topo.hosts()[0] + "; rerun to refresh.",
         "Peak: register-only FMA loop per rank; efficiencies are measured rates / that peak.",
         "Heads for the attention measurement: H_q=" + std::to_string(Hq) + " H_kv=" + std::to_string(Hkv) +
             " D=" + std::to_string(D) + "; causal blocks, forward + backward."},
        {{"peak_tflops_fp32", "max(FMA loop min over ranks, best measured kernel rate)"},
         {"hbm_tb_s", "triad over 3 x 32 MiB, all ranks at once (per-rank share)"},
         {"hbm_gb", "MemTotal of /proc/meminfo"},
         {"intra_gb_s", "16 MiB exchange between ranks 0 and 1, per direction"},
         {"intra_latency_us", "8 B exchange between ranks 0 and 1"},
         {"intra_alltoall_gb_s", "all-to-all of 4 MiB per destination over all " + std::to_string(P) + " ranks, bytes leaving a rank"},
         {"inter_gb_s", "no second node: same as intra"},
         {"compute_units_per_node", "hardware threads / threads per rank"},
         {"gemm_eff_values", "Y=XW, dX=dY W^T, dW=X^T dY with K=N=1024, per M"},
         {"attn_eff_values", "attn_fwd+attn_bwd of one causal block of b tokens"},
         {"overlap_collectives", "the CPU training loop all-reduces gradients blocking"}});
    std::ofstream f(path);
    if (!f) {
      log0("ctxpar: error: cannot write %s\n", path.c_str());
      ++wrong;
    } else {
      f << text;
    }
  }
  world.all_reduce(std::span<int32_t>(reinterpret_cast<int32_t*>(&wrong), 1), ReduceOp::max);
  print_verdict("bench calibrate", wrong, cfg.csv);
  return wrong;
}

}  // namespace ctxpar
