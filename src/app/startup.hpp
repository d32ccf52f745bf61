// The program's start-up checks (main.cpp calls them; tests/cli/check_inputs.cpp runs its table
// of bad inputs through the same function in one process): the command line, the configuration
// file, the settings, the mesh, the mode's own checks, the run's files, the memory plan and the
// input files' values. Identical on every rank; nothing allocated beyond the checks themselves,
// nothing written. A refusal is one message on rank 0 (stderr) and exit code 2 on every rank.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "dist/topology.hpp"
#include "modes/modes.hpp"
#include "modes/run_files.hpp"

namespace ctxpar {

class Comm;
class Watchdog;

// The command line split: mode, flags, key=value overrides.
struct Cli {
  std::string mode, bench, config_path;
  std::vector<std::string> overrides;
  bool help = false, help_keys = false, features = false, print_config = false, dry_run = false;
};

// What the checks leave for the run. `rc` < 0: go on with the run; otherwise the exit code (0:
// --help or --features printed; 2: refused, the message printed on rank 0).
struct Startup {
  int rc = -1;
  Cli cli;
  Config cfg;
  const ModeRow* row = nullptr;
  std::unique_ptr<Topology> topo;
  std::vector<RunFile> files;
};

// The checks in their order (main.cpp's header). `args` is argv without the program name;
// `watchdog` (may be null) gets its limit from the configuration and a heartbeat per stage.
Startup check_startup(const std::vector<std::string>& args, Comm& world, Watchdog* watchdog);

// The command line's own parse (throws UsageError); the start-up watchdog reads watchdog_s from it
// before MPI is up.
Cli parse_cli(const std::vector<std::string>& args);

}  // namespace ctxpar
