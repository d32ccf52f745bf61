// ctxpar <mode> [--config F] [key=value | --key=value | --key value ...]
// The only file that names MPI_COMM_WORLD. Order: MPI → parse (rank 0 reads the file, every
// rank parses the same text) → validate on every rank before any allocation (settings, mesh,
// mode, the run's files, memory) → lock the outputs → trace → mode.
// Bad input: one message on rank 0 (stderr), exit code 2 on every rank, no file created or
// changed. Exit codes: core/error.hpp (0 complete, 1 bug, 2 bad input, 3 fault, 128+N signal N).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "app/startup.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/log.hpp"
#include "core/watchdog.hpp"
#include "cp/strategy.hpp"
#include "dist/comm_mpi.hpp"
#include "dist/topology.hpp"
#include "io/output_lock.hpp"
#include "modes/device_run.hpp"
#include "modes/modes.hpp"
#include "modes/run_files.hpp"
#include "trace/trace.hpp"

using namespace ctxpar;

namespace {

// The start-up's watchdog, from before MPI_Init until the trace's own watchdog runs: a rank
// stopped or stuck at start-up (MPI_Init, the validation's collectives) ends the job too, exit 3.
// Its limit: watchdog_s of the command line until the configuration file is read, then the
// configuration's (0: off).
std::atomic<bool> g_mpi_ready{false};
void start_startup_watchdog(Watchdog& w, int argc, char** argv) {
  state_strategy_choices();  // the registry's strategy names, before the first parse (check_startup states them too)
  double limit = 600;
  try {
    limit = parse_config("", "(command line)", parse_cli(std::vector<std::string>(argv + 1, argv + argc)).overrides).watchdog_s;
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
  // ---- parse and validate: identical on every rank; nothing allocated, nothing written -------
  Startup st = check_startup(std::vector<std::string>(argv + 1, argv + argc), world, &startup);
  if (st.rc >= 0) return st.rc;
  const Cli& cli = st.cli;
  const Config& cfg = st.cfg;
  const ModeRow* row = st.row;
  std::unique_ptr<Topology>& topo = st.topo;
  const std::vector<RunFile>& files = st.files;
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

  install_stop_signals();  // again: MPI_Init may have installed handlers of its own
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
    } catch (const RunFailed& e) {  // every rank at once
      tracer.fail(e.what());         // where the thrower has not marked the trace failed (collective)
      err0("ctxpar: %s\n", e.what());
      rc = kExitFault;
    } catch (const std::bad_alloc&) {
      fail_run("out of memory (std::bad_alloc) in " + mode_words(cfg) + "; valid: a shorter seq, more ranks, or remat "
               "(--dry-run shows the plan's memory per rank)");
    } catch (const std::exception& e) {
      fail_run(std::string("error in ") + mode_words(cfg) + ": " + e.what());
    }
    try {
      tracer.finish(false);
    } catch (const RunFailed& e) {  // the trace's own file: every rank at once
      err0("ctxpar: %s\n", e.what());
      rc = kExitFault;
    }
    if (const int sig = tracer.stop_signal(); sig != 0 && rc == 0) {
      rc = kExitSignalBase + sig;
      err0("# TRUNCATED: %s stopped the run after step %lld (%lld steps completed); the trace holds "
           "every completed step (status truncated); exit code %d\n",
           tracer.stop_who().c_str(), (long long)tracer.stop_step(), (long long)tracer.steps_completed(), rc);
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
  // First: a stop signal during start-up is recorded (the run then stops after its first step;
  // predict and the benches without steps run to their end), never the default action's kill.
  install_stop_signals();
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
