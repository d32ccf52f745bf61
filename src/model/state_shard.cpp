#include "model/state_shard.hpp"

#include <algorithm>
#include <span>

#include "core/error.hpp"
#include "dist/comm.hpp"
#include "ops.hpp"

namespace ctxpar {

StateShard::StateShard(int64_t n_, int z_, int Z_) : n(n_), Z(Z_), z(z_) {
  CTXPAR_CHECK(Z >= 1 && z >= 0 && z < Z && n >= 0, "StateShard: rank " << z << " of " << Z << " over " << n);
  chunk = (n + Z - 1) / Z;
  lo = std::min(n, int64_t(z) * chunk);
  hi = std::min(n, lo + chunk);
}

StateShard make_state_shard(ShardLevel level, int64_t n, Comm& group) {
  if (level == ShardLevel::none) return StateShard::whole(n);
  return StateShard(n, group.rank(), group.size());
}

void all_gather_ranges(float* params, const StateShard& s, Comm& group, Buffer<float>& stage, Device dev,
                       Stream stream) {
  if (!s.sharded()) return;
  CTXPAR_CHECK(group.size() == s.Z && group.rank() == s.z, "all_gather_ranges: the group is not the shard's");
  if (stage.size() != size_t(s.chunk)) stage = Buffer<float>(size_t(s.chunk), false, dev, stream);
  // MPI's send and receive buffers may not overlap: this rank's range goes through `stage` (its
  // padding, past n on the last rank, is the buffer's zeros and comes back unchanged).
  const size_t bytes = size_t(s.chunk) * sizeof(float);
  device_copy(stage.data(), params + int64_t(s.z) * s.chunk, bytes, dev, stream);
  group.all_gather(buf_at(static_cast<const float*>(stage.data()), size_t(s.chunk), dev),
                   buf_at(params, size_t(s.padded()), dev));
}

std::vector<float> gather_ranges(const float* mine, const StateShard& s, Comm& group) {
  std::vector<float> all;
  group.gather_v(std::span<const float>(mine, size_t(s.elems())), all, 0);
  if (group.rank() == 0) CTXPAR_CHECK(int64_t(all.size()) == s.n, "gather_ranges: " << all.size() << " of " << s.n);
  return all;
}

}  // namespace ctxpar
