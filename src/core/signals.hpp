// Stop signals of a run: SIGTERM and SIGUSR1 (what SLURM sends before the time limit) only set a
// flag; the tracer's end of step agrees over the ranks whether any rank saw one, and every rank
// stops after that step (trace/trace.hpp).
#pragma once

namespace ctxpar {

// Installs the handlers (idempotent).
void install_stop_signals();
bool stop_signal_seen();
// Forgets a seen signal (tests that run several traced loops in one process).
void clear_stop_signal();

}  // namespace ctxpar
