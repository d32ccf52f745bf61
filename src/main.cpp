// ctxpar <mode> [--config F] [key=value | --key=value | --key value ...]
// The only file that names MPI_COMM_WORLD. Order: MPI → parse (rank 0 reads the file, every
// rank parses the same text) → validate on every rank before any allocation (settings, mesh,
// mode, the run's files, memory) → lock the outputs → trace → mode.
// Bad input: one message on rank 0 (stderr), exit code 2 on every rank, no file created or
// changed. Exit codes: core/error.hpp (0 complete, 1 bug, 2 bad input, 3 fault, 128+N signal N).
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/log.hpp"
#include "core/watchdog.hpp"
#include "dist/comm_mpi.hpp"
#include "dist/topology.hpp"
#include "io/output_lock.hpp"
#include "modes/device_run.hpp"
#include "modes/modes.hpp"
#include "modes/run_files.hpp"
#include "trace/trace.hpp"

using namespace ctxpar;

namespace {

struct Cli {
  std::string mode, bench, config_path;
  std::vector<std::string> overrides;
  bool help = false, print_config = false, dry_run = false;
};

template <int (*Bench)(BenchContext&)> int run_bench(const Config& cfg, Topology& topo, Tracer& tracer) {
  BenchContext ctx{cfg, topo, tracer};
  return Bench(ctx);
}
// The mode table: every `ctxpar <mode>` and `ctxpar bench <name>` is one row here, with its run,
// its own checks and its --dry-run lines (modes/modes.hpp).
//   mode, bench, run, validate, plan, memory, scan, needs_peak, attention_workload, cuda
const ModeRow kModeTable[] = {
    {Mode::run, Bench::none, run_default, nullptr, nullptr, workload_memory, nullptr, false, true, true},
    {Mode::attn, Bench::none, run_attn_mode, validate_attn_mode, nullptr, attn_memory, scan_attn_inputs, false, true, true},
    {Mode::train, Bench::none, run_train, validate_train_mode, train_plan, train_memory, scan_train_inputs, true, false, true},
    {Mode::prefill, Bench::none, run_infer, validate_infer_mode, infer_plan, infer_memory, scan_infer_inputs, false, false,true},
    {Mode::decode, Bench::none, run_infer, validate_infer_mode, infer_plan, infer_memory, scan_infer_inputs, false, false,true},
    {Mode::chat, Bench::none, run_infer, validate_infer_mode, infer_plan, infer_memory, scan_infer_inputs, false, false,true},
    {Mode::bench, Bench::comm, run_bench<bench_comm>, nullptr, nullptr, bench_comm_memory, nullptr, false, false, false},
    {Mode::bench, Bench::attn, run_bench<bench_attn>, nullptr, nullptr, bench_attn_memory, nullptr, false, false, true},
    {Mode::bench, Bench::cp, run_bench<bench_cp>, nullptr, nullptr, workload_memory, nullptr, false, true, true},
    {Mode::bench, Bench::train, run_bench<bench_train>, validate_train_mode, train_plan, train_memory, scan_train_inputs, true, false, true},
    {Mode::bench, Bench::peak, run_bench<bench_peak>, nullptr, nullptr, nullptr, nullptr, false, false, false},
    {Mode::bench, Bench::infer, run_bench<bench_infer>, validate_infer_mode, infer_plan, infer_memory, scan_infer_inputs, false, false, true},
    {Mode::predict, Bench::none, run_predict, validate_predict_mode, nullptr, nullptr, nullptr, false, false, false},
    {Mode::bench, Bench::calibrate, run_bench<bench_calibrate>, validate_calibrate, nullptr, calibrate_memory, nullptr, false, false, false},
};

// The row of `ctxpar <mode> [<bench>]` (names as typed), or null.
const ModeRow* find_mode(const std::string& mode, const std::string& bench) {
  for (const ModeRow& m : kModeTable)
    if (mode == name_of(m.mode) && bench == name_of(m.bench)) return &m;
  return nullptr;
}

std::string names(bool benches) {
  std::string out;
  for (const ModeRow& m : kModeTable) {
    const std::string n = benches ? name_of(m.bench) : name_of(m.mode);
    if ((m.mode == Mode::bench) != benches || out.find(n) != std::string::npos) continue;
    out += (out.empty() ? "" : ", ") + n;
  }
  return benches ? out : out + ", bench";
}

bool is_bool_field(const std::string& key) {
  for (const Field& f : config_fields())
    if (f.name == key) return std::holds_alternative<bool Config::*>(f.member);
  return false;
}

// Splits argv into mode, flags and key=value overrides; throws UsageError.
Cli parse_cli(int argc, char** argv) {
  Cli c;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") { c.help = true; continue; }
    if (a == "--print-config") { c.print_config = true; continue; }
    if (a == "--dry-run") { c.dry_run = true; continue; }
    if (a == "--config" || a.rfind("--config=", 0) == 0) {
      if (a == "--config") {
        if (i + 1 >= args.size()) throw UsageError("--config needs a file name (e.g. --config inputs/default.toml)");
        c.config_path = args[++i];
      } else {
        c.config_path = a.substr(9);
      }
      if (c.config_path.empty()) throw UsageError("--config needs a file name (e.g. --config inputs/default.toml); got an empty one");
      continue;
    }
    if (a.find('=') != std::string::npos) { c.overrides.push_back(a); continue; }
    if (a.rfind("--", 0) == 0) {
      const std::string key = a.substr(2);
      if (is_bool_field(key)) { c.overrides.push_back(key + "=true"); continue; }
      if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
        c.overrides.push_back(key + "=" + args[++i]);
        continue;
      }
      c.overrides.push_back(a);  // parse_config reports the missing value / unknown key
      continue;
    }
    if (c.mode.empty()) { c.mode = a; continue; }
    if (c.mode == "bench" && c.bench.empty()) { c.bench = a; continue; }
    throw UsageError("unexpected argument '" + a + "'; options are key=value or --key=value (ctxpar --help)");
  }
  if (c.help) return c;
  if (c.mode.empty()) throw UsageError("no mode given; valid modes: " + names(false) + " (ctxpar --help)");
  if (c.mode == "bench" && !find_mode(c.mode, c.bench))
    throw UsageError("bench needs one of: " + names(true) + (c.bench.empty() ? "" : " (got '" + c.bench + "')"));
  if (!find_mode(c.mode, c.bench)) throw UsageError("unknown mode '" + c.mode + "'; valid modes: " + names(false));
  return c;
}

