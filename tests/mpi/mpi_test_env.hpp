// For distributed tests: the world communicator made by the MPI-aware gtest main
// (tests/mpi/mpi_gtest_main.cpp). Tests must not stop before a collective on one rank only:
// use EXPECT_* (not ASSERT_*) on values that can differ between ranks, and agree on results
// with all_ok() before acting on them.
#pragma once
#include "dist/comm.hpp"

namespace ctxpar::test {

Comm& world();
// True on every rank when `ok` is true on every rank.
bool all_ok(bool ok);

}  // namespace ctxpar::test
