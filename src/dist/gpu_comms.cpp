// use_gpu_comms (dist/comm_device.hpp): the device backends of a run on GPUs.
#include "dist/comm_device.hpp"
#include "dist/topology.hpp"

namespace ctxpar {

std::string use_gpu_comms(Topology& topo, int device, int devices, Stream compute) {
  // The same choice on every rank of a node; nodes may differ only if their GPU counts do, and a
  // mixed job still pairs each communicator's ranks with one backend only when the counts agree:
  // agree on the smallest (NCCL only where every node has a GPU per rank).
  int32_t own = devices >= topo.local_size() ? 1 : 0;
  topo.world().all_reduce(std::span<int32_t>(&own, 1), ReduceOp::min);
  const bool nccl = own == 1;
  topo.use_device_comms([&](Comm& host) -> std::unique_ptr<Comm> {
    if (nccl && host.size() > 1) return make_nccl_comm(host, device);
    return make_staged_comm(host, device);
  });
  topo.cp().set_compute_stream(compute);
  topo.shard().set_compute_stream(compute);
  for (int a = 0; a < kNumAxes; ++a) topo.axis(Axis(a)).set_compute_stream(compute);
  return nccl && topo.cp().size() > 1 ? "nccl" : "mpi-staged";
}

}  // namespace ctxpar
