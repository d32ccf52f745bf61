// `ctxpar bench cp` with Gated DeltaNet layers in layer_pattern: the GDN layer op (kernels/ops.hpp
// gdn_*) forward + backward on the CP group, one row per schedule (src/cp/gdn_cp.hpp: ring, scan)
// and length, on contiguous pieces. Times, bytes each rank sent (and, for the scan, its bound),
// exposed communication, throughput against this run's sgemm rate, and a correctness column:
// every rank recomputes the whole sequence with the single-rank op and counts its own rows of O,
// dQ, dK, dV, dg, dbeta that differ by more than 1e-4 x max|tensor|.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "core/config.hpp"
#include "core/log.hpp"
#include "core/memory.hpp"
#include "core/random.hpp"
#include "core/stats.hpp"
#include "cp/gdn_cp.hpp"
#include "dist/topology.hpp"
#include "model/flops.hpp"
#include "model/model.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

namespace {

constexpr double kWrongRel = 1e-4;
// Synthetic tensors of the GDN rows (distinct from the attention ones).
constexpr uint64_t kTensorGdnQ = 101, kTensorGdnK = 102, kTensorGdnV = 103, kTensorGdnG = 104, kTensorGdnB = 105,
                   kTensorGdnDout = 106;

// The op's inputs for global rows `pos`: q, k L2-normalised per head, v and dO uniform, g in
// [-0.2, 0), beta in (0.05, 0.95).
struct GdnInputs {
  Buffer<float> q, k, v, g, beta, dout, o, dq, dk, dv, dg, dbeta;
  GdnInputs(uint64_t seed, const std::vector<int64_t>& pos, int32_t H, int32_t Dk, int32_t Dv) {
    const size_t n = pos.size();
    q.resize(n * H * Dk, false), k.resize(n * H * Dk, false), v.resize(n * H * Dv, false);
    g.resize(n * H, false), beta.resize(n * H, false), dout.resize(n * H * Dv, false);
    o.resize(n * H * Dv), dq.resize(n * H * Dk), dk.resize(n * H * Dk), dv.resize(n * H * Dv);
    dg.resize(n * H), dbeta.resize(n * H);
    fill_rows(seed, kTensorGdnQ, pos, int64_t(H) * Dk, 1.0f, q.data());
    fill_rows(seed, kTensorGdnK, pos, int64_t(H) * Dk, 1.0f, k.data());
    fill_rows(seed, kTensorGdnV, pos, int64_t(H) * Dv, 1.0f, v.data());
    fill_rows(seed, kTensorGdnG, pos, H, 1.0f, g.data());
    fill_rows(seed, kTensorGdnB, pos, H, 1.0f, beta.data());
    fill_rows(seed, kTensorGdnDout, pos, int64_t(H) * Dv, 1.0f, dout.data());
    for (float* x : {q.data(), k.data()})
      for (size_t r = 0; r < n * size_t(H); ++r) {
        double s = 0;
        for (int e = 0; e < Dk; ++e) s += double(x[r * Dk + e]) * x[r * Dk + e];
        const float inv = float(1.0 / std::sqrt(s + 1e-6));
        for (int e = 0; e < Dk; ++e) x[r * Dk + e] *= inv;
      }
    for (size_t i = 0; i < n * size_t(H); ++i) {
      g[i] = -0.1f * (1.0f + g[i]);
      beta[i] = 0.5f + 0.45f * beta[i];
    }
  }
  GdnParams params(int32_t H, int32_t Dk, int32_t Dv, int32_t chunk, int64_t T) {
    GdnParams p;
    p.T = T, p.H = H, p.Dk = Dk, p.Dv = Dv, p.chunk = chunk;
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.g = g.data(), p.beta = beta.data(), p.o = o.data();
    p.d_o = dout.data(), p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data(), p.dg = dg.data(), p.dbeta = dbeta.data();
    return p;
  }
};

}  // namespace

