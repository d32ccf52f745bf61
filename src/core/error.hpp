// One fatal path for the whole program, two entries:
//  - fatal (CTXPAR_CHECK): a broken invariant, a bug: "[rank r/P host] file:line expr -> message",
//    exit code 1;
//  - fail_run: a fault of the run that is not the user's input (out of memory, a full disk, a
//    stalled rank, a non-finite value met mid-run): "[rank r/P host] message", exit code 3.
// Both call the fault hook first (the tracer's: rank 0 marks the trace failed, another rank tells
// rank 0 why), then abort the job (MPI_Abort once dist/ has installed its hook; std::abort before).
// Input errors are not fatal errors: they go through ctxpar::UsageError and exit code 2.
#pragma once
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ctxpar {

// Who we are, for messages. Set once by main after MPI init.
struct Identity {
  int rank = 0;
  int world = 1;
  std::string host = "?";
};
Identity& identity();

// Installed by dist/ so that a fatal error on one rank ends the whole job.
void set_abort_hook(std::function<void(int code)> hook);
// Installed by the tracer while it lives: called once with the message before the abort.
void set_fault_hook(std::function<void(const std::string& msg)> hook);
// Work to do before the job is aborted (io/output_lock: remove the run's lock files), run once
// each: by the failing rank before its abort, and by rank 0 when another rank tells it of its
// fault (the tracer's fault channel), since the abort then kills it without a word.
void add_abort_cleanup(std::function<void()> f);
void run_abort_cleanups();

// Exit codes of the whole job (every rank alike; docs/faults.md "How a run ends").
constexpr int kExitBug = 1;        // a broken invariant (fatal)
constexpr int kExitUsage = 2;      // bad input, refused before anything is allocated or written
constexpr int kExitFault = 3;      // a fault of the run (fail_run, the watchdog): trace marked failed
constexpr int kExitSignalBase = 128;  // + N: stopped early by signal N, trace truncated

[[noreturn]] void fatal(const char* file, int line, const char* expr, const std::string& msg);
[[noreturn]] void fail_run(const std::string& msg);

// A bad value in the user's input (config, command line, input files). Thrown during validation,
// caught in main, printed once on rank 0; every rank exits with code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A fault every rank learned of at the same point (a collective agreed on it, e.g. the trace's
// disk is full): thrown on every rank, caught in main, which marks the trace failed (where the
// thrower has not), prints it once on rank 0; every rank exits with code 3 without aborting the
// job (an abort is what a fault must do only where the other ranks cannot be told).
struct RunFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A fault of work one rank does alone that the other ranks will wait for (rank 0 writing a file
// the disk refuses, a tensor found not finite before it is written): thrown there, and turned into
// RunFailed on every rank where they meet again (dist/comm.hpp run_then_agree).
struct LocalFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace ctxpar

#define CTXPAR_CHECK(cond, msg_expr)                                                        \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::ostringstream ctxpar_os_;                                                        \
      ctxpar_os_ << msg_expr;                                                               \
      ::ctxpar::fatal(__FILE__, __LINE__, #cond, ctxpar_os_.str());                         \
    }                                                                                       \
  } while (0)

#define CTXPAR_FATAL(msg_expr) CTXPAR_CHECK(false, msg_expr)
