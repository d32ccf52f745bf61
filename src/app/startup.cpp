// The start-up checks (startup.hpp): the mode table, the command line, and the checks of main.cpp's
// order before anything is allocated.
#include "app/startup.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/bench.hpp"
#include "core/error.hpp"
#include "cp/strategy.hpp"
#include "core/log.hpp"
#include "core/watchdog.hpp"
#include "dist/comm.hpp"
#include "ops.hpp"

namespace ctxpar {

namespace {

template <int (*Bench)(BenchContext&)> int run_bench(const Config& cfg, Topology& topo, Tracer& tracer) {
  BenchContext ctx{cfg, topo, tracer};
  return Bench(ctx);
}
// The mode table: every `ctxpar <mode>` and `ctxpar bench <name>` is one row here, with its run,
// its own checks and its --dry-run lines (modes/modes.hpp).
//   mode, bench, run, validate, plan, memory, device_memory (null: no device=cuda), scan, needs_peak,
//   attention_workload
const ModeRow kModeTable[] = {
    {Mode::run, Bench::none, run_default, nullptr, nullptr, workload_memory, attn_device_memory, nullptr, false, true},
    {Mode::attn, Bench::none, run_attn_mode, validate_attn_mode, nullptr, attn_memory, attn_device_memory,
     scan_attn_inputs, false, true},
    {Mode::train, Bench::none, run_train, validate_train_mode, train_plan, train_memory, train_device_memory,
     scan_train_inputs, true, false},
    {Mode::prefill, Bench::none, run_infer, validate_infer_mode, infer_plan, infer_memory, infer_device_memory,
     scan_infer_inputs, false, false},
    {Mode::decode, Bench::none, run_infer, validate_infer_mode, infer_plan, infer_memory, infer_device_memory,
     scan_infer_inputs, false, false},
    {Mode::chat, Bench::none, run_infer, validate_infer_mode, infer_plan, infer_memory, infer_device_memory,
     scan_infer_inputs, false, false},
    {Mode::bench, Bench::comm, run_bench<bench_comm>, nullptr, nullptr, bench_comm_memory, nullptr, nullptr, false, false},
    {Mode::bench, Bench::attn, run_bench<bench_attn>, nullptr, nullptr, bench_attn_memory, bench_attn_device_memory,
     nullptr, false, false},
    {Mode::bench, Bench::cp, run_bench<bench_cp>, nullptr, nullptr, workload_memory, attn_device_memory, nullptr, false,
     true},
    {Mode::bench, Bench::train, run_bench<bench_train>, validate_train_mode, train_plan, train_memory,
     train_device_memory, scan_train_inputs, true, false},
    {Mode::bench, Bench::peak, run_bench<bench_peak>, nullptr, nullptr, nullptr, nullptr, nullptr, false, false},
    {Mode::bench, Bench::infer, run_bench<bench_infer>, validate_infer_mode, infer_plan, infer_memory,
     infer_device_memory, scan_infer_inputs, false, false},
    {Mode::predict, Bench::none, run_predict, validate_predict_mode, nullptr, nullptr, nullptr, nullptr, false, false},
    {Mode::bench, Bench::calibrate, run_bench<bench_calibrate>, validate_calibrate, nullptr, calibrate_memory, nullptr,
     nullptr, false, false},
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

}  // namespace

// Splits argv into mode, flags and key=value overrides; throws UsageError.
Cli parse_cli(const std::vector<std::string>& args) {
  Cli c;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") { c.help = true; continue; }
    if (a == "--help-keys") { c.help_keys = true; continue; }
    if (a == "--features") { c.features = true; continue; }
    if (a == "--print-config") { c.print_config = true; continue; }
    if (a == "--dry-run") { c.dry_run = true; continue; }
    if (a == "--config" || a.rfind("--config=", 0) == 0) {
      const std::string first = c.config_path;
      if (a == "--config") {
        if (i + 1 >= args.size()) throw UsageError("--config needs a file name (e.g. --config inputs/default.toml)");
        c.config_path = args[++i];
      } else {
        c.config_path = a.substr(9);
      }
      if (c.config_path.empty()) throw UsageError("--config needs a file name (e.g. --config inputs/default.toml); got an empty one");
      // One file: a second would silently drop the first's settings.
      if (!first.empty())
        throw UsageError("--config given twice ('" + printable(first, 1) + "', then '" + printable(c.config_path, 1) +
                         "'); valid: one --config file, and key=value overrides for the rest");
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
  if ((c.help && (c.mode.empty() || (c.mode == "bench" && c.bench.empty()))) || c.help_keys || c.features) return c;
  if (c.mode.empty()) throw UsageError("no mode given; valid modes: " + names(false) + " (ctxpar --help)");
  if (c.mode == "bench" && !find_mode(c.mode, c.bench))
    throw UsageError("bench needs one of: " + names(true) + (c.bench.empty() ? "" : " (got '" + c.bench + "')"));
  if (!find_mode(c.mode, c.bench)) throw UsageError("unknown mode '" + c.mode + "'; valid modes: " + names(false));
  return c;
}

namespace {

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

// OpenMP threads per rank: `threads`, else OMP_NUM_THREADS, else this node's cores shared evenly
// by its ranks (the OpenMP default would give every rank all cores and oversubscribe them).
// Returns "" or why `threads` cannot run here: more threads than the CPUs a rank may run on are
// time-sliced, and every barrier of the kernels then waits for a descheduled thread (the audit at
// 9a771b3: threads=16 on 2 CPUs, a step 3000x slower). Set before the memory plan, which counts
// per-thread scratch.
std::string set_rank_threads(const Config& cfg, Topology& topo) {
  const int cpus = omp_get_num_procs();  // this rank's affinity
  if (cfg.threads > cpus)
    return "config: threads = " + std::to_string(cfg.threads) + " but rank " + std::to_string(topo.world().rank()) +
           " may run on only " + std::to_string(cpus) + " CPU(s) (the node's, or those the launcher bound it to); " +
           "valid: threads <= " + std::to_string(cpus) + ", threads=0 (the node's cores shared by its ranks), or " +
           "more cores per rank (mpirun --bind-to none or --map-by slot:PE=" + std::to_string(cfg.threads) +
           "; srun --cpus-per-task=" + std::to_string(cfg.threads) + ")";
  if (cfg.threads > 0) omp_set_num_threads(int(cfg.threads));
  else if (!std::getenv("OMP_NUM_THREADS")) omp_set_num_threads(std::max(1, cpus / topo.local_size()));
  // OMP_NUM_THREADS beyond the rank's CPUs (mpirun binds to one core by default for small jobs):
  // time-sliced threads make every kernel barrier wait (a step 1000x slower), as threads= would.
  if (const int t = omp_get_max_threads(); t > cpus)
    return "environment: OMP_NUM_THREADS = " + std::to_string(t) + " (threads = 0 takes it) but rank " +
           std::to_string(topo.world().rank()) + " may run on only " + std::to_string(cpus) + " CPU(s) (the node's, " +
           "or those the launcher bound it to); valid: OMP_NUM_THREADS <= " + std::to_string(cpus) + ", unset " +
           "(threads=0 then shares the node's cores among its ranks), threads=N, or more cores per rank (mpirun " +
           "--bind-to none or --map-by slot:PE=" + std::to_string(t) + "; srun --cpus-per-task=" + std::to_string(t) + ")";
  return "";
}

}  // namespace

Startup check_startup(const std::vector<std::string>& args, Comm& world, Watchdog* watchdog) {
  Startup s;
  const auto beat = [&] {
    if (watchdog) watchdog->heartbeat(0, -1, 0);
  };
  try {
    std::string err;
    state_strategy_choices();  // the registry's names, for parsing and --help
    s.cli = parse_cli(args);
    if (s.cli.help || s.cli.help_keys || s.cli.features) {  // `ctxpar MODE --help`: that mode's keys
      const std::string mode = s.cli.mode + (s.cli.bench.empty() ? "" : " " + s.cli.bench);
      log0("%s", (s.cli.help_keys ? help_keys_markdown()
                  : s.cli.help    ? help_text(mode == "bench" ? "" : mode)
                                  : strategy_features_table())
                     .c_str());
      s.rc = 0;
      return s;
    }
    const std::string text = read_config_text(world, s.cli.config_path, err);
    if (!err.empty()) throw UsageError(err);
    Config& cfg = s.cfg;
    std::vector<std::string> file_keys;
    cfg = parse_config(text, s.cli.config_path.empty() ? "(none)" : s.cli.config_path, s.cli.overrides, &file_keys);
    if (watchdog) watchdog->set_limit(cfg.watchdog_s);
    beat();
    // The CPU kernels' instruction set, when the environment forces one (CTXPAR_ISA)
    if (const std::string e = kernel_isa_error(); !e.empty()) throw UsageError("environment: " + e);
    s.row = find_mode(s.cli.mode, s.cli.bench);  // parse_cli checked it exists
    cfg.mode = s.row->mode;
    cfg.bench = s.row->bench;
    // A key the mode does not read, given on the command line: refused, naming the modes it serves.
    if (const std::string e = check_keys_for_mode(s.cli.overrides, mode_words(cfg)); !e.empty()) throw UsageError(e);
    // attn in=FILE: the file's tensors give the shape; a shape key beside it would be dropped unsaid.
    if (cfg.mode == Mode::attn && !cfg.in.empty())
      for (const std::string& o : s.cli.overrides) {
        const std::string key = override_key(o);
        if (key == "seq" || key == "heads" || key == "kv_heads" || key == "head_dim")
          throw UsageError("config: " + key + " (command line) is not read by `ctxpar attn` with in = '" + cfg.in +
                           "': the file's tensors give the sequence length and the heads (q [S, H_q, D], k [S, H_kv, "
                           "D]); valid: leave " + key + " out");
      }
    validate_config(cfg, world.size());
    const MeshSpec mesh = parse_mesh(cfg.mesh, world.size());
    // Record the mesh in full (the trace and printouts then never show an implicit default).
    cfg.mesh = "dp:" + std::to_string(mesh.dp) + ",tp:" + std::to_string(mesh.tp) + ",ulysses:" +
               std::to_string(mesh.ulysses) + ",ring:" + std::to_string(mesh.ring);
    s.topo = Topology::create(world, mesh);
    Topology& topo = *s.topo;
    for (const std::string& w : placement_warnings(topo)) err0("# warning: %s\n", w.c_str());
    err = agree_on_error(world, set_rank_threads(cfg, topo));
    if (!err.empty()) throw UsageError(err);
    err = agree_on_error(world, resolve_auto_strategy(cfg, topo));
    if (!err.empty()) throw UsageError(err);
    err = agree_on_error(world, validate_mode(cfg, topo, *s.row));
    if (!err.empty()) throw UsageError(err);
    beat();
    // The files of the run (--print-config shows settings only; job scripts call it without the
    // run's own out=).
    s.files = run_files(cfg, s.cli.config_path);
    err = agree_on_error(world, world.rank() == 0 && !s.cli.print_config ? check_run_files(s.files, cfg) : "");
    if (!err.empty()) throw UsageError(err);
    if (!s.cli.dry_run && !s.cli.print_config) {
      err = agree_on_error(world, check_memory(cfg, topo, *s.row));
      if (!err.empty()) throw UsageError(err);
      beat();
      // Last, as they may read gigabytes: the values of the input files (NaN/Inf, token ids).
      err = agree_on_error(world, s.row->scan ? s.row->scan(cfg, topo) : "");
      if (!err.empty()) throw UsageError(err);
      beat();
    }
    // A config file's keys the mode does not read are named, never dropped in silence.
    std::sort(file_keys.begin(), file_keys.end());
    if (const std::vector<std::string> unread = keys_not_read(file_keys, mode_words(cfg)); !unread.empty()) {
      std::string list;
      for (const std::string& k : unread) list += (list.empty() ? "" : ", ") + k;
      err0("# note: %s sets %s, which `ctxpar %s` does not read (a config file may serve several modes)\n",
           s.cli.config_path.c_str(), list.c_str(), mode_words(cfg).c_str());
    }
  } catch (const UsageError& e) {
    err0("ctxpar: error: %s\n", e.what());
    s.rc = kExitUsage;
  }
  return s;
}

}  // namespace ctxpar
