#include "dist/topology.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "dist/comm_mpi.hpp"

namespace ctxpar {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::dp: return "dp";
    case Axis::ring: return "ring";
    case Axis::ulysses: return "ulysses";
    case Axis::tp: return "tp";
  }
  return "?";
}

namespace {

class TopologyMpi final : public Topology {
 public:
  TopologyMpi(Comm& world, const MeshSpec& mesh) {
    world_ = &world;
    mesh_ = mesh;
    MPI_Comm wc = mpi_handle(world);
    CTXPAR_CHECK(mesh.product() == world.size(),
                 "mesh product " << mesh.product() << " != world size " << world.size()
                                 << " (validate_config should have caught this)");
    // Row-major Cartesian order makes the last dimension vary fastest: [dp, ring, ulysses, tp],
    // so tp neighbours are adjacent world ranks (node-local under block placement).
    dims_ = {int(mesh.dp), int(mesh.ring), int(mesh.ulysses), int(mesh.tp)};
    int periods[kNumAxes] = {0, 1, 0, 0};  // the ring axis wraps
    MPI_Comm cart;
    // reorder = 0: Cartesian rank = world rank, so the placement of mpirun/srun is respected.
    int rc = MPI_Cart_create(wc, kNumAxes, dims_.data(), periods, 0, &cart);
    CTXPAR_CHECK(rc == MPI_SUCCESS && cart != MPI_COMM_NULL, "MPI_Cart_create failed");
    MPI_Cart_coords(cart, world.rank(), kNumAxes, coords_.data());
    for (int a = 0; a < kNumAxes; ++a) {
      int keep[kNumAxes] = {0, 0, 0, 0};
      keep[a] = 1;
      MPI_Comm sub;
      CTXPAR_CHECK(MPI_Cart_sub(cart, keep, &sub) == MPI_SUCCESS, "MPI_Cart_sub failed for axis " << axis_name(Axis(a)));
      axes_[size_t(a)] = adopt_mpi_comm(sub, axis_name(Axis(a)));
    }
    {
      int keep[kNumAxes] = {0, 1, 1, 0};  // CP group: ring x ulysses, rank = ring*U + ulysses
      MPI_Comm sub;
      CTXPAR_CHECK(MPI_Cart_sub(cart, keep, &sub) == MPI_SUCCESS, "MPI_Cart_sub failed for the CP group");
      cp_ = adopt_mpi_comm(sub, "cp");
    }
    // Every rank's coordinates, for the trace and the dry-run plan.
    std::vector<int> all(size_t(world.size()) * kNumAxes);
    MPI_Allgather(coords_.data(), kNumAxes, MPI_INT, all.data(), kNumAxes, MPI_INT, cart);
    all_coords_.resize(size_t(world.size()));
    for (int r = 0; r < world.size(); ++r)
      for (int a = 0; a < kNumAxes; ++a) all_coords_[size_t(r)][size_t(a)] = all[size_t(r) * kNumAxes + size_t(a)];
    MPI_Comm_free(&cart);

    // Node-local rank (→ device index) and node ids from host names.
    MPI_Comm node;
    MPI_Comm_split_type(wc, MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
    device_index_ = local_rank_;
    char host[MPI_MAX_PROCESSOR_NAME] = {0};
    int n = 0;
    MPI_Get_processor_name(host, &n);
    std::vector<char> hosts(size_t(world.size()) * MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, wc);
    for (int r = 0; r < world.size(); ++r) {
      hosts_.emplace_back(&hosts[size_t(r) * MPI_MAX_PROCESSOR_NAME]);
      // Node id = order of first appearance of the host name.
      int id = -1, next = 0;
      for (int q = 0; q < r; ++q) {
        if (hosts_[size_t(q)] == hosts_.back()) { id = node_of_rank_[size_t(q)]; break; }
        next = std::max(next, node_of_rank_[size_t(q)] + 1);
      }
      if (id < 0) id = next;
      node_of_rank_.push_back(id);
    }
  }
};

}  // namespace

std::unique_ptr<Topology> Topology::create(Comm& world, const MeshSpec& mesh) {
  return std::make_unique<TopologyMpi>(world, mesh);
}

}  // namespace ctxpar
