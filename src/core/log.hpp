// Rank-0 logging: everything the user reads comes from rank 0, once (faults that only one rank
// sees print on that rank, to stderr, with its rank: core/error.hpp).
#pragma once
#include <cstdio>
#include <string>

namespace ctxpar {

// printf-style, rank 0 only, flushed: log0 to stdout (tables, the run's story), err0 to stderr
// (errors and warnings: what a script must not parse as output).
void log0(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void err0(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Human-readable units.
std::string fmt_bytes(double bytes);

}  // namespace ctxpar
