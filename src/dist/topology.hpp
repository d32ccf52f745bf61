// Topology: the Cartesian mesh of ranks with named axes dp, tp, ulysses, ring (tp varies fastest,
// then ulysses, ring, dp), one sub-communicator per axis plus the CP group (ulysses x ring),
// node-local rank and device index.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "dist/comm.hpp"

namespace ctxpar {

enum class Axis : int { dp = 0, ring = 1, ulysses = 2, tp = 3 };  // Cartesian dim order (last fastest)
constexpr int kNumAxes = 4;
const char* axis_name(Axis a);

class Topology;

// Placement problems of a mesh on its hosts, one line per axis (empty: none): a tp or ulysses
// group whose ranks are on more than one host (their collectives run every layer and belong on
// the fast links inside a host; the ring is the axis meant to cross hosts).
std::vector<std::string> placement_warnings(const Topology& topo);

class Topology {
 public:
  // Collective over `world`. The mesh product must equal world.size() (checked by
  // validate_config before this is called).
  static std::unique_ptr<Topology> create(Comm& world, const MeshSpec& mesh);
  virtual ~Topology() = default;

  Comm& world() { return *world_; }
  Comm& axis(Axis a) { return *axes_[int(a)]; }
  Comm& cp() { return *cp_; }   // ulysses x ring; rank = ring_rank * U + ulysses_rank
  const MeshSpec& mesh() const { return mesh_; }
  int size(Axis a) const { return dims_[int(a)]; }
  int cp_size() const { return size(Axis::ulysses) * size(Axis::ring); }  // the CP group's size
  int coord(Axis a) const { return coords_[int(a)]; }
  // Coordinates of every rank, [world][kNumAxes] in Axis order; node index of every rank.
  const std::vector<std::array<int, kNumAxes>>& all_coords() const { return all_coords_; }
  const std::vector<int>& node_of_rank() const { return node_of_rank_; }
  const std::vector<std::string>& hosts() const { return hosts_; }  // per rank
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int device_index() const { return device_index_; }

 protected:
  Topology() = default;
  Comm* world_ = nullptr;
  std::array<std::unique_ptr<Comm>, kNumAxes> axes_;
  std::unique_ptr<Comm> cp_;
  MeshSpec mesh_;
  std::array<int, kNumAxes> dims_{1, 1, 1, 1};
  std::array<int, kNumAxes> coords_{0, 0, 0, 0};
  std::vector<std::array<int, kNumAxes>> all_coords_;
  std::vector<int> node_of_rank_;
  std::vector<std::string> hosts_;
  int local_rank_ = 0, local_size_ = 1, device_index_ = 0;
};

}  // namespace ctxpar
