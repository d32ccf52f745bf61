// `ctxpar bench comm`: nccl-tests style table for a ring send/recv, all-gather and all-to-all on
// each mesh axis of size > 1 (the world when every axis is 1). Conventions of nccl-tests
// (doc/PERFORMANCE.md): size = bytes per rank sent (sendrecv), received (all_gather, total
// output) or sent (all_to_all); algbw = size / time; busbw = algbw * factor with factor 1 for
// sendrecv and (n-1)/n for all_gather and all_to_all. time = mean over iterations, max over ranks.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "core/config.hpp"
#include "core/memory.hpp"
#include "dist/topology.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

namespace {

// Value rank `src` puts at element i of the block for rank `dst`: exact in fp32.
inline float pattern(int src, int dst, size_t i) { return float((src * 131 + dst * 7 + int(i % 1021)) % 4093); }

enum class OpKind { sendrecv, all_gather, all_to_all };
struct CommOp {
  const char* name;
  OpKind kind;
  Phase phase;
  double busbw_factor(int n) const { return kind == OpKind::sendrecv ? 1.0 : double(n - 1) / n; }
};

}  // namespace

double bench_comm_memory(const Config& cfg, Topology&) {
  // The largest size: send and receive buffers of bench_max_bytes each (bench_comm below).
  return 2.0 * double(cfg.bench_max_bytes);
}

int bench_comm(BenchContext& ctx) {
  const Config& cfg = ctx.cfg;
  std::vector<std::pair<std::string, Comm*>> groups;
  const Axis order[] = {Axis::tp, Axis::ulysses, Axis::ring, Axis::dp};
  for (Axis a : order)
    if (ctx.topo.size(a) > 1) groups.emplace_back(axis_name(a), &ctx.topo.axis(a));
  if (ctx.topo.size(Axis::ring) > 1 && ctx.topo.size(Axis::ulysses) > 1) groups.emplace_back("cp", &ctx.topo.cp());
  if (groups.empty()) groups.emplace_back("world", &ctx.topo.world());

  Table table("ctxpar bench comm — MPI over host memory, float32 elements",
                   {{"axis", "axis", "", 9, 0}, {"ranks", "ranks", "", 6, 0}, {"op", "op", "", 11, 0},
                    {"size_bytes", "size", "B", 12, 0}, {"count_elems", "count", "elems", 11, 0},
                    {"time_us", "time", "us", 11, 1}, {"algbw_gbs", "algbw", "GB/s", 9, 2},
                    {"busbw_gbs", "busbw", "GB/s", 9, 2}, {"wrong", "#wrong", "", 8, 0}},
                   {"size: bytes sent per rank (sendrecv, all_to_all) or gathered per rank (all_gather)",
                    "busbw = algbw * factor: sendrecv 1, all_gather (n-1)/n, all_to_all (n-1)/n (nccl-tests)",
                    "time: mean of " + std::to_string(cfg.bench_iters) + " iterations after 2 warmup, max over ranks"});
  const CommOp ops[] = {{"sendrecv", OpKind::sendrecv, Phase::comm_send_recv},
                        {"all_gather", OpKind::all_gather, Phase::all_gather},
                        {"all_to_all", OpKind::all_to_all, Phase::all_to_all}};
  int wrong_total = 0;
  int64_t step = 0;
  bool stop = false;
  for (auto& [gname, comm] : groups) {
    if (stop) break;
    const int n = comm->size(), r = comm->rank();
    for (const CommOp& op : ops) {
      if (stop) break;
      if (ctx.own_steps) ctx.tracer.begin_step(step);
      double t_step0 = ctx.tracer.now_us();
      for (int64_t bytes = cfg.bench_min_bytes; bytes <= cfg.bench_max_bytes; bytes *= 2) {
        // Element counts: sendrecv sends `count`; all_gather output is `count` (n blocks);
        // all_to_all sends `count` (n blocks). Round so blocks are whole.
        size_t count = size_t(bytes) / sizeof(float);
        if (op.kind != OpKind::sendrecv) count = std::max<size_t>(count / size_t(n), 1) * size_t(n);
        const size_t block = op.kind == OpKind::sendrecv ? count : count / size_t(n);
        Buffer<float> send(op.kind == OpKind::all_gather ? block : count, false);
        Buffer<float> recv(count, false);
        const int to = (r + 1) % n, from = (r - 1 + n) % n;
        for (size_t i = 0; i < send.size(); ++i) {
          const int dst = op.kind == OpKind::all_to_all ? int(i / block) : to;
          send[i] = pattern(r, dst, i % block);
        }
        auto once = [&] {
          if (op.kind == OpKind::sendrecv) {
            Request q = comm->send_recv_async(send.span(), to, recv.span(), from, 7);
            comm->wait(q);
          } else if (op.kind == OpKind::all_gather) {
            comm->all_gather(send.span(), recv.span());
          } else {
            comm->all_to_all(send.span(), recv.span());
          }
        };
        once();
        once();
        comm->barrier();
        const double t0 = comm->now();
        const double tb = ctx.tracer.now_us();
        for (int64_t it = 0; it < cfg.bench_iters; ++it) once();
        double t = (comm->now() - t0) / double(cfg.bench_iters);
        ctx.tracer.add_span(op.phase, -1, -1, tb, ctx.tracer.now_us(), 0, double(bytes) * double(cfg.bench_iters));
        comm->all_reduce(std::span<double>(&t, 1), ReduceOp::max);
        // Check what arrived.
        int32_t wrong = 0;
        for (size_t i = 0; i < recv.size(); ++i) {
          float want;
          if (op.kind == OpKind::sendrecv) want = pattern(from, r, i);
          else if (op.kind == OpKind::all_gather) want = pattern(int(i / block), (int(i / block) + 1) % n, i % block);
          else want = pattern(int(i / block), r, i % block);
          if (recv[i] != want) ++wrong;
        }
        comm->all_reduce(std::span<int32_t>(&wrong, 1), ReduceOp::sum);
        wrong_total += wrong;
        const double size_bytes = double(count) * sizeof(float);
        const double algbw = size_bytes / t / 1e9;
        table.add_row({gname, std::to_string(n), op.name, table.cell(3, size_bytes), table.cell(4, double(count)),
                       table.cell(5, t * 1e6), table.cell(6, algbw), table.cell(7, algbw * op.busbw_factor(n)),
                       std::to_string(wrong)});
      }
      if (ctx.own_steps) {
        StepRecord rec;
        rec.step = step++;
        rec.time_s = (ctx.tracer.now_us() - t_step0) * 1e-6;
        stop = ctx.tracer.end_step(rec);  // a stop signal: report what was measured so far
      }
    }
  }
  table.print(cfg.csv);
  print_verdict("bench comm", wrong_total, cfg.csv);
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace ctxpar
