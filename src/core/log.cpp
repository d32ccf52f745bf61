#include "core/log.hpp"

#include <cstdarg>
#include <cmath>

#include "core/error.hpp"

namespace ctxpar {

void log0(const char* fmt, ...) {
  if (identity().rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stdout, fmt, ap);
  va_end(ap);
  std::fflush(stdout);
}

void log_rank(const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stdout, "[rank %d] %s", identity().rank, buf);
  std::fflush(stdout);
}

static std::string scaled(double v, const char* const* units, int n, double base) {
  int i = 0;
  while (std::fabs(v) >= base && i < n - 1) { v /= base; ++i; }
  char b[64];
  std::snprintf(b, sizeof b, i == 0 ? "%.0f %s" : "%.2f %s", v, units[i]);
  return b;
}

std::string fmt_bytes(double bytes) {
  static const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  return scaled(bytes, u, 5, 1024.0);
}

std::string fmt_count(double n) {
  static const char* u[] = {"", "K", "M", "G", "T"};
  std::string s = scaled(n, u, 5, 1000.0);
  if (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace ctxpar
