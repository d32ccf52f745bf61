// The device backends of Comm (dist/comm.hpp), built only with the CUDA backend
// (CTXPAR_WITH_NCCL; target ctxpar_dist_cuda). Both move DeviceSpan buffers under the stream
// contract of comm.hpp and hand host buffers to the MPI Comm they were made from.
//
//  - make_staged_comm: device buffers staged through pinned host memory around the MPI Comm.
//    Debian's OpenMPI is not CUDA-aware, so device pointers cannot go to MPI directly; staging
//    also lets several ranks share one GPU (tests on a one-GPU machine). Reductions of bf16/f16
//    are computed in f32 on the host and rounded once (NCCL reduces in the element type, so the
//    two backends may differ in the last bf16 bit for sums of inexact values); u8 reductions are
//    refused (MPI has no arithmetic on bytes). Messages are limited to MPI's int count (checked).
//  - make_nccl_comm: NCCL on its own communication stream; one GPU per rank.
//    Bootstrap over `bootstrap` (normally Topology's cp() or an axis comm, never the MPI world by
//    name): rank 0 creates the NCCL unique id and broadcasts it; the NCCL rank equals the Comm
//    rank. Non-blocking init (ncclCommInitRankConfig, blocking = 0) polled up to init_timeout_s,
//    then a fatal error naming this rank, its host and device. Every NCCL call is polled until
//    enqueued before its completion event is recorded. Ordering: event on the compute stream →
//    communication stream waits → NCCL → event → (collectives) compute stream waits, so
//    transfers overlap independent compute. send_recv_async is one grouped ncclSend + ncclRecv
//    (its Request a CUDA event: test = cudaEventQuery, wait = polling that also checks NCCL's
//    async error and op_timeout_s, stream_wait = the compute stream waits); all_to_all is grouped
//    send/recv to every peer; the other collectives are NCCL's.
// Both are collective over the MPI Comm (not owned, must outlive the result); `device` must be
// the current CUDA device (select_device in dist/chips.hpp).
#pragma once
#include <memory>
#include <string>

#include "dist/comm.hpp"
#include "dtype_cuda.hpp"  // DType of __nv_bfloat16 and __half

namespace ctxpar {

class Topology;

std::unique_ptr<Comm> make_staged_comm(Comm& host, int device);

struct NcclOptions {
  double init_timeout_s = 120;  // communicator creation (bootstrap + connection setup)
  double op_timeout_s = 0;      // each host-side wait (wait, synchronize); 0 = no limit
};
// Throws UsageError, identically on every rank, when two ranks of `bootstrap` use the same GPU
// (NCCL does not support that; use the staged backend to share a GPU).
std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device, const NcclOptions& opt = {});

// A run on GPUs (device=cuda): every communicator of `topo` gets a device backend
// (Topology::use_device_comms) with `compute` as its compute stream: NCCL when every rank of the
// node has a GPU of its own (`devices` >= local ranks) and the communicator has more than one
// rank, else the staged MPI backend (ranks sharing a GPU; a one-rank communicator moves nothing).
// Collective over the world. Returns "nccl" or "mpi-staged" (the CP group's backend).
std::string use_gpu_comms(Topology& topo, int device, int devices, Stream compute);

// "NCCL 2.28.9" (the library loaded at run time), for provenance.
std::string nccl_library_version();

}  // namespace ctxpar
