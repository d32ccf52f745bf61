// Chips: which GPU each rank uses, and the rank → chip map for printing and the trace.
// Built only with the CUDA backend (target ctxpar_dist_cuda).
//
// Policy (device_for_local_rank): a node's ranks are numbered 0..L-1 (node-local rank, from
// MPI_Comm_split_type(shared)); with G visible GPUs on the node,
//   G >= L: rank l uses GPU l (one GPU per rank, the NCCL layout; GPUs beyond L stay idle);
//   G <  L: GPUs are shared in contiguous blocks, rank l uses GPU floor(l*G/L), so neighbouring
//           ranks (tp varies fastest in Topology, then ulysses) share a GPU and every GPU gets
//           floor(L/G) or ceil(L/G) ranks. Sharing works with the staged MPI comm, not NCCL.
// GPU indices are CUDA runtime indices, i.e. after CUDA_VISIBLE_DEVICES.
#pragma once
#include <string>
#include <vector>

#include "dist/comm.hpp"

namespace ctxpar {

struct NodeLocal {
  int rank = 0;  // this rank's index among the ranks of `comm` on its node
  int size = 1;  // ranks of `comm` on this node
};
// Collective over `comm` (an MPI Comm): MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), ordered by rank.
NodeLocal node_local(Comm& comm);

// The policy above; pure, so it is tested without a GPU. device_count must be >= 1.
int device_for_local_rank(int local_rank, int local_size, int device_count);

struct DeviceCount {
  int count = 0;
  std::string why;  // when count == 0: the CUDA runtime's reason (no driver, no device, ...)
};
// Never fails: a machine without a driver or GPU reports 0 and why.
DeviceCount cuda_device_count();
// Free and total bytes of CUDA device `device` (cudaMemGetInfo); {-1, -1} when it cannot be read.
struct DeviceMemory {
  int64_t free_bytes = -1, total_bytes = -1;
};
DeviceMemory cuda_device_memory(int device);

// Picks this rank's GPU by the policy and makes it current (cudaSetDevice); returns its index.
// Ends the job with a clear message when no GPU is visible.
int select_device(int local_rank, int local_size);

struct ChipInfo {
  int rank = 0;            // rank in the communicator the map was gathered over
  std::string host;
  int local_rank = 0, local_size = 1;
  int device = -1;         // CUDA runtime index
  std::string name;        // e.g. "NVIDIA H200"
  std::string pci_bus_id;  // e.g. "0000:19:00.0" (unique per GPU on a host)
};
// This rank's entry; queries the device's name and PCI bus id.
ChipInfo this_chip(int rank, int local_rank, int local_size, int device);
// Collective over `comm`: every rank gets every rank's entry, in rank order.
std::vector<ChipInfo> gather_chip_map(Comm& comm, const ChipInfo& mine);
// Dense bf16 tensor-core peak of a GPU by its CUDA device name (FLOP/s; no sparsity), from a table
// (../shared/reference/hardware.csv for H100 SXM and H200; NVIDIA's data sheets for the others);
// 0 for a name the table lacks (then MFU stays 0 unless peak_tflops_per_rank is given).
double gpu_bf16_dense_peak_flops(const std::string& device_name);

// Human-readable map, one line per rank plus a header, e.g.
//   rank -> chip: 4 ranks on 1 host, 1 GPU (4 ranks per GPU)
//     rank 0  host gpu01  local 0/4  cuda:0  NVIDIA H200  0000:19:00.0  shared with ranks 1,2,3
std::string describe_chip_map(const std::vector<ChipInfo>& map);

}  // namespace ctxpar
