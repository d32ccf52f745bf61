#include "dist/topology.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <sstream>

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
    {
      int keep[kNumAxes] = {1, 1, 1, 0};  // shard group: dp x ring x ulysses, rank = dp*CP + cp rank
      MPI_Comm sub;
      CTXPAR_CHECK(MPI_Cart_sub(cart, keep, &sub) == MPI_SUCCESS, "MPI_Cart_sub failed for the shard group");
      shard_ = adopt_mpi_comm(sub, "shard");
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

std::vector<std::string> placement_warnings(const Topology& topo) {
  std::vector<std::string> out;
  const auto& coords = topo.all_coords();
  const auto& node = topo.node_of_rank();
  const auto& hosts = topo.hosts();
  // Two ranks of one group of axis a (equal coordinates on every other axis) on two hosts.
  auto split = [&](Axis a) -> std::pair<size_t, size_t> {
    for (size_t r = 0; r < coords.size(); ++r)
      for (size_t q = r + 1; q < coords.size(); ++q) {
        bool same_group = node[r] != node[q];
        for (int b = 0; b < kNumAxes && same_group; ++b)
          if (b != int(a) && coords[r][size_t(b)] != coords[q][size_t(b)]) same_group = false;
        if (same_group) return {r, q};
      }
    return {0, 0};
  };
  for (Axis a : {Axis::tp, Axis::ulysses}) {
    if (topo.size(a) <= 1) continue;
    const auto [r, q] = split(a);
    if (r == q) continue;
    // tp groups are runs of tp consecutive ranks; whole ulysses groups lie in runs of tp x ulysses.
    const int block = a == Axis::tp ? topo.size(Axis::tp) : topo.size(Axis::tp) * topo.size(Axis::ulysses);
    std::ostringstream os;
    os << "mesh: the " << axis_name(a) << " axis (size " << topo.size(a) << ") spans hosts: ranks " << r << " on "
       << hosts[r] << " and " << q << " on " << hosts[q] << " are in one " << axis_name(a) << " group, so its "
       << (a == Axis::tp ? "all-reduces" : "all-to-alls")
       << " of every layer cross the host-to-host link; place consecutive ranks on one host (mpirun --map-by "
          "slot, srun --distribution=block) with a multiple of "
       << block << " ranks per host, and let the ring cross hosts";
    out.push_back(os.str());
  }
  return out;
}

std::unique_ptr<Topology> Topology::create(Comm& world, const MeshSpec& mesh) {
  return std::make_unique<TopologyMpi>(world, mesh);
}

void Topology::use_device_comms(const std::function<std::unique_ptr<Comm>(Comm& host)>& make) {
  CTXPAR_CHECK(!host_cp_, "use_device_comms called twice");
  for (int a = 0; a < kNumAxes; ++a) {
    host_axes_[size_t(a)] = std::move(axes_[size_t(a)]);
    axes_[size_t(a)] = make(*host_axes_[size_t(a)]);
  }
  host_cp_ = std::move(cp_);
  cp_ = make(*host_cp_);
  host_shard_ = std::move(shard_);
  shard_ = make(*host_shard_);
}

}  // namespace ctxpar
