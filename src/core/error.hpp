// One fatal path for the whole program: "[rank r/P host] file:line expr -> message", then abort
// the job (MPI_Abort once dist/ has installed its hook; std::abort before that).
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

[[noreturn]] void fatal(const char* file, int line, const char* expr, const std::string& msg);

// A bad value in the user's input (config, command line, input files). Thrown during validation,
// caught in main, printed once on rank 0; every rank exits with code 2.
struct UsageError : std::runtime_error {
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