// Rank 0 reads the config file; every rank gets its text (or the read error).
std::string read_config_text(Comm& world, const std::string& path, std::string& error) {
  std::string text;
  if (world.rank() == 0 && !path.empty()) {
    std::error_code ec;
    std::ifstream f;
    if (!std::filesystem::is_regular_file(path, ec))
      error = "config: --config '" + path + "' is " + (std::filesystem::exists(path, ec) ? "not a regular file" : "missing") +
              "; valid: a readable TOML file such as inputs/default.toml";
    else if (f.open(path); !f)
      error = "config: cannot read --config file '" + path + "'; valid: a readable TOML file such as inputs/default.toml";
    else {
      std::stringstream ss;
      ss << f.rdbuf();
      text = ss.str();
    }
  }
  error = agree_on_error(world, error);
  int64_t n = int64_t(text.size());
  world.broadcast(std::span<int64_t>(&n, 1), 0);
  text.resize(size_t(n));
  world.broadcast(std::span<uint8_t>(reinterpret_cast<uint8_t*>(text.data()), text.size()), 0);
  return text;
}

// The start-up's watchdog, from before MPI_Init until the trace's own watchdog runs: a rank
// stopped or stuck at start-up (MPI_Init, the validation's collectives) ends the job too, exit 3.
// Its limit: watchdog_s of the command line until the configuration file is read, then the
// configuration's (0: off).
std::atomic<bool> g_mpi_ready{false};
void start_startup_watchdog(Watchdog& w, int argc, char** argv) {
  double limit = 600;
  try {
    limit = parse_config("", "(command line)", parse_cli(argc, argv).overrides).watchdog_s;
  } catch (const UsageError&) {
    // the real parse reports it, on rank 0
  }
  w.start(limit, [](int32_t) { return "start-up (MPI_Init, checking the settings and files)"; },
          [](const std::string& line) {
            if (g_mpi_ready) fail_run(line + "; a rank may be stopped, slow or stuck");
            // Before MPI is up there is no MPI_Abort: leaving is what ends the job.
            std::fprintf(stderr, "ctxpar: %s; a rank may be stopped, slow or stuck\n", line.c_str());
            std::fflush(stderr);
            std::_Exit(kExitFault);
          });
}

