// Wall-clock seconds of a monotonic clock, for the step-time breakdowns (differences only).
#pragma once
#include <chrono>

namespace ctxpar {
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace ctxpar
