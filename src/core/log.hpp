// Rank-0 logging: everything the user reads comes from rank 0, once.
#pragma once
#include <cstdio>
#include <string>

namespace ctxpar {

// printf-style, rank 0 only, to stdout, flushed.
void log0(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Human-readable units.
std::string fmt_bytes(double bytes);

}  // namespace ctxpar
