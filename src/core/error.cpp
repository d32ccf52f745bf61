#include "core/error.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace ctxpar {

Identity& identity() {
  static Identity id;
  return id;
}

static std::function<void(int)>& abort_hook() {
  static std::function<void(int)> hook;
  return hook;
}

static std::function<void(const std::string&)>& fault_hook() {
  static std::function<void(const std::string&)> hook;
  return hook;
}

void set_abort_hook(std::function<void(int)> hook) { abort_hook() = std::move(hook); }

namespace {
std::mutex& cleanup_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::function<void()>>& cleanups() {
  static std::vector<std::function<void()>> list;
  return list;
}
}  // namespace

void add_abort_cleanup(std::function<void()> f) {
  const std::lock_guard<std::mutex> lk(cleanup_mutex());
  cleanups().push_back(std::move(f));
}

void run_abort_cleanups() {
  std::vector<std::function<void()>> run;
  {
    const std::lock_guard<std::mutex> lk(cleanup_mutex());
    run.swap(cleanups());
  }
  for (auto& f : run) f();
}
void set_fault_hook(std::function<void(const std::string&)> hook) { fault_hook() = std::move(hook); }

namespace {
[[noreturn]] void end_job(const std::string& line, const std::string& msg, int code) {
  // The monitor thread may race the main thread here; the first one ends the job.
  static std::recursive_mutex mu;
  std::lock_guard<std::recursive_mutex> lock(mu);
  static bool ending = false;
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  if (!ending) {
    ending = true;  // a fault inside the hook goes straight to the abort
    if (fault_hook()) fault_hook()(msg);
    run_abort_cleanups();
  }
  if (abort_hook()) abort_hook()(code);
  std::abort();
}
std::string who() {
  const Identity& id = identity();
  return "[rank " + std::to_string(id.rank) + "/" + std::to_string(id.world) + " " + id.host + "] ";
}
}  // namespace

void fatal(const char* file, int line, const char* expr, const std::string& msg) {
  end_job(who() + file + ":" + std::to_string(line) + " " + expr + " -> " + msg,
          std::string("internal error at ") + file + ":" + std::to_string(line) + ": " + msg, kExitBug);
}

void fail_run(const std::string& msg) { end_job(who() + "ctxpar: " + msg, msg, kExitFault); }

}  // namespace ctxpar
