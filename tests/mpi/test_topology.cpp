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
