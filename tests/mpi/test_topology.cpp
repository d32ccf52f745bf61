// Topology: axis sizes and coordinates of every mesh that fits the rank count, tp fastest.
#include <gtest/gtest.h>

#include <vector>

#include "dist/topology.hpp"
#include "mpi_test_env.hpp"

using namespace ctxpar;
using ctxpar::test::world;

namespace {

std::vector<MeshSpec> meshes_for(int n) {
  std::vector<MeshSpec> out;
  for (int dp = 1; dp <= n; ++dp)
    for (int tp = 1; tp <= n; ++tp)
      for (int u = 1; u <= n; ++u)
        if (n % (dp * tp * u) == 0) out.push_back(MeshSpec{dp, tp, u, n / (dp * tp * u)});
  return out;
}

}  // namespace

TEST(Topology, EveryFactorizationHasConsistentAxes) {
  Comm& w = world();
  for (const MeshSpec& m : meshes_for(w.size())) {
    auto topo = Topology::create(w, m);
    EXPECT_EQ(topo->size(Axis::dp), m.dp);
    EXPECT_EQ(topo->size(Axis::tp), m.tp);
    EXPECT_EQ(topo->size(Axis::ulysses), m.ulysses);
    EXPECT_EQ(topo->size(Axis::ring), m.ring);
    // Row-major [dp, ring, ulysses, tp]: tp varies fastest, then ulysses, ring, dp.
    const int r = w.rank();
    const int tp = r % m.tp, u = (r / m.tp) % m.ulysses, ring = (r / (m.tp * m.ulysses)) % m.ring,
              dp = r / (m.tp * m.ulysses * m.ring);
    EXPECT_EQ(topo->coord(Axis::tp), tp);
    EXPECT_EQ(topo->coord(Axis::ulysses), u);
    EXPECT_EQ(topo->coord(Axis::ring), ring);
    EXPECT_EQ(topo->coord(Axis::dp), dp);
    EXPECT_EQ(topo->axis(Axis::tp).rank(), tp);
    EXPECT_EQ(topo->axis(Axis::ring).rank(), ring);
    EXPECT_EQ(topo->axis(Axis::ulysses).size(), int(m.ulysses));
    EXPECT_EQ(topo->cp().size(), int(m.ring * m.ulysses));
    EXPECT_EQ(topo->cp().rank(), ring * int(m.ulysses) + u);
    // The shard group: every rank of this tp slice, dp-major, then the CP rank.
    EXPECT_EQ(topo->shard().size(), int(m.dp * m.ring * m.ulysses));
    EXPECT_EQ(topo->shard().rank(), dp * int(m.ring * m.ulysses) + topo->cp().rank());
    {
      int32_t mine = tp, least = -1, most = -1;  // one tp coordinate throughout the group
      topo->shard().all_reduce(std::span<int32_t>(&mine, 1), ReduceOp::min);
      least = mine;
      mine = tp;
      topo->shard().all_reduce(std::span<int32_t>(&mine, 1), ReduceOp::max);
      most = mine;
      EXPECT_EQ(least, tp);
      EXPECT_EQ(most, tp);
    }
    ASSERT_EQ(topo->all_coords().size(), size_t(w.size()));
    EXPECT_EQ(topo->all_coords()[size_t(r)][int(Axis::ring)], ring);
    EXPECT_EQ(topo->hosts().size(), size_t(w.size()));
    EXPECT_EQ(topo->node_of_rank()[0], 0);
    EXPECT_GE(topo->local_rank(), 0);
    EXPECT_LT(topo->local_rank(), topo->local_size());
    // The ring sub-communicator really connects ring neighbours: pass the world rank along it.
    Comm& ring_c = topo->axis(Axis::ring);
    const int n = ring_c.size();
    int32_t mine = r, got = -1;
    Request q = ring_c.send_recv_async(std::span<const int32_t>(&mine, 1), (ring + 1) % n, std::span<int32_t>(&got, 1),
                                       (ring - 1 + n) % n);
    ring_c.wait(q);
    const int prev_ring = (ring - 1 + n) % n;
    EXPECT_EQ(got, ((dp * m.ring + prev_ring) * m.ulysses + u) * m.tp + tp);
  }
}

// Placement warnings from hosts alone: a fake topology (no MPI) with the Cartesian coordinates
// of a mesh and a given host per rank.
namespace {
class PlacedTopology : public Topology {
 public:
  PlacedTopology(const MeshSpec& m, const std::vector<int>& node) {
    mesh_ = m;
    dims_ = {int(m.dp), int(m.ring), int(m.ulysses), int(m.tp)};
    for (int r = 0; r < int(node.size()); ++r) {
      all_coords_.push_back({r / int(m.tp * m.ulysses * m.ring), (r / int(m.tp * m.ulysses)) % int(m.ring),
                             (r / int(m.tp)) % int(m.ulysses), r % int(m.tp)});
      node_of_rank_.push_back(node[size_t(r)]);
      hosts_.push_back("h" + std::to_string(node[size_t(r)] + 1));
    }
  }
};
}  // namespace

TEST(Topology, PlacementWarnsWhereTpOrUlyssesCrossHosts) {
  // 2 hosts x 2 ranks, block placement: tp:2 inside each host, the ring across: no warning.
  EXPECT_TRUE(placement_warnings(PlacedTopology(MeshSpec{1, 2, 1, 2}, {0, 0, 1, 1})).empty());
  EXPECT_TRUE(placement_warnings(PlacedTopology(MeshSpec{1, 1, 2, 2}, {0, 0, 1, 1})).empty());
  // the same mesh with ranks alternating over the hosts: tp crosses them
  auto w = placement_warnings(PlacedTopology(MeshSpec{1, 2, 1, 2}, {0, 1, 0, 1}));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("the tp axis (size 2) spans hosts: ranks 0 on h1 and 1 on h2"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("multiple of 2 ranks per host"), std::string::npos) << w[0];
  // 4 hosts x 1 rank: tp:2 x ulysses:2 both cross
  w = placement_warnings(PlacedTopology(MeshSpec{1, 2, 2, 1}, {0, 1, 2, 3}));
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(w[0].find("the tp axis"), std::string::npos) << w[0];
  EXPECT_NE(w[1].find("the ulysses axis (size 2) spans hosts: ranks 0 on h1 and 2 on h3"), std::string::npos) << w[1];
  EXPECT_NE(w[1].find("multiple of 4 ranks per host"), std::string::npos) << w[1];
  // ring and dp may cross hosts freely
  EXPECT_TRUE(placement_warnings(PlacedTopology(MeshSpec{2, 1, 1, 2}, {0, 1, 2, 3})).empty());
}
