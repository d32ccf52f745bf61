// `ctxpar bench attn`: speed of the local attention kernels (kernels/cpu) against the GEMM speed
// of the same machine in the same run, with a correctness column against kernels/ref.
//
// Rows: S = 1K, 2K, ... up to cfg.seq for the configured shape (heads, kv_heads, head_dim,
// mask, window), then fixed rows that cover the kernel's variants (D = 64, MQA, no mask, window)
// and the headline row S = 8K, H_q = 32, H_kv = 8, D = 128, causal.
// Every rank runs every row at the same time (a barrier before each measurement), as ranks
// sharing a node do in a real run; times are the mean over the timed iterations, max over ranks.
// Run with one rank per node for the kernel's own speed.
//
// Per row, the large-sgemm rate is measured right before the row (2048^3, best of 3, the rank's
// threads) so that ratios compare like with like even when the machine's load changes; the FMA
// peak (register-only loop) is measured once and named in the header.
//
// Correctness ("wrong" column: failed checks of the row, 0 = all pass):
//  - O, LSE and dQ of a sample of query rows (first, last, two inside) against the fp64
//    reference run on just those rows (a row's O, LSE and dQ depend only on that row and all
//    keys), within the tests/README.md policy (2x the naive fp32 reference's error + floor);
//  - dK and dV through identities over all rows: sum_j dV_j = sum over the group's heads and the
//    rows that see a key of dO_i (rows of P sum to 1), and sum_j dK_j = 0 (rows of dS sum to 0).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "core/config.hpp"
#include "core/memory.hpp"
#include "core/random.hpp"
#include "dist/topology.hpp"
#include "ops.hpp"
#include "ref/attn_ref.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

namespace {

struct Row {
  int64_t S;
  int32_t H_q, H_kv, D;
  MaskKind mask;
  int64_t window;
};

const char* mask_name(MaskKind m) {
  return m == MaskKind::none ? "none" : m == MaskKind::causal ? "causal" : "window";
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Large-GEMM rate of this rank (its OpenMP threads), best of 3 after one warm-up.
double sgemm_gflops() {
  const int64_t N = 2048;
  Buffer<float> a(N * N, false), b(N * N, false), c(N * N, true);
  for (int64_t i = 0; i < N * N; ++i) {
    a[i] = uniform_pm1(uint64_t(i) * 2 + 1);
    b[i] = uniform_pm1(uint64_t(i) * 2 + 2);
  }
  sgemm(false, false, N, N, N, 1.f, a.data(), N, b.data(), N, 0.f, c.data(), N);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = seconds_now();
    sgemm(false, false, N, N, N, 1.f, a.data(), N, b.data(), N, 0.f, c.data(), N);
    best = std::min(best, seconds_now() - t0);
  }
  return 2.0 * double(N) * N * N / best / 1e9;
}

double max_abs_err(const float* a, const double* ref, int64_t n) {
  double e = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(ref[i])) return std::numeric_limits<double>::infinity();
    if (std::isinf(ref[i]) || std::isinf(a[i])) {
      if (double(a[i]) != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    e = std::max(e, std::abs(double(a[i]) - ref[i]));
  }
  return e;
}

// The tests/README.md policy: fast error <= 2 x naive fp32 error + floor * 1e-6 * max(1, |ref|).
bool within_policy(const float* fast, const float* naive, const double* ref, int64_t n, double floor_factor) {
  double mag = 1;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(ref[i])) mag = std::max(mag, std::abs(ref[i]));
  const double e_naive = max_abs_err(naive, ref, n);
  if (!std::isfinite(e_naive)) return false;
  return max_abs_err(fast, ref, n) <= 2.0 * e_naive + floor_factor * 1e-6 * mag;
}

