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
  const std::vector<ParamUnit>& units = layout.units();
  for (size_t i = 0; i < units.size(); ++i) {  // the embedding, the layers, the head
    const ParamUnit& u = units[i];
    const int64_t chunk = (u.elems() + Z - 1) / Z;
    const int64_t lo = std::min(u.end, u.begin + int64_t(z) * chunk);
    pieces.push_back({lo, std::min(u.end, lo + chunk), local, u.begin, u.elems(), chunk});
    local += chunk;
    widest = std::max(widest, chunk * Z);
    if (i > 0 && i + 1 < units.size()) widest_layer = std::max(widest_layer, chunk * Z);
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

void gather_units(const float* master, bool on_host, const StateShard& s, Comm& group, GatherStage& stage, Device dev,
                  Stream stream, const std::function<void(size_t u, const float* unit)>& use) {
  if (stage.unit.size() < size_t(s.widest)) stage.unit = Buffer<float>(size_t(s.widest), false, dev, stream);
  if (on_host && stage.piece.size() < size_t(s.widest / s.Z))
    stage.piece = Buffer<float>(size_t(s.widest / s.Z), false, dev, stream);
  for (size_t u = 0; u < s.pieces.size(); ++u) {
    const StateShard::Piece& p = s.pieces[u];
    const float* mine = master + p.at;
    if (on_host) {  // pinned: on the stream, after the last unit's all-gather read the piece buffer
      copy_in_async(stage.piece.data(), mine, size_t(p.chunk) * sizeof(float), dev, stream);
      mine = stage.piece.data();
    }
    group.all_gather(buf_at(mine, size_t(p.chunk), dev), buf_at(stage.unit.data(), size_t(p.chunk * s.Z), dev));
    use(u, stage.unit.data());
  }
}

void gather_weights(const float* master, float* flat, const StateShard& s, Comm& group, GatherStage& stage, Device dev,
                    Stream stream) {
  if (!s.sharded()) return;
  gather_units(master, false, s, group, stage, dev, stream, [&](size_t u, const float* unit) {
    device_copy(flat + s.pieces[u].begin, unit, size_t(s.pieces[u].len) * sizeof(float), dev, stream);
  });
}

UnitFeed::UnitFeed(const ParamLayout& layout, const StateShard& s, Comm* group, bool exact, Device dev, Stream stream,
                   bool pieces_on_host)
    : layout_(layout), s_(s), group_(group), gather_(s.params_sharded()), reduce_(s.grads_sharded() && !exact),
      on_host_(gather_ && pieces_on_host), dev_(dev), stream_(stream), order_(step_order(s.pieces.size())) {
  CTXPAR_CHECK(!(gather_ || reduce_) || (group && group->size() == s.Z), "UnitFeed: no shard group of " << s.Z);
  CTXPAR_CHECK(!on_host_ || dev != Device::cpu, "UnitFeed: pieces in host memory on a CPU run");
  const size_t cap[2] = {size_t(s.widest), size_t(s.widest_layer)};
  for (int k = 0; k < 2; ++k) {
    if (gather_) w_[k].buf = Buffer<float>(cap[k], true, dev, stream);
    if (on_host_) w_[k].piece = Buffer<float>(cap[k] / size_t(s.Z), false, dev, stream);
    if (reduce_) g_[k].buf = Buffer<float>(cap[k], true, dev, stream);
  }
}

std::vector<size_t> UnitFeed::step_order(size_t units) {
  std::vector<size_t> o;
  for (size_t u = 0; u < units; ++u) o.push_back(u);              // the forward, the head last
  for (size_t u = units - 1; u-- > 1;) o.push_back(u);             // the layers' backward
  return o;
}

double UnitFeed::buffer_bytes(const StateShard& s, bool exact, bool pieces_on_host) {
  const double two = 4.0 * double(s.widest + s.widest_layer);
  const double pieces = s.params_sharded() && pieces_on_host ? two / double(s.Z) : 0.0;
  return two * ((s.params_sharded() ? 1.0 : 0.0) + (s.grads_sharded() && !exact ? 1.0 : 0.0)) + pieces;
}

void UnitFeed::complete(Slot& slot, Phase phase, double bytes) {
  if (!slot.req.pending()) return;
  Tracer::Scope sc(tr_, phase, int32_t(slot.unit) - 1, -1, 0, bytes);
  const double t0 = group_->now();
  group_->stream_wait(slot.req);
  if (st_) st_->exposed_comm_s += group_->now() - t0;
}

void UnitFeed::finish() {
  for (Slot* slot : {&w_[0], &w_[1]}) complete(*slot, Phase::state_gather, 0);
  for (Slot* slot : {&g_[0], &g_[1]}) complete(*slot, Phase::state_reduce, 0);
}

void UnitFeed::bind(const float* params, float* grads, Tracer* tr, CpStats* st) {
  finish();  // nothing of an earlier step in flight (normally nothing is)
  params_ = params;
  grads_ = grads;
  tr_ = tr;
  st_ = st;
  w_[0].unit = w_[1].unit = -1;  // the master pieces may have changed since
  cur_w_ = cur_g_ = last_g_ = -1;
  at_ = 0;
  late_ = 0;
  // Whole gradients are accumulated in place; reduced pieces are written once per unit.
  if (!reduce_) device_zero(grads, size_t(layout_.local_elems()) * sizeof(float), dev_, stream_);
}

int UnitFeed::fits(const Slot (&slots)[2], int64_t elems, int avoid) {
  int k = -1;
  for (int j = 0; j < 2; ++j)
    if (int64_t(slots[j].buf.size()) >= elems && (k < 0 || k == avoid)) k = j;
  return k;
}

void UnitFeed::start_gather(size_t u, int k) {
  const StateShard::Piece& p = s_.pieces[u];
  w_[k].unit = int64_t(u);
  const float* mine = params_ + p.at;
  if (on_host_) {  // the slot's last gather, which read the piece buffer, is complete (complete())
    copy_in_async(w_[k].piece.data(), mine, size_t(p.chunk) * sizeof(float), dev_, stream_);
    mine = w_[k].piece.data();
    host_bytes_ += 4.0 * double(p.chunk);
  }
  w_[k].req = group_->all_gather_async(buf_at(mine, size_t(p.chunk), dev_),
                                       buf_at(w_[k].buf.data(), size_t(padded(u)), dev_));
}

const float* UnitFeed::weights(size_t u) {
  const StateShard::Piece& p = s_.pieces[u];
  if (!gather_) return params_ + p.begin;
  const double bytes = 4.0 * double(p.chunk * (s_.Z - 1));
  int k = w_[0].unit == int64_t(u) ? 0 : w_[1].unit == int64_t(u) ? 1 : -1;
  if (k < 0) {  // not prefetched: gathered now, into the other buffer if it fits
    k = fits(w_, padded(u), cur_w_);
    complete(w_[k], Phase::state_gather, 0);
    start_gather(u, k);
    ++late_;
  }
  complete(w_[k], Phase::state_gather, bytes);
  cur_w_ = k;
  // The unit asked for next, into the other buffer while this one is used.
  if (at_ >= order_.size() || order_[at_] != u) at_ = size_t(std::find(order_.begin(), order_.end(), u) - order_.begin());
  const size_t next_at = at_ + 1;
  if (next_at < order_.size()) {
    const size_t next = order_[next_at];
    const int o = 1 - k;
    if (w_[k].unit != int64_t(next) && w_[o].unit != int64_t(next) && int64_t(w_[o].buf.size()) >= padded(next)) {
      complete(w_[o], Phase::state_gather, 0);
      start_gather(next, o);
    }
  }
  at_ = next_at;
  return w_[k].buf.data();
}

float* UnitFeed::grads(size_t u) {
  const StateShard::Piece& p = s_.pieces[u];
  if (!reduce_) return grads_ + p.begin;
  const int k = fits(g_, padded(u), last_g_);  // not the one whose reduce-scatter started last
  complete(g_[k], Phase::state_reduce, 0);  // its reduce-scatter has read it
  g_[k].unit = int64_t(u);
  device_zero(g_[k].buf.data(), size_t(padded(u)) * sizeof(float), dev_, stream_);
  cur_g_ = k;
  return g_[k].buf.data();
}

void UnitFeed::grads_done(size_t u) {
  if (!reduce_) return;
  const StateShard::Piece& p = s_.pieces[u];
  CTXPAR_CHECK(cur_g_ >= 0 && g_[cur_g_].unit == int64_t(u), "UnitFeed::grads_done(" << u << "): not the unit handed out");
  Slot& g = g_[cur_g_];
  Tracer::Scope sc(tr_, Phase::state_reduce, int32_t(u) - 1, -1, 0, 4.0 * double(p.chunk * (s_.Z - 1)));
  g.req = group_->reduce_scatter_async(buf_at(static_cast<const float*>(g.buf.data()), size_t(padded(u)), dev_),
                                       buf_at(grads_ + p.at, size_t(p.chunk), dev_));
  last_g_ = cur_g_;
  cur_g_ = -1;
}

}  // namespace ctxpar
