// Topology: the Cartesian mesh of ranks with named axes dp, tp, ulysses, ring (tp varies fastest,
// then ulysses, ring, dp), one sub-communicator per axis plus the CP group (ulysses x ring),
// node-local rank and device index, and the shard group (dp x CP: the ranks that hold the same tp
// slice of the parameters, over which shard= splits the training state).
#pragma once
#include <array>
#include <functional>
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

  // Device buffers (device=cuda): each axis and the CP group get a device backend made by
  // `make(host_comm)` (dist/comm_device.hpp: make_nccl_comm or make_staged_comm), which moves
  // device buffers and hands host buffers to the host communicator it was made from (kept here).
  // Collective over every axis; call before strategies are made (they bind to cp() and axis()).
  void use_device_comms(const std::function<std::unique_ptr<Comm>(Comm& host)>& make);
  // The host (MPI) communicators, whichever backend axis() and cp() use.
  Comm& host_axis(Axis a) { return host_axes_[int(a)] ? *host_axes_[int(a)] : axis(a); }
  Comm& host_cp() { return host_cp_ ? *host_cp_ : cp(); }
  Comm& host_shard() { return host_shard_ ? *host_shard_ : shard(); }

  Comm& world() { return *world_; }
  Comm& axis(Axis a) { return *axes_[int(a)]; }
  Comm& cp() { return *cp_; }   // ulysses x ring; rank = ring_rank * U + ulysses_rank
  // dp x ulysses x ring, the ranks with this rank's tp coordinate; rank = dp_rank * CP + cp().rank()
  // (rank 0: dp 0, CP rank 0).
  Comm& shard() { return *shard_; }
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
  // Set by use_device_comms; declared first so that they outlive the device comms made from them.
  std::array<std::unique_ptr<Comm>, kNumAxes> host_axes_;
  std::unique_ptr<Comm> host_cp_, host_shard_;
  std::array<std::unique_ptr<Comm>, kNumAxes> axes_;
  std::unique_ptr<Comm> cp_, shard_;
  MeshSpec mesh_;
  std::array<int, kNumAxes> dims_{1, 1, 1, 1};
  std::array<int, kNumAxes> coords_{0, 0, 0, 0};
  std::vector<std::array<int, kNumAxes>> all_coords_;
  std::vector<int> node_of_rank_;
  std::vector<std::string> hosts_;
  int local_rank_ = 0, local_size_ = 1, device_index_ = 0;
};

}  // namespace ctxpar
