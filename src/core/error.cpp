#include "core/error.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ctxpar {

Identity& identity() {
  static Identity id;
  return id;
}

static std::function<void(int)>& abort_hook() {
  static std::function<void(int)> hook;
  return hook;
}

void set_abort_hook(std::function<void(int)> hook) { abort_hook() = std::move(hook); }

void fatal(const char* file, int line, const char* expr, const std::string& msg) {
  static std::mutex mu;  // the watchdog thread may race the main thread here
  std::lock_guard<std::mutex> lock(mu);
  const Identity& id = identity();
  std::fprintf(stderr, "[rank %d/%d %s] %s:%d %s -> %s\n", id.rank, id.world, id.host.c_str(), file,
               line, expr, msg.c_str());
  std::fflush(stderr);
  if (abort_hook()) abort_hook()(1);
  std::abort();
}

}  // namespace ctxpar