int run(int argc, char** argv, Comm& world, Watchdog& startup) {
  Cli cli;
  Config cfg;
  const ModeRow* row = nullptr;
  std::unique_ptr<Topology> topo;
  std::vector<RunFile> files;
  // ---- parse and validate: identical on every rank; nothing allocated, nothing written -------
  try {
    std::string err;
    cli = parse_cli(argc, argv);
    if (cli.help) {
      log0("%s", help_text().c_str());
      return 0;
    }
    const std::string text = read_config_text(world, cli.config_path, err);
    if (!err.empty()) throw UsageError(err);
    cfg = parse_config(text, cli.config_path.empty() ? "(none)" : cli.config_path, cli.overrides);
    startup.set_limit(cfg.watchdog_s);
    startup.heartbeat(0, -1, 0);
    row = find_mode(cli.mode, cli.bench);  // parse_cli checked it exists
    cfg.mode = row->mode;
    cfg.bench = row->bench;
    validate_config(cfg, world.size());
    const MeshSpec mesh = parse_mesh(cfg.mesh, world.size());
    // Record the mesh in full (the trace and printouts then never show an implicit default).
    cfg.mesh = "dp:" + std::to_string(mesh.dp) + ",tp:" + std::to_string(mesh.tp) + ",ulysses:" +
               std::to_string(mesh.ulysses) + ",ring:" + std::to_string(mesh.ring);
    topo = Topology::create(world, mesh);
    for (const std::string& w : placement_warnings(*topo)) err0("# warning: %s\n", w.c_str());
    err = agree_on_error(world, resolve_auto_strategy(cfg, *topo));
    if (!err.empty()) throw UsageError(err);
    err = agree_on_error(world, validate_mode(cfg, *topo, *row));
    if (!err.empty()) throw UsageError(err);
    startup.heartbeat(0, -1, 0);
    // The files of the run (--print-config shows settings only; job scripts call it without the
    // run's own out=).
    files = run_files(cfg, cli.config_path);
    err = agree_on_error(world, world.rank() == 0 && !cli.print_config ? check_run_files(files, cfg) : "");
    if (!err.empty()) throw UsageError(err);
    if (!cli.dry_run && !cli.print_config) {
      err = agree_on_error(world, check_memory(cfg, *topo, *row));
      if (!err.empty()) throw UsageError(err);
      startup.heartbeat(0, -1, 0);
      // Last, as they may read gigabytes: the values of the input files (NaN/Inf, token ids).
      err = agree_on_error(world, row->scan ? row->scan(cfg, *topo) : "");
      if (!err.empty()) throw UsageError(err);
      startup.heartbeat(0, -1, 0);
    }
  } catch (const UsageError& e) {
    err0("ctxpar: error: %s\n", e.what());
    return kExitUsage;
  }
  // Threads per rank: the config, else OMP_NUM_THREADS, else this node's cores shared evenly by
  // its ranks (the OpenMP default would give every rank all cores and oversubscribe them).
  if (cfg.threads > 0) omp_set_num_threads(int(cfg.threads));
  else if (!std::getenv("OMP_NUM_THREADS")) omp_set_num_threads(std::max(1, omp_get_num_procs() / topo->local_size()));
  // A rank bound to fewer CPUs than its threads (mpirun binds to one core by default for small
  // jobs) runs them time-sliced: every rate then halves or worse. Say so rather than print it.
  if (omp_get_max_threads() > omp_get_num_procs())
    err0("# warning: %d OpenMP threads per rank but rank 0 may run on only %d CPU(s) (its affinity); "
         "use mpirun --bind-to none or --map-by slot:PE=%d\n",
         omp_get_max_threads(), omp_get_num_procs(), omp_get_max_threads());
  if (cli.print_config) {
    log0("%s", config_listing(cfg).c_str());
    return 0;
  }
  if (cli.dry_run) {
    log0("%s", dry_run_plan(cfg, *topo, *row).c_str());
    return 0;
  }

  // Every output is locked before any file is created; a second job on one of them stops here.
  OutputLocks locks;
  {
    std::string err;
    if (world.rank() == 0) {
      err = lock_run_outputs(files, cfg, locks);
      if (err.empty()) err = check_run_files(files, cfg);  // again, now that no one else can change them
    }
    err = agree_on_error(world, err);
    if (!err.empty()) {
      locks.abandon();  // nothing left behind, not even the directories the locks made
      err0("ctxpar: error: %s\n", err.c_str());
      return kExitUsage;
    }
    for (const std::string& f : locks.unlocked())
      err0("# warning: the file system of %s keeps no locks: a second job on it would not be stopped\n", f.c_str());
  }

  install_stop_signals();
  int rc = 0;
  // Anything a mode throws is a fault of the run, not of the input (validation is over): one
  // message, the trace marked failed, exit 3 (core/error.hpp fail_run); never a backtrace.
  try {
    // MFU's peak: the CPU's measured one where the mode needs it; on the GPU its dense bf16 peak.
    const double peak = row->needs_peak                ? train_peak_flops_per_rank(cfg, *topo)
                        : cfg.device == Device::cuda ? gpu_peak_flops_per_rank(cfg, *topo)
                                                      : 0.0;
    Tracer tracer(world, cfg, *topo, trace_path(cfg), peak);
    startup.stop();  // the trace's watchdog has taken over
    try {
      rc = row->run(cfg, *topo, tracer);
    } catch (const RunFailed& e) {  // every rank at once; the trace already says failed
      err0("ctxpar: %s\n", e.what());
      rc = kExitFault;
    } catch (const std::bad_alloc&) {
      fail_run("out of memory (std::bad_alloc) in " + mode_words(cfg) + "; valid: a shorter seq, more ranks, or remat "
               "(--dry-run shows the plan's memory per rank)");
    } catch (const std::exception& e) {
      fail_run(std::string("error in ") + mode_words(cfg) + ": " + e.what());
    }
    tracer.finish(false);
    if (const int sig = tracer.stop_signal(); sig != 0 && rc == 0) {
      rc = kExitSignalBase + sig;
      err0("# TRUNCATED: %s on rank %d stopped the run after step %lld (%lld steps completed); the trace holds "
           "every completed step (status truncated); exit code %d\n",
           signal_name(sig), tracer.stop_rank(), (long long)tracer.stop_step(),
           (long long)tracer.steps_completed(), rc);
    }
  } catch (const UsageError& e) {  // the trace's own checks (its output path)
    locks.abandon();
    err0("ctxpar: error: %s\n", e.what());
    return kExitUsage;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Watchdog startup;
  start_startup_watchdog(startup, argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  Identity& id = identity();
  MPI_Comm_rank(MPI_COMM_WORLD, &id.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &id.world);
  char host[MPI_MAX_PROCESSOR_NAME];
  int n = 0;
  MPI_Get_processor_name(host, &n);
  id.host.assign(host, size_t(n));
  set_abort_hook([](int code) { MPI_Abort(MPI_COMM_WORLD, code); });
  g_mpi_ready = true;
  CTXPAR_CHECK(provided >= MPI_THREAD_MULTIPLE,
               "MPI provides thread level " << provided << " < MPI_THREAD_MULTIPLE (the watchdog needs it)");
  int rc = 0;
  {
    std::unique_ptr<Comm> world = make_mpi_comm(MPI_COMM_WORLD, "world");
    rc = run(argc, argv, *world, startup);
    // Every rank returns the same code: usage errors are agreed, bench verdicts are per job.
    int32_t worst = rc;
    world->all_reduce(std::span<int32_t>(&worst, 1), ReduceOp::max);
    rc = worst;
    startup.stop();
  }
  mem_release_cached();  // the buffers' reuse cache goes back to the C library before the exit
  MPI_Finalize();
  return rc;
}
