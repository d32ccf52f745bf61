// The MPI backend of Comm (host memory). Only dist/ and main.cpp see MPI types.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "dist/comm.hpp"

namespace ctxpar {

// Wraps `comm` (duplicated, so ctxpar's traffic never mixes with the caller's); errors are
// returned, not fatal inside MPI, and reported by ctxpar's fatal path with rank, host, file, line.
std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm, const std::string& name);
// Takes ownership of `comm` (freed on destruction) instead of duplicating it.
std::unique_ptr<Comm> adopt_mpi_comm(MPI_Comm comm, const std::string& name);
// The MPI communicator behind a Comm made above (fatal if it is another backend).
MPI_Comm mpi_handle(Comm& c);

}  // namespace ctxpar
