#include "bench/bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <span>
#include <sstream>

#include "core/error.hpp"
#include "core/log.hpp"
#include "dist/topology.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

FmaPeak measure_fma_peak(BenchContext& ctx, int threads, std::optional<ReduceOp> over_ranks) {
  FmaPeak p = fma_peak(threads);
  if (over_ranks) ctx.topo.world().all_reduce(std::span<double>(&p.gflops, 1), *over_ranks);
  ctx.tracer.write_attr("/", "fma_peak_flops_per_rank", p.gflops * 1e9);
  ctx.tracer.write_attr("/", "fma_isa", std::string(p.isa_name));
  ctx.tracer.write_attr("/", "fma_vector_bits", int64_t(p.vector_bits));
  return p;
}

std::vector<std::pair<std::string, std::string>> bench_context(const Config& cfg, Topology& topo) {
  std::string mesh = cfg.mesh;  // recorded in full at start-up; '/' keeps it one CSV field
  std::replace(mesh.begin(), mesh.end(), ',', '/');
  return {{"ranks", std::to_string(topo.world().size())}, {"mesh", mesh}, {"heads", std::to_string(cfg.heads)},
          {"kv_heads", std::to_string(cfg.kv_heads)}, {"head_dim", std::to_string(cfg.head_dim)},
          {"dtype", cfg.device == Device::cuda ? "bf16" : "fp32"}};
}

void print_table(Table& t, BenchContext& ctx) {
  t.set_context(bench_context(ctx.cfg, ctx.topo));
  t.print(ctx.cfg.csv);
}

void print_verdict(const std::string& what, int wrong, bool csv) {
  if (csv) return;  // CSV output stays machine-readable; the exit code carries the verdict
  if (wrong == 0) log0("# VALID: %s — every checked result within tolerance\n\n", what.c_str());
  else log0("# INVALID: %s — %d wrong result(s)\n\n", what.c_str(), wrong);
}

int64_t count_wrong(const float* got, const float* want, size_t n, double rel) {
  float m = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(want[i])) m = std::max(m, std::abs(want[i]));
  int64_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool same_inf = std::isinf(want[i]) && got[i] == want[i];
    if (!same_inf && !(std::abs(got[i] - want[i]) <= rel * m)) ++wrong;
  }
  return wrong;
}

}  // namespace ctxpar
