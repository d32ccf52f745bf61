// shard=optimizer (ZeRO-1 style): the ranks that hold one tp slice of the parameters (the shard
// group, dp x CP: Topology::shard) split the flat per-rank buffer (model.hpp's layout, which the
// parameters, the gradients and both AdamW moments share) into equal ranges, range z of
// ceil(n / Z) elements to group rank z (the last one shorter; the buffers padded to Z whole
// ranges). Each rank keeps the AdamW moments of its range only and updates only that range of
// the parameters, from the whole gradient every rank holds after the gradient sum; an all-gather
// then gives every rank every range again. The update is elementwise and the all-gather moves
// bits, so the parameters and the losses have the bits of shard=none.
#pragma once
#include <cstdint>
#include <vector>

#include "core/memory.hpp"
#include "core/settings.hpp"

namespace ctxpar {

class Comm;

struct StateShard {
  int64_t n = 0;           // elements of the flat per-rank layout
  int Z = 1, z = 0;        // ranks that share the state; this rank's index among them
  int64_t chunk = 0;       // elements of a range: ceil(n / Z)
  int64_t lo = 0, hi = 0;  // this rank's range [lo, hi) of the layout
  // One rank holds everything (shard=none, or a group of one).
  static StateShard whole(int64_t n) { return StateShard(n, 0, 1); }
  // No range at all (inference reads a checkpoint's parameters, not its moments).
  static StateShard nothing(int64_t n) {
    StateShard s = whole(n);
    s.hi = s.lo;
    return s;
  }
  StateShard(int64_t n, int z, int Z);
  int64_t elems() const { return hi - lo; }
  int64_t padded() const { return chunk * Z; }  // the buffers' elements: Z whole ranges
  bool sharded() const { return Z > 1; }
};

// The range of this rank of `group` at `level` (none: the whole layout).
StateShard make_state_shard(ShardLevel level, int64_t n, Comm& group);

// After every rank of `group` wrote its own range of `params` (padded() elements, on `dev`):
// every range on every rank. `stage`: a range's worth of scratch on `dev` (made on first use).
void all_gather_ranges(float* params, const StateShard& s, Comm& group, Buffer<float>& stage, Device dev,
                       Stream stream);

// The ranges of every rank of `group` (`mine`: this rank's elems(), host memory) assembled into the
// whole buffer of n elements on group rank 0 (checkpoints, oracle dumps); empty elsewhere.
// Collective over `group`.
std::vector<float> gather_ranges(const float* mine, const StateShard& s, Comm& group);

}  // namespace ctxpar
