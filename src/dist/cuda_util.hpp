// Internal to dist/'s CUDA files: the CUDA instance of ctxpar's one fatal path, and this host's
// name for error messages. Not installed for other modules (kernels/cuda has its own checks).
#pragma once
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <string>

#include "core/error.hpp"

// A failing CUDA runtime call reports rank, host, file, line, the call and CUDA's error string,
// then ends the job (core/error.hpp's fatal path, MPI_Abort once dist/ installed its hook).
#define CTXPAR_DIST_CUDA_CHECK(call)                                                                  \
  do {                                                                                                \
    cudaError_t ctxpar_ce_ = (call);                                                                  \
    if (ctxpar_ce_ != cudaSuccess)                                                                    \
      ::ctxpar::fatal(__FILE__, __LINE__, #call,                                                      \
                      std::string("CUDA error ") + cudaGetErrorName(ctxpar_ce_) + ": " + cudaGetErrorString(ctxpar_ce_)); \
  } while (0)

namespace ctxpar::dist_detail {

// gethostname(), or "?" when it fails.
inline std::string host_name() {
  char h[256] = {0};
  if (gethostname(h, sizeof h - 1) != 0) return "?";
  return h;
}

}  // namespace ctxpar::dist_detail