// Checks of one row (see the file comment); returns the number that failed.
int check_row(const AttnParams& p, const std::vector<int64_t>& pos) {
  const int64_t S = p.S_q;
  const int32_t H_q = p.H_q, H_kv = p.H_kv, D = p.D, group = H_q / H_kv;
  int wrong = 0;
  // --- sampled query rows against the reference
  std::vector<int64_t> rows = {0, S / 3, (2 * S) / 3 + 1, S - 1};
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const int64_t n = int64_t(rows.size()), row_elems = int64_t(H_q) * D;
  std::vector<float> q(n * row_elems), o(n * row_elems), d_o(n * row_elems), lse(n * H_q);
  std::vector<int64_t> q_pos(n);
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(p.q + rows[r] * row_elems, row_elems, q.begin() + r * row_elems);
    std::copy_n(p.o + rows[r] * row_elems, row_elems, o.begin() + r * row_elems);
    std::copy_n(p.dout + rows[r] * row_elems, row_elems, d_o.begin() + r * row_elems);
    std::copy_n(p.lse + rows[r] * H_q, H_q, lse.begin() + r * H_q);
    q_pos[r] = pos[rows[r]];
  }
  AttnParams sub = p;
  sub.S_q = n;
  sub.q_pos = q_pos.data();
  const int64_t nk = p.S_k * H_kv * D;
  const std::vector<double> q64(q.begin(), q.end()), k64(p.k, p.k + nk), v64(p.v, p.v + nk),
      o_fast64(o.begin(), o.end()), lse_fast64(lse.begin(), lse.end()), do64(d_o.begin(), d_o.end());
  std::vector<double> o64(n * row_elems), lse64(n * H_q);
  std::vector<float> o32(n * row_elems), lse32(n * H_q);
  ref::attn_fwd<double>(sub, q64.data(), k64.data(), v64.data(), o64.data(), lse64.data());
  ref::attn_fwd<float>(sub, q.data(), p.k, p.v, o32.data(), lse32.data());
  wrong += !within_policy(o.data(), o32.data(), o64.data(), n * row_elems, 1.0);
  wrong += !within_policy(lse.data(), lse32.data(), lse64.data(), n * H_q, 1.0);
  // dQ of the sampled rows: both references start from the fast forward's O and LSE, as the
  // fast backward did; dK/dV of this partial call are discarded.
  std::vector<double> dq64(n * row_elems), dk_scratch64(nk), dv_scratch64(nk);
  ref::attn_bwd<double>(sub, q64.data(), k64.data(), v64.data(), o_fast64.data(), lse_fast64.data(),
                        do64.data(), dq64.data(), dk_scratch64.data(), dv_scratch64.data());
  std::vector<float> dq32(n * row_elems), dk_scratch(nk), dv_scratch(nk), dq_fast(n * row_elems);
  ref::attn_bwd<float>(sub, q.data(), p.k, p.v, o.data(), lse.data(), d_o.data(), dq32.data(),
                       dk_scratch.data(), dv_scratch.data());
  for (int64_t r = 0; r < n; ++r) std::copy_n(p.dq + rows[r] * row_elems, row_elems, dq_fast.begin() + r * row_elems);
  wrong += !within_policy(dq_fast.data(), dq32.data(), dq64.data(), n * row_elems, 8.0);
  // --- dV and dK identities over all rows, per (kv head, d)
  std::vector<double> dv_sum(H_kv * D, 0), dv_want(H_kv * D, 0), dv_abs(H_kv * D, 0), dk_sum(H_kv * D, 0),
      dk_abs(H_kv * D, 0);
  for (int64_t j = 0; j < p.S_k; ++j)
    for (int64_t x = 0; x < H_kv * D; ++x) {
      dv_sum[x] += p.dv[j * H_kv * D + x];
      dk_sum[x] += p.dk[j * H_kv * D + x];
      dk_abs[x] += std::abs(p.dk[j * H_kv * D + x]);
    }
  for (int64_t i = 0; i < S; ++i)
    for (int32_t h = 0; h < H_q; ++h) {
      if (p.lse[i * H_q + h] == -INFINITY) continue;
      for (int32_t d = 0; d < D; ++d) {
        const float g = p.dout[(i * H_q + h) * D + d];
        dv_want[(h / group) * D + d] += g;
        dv_abs[(h / group) * D + d] += std::abs(g);
      }
    }
  int bad_dv = 0, bad_dk = 0;
  for (int64_t x = 0; x < H_kv * D; ++x) {
    // fp32 sums of S terms: a bound of a few 1e-5 relative to the sum of magnitudes
    bad_dv += std::abs(dv_sum[x] - dv_want[x]) > 1e-4 * dv_abs[x] + 1e-6;
    bad_dk += std::abs(dk_sum[x]) > 1e-4 * dk_abs[x] + 1e-6;
  }
  wrong += bad_dv > 0;
  wrong += bad_dk > 0;
  return wrong;
}

}  // namespace

