#include "model/state_shard.hpp"

#include <algorithm>
#include <span>

#include "core/error.hpp"
#include "cp/strategy.hpp"  // CpStats
#include "dist/comm.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

StateShard::StateShard(const ParamLayout& layout, ShardLevel lv, int z_, int Z_)
    : level(lv), n(layout.local_elems()), Z(Z_), z(z_) {
  CTXPAR_CHECK(Z >= 1 && z >= 0 && z < Z, "StateShard: rank " << z << " of " << Z);
  for (const ParamUnit& u : layout.units()) {
    const int64_t chunk = (u.elems() + Z - 1) / Z;
    const int64_t lo = std::min(u.end, u.begin + int64_t(z) * chunk);
    pieces.push_back({lo, std::min(u.end, lo + chunk), local, u.begin, u.elems(), chunk});
    local += chunk;
    widest = std::max(widest, chunk * Z);
  }
}

StateShard make_state_shard(ShardLevel level, const ParamLayout& layout, Comm& group) {
  if (level == ShardLevel::none) return StateShard::whole(layout);
  return StateShard(layout, level, group.rank(), group.size());
}

void take_pieces(const StateShard& s, const float* flat, float* shard, Device dev, Stream stream) {
  for (const StateShard::Piece& p : s.pieces) {
    device_copy(shard + p.at, flat + p.lo, size_t(p.hi - p.lo) * sizeof(float), dev, stream);
    // the last ranks' padding
    device_zero(shard + p.at + (p.hi - p.lo), size_t(p.chunk - (p.hi - p.lo)) * sizeof(float), dev, stream);
  }
}

void init_pieces(const ParamLayout& layout, const StateShard& s, uint64_t seed, float* shard) {
  std::vector<float> unit;
  for (size_t u = 0; u < s.pieces.size(); ++u) {
    const StateShard::Piece& p = s.pieces[u];
    unit.assign(size_t(p.len), 0.0f);
    layout.init_unit(seed, u, unit.data());
    std::fill(shard + p.at, shard + p.at + p.chunk, 0.0f);
    std::copy(unit.begin() + (p.lo - p.begin), unit.begin() + (p.hi - p.begin), shard + p.at);
  }
}

std::vector<float> gather_pieces(const float* mine, const StateShard& s, Comm& group) {
  std::vector<float> all, flat;
  group.gather_v(std::span<const float>(mine, size_t(s.elems())), all, 0);
  if (group.rank() != 0) return flat;
  CTXPAR_CHECK(int64_t(all.size()) == s.elems() * s.Z, "gather_pieces: " << all.size() << " elements");
  flat.assign(size_t(s.n), 0.0f);
  for (int q = 0; q < s.Z; ++q)  // rank q's piece of each unit: its shard buffer at the same place
    for (const StateShard::Piece& p : s.pieces) {
      const int64_t lo = std::min(p.begin + p.len, p.begin + int64_t(q) * p.chunk);
      const int64_t hi = std::min(p.begin + p.len, lo + p.chunk);
      const float* src = all.data() + int64_t(q) * s.elems() + p.at;
      std::copy(src, src + (hi - lo), flat.data() + lo);
    }
  return flat;
}

void gather_weights(const float* master, float* flat, const StateShard& s, Comm& group, Buffer<float>& stage,
                    Device dev, Stream stream) {
  if (!s.sharded()) return;
  if (stage.size() < size_t(s.widest)) stage = Buffer<float>(size_t(s.widest), false, dev, stream);
  for (const StateShard::Piece& p : s.pieces) {
    group.all_gather(buf_at(master + p.at, size_t(p.chunk), dev), buf_at(stage.data(), size_t(p.chunk * s.Z), dev));
    device_copy(flat + p.begin, stage.data(), size_t(p.len) * sizeof(float), dev, stream);
  }
}

UnitFeed::UnitFeed(const ParamLayout& layout, const StateShard& s, Comm* group, bool exact, Device dev, Stream stream)
    : layout_(layout), s_(s), group_(group), gather_(s.params_sharded()), reduce_(s.grads_sharded() && !exact),
      dev_(dev), stream_(stream) {
  CTXPAR_CHECK(!(gather_ || reduce_) || (group && group->size() == s.Z), "UnitFeed: no shard group of " << s.Z);
  if (gather_) wbuf_ = Buffer<float>(size_t(s.widest), true, dev, stream);
  if (reduce_) gbuf_ = Buffer<float>(size_t(s.widest), true, dev, stream);
}

double UnitFeed::buffer_bytes(const StateShard& s, bool exact) {
  return 4.0 * double(s.widest) * ((s.params_sharded() ? 1.0 : 0.0) + (s.grads_sharded() && !exact ? 1.0 : 0.0));
}

void UnitFeed::bind(const float* params, float* grads, Tracer* tr, CpStats* st) {
  params_ = params;
  grads_ = grads;
  tr_ = tr;
  st_ = st;
  held_ = -1;  // the master pieces may have changed since
  // Whole gradients are accumulated in place; reduced pieces are written once per unit.
  if (!reduce_) device_zero(grads, size_t(layout_.local_elems()) * sizeof(float), dev_, stream_);
}

const float* UnitFeed::weights(size_t u) {
  const StateShard::Piece& p = s_.pieces[u];
  if (!gather_) return params_ + p.begin;
  if (held_ != int64_t(u)) {
    Tracer::Scope sc(tr_, Phase::state_gather, int32_t(u) - 1, -1, 0, 4.0 * double(p.chunk * (s_.Z - 1)));
    const double t0 = group_->now();
    group_->all_gather(buf_at(params_ + p.at, size_t(p.chunk), dev_), buf_at(wbuf_.data(), size_t(p.chunk * s_.Z), dev_));
    if (st_) st_->exposed_comm_s += group_->now() - t0;
    held_ = int64_t(u);
  }
  return wbuf_.data();
}

float* UnitFeed::grads(size_t u) {
  const StateShard::Piece& p = s_.pieces[u];
  if (!reduce_) return grads_ + p.begin;
  device_zero(gbuf_.data(), size_t(p.chunk * s_.Z) * sizeof(float), dev_, stream_);
  return gbuf_.data();
}

void UnitFeed::grads_done(size_t u) {
  if (!reduce_) return;
  const StateShard::Piece& p = s_.pieces[u];
  Tracer::Scope sc(tr_, Phase::state_reduce, int32_t(u) - 1, -1, 0, 4.0 * double(p.chunk * (s_.Z - 1)));
  const double t0 = group_->now();
  group_->reduce_scatter(buf_at(static_cast<const float*>(gbuf_.data()), size_t(p.chunk * s_.Z), dev_),
                         buf_at(grads_ + p.at, size_t(p.chunk), dev_));
  if (st_) st_->exposed_comm_s += group_->now() - t0;
}

}  // namespace ctxpar
