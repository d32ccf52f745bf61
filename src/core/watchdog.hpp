// Watchdog: a monitor thread per rank. It ends the job when the rank makes no progress for
// `limit_s` seconds, so a mismatched collective or a stalled peer never hangs a batch allocation,
// and it runs the owner's `on_tick` at every check (rank 0's tracer polls fault notices there).
// The owner reports progress with heartbeat(step, layer, phase) (cheap: relaxed atomics); when
// the limit passes, `on_stall` gets one line naming step, layer and phase (the phase's name from
// `phase_name`) and must end the job (the tracer's fault path: core/error.hpp fail_run).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ctxpar {

class Watchdog {
 public:
  Watchdog() = default;
  ~Watchdog() { stop(); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // limit_s 0: no stall check (the ticks still run). Checks every min(0.25 s, limit_s / 4).
  void start(double limit_s, std::function<const char*(int32_t)> phase_name,
             std::function<void(const std::string&)> on_stall, std::function<void()> on_tick = nullptr);
  void heartbeat(int64_t step, int32_t layer, int32_t phase);
  // A new limit for a running watchdog (0: no stall check from now on).
  void set_limit(double limit_s) { limit_s_.store(limit_s); }
  // Seconds between two checks.
  double tick_s() const { return tick_s_.load(); }
  // Seconds since the last heartbeat, and where it was.
  double idle_s(int64_t& step, int32_t& layer, int32_t& phase) const;
  void stop();  // joins the thread (idempotent)

 private:
  std::atomic<int64_t> last_ns_{0}, step_{0};
  std::atomic<int32_t> layer_{-1}, phase_{0};
  std::atomic<double> limit_s_{0}, tick_s_{1.0};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace ctxpar
