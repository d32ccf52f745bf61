#include "core/watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace ctxpar {

namespace {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void Watchdog::heartbeat(int64_t step, int32_t layer, int32_t phase) {
  step_.store(step, std::memory_order_relaxed);
  layer_.store(layer, std::memory_order_relaxed);
  phase_.store(phase, std::memory_order_relaxed);
  last_ns_.store(steady_ns(), std::memory_order_relaxed);
}

void Watchdog::start(double limit_s, std::function<const char*(int32_t)> phase_name,
                     std::function<void(const std::string&)> on_stall, std::function<void()> on_tick) {
  heartbeat(step_.load(), layer_.load(), phase_.load());
  limit_s_.store(limit_s);
  thread_ = std::thread([this, phase_name, on_stall, on_tick] {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      // Check often enough that the abort comes within 0.25 s (or a quarter of a short limit) of
      // the limit being reached, and that the ticks see a stop signal well within the second a
      // launcher (mpirun's kill sequence) leaves between its SIGTERM and its SIGKILL.
      const double limit_s = limit_s_.load();
      tick_s_.store(limit_s > 0 ? std::clamp(limit_s / 4, 0.01, 0.25) : 0.25);
      cv_.wait_for(lk, std::chrono::duration<double>(tick_s_.load()));
      if (stop_) break;
      if (on_tick) on_tick();
      const double idle_s = double(steady_ns() - last_ns_.load()) * 1e-9;
      if (limit_s > 0 && idle_s > limit_s) {
        char line[256];
        std::snprintf(line, sizeof line, "watchdog: no progress for %.1f s at step %lld, layer %d, phase %s", idle_s,
                      static_cast<long long>(step_.load()), int(layer_.load()), phase_name(phase_.load()));
        lk.unlock();  // stop() from the fault path must not deadlock on mu_
        on_stall(line);
        return;
      }
    }
  });
}

double Watchdog::idle_s(int64_t& step, int32_t& layer, int32_t& phase) const {
  step = step_.load(std::memory_order_relaxed);
  layer = layer_.load(std::memory_order_relaxed);
  phase = phase_.load(std::memory_order_relaxed);
  return double(steady_ns() - last_ns_.load(std::memory_order_relaxed)) * 1e-9;
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

}  // namespace ctxpar