int bench_attn(BenchContext& ctx) {
  const Config& cfg = ctx.cfg;
  Comm& world = ctx.topo.world();
  const int threads = cfg.threads > 0 ? int(cfg.threads) : omp_get_max_threads();

  auto parse_mask = [](const std::string& m) {
    return m == "none" ? MaskKind::none : m == "window" ? MaskKind::window : MaskKind::causal;
  };
  std::vector<Row> rows;
  const MaskKind user_mask = parse_mask(cfg.mask);
  for (int64_t S = 1024; S <= std::max<int64_t>(cfg.seq, 1024); S *= 2)
    rows.push_back({S, int32_t(cfg.heads), int32_t(cfg.kv_heads), int32_t(cfg.head_dim), user_mask, cfg.window});
  rows.push_back({4096, 32, 8, 64, MaskKind::causal, 0});    // D = 64
  rows.push_back({4096, 32, 1, 128, MaskKind::causal, 0});   // MQA
  rows.push_back({2048, 32, 8, 128, MaskKind::none, 0});     // no mask (full square)
  rows.push_back({8192, 32, 8, 128, MaskKind::window, 1024});  // sliding window
  rows.push_back({8192, 32, 8, 128, MaskKind::causal, 0});   // headline

  const double peak = fma_peak_gflops(threads);
  BenchTable table(
      "ctxpar bench attn — CPU flash attention (fp32, " + std::to_string(threads) + " threads per rank, " +
          std::to_string(world.size()) + " rank(s) running at once)",
      {{"S", "S", "tokens", 7, 0}, {"H_q", "H_q", "", 5, 0}, {"H_kv", "H_kv", "", 5, 0}, {"D", "D", "", 5, 0},
       {"mask", "mask", "", 8, 0}, {"fwd_ms", "fwd", "ms", 10, 2}, {"bwd_ms", "bwd", "ms", 10, 2},
       {"fwd_gflops", "fwd", "GFLOP/s", 9, 1}, {"bwd_gflops", "bwd", "GFLOP/s", 9, 1},
       {"sgemm_gflops", "sgemm", "GFLOP/s", 9, 1}, {"fwd_vs_sgemm", "fwd/gemm", "", 9, 2},
       {"bwd_vs_sgemm", "bwd/gemm", "", 9, 2}, {"sgemm_vs_peak", "gemm/pk", "", 8, 2},
       {"wrong", "#wrong", "", 7, 0}},
      {std::string("FLOP convention: ") + kFlopConvention,
       "fma peak (measured, register-only FMA loop, " + std::to_string(threads) + " threads): " +
           std::to_string(int(peak + 0.5)) + " GFLOP/s per rank",
       std::string("sgemm: ") + blas_name() + ", 2048^3, best of 3, measured before each row",
       "time: mean of the timed iterations after one warm-up, max over ranks; window rows: window = 1024",
       "#wrong: failed checks against kernels/ref (sampled rows: O, LSE, dQ; all rows: dK, dV sums)"});

  int wrong_total = 0;
  int64_t step = 0;
  for (const Row& row : rows) {
    ctx.tracer.begin_step(step);
    const double t_step0 = ctx.tracer.now_us();
    const int64_t S = row.S, nq = S * row.H_q * row.D, nk = S * row.H_kv * row.D;
    Buffer<float> q(nq, false), k(nk, false), v(nk, false), dout(nq, false), o(nq), lse(S * row.H_q),
        dq(nq), dk(nk), dv(nk);
    std::vector<int64_t> pos(S);
    for (int64_t i = 0; i < S; ++i) pos[i] = i;
    fill_rows(uint64_t(cfg.seed), 1, pos, row.H_q * row.D, 1.f, q.data());
    fill_rows(uint64_t(cfg.seed), 2, pos, row.H_kv * row.D, 1.f, k.data());
    fill_rows(uint64_t(cfg.seed), 3, pos, row.H_kv * row.D, 1.f, v.data());
    fill_rows(uint64_t(cfg.seed), 4, pos, row.H_q * row.D, 1.f, dout.data());
    AttnParams p;
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.o = o.data();
    p.lse = lse.data();
    p.dout = dout.data();
    p.dq = dq.data();
    p.dk = dk.data();
    p.dv = dv.data();
    p.S_q = p.S_k = S;
    p.H_q = row.H_q;
    p.H_kv = row.H_kv;
    p.D = row.D;
    p.q_pos = p.k_pos = pos.data();
    p.mask = row.mask;
    p.window = row.window;
    p.threads = threads;
    const double fwd_flops = 4.0 * double(visible_pairs(p)) * row.H_q * row.D, bwd_flops = 2.5 * fwd_flops;

    world.barrier();
    double gemm = sgemm_gflops();
    // warm-up calls (zeroed gradients) give the results that are checked
    world.barrier();
    double t0 = seconds_now();
    attn_fwd(p);
    const double fwd_warm_s = seconds_now() - t0;
    t0 = seconds_now();
    attn_bwd(p);
    const double bwd_warm_s = seconds_now() - t0;
    int32_t wrong = check_row(p, pos);
    // Timed iterations: as many as fit in ~2 s, at most bench_iters (long rows run once).
    auto iters_for = [&](double warm_s) {
      double n = std::clamp(std::floor(2.0 / std::max(warm_s, 1e-6)), 1.0, double(cfg.bench_iters));
      world.all_reduce(std::span<double>(&n, 1), ReduceOp::min);
      return int64_t(n);
    };
    const int64_t fwd_iters = iters_for(fwd_warm_s), bwd_iters = iters_for(bwd_warm_s);
    world.barrier();
    double tb = ctx.tracer.now_us();
    t0 = seconds_now();
    for (int64_t it = 0; it < fwd_iters; ++it) attn_fwd(p);
    double fwd_s = (seconds_now() - t0) / double(fwd_iters);
    ctx.tracer.add_span(Phase::attn_fwd, -1, -1, tb, ctx.tracer.now_us(), fwd_flops * double(fwd_iters));
    world.barrier();
    tb = ctx.tracer.now_us();
    t0 = seconds_now();
    for (int64_t it = 0; it < bwd_iters; ++it) attn_bwd(p);  // accumulates; values unused
    double bwd_s = (seconds_now() - t0) / double(bwd_iters);
    ctx.tracer.add_span(Phase::attn_bwd, -1, -1, tb, ctx.tracer.now_us(), bwd_flops * double(bwd_iters));

    world.all_reduce(std::span<double>(&fwd_s, 1), ReduceOp::max);
    world.all_reduce(std::span<double>(&bwd_s, 1), ReduceOp::max);
    world.all_reduce(std::span<double>(&gemm, 1), ReduceOp::min);
    world.all_reduce(std::span<int32_t>(&wrong, 1), ReduceOp::sum);
    wrong_total += wrong;
    const double fwd_gf = fwd_flops / fwd_s / 1e9, bwd_gf = bwd_flops / bwd_s / 1e9;
    table.add_row({std::to_string(S), std::to_string(row.H_q), std::to_string(row.H_kv), std::to_string(row.D),
                   mask_name(row.mask), table.cell(5, fwd_s * 1e3), table.cell(6, bwd_s * 1e3),
                   table.cell(7, fwd_gf), table.cell(8, bwd_gf), table.cell(9, gemm), table.cell(10, fwd_gf / gemm),
                   table.cell(11, bwd_gf / gemm), table.cell(12, gemm / peak), std::to_string(wrong)});
    StepRecord rec;
    rec.step = step++;
    rec.tokens = S;
    rec.model_flops = (fwd_flops + bwd_flops) * world.size();
    rec.time_s = (ctx.tracer.now_us() - t_step0) * 1e-6;
    rec.tflops_per_rank = (fwd_flops + bwd_flops) / (fwd_s + bwd_s) / 1e12;
    rec.peak_bytes = mem_peak_bytes();
    ctx.tracer.end_step(rec);
  }
  if (world.rank() == 0) table.print(cfg.csv);
  print_verdict("bench attn", wrong_total, cfg.csv);
  return wrong_total;
}

}  // namespace ctxpar
