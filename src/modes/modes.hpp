// Run modes dispatched by main.cpp. Each takes the validated config, the mesh and the tracer.
#pragma once
#include <string>

#include "core/settings.hpp"

namespace ctxpar {

struct Config;
class Topology;
class Tracer;

// One row of the mode table (main.cpp): every `ctxpar <mode>` and `ctxpar bench <name>` with its
// run, checks and --dry-run lines; nothing else dispatches on the mode.
struct ModeRow {
  Mode mode;
  Bench bench;
  int (*run)(const Config&, Topology&, Tracer&);
  std::string (*validate)(const Config&, Topology&);  // the mode's checks before any allocation (null: none)
  std::string (*plan)(const Config&, Topology&);      // the mode's lines of --dry-run (null: none)
  // Host bytes per rank at the plan's peak (null: a mode too small to matter); compared with
  // what the node has before anything is allocated (check_memory).
  double (*memory)(const Config&, Topology&);
  // GPU bytes per rank of a device=cuda run, against the GPU's free memory before anything is
  // allocated; null: the row is not built for device=cuda.
  double (*device_memory)(const Config&, Topology&);
  // The row's reads of its input files' values (NaN/Inf, token ids), every rank a share, after the
  // memory check: they may read gigabytes (null: none). Not run by --dry-run.
  std::string (*scan)(const Config&, Topology&);
  bool needs_peak;          // the trace's MFU needs this rank's peak FLOP/s
  bool attention_workload;  // runs the sharded attention workload (validated and planned by workload.hpp)
};

// Validation before any allocation (same result on every rank); "" when valid: the device, the
// attention workload (when the row has one), the row's own checks. The files of the run are
// checked by modes/run_files.hpp.
std::string validate_mode(const Config& cfg, Topology& topo, const ModeRow& row);
// "" when the row's memory plan fits what each rank may use (mem_per_rank, else the node's
// available memory shared by its ranks), else the message with the estimate, the budget and the
// largest seq that would fit. Every rank checks its own node.
std::string check_memory(const Config& cfg, Topology& topo, const ModeRow& row);
// The memory plans of the rows: the attention workload (run, attn, bench cp), train, inference.
double workload_memory(const Config& cfg, Topology& topo);
double train_memory(const Config& cfg, Topology& topo);
// device=cuda: GPU memory per rank of `ctxpar train` (the plan above on the device, the
// weights' bf16 copy and the attention's bf16 Q/K/V beside it; the host's gather for checkpoints not).
double train_device_memory(const Config& cfg, Topology& topo);
// device=cuda: host memory per rank of `ctxpar train` (its copies of the state, or the offloaded moments).
double train_host_memory_on_gpu(const Config& cfg, Topology& topo);
// prefill, decode, chat and bench infer with device=cuda: the GPU memory per rank (weights fp32 + bf16, bf16 KV cache).
double infer_device_memory(const Config& cfg, Topology& topo);
// ... and the host memory per rank beside it (the weights' fp32 copy; a checkpoint's moments while it loads).
double infer_host_memory_on_gpu(const Config& cfg, Topology& topo);
double plan_infer_memory(const Config& cfg, Topology& topo, std::string* parts = nullptr);
double infer_memory(const Config& cfg, Topology& topo);
std::string infer_plan(const Config& cfg, Topology& topo);  // the --dry-run lines of inference
// The plan printed by --dry-run (mesh, each rank's coordinates and token ranges, memory
// estimate, and the row's own lines).
std::string dry_run_plan(const Config& cfg, Topology& topo, const ModeRow& row);
// "" when `path` can be created (its nearest existing directory is writable and it is not a
// directory), else a message naming `field`. Rank 0 calls it; main agrees on the result.
std::string check_output(const std::string& path, const char* field);
// Trace file of a run: cfg.out, or out/<mode>.h5 (attn: the results go to out, the trace beside).
std::string trace_path(const Config& cfg);
// attn's result tensors: cfg.out, or out/attn_result.h5.
std::string attn_result_path(const Config& cfg);
// The profile `bench calibrate` writes (out/hardware/local.toml, or hardware=FILE.toml).
std::string calibrate_path(const Config& cfg);
// "train", "bench cp", ...: the mode as typed, words joined by `sep`.
std::string mode_words(const Config& cfg, const char* sep = " ");

// attn mode's own checks (input file datasets and shapes); "" when valid. Implemented with the mode.
std::string validate_attn_mode(const Config& cfg, Topology& topo);
std::string scan_attn_inputs(const Config& cfg, Topology& topo);  // NaN/Inf in q, k, v, do
double attn_memory(const Config& cfg, Topology& topo);            // the workload at the input file's shape
double attn_device_memory(const Config& cfg, Topology& topo);     // device=cuda: GPU bytes per rank
std::string scan_train_inputs(const Config& cfg, Topology& topo); // resume values, token ids
std::string scan_infer_inputs(const Config& cfg, Topology& topo); // resume values
double calibrate_memory(const Config& cfg, Topology& topo);       // bench calibrate at its largest shapes

// train mode's own checks (model shape vs tp, strategy with per-tp-rank heads, data file,
// resume checkpoint, dump/checkpoint paths); "" when valid. Implemented in modes/train.cpp.
std::string validate_train_mode(const Config& cfg, Topology& topo);
// Peak memory estimate per rank of `ctxpar train` (for --dry-run), bytes.
struct TrainMemoryPlan {
  double state_bytes = 0;       // params, grads, AdamW moments
  double activation_bytes = 0;  // saved activations (by remat) + backward scratch
  double strategy_bytes = 0;    // the CP strategy's transient buffers
  double gather_bytes = 0;      // rank 0: whole tensors gathered for a checkpoint or the oracle dump
  double total_bytes = 0;
};
TrainMemoryPlan plan_train_memory(const Config& cfg, Topology& topo);
std::string train_plan(const Config& cfg, Topology& topo);  // the --dry-run lines of train
// Peak FLOP/s per rank for MFU on the CPU, fixed for the machine: peak_tflops_per_rank, else one
// core's FMA-loop rate (model/flops.hpp measure_core_peak_flops) times the rank's threads. The
// run's own sgemm rate is reported beside it, never divided by (train_sgemm_flops_per_rank).
// Both measured once per process; collective.
double train_peak_flops_per_rank(const Config& cfg, Topology& topo);
double train_sgemm_flops_per_rank(Topology& topo);

int run_train(const Config& cfg, Topology& topo, Tracer& tracer);     // `ctxpar train`
// The training loop behind run_train and `bench train`: medians over the measured steps.
struct TrainSummary {
  int64_t steps = 0;
  double step_s = 0, tokens_per_s = 0, tflops_per_rank = 0, mfu = 0, peak_flops_per_rank = 0;
  double gemm_share = 0, attn_share = 0;  // of the step time, mean over ranks
  double first_loss = 0, last_loss = 0;
  bool finite = false;
};
// trace_step0: the trace's number of the first step (bench train runs two loops into one trace;
// the data and everything else follow the loop's own step numbers).
int train_loop(const Config& cfg, Topology& topo, Tracer& tracer, TrainSummary& sum, int64_t trace_step0 = 0);
int run_attn_mode(const Config& cfg, Topology& topo, Tracer& tracer); // `ctxpar attn`

// `ctxpar predict` (modes/predict.cpp): the cost model's table per strategy; its checks (hardware
// profile loads, sweep parses, partial prefill has cached tokens) run in validate_mode.
std::string validate_predict_mode(const Config& cfg, Topology& topo);
// strategy=auto: replaces cfg.strategy by the cost model's recommendation (src/perf) for this
// job's mesh, sequence, model and mode, with the `hardware` profile (default local); logs the
// predictions on rank 0. "" or a usage message (e.g. an unreadable profile). No-op otherwise.
std::string resolve_auto_strategy(Config& cfg, Topology& topo);
int run_predict(const Config& cfg, Topology& topo, Tracer& tracer);
// `ctxpar bench calibrate` (bench/bench_calibrate.cpp): writes out/hardware/local.toml.
struct BenchContext;
std::string validate_calibrate(const Config& cfg, Topology& topo);
int bench_calibrate(BenchContext& ctx);

// Inference (modes/infer.cpp): `ctxpar prefill`, `ctxpar decode`, `ctxpar chat` (cfg.mode selects).
// validate_infer_mode: mesh (CP axes only), model shape, schedule / seq / cached, strategy, resume.
std::string validate_infer_mode(const Config& cfg, Topology& topo);
int run_infer(const Config& cfg, Topology& topo, Tracer& tracer);

}  // namespace ctxpar