int64_t bench_cp_gdn(BenchContext& ctx, const std::vector<int64_t>& lengths) {
  const Config& cfg = ctx.cfg;
  Topology& topo = ctx.topo;
  Comm& world = topo.world();
  Comm& cpc = topo.cp();
  const int P = cpc.size(), r = cpc.rank();
  const uint64_t seed = uint64_t(cfg.seed);
  const ModelDims d = model_dims(cfg, 1, 0);
  const int32_t H = d.gdn_H, Dk = d.gdn_Dk, Dv = d.gdn_Dv, chunk = d.gdn_chunk;
  const double sgemm = measure_sgemm_peak_flops(world);  // per rank, this run
  const double rounds = P > 1 ? std::ceil(std::log2(double(P))) : 0;
  const double scan_bound = 2 * rounds * H * double(Dk) * (Dk + Dv) * 4;

  std::vector<std::string> notes = {
      "Gated DeltaNet op (layer_pattern has D): H=" + std::to_string(H) + " Dk=" + std::to_string(Dk) +
          " Dv=" + std::to_string(Dv) + " chunk=" + std::to_string(chunk) + ", P = " + std::to_string(P) +
          " contiguous pieces, " + std::to_string(cfg.threads) + " threads/rank (0 = OpenMP default)",
      std::string("FLOP convention: ") + kFlopConvention + "; TFLOP/s per rank = model FLOPs / (time * ranks)",
      "time: median over " + std::to_string(cfg.steps) + " steps (after " + std::to_string(cfg.warmup) +
          " warmup) of the max over ranks",
      "bytes: sent per rank, forward + backward, max over ranks; bound: the scan's 2 ceil(log2 P) H Dk (Dk+Dv) 4 B",
      "sgemm: this run's large-sgemm rate per rank, " + std::to_string(sgemm / 1e9).substr(0, 7) +
          " GFLOP/s; %sgemm = (fwd+bwd) TFLOP/s per rank / that rate",
      "#wrong: elements of O, dQ, dK, dV, dg, dbeta off the single-rank op on the whole sequence by > 1e-4 * max|tensor|"};
  Table table("ctxpar bench cp — Gated DeltaNet forward + backward under CP",
                   {{"schedule", "schedule", "", 9, 0}, {"seq", "seq", "tokens", 9, 0},
                    {"fwd_ms", "fwd", "ms", 11, 1}, {"bwd_ms", "bwd", "ms", 11, 1},
                    {"bytes_kb", "bytes", "KB", 10, 1}, {"bound_kb", "bound", "KB", 10, 1},
                    {"exposed_ms", "exposed", "ms", 10, 2}, {"exposed_pct", "exposed", "%", 9, 2},
                    {"fwd_tflops", "fwd", "TFLOP/s", 10, 4}, {"bwd_tflops", "bwd", "TFLOP/s", 10, 4},
                    {"pct_sgemm", "fwd+bwd", "%sgemm", 9, 1}, {"wrong", "#wrong", "", 8, 0}},
                   notes);
  int64_t wrong_total = 0;
  for (const std::string& sched : gdn_cp_names()) {
    std::unique_ptr<GdnCp> cp = make_gdn_cp(sched);
    for (int64_t S : lengths) {
      if (ctx.tracer.stop_signal() != 0) break;
      const int64_t base = S / P, extra = S % P;
      const int64_t t0 = r * base + std::min<int64_t>(r, extra), n = base + (r < extra ? 1 : 0);
      std::vector<int64_t> pos(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = t0 + i;
      GdnInputs in(seed, pos, H, Dk, Dv);
      const std::vector<GdnParams> pieces = {in.params(H, Dk, Dv, chunk, n)};
      const GdnChain chain = GdnChain::contiguous(P);
      std::vector<double> fwd_s, bwd_s, bytes, exposed;
      for (int64_t it = 0; it < cfg.warmup + cfg.steps; ++it) {
        CpStats fst, bst;
        GdnCpContext cctx;
        world.barrier();
        const double a0 = world.now();
        cp->forward(cpc, chain, pieces, cctx, &fst);
        const double a1 = world.now();
        world.barrier();
        const double a2 = world.now();
        cp->backward(cpc, chain, pieces, cctx, &bst);
        const double a3 = world.now();
        double mx[4] = {a1 - a0, a3 - a2, fst.bytes_sent + bst.bytes_sent, fst.exposed_comm_s + bst.exposed_comm_s};
        world.all_reduce(std::span<double>(mx, 4), ReduceOp::max);
        if (it >= cfg.warmup) {
          fwd_s.push_back(mx[0]);
          bwd_s.push_back(mx[1]);
          bytes.push_back(mx[2]);
          exposed.push_back(mx[3]);
        }
      }
      if (fwd_s.empty()) break;
      // The single-rank op on the whole sequence; this rank's rows compared.
      std::vector<int64_t> all(static_cast<size_t>(S));
      for (int64_t i = 0; i < S; ++i) all[size_t(i)] = i;
      GdnInputs ref(seed, all, H, Dk, Dv);
      GdnParams rp = ref.params(H, Dk, Dv, chunk, S);
      gdn_fwd(rp);
      gdn_bwd(rp);
      int64_t wrong = 0;
      auto cmp = [&](const Buffer<float>& mine, const Buffer<float>& whole, int64_t w) {
        wrong += count_wrong(mine.data(), whole.data() + t0 * w, size_t(n * w), kWrongRel);
      };
      cmp(in.o, ref.o, int64_t(H) * Dv);
      cmp(in.dq, ref.dq, int64_t(H) * Dk);
      cmp(in.dk, ref.dk, int64_t(H) * Dk);
      cmp(in.dv, ref.dv, int64_t(H) * Dv);
      cmp(in.dg, ref.dg, H);
      cmp(in.dbeta, ref.dbeta, H);
      world.all_reduce(std::span<int64_t>(&wrong, 1), ReduceOp::sum);
      wrong_total += wrong;
      const double tf = median(fwd_s), tb = median(bwd_s), ex = median(exposed), by = median(bytes);
      const double ff = gdn_fwd_flops(double(S), H, Dk, Dv, chunk), fb = 2 * ff, ranks = double(P);
      const double rate = (ff + fb) / ((tf + tb) * ranks);
      table.add_row({sched, std::to_string(S), table.cell(2, tf * 1e3), table.cell(3, tb * 1e3), table.cell(4, by / 1e3),
                     sched == "scan" ? table.cell(5, scan_bound / 1e3) : std::string("-"), table.cell(6, ex * 1e3),
                     table.cell(7, 100.0 * ex / (tf + tb)), table.cell(8, ff / (tf * ranks) / 1e12),
                     table.cell(9, fb / (tb * ranks) / 1e12), table.cell(10, 100.0 * rate / sgemm),
                     std::to_string(wrong)});
    }
  }
  if (world.rank() == 0) print_table(table, ctx);
  return wrong_total;
}

}  // namespace ctxpar
