// Shared driver pieces for `ctxpar bench ...`: every bench prints an nccl-tests style table —
// a two-row header (names, then units), one row per case with a correctness column, a verdict
// line — or the same rows as CSV with `--csv` (column names, units in the names).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/table.hpp"
#include "dist/comm.hpp"
#include "ops.hpp"

namespace ctxpar {

class Comm;
class Topology;
class Tracer;
struct Config;

struct BenchContext {
  const Config& cfg;
  Topology& topo;
  Tracer& tracer;
  // true: each bench case is a traced step of its own; false: the bench only adds spans to the
  // caller's current step (the default job runs the comm bench inside its warmup step).
  bool own_steps = true;
};

// Each bench returns the number of wrong results (0 = VALID); the verdict line says which.
// `ctxpar run` (run_default.cpp): the comm bench inside the warmup step, then the attention workload.
int run_default(const Config& cfg, Topology& topo, Tracer& tracer);
int bench_comm(BenchContext& ctx);
int bench_attn(BenchContext& ctx);
// Elements of `got` off the reference `want` by more than rel x max |finite want| (a correctness
// column: a CP result against the single-rank one); infinities must match exactly.
int64_t count_wrong(const float* got, const float* want, size_t n, double rel);
int bench_cp(BenchContext& ctx);
// bench_cp_gdn.cpp: the Gated DeltaNet rows of bench cp (layer_pattern with D); returns the
// number of wrong elements over all rows (summed over ranks).
int64_t bench_cp_gdn(BenchContext& ctx, const std::vector<int64_t>& lengths);
int bench_train(BenchContext& ctx);  // bench_train.cpp: training steps, MFU and time shares
int bench_peak(BenchContext& ctx);   // bench_train.cpp: the per-rank peak MFU is measured against
int bench_infer(BenchContext& ctx);  // bench_infer.cpp: pass-KV vs pass-Q TTFT, decode TTIT vs CP size

// Host bytes per rank of the benches' largest case (the memory check before a run, main.cpp).
double bench_comm_memory(const Config& cfg, Topology& topo);
double bench_attn_memory(const Config& cfg, Topology& topo);
double bench_attn_device_memory(const Config& cfg, Topology& topo);  // GPU bytes of device=cuda's largest row

// "VALID: ..." / "INVALID: N wrong" line on rank 0.
void print_verdict(const std::string& what, int wrong, bool csv);
// The run's settings every row of a bench table shares, for Table::set_context: ranks, mesh (axes
// joined by '/'), heads, kv_heads, head_dim and dtype (fp32 on the CPU, bf16 inputs on a GPU).
std::vector<std::pair<std::string, std::string>> bench_context(const Config& cfg, Topology& topo);
// The table with the run's context (bench_context), as a table or CSV (cfg.csv); rank 0 calls it.
void print_table(Table& t, BenchContext& ctx);

// The FMA-loop peak of this rank's `threads` threads (kernels/ops.hpp: the widest FMA the CPU
// has), recorded in the trace as root attributes fma_peak_flops_per_rank, fma_isa and
// fma_vector_bits. `over_ranks`: every rank measures at once and all get the smallest (min) or
// largest (max); without it each rank keeps its own.
FmaPeak measure_fma_peak(BenchContext& ctx, int threads, std::optional<ReduceOp> over_ranks = std::nullopt);

}  // namespace ctxpar
