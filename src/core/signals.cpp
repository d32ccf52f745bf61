#include "core/signals.hpp"

#include <atomic>
#include <cstdint>
#include <csignal>
#include <cstring>

namespace ctxpar {

namespace {
// The handler may only touch a lock-free atomic (async-signal-safe).
std::atomic<int> g_stop_signal{0};
std::atomic<uint32_t> g_stop_mask{0};  // bit signo: every stop signal received
static_assert(std::atomic<int>::is_always_lock_free, "signal flag must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "signal mask must be lock-free");
extern "C" void ctxpar_stop_handler(int signo) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signo, std::memory_order_relaxed);
  if (signo > 0 && signo < 32) g_stop_mask.fetch_or(uint32_t(1) << signo, std::memory_order_relaxed);
}
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP, SIGXCPU};
}  // namespace

void install_stop_signals() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = ctxpar_stop_handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls (MPI progress, file I/O) resume after the handler
  for (int s : kStopSignals) sigaction(s, &sa, nullptr);
}
bool stop_signal_seen() { return g_stop_signal.load(std::memory_order_relaxed) != 0; }
int stop_signal_number() { return g_stop_signal.load(std::memory_order_relaxed); }
uint32_t stop_signal_mask() { return g_stop_mask.load(std::memory_order_relaxed); }
void clear_stop_signal() {
  g_stop_signal.store(0, std::memory_order_relaxed);
  g_stop_mask.store(0, std::memory_order_relaxed);
}

const char* signal_name(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGKILL: return "SIGKILL";
    case SIGHUP: return "SIGHUP";
    case SIGXCPU: return "SIGXCPU";
    default: return "a signal";
  }
}

}  // namespace ctxpar
