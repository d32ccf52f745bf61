// The NCCL backend of DeviceComm (dist/device_comm.hpp): device buffers, one NCCL communicator
// per DeviceComm, its own communication stream. Built only with the CUDA backend.
//
// Design:
//  - Bootstrap over an existing Comm (normally Topology's cp() or an axis comm, never the MPI world
//    by name): rank 0 of that Comm creates the NCCL unique id and broadcasts it through the Comm.
//    The NCCL rank equals the Comm rank, so rank numbers mean the same in both.
//  - Non-blocking init (ncclCommInitRankConfig with blocking = 0): the host polls
//    ncclCommGetAsyncError until the communicator is ready, an error is reported, or
//    init_timeout_s passes; then the job ends with a message naming this rank, its host and device
//    (a rank that never reached init, or a bootstrap network problem, no longer hangs silently).
//  - With a non-blocking communicator an NCCL call may return ncclInProgress before its kernels are
//    on the stream; every call is therefore followed by polling until it is enqueued, before the
//    completion event is recorded (otherwise the event could complete before the transfer).
//  - Ordering: event on the compute stream → communication stream waits → NCCL → event on the
//    communication stream → (collectives) compute stream waits. Transfers thus overlap compute
//    that is independent of them.
//  - send_recv_async is one grouped ncclSend + ncclRecv; all_to_all is grouped ncclSend/ncclRecv to
//    every peer (works with any NCCL 2.7+, no ncclAlltoAll needed); all_gather, reduce_scatter,
//    all_reduce (in place), broadcast (in place) are NCCL collectives.
//  - Waiting polls the completion event and the communicator's async error, so a failing peer ends
//    the job with NCCL's error instead of a hang; op_timeout_s > 0 also bounds each wait.
#pragma once
#include <memory>

#include "dist/device_comm.hpp"

namespace ctxpar {

struct NcclOptions {
  double init_timeout_s = 120;  // communicator creation (bootstrap + connection setup)
  double op_timeout_s = 0;      // each host-side wait (wait, synchronize); 0 = no limit
};

// Collective over `bootstrap` (not owned; used only during construction). `device` must be the
// current CUDA device (see select_device in dist/chips.hpp). Throws UsageError, identically on
// every rank, when two ranks of `bootstrap` use the same GPU (NCCL does not support that; use the
// staged MPI backend to share a GPU).
std::unique_ptr<DeviceComm> make_nccl_comm(Comm& bootstrap, int device, const NcclOptions& opt = {});

// "NCCL 2.28.9" (the library loaded at run time), for provenance.
std::string nccl_library_version();

}  // namespace ctxpar
