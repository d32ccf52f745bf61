// Watchdog: a thread that ends the job when a rank makes no progress for `limit_s` seconds, so a
// mismatched collective or a stalled peer never hangs a batch allocation. The owner reports
// progress with heartbeat(step, layer, phase) (cheap: relaxed atomics); when the limit passes,
// the thread prints one line naming rank, step, layer and phase (the phase's name from
// `phase_name`) and calls `abort` (MPI_Abort through the world Comm).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace ctxpar {

class Watchdog {
 public:
  Watchdog() = default;
  ~Watchdog() { stop(); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void start(double limit_s, int rank, std::function<const char*(int32_t)> phase_name, std::function<void(int)> abort);
  void heartbeat(int64_t step, int32_t layer, int32_t phase);
  void stop();  // joins the thread (idempotent)

 private:
  std::atomic<int64_t> last_ns_{0}, step_{0};
  std::atomic<int32_t> layer_{-1}, phase_{0};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace ctxpar
