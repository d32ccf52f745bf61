// Stop signals of a run: SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP and SIGXCPU (SLURM sends
// SIGTERM at the time limit and any signal asked for with --signal; scancel sends SIGTERM; a lost
// terminal SIGHUP; a CPU-time limit SIGXCPU) only record which signal came; the tracer's end of step agrees over the ranks whether any rank saw one, and every rank
// stops after that same step (trace/trace.hpp): the trace says "truncated", the job exits with
// 128 + the signal's number.
#pragma once
#include <cstdint>

namespace ctxpar {

// Installs the handlers (idempotent).
void install_stop_signals();
bool stop_signal_seen();
// The number of the first stop signal this process received (0: none).
int stop_signal_number();
// Every stop signal this process received: bit N for signal N.
uint32_t stop_signal_mask();
// "SIGTERM", "SIGUSR1", ... ("signal N" for others).
const char* signal_name(int signo);
// Forgets a seen signal (tests that run several traced loops in one process).
void clear_stop_signal();

}  // namespace ctxpar
