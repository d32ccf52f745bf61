// The files of a run: every file it reads and every file it writes, from its config. One place
// decides what a run may write:
//  - no output is an input of the run, or another of its outputs (or one's NAME.partial or
//    NAME.lock); the one exception is checkpoint = resume, the usual restart, which is safe
//    because a checkpoint replaces its file only when complete;
//  - an output may replace an existing file only when that file is the same kind of output of
//    ctxpar: a trace of the same mode (a rerun), a checkpoint, an attn result, an oracle dump, a
//    calibrated profile. Anything else (another mode's trace, a checkpoint at out=, a file ctxpar
//    did not write) is refused with a message, never replaced;
//  - each output's directory is writable;
//  - while the run lives it holds a lock on every output (io/output_lock), taken before any file
//    is created, so a second job on the same output stops before touching anything.
#pragma once
#include <string>
#include <vector>

namespace ctxpar {

struct Config;
class OutputLocks;

struct RunFile {
  std::string path;
  std::string field;  // the setting that names it: "out", "in", "resume", "--config", ...
  bool output = false;
  // Outputs: what the run writes there ("trace", "checkpoint", "attn_result", "oracle_dump",
  // "hardware_profile"); inputs: "".
  std::string kind;
};

// Every file `cfg` reads and writes (`config_path`: the --config file, "" if none).
std::vector<RunFile> run_files(const Config& cfg, const std::string& config_path);

// "" when the outputs may be written (the rules above), else the message (exit 2). Rank 0 calls
// it; it reads only file metadata and attributes.
std::string check_run_files(const std::vector<RunFile>& files, const Config& cfg);

// Locks every output of `files` into `locks` (rank 0, after check_run_files and before anything
// is written). "" or the message naming the output and the job that holds it.
std::string lock_run_outputs(const std::vector<RunFile>& files, const Config& cfg, OutputLocks& locks);

}  // namespace ctxpar
