#include "core/log.hpp"

#include <cstdarg>
#include <cmath>

#include "core/error.hpp"

namespace ctxpar {

namespace {
void vprint0(std::FILE* f, const char* fmt, va_list ap) {
  if (identity().rank != 0) return;
  std::fflush(stdout);  // keeps stdout and stderr in order on a terminal
  std::vfprintf(f, fmt, ap);
  std::fflush(f);
}
}  // namespace

void log0(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprint0(stdout, fmt, ap);
  va_end(ap);
}

void err0(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprint0(stderr, fmt, ap);
  va_end(ap);
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

}  // namespace ctxpar
