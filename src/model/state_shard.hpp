// Sharded training state (config shard=, ZeRO / FSDP style). The ranks that hold one tp slice of
// the parameters (the shard group, dp x CP: Topology::shard) split the state of each unit of the
// flat layout (model.hpp ParamUnit: the embedding, each layer, the head) into Z equal pieces,
// piece z of ceil(len / Z) elements to group rank z (the last one shorter or empty). A rank's
// pieces, one per unit, make its shard buffer; with Z = 1 a piece is its whole unit and the shard
// buffer is the flat layout itself (a shard index is the flat index).
//   optimizer  (ZeRO-1) the AdamW moments and the fp32 master weights of the pieces only; the
//              gradients summed whole on every rank as before; after the update each unit's
//              pieces are all-gathered into the whole weights the model reads.
//   grads      (ZeRO-2) also the gradients: each unit's gradient is reduce-scattered over the
//              group as soon as the backward has added its last term to it (one unit's whole
//              gradient at a time), into this rank's piece.
//   params     (ZeRO-3) also the weights: no rank holds them whole; each unit's are all-gathered
//              just before the forward or the backward uses them and freed after.
// The update is elementwise and the all-gathers move bits: optimizer has the bits of none, and so
// do grads and params under deterministic=true (whose integer gradient sums are all-reduced whole,
// as at every level, and whose gradients therefore stay whole); with the plain numerics the
// reduce-scatter sums the ranks' gradients in another order than the all-reduce.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/memory.hpp"
#include "core/settings.hpp"
#include "dist/comm.hpp"
#include "trace/trace.hpp"
#include "model/model.hpp"

namespace ctxpar {

struct CpStats;

struct StateShard {
  struct Piece {      // this rank's piece of one unit
    int64_t lo, hi;   // flat elements [lo, hi) (lo == hi: none)
    int64_t at;       // its first element's place in the shard buffer
    int64_t begin;    // the unit's first flat element
    int64_t len;      // the unit's elements
    int64_t chunk;    // elements of every rank's piece of this unit: ceil(len / Z)
  };
  ShardLevel level = ShardLevel::none;
  int64_t n = 0;      // elements of the flat layout
  int Z = 1, z = 0;   // ranks that share the state; this rank's index among them
  std::vector<Piece> pieces;  // one per unit, in unit order
  int64_t local = 0;          // elements of the shard buffer: the sum of the chunks
  int64_t widest = 0;         // the largest Z * chunk (a whole unit, padded to Z pieces)
  int64_t widest_layer = 0;   // the same over the layers only
  StateShard(const ParamLayout& layout, ShardLevel level, int z, int Z);
  static StateShard whole(const ParamLayout& layout) { return StateShard(layout, ShardLevel::none, 0, 1); }
  int64_t elems() const { return local; }
  bool sharded() const { return Z > 1; }
  bool grads_sharded() const { return sharded() && level != ShardLevel::optimizer; }
  bool params_sharded() const { return sharded() && level == ShardLevel::params; }
};

// This rank's share of `group` at `level` (none: the whole layout).
StateShard make_state_shard(ShardLevel level, const ParamLayout& layout, Comm& group);

// This rank's pieces of a flat buffer (`flat`: n elements) into its shard buffer, both on `dev`.
void take_pieces(const StateShard& s, const float* flat, float* shard, Device dev, Stream stream);
// The seeded initial weights (ParamLayout::init) of this rank's pieces only, into its shard
// buffer, one unit at a time (a unit's worth of scratch, never the whole model).
void init_pieces(const ParamLayout& layout, const StateShard& s, uint64_t seed, float* shard);
// The pieces of every rank of `group` (`mine`: this rank's shard buffer, host memory) assembled
// into the whole flat buffer on group rank 0 (checkpoints, oracle dumps); empty elsewhere.
std::vector<float> gather_pieces(const float* mine, const StateShard& s, Comm& group);

// The model's weights and gradient accumulators, one unit at a time (model/transformer.cpp asks
// for each unit just before it needs it, and says when a unit's gradient is complete). Without
// shards it hands out places in the whole flat buffers; with them it gathers and reduce-scatters,
// through two unit buffers each way so that the communication overlaps the compute:
//  - weights: when unit u is handed out, the gather of the unit asked for next (step_order) starts
//    into the other buffer, and completes when that unit is asked for. One buffer holds the widest
//    unit (the embedding or the head), the other the widest layer: with an even number of layers
//    the head's gather in the forward cannot start early (the last layer holds the wide buffer).
//  - gradients: grads_done starts the unit's reduce-scatter; the next unit accumulates into the
//    other buffer; finish() completes the last ones.
// Asked in another order, it is still right: it completes what is in flight and gathers then.
class UnitFeed {
 public:
  // `group`: the shard group (its host or device communicator; null without shards); `exact`:
  // the exact numerics, whose gradients stay whole at every level (their integer sums are
  // all-reduced whole); `pieces_on_host`: offload=params, the master pieces bind() is given are in
  // pinned host memory (each piece is copied to the device, into its weight buffer's piece slot,
  // on the compute stream just before its all-gather starts).
  UnitFeed(const ParamLayout& layout, const StateShard& s, Comm* group, bool exact, Device dev, Stream stream,
           bool pieces_on_host = false);
  // A step's buffers: `params`, the whole flat weights, or with shard=params the master pieces
  // (a shard buffer); `grads`, the whole flat gradients (zeroed here), or with a sharded gradient
  // the shard buffer its pieces are reduced into. `tr`, `st`: the gathers' spans and exposed time.
  void bind(const float* params, float* grads, Tracer* tr, CpStats* st);
  // Unit u's weights (tensor i at weights(u) + offset_i - begin_u), valid until weights() is
  // asked for another unit.
  const float* weights(size_t u);
  // Unit u's gradient accumulator, laid out the same way (zeroed at bind, or here).
  float* grads(size_t u);
  void grads_done(size_t u);  // every term of unit u's gradient added: its reduce-scatter starts
  void finish();              // every reduce-scatter and gather started is complete
  // Whether weights() hands out its own unit buffers (shard=params), of at most unit_capacity()
  // elements, rather than places in the flat weights it was bound to.
  bool gathers() const { return gather_; }
  int64_t unit_capacity() const { return s_.widest; }
  // Units since bind whose weights were gathered when asked for, not ahead.
  int64_t late_gathers() const { return late_; }
  // pieces_on_host: bytes of pieces copied in from host memory so far (offload's traffic).
  double host_bytes() const { return host_bytes_; }
  // The order a training step asks for weights: the embedding, the layers, the head, and the
  // layers again from the last to the first (the embedding's backward needs no weights).
  static std::vector<size_t> step_order(size_t units);
  // Bytes of gather and reduce buffers this object holds (the plan).
  static double buffer_bytes(const StateShard& s, bool exact, bool pieces_on_host = false);

 private:
  struct Slot {          // one unit buffer
    Buffer<float> buf;
    int64_t unit = -1;   // the unit it holds or is being filled with
    Request req;         // the collective filling it (weights) or reading it (gradients)
    Buffer<float> piece; // pieces_on_host: this rank's piece on the device, the gather's send buffer
  };
  void complete(Slot& slot, Phase phase, double bytes);
  // The slot of `slots` (weights' or gradients') that holds `elems`, not `avoid` if the other does.
  static int fits(const Slot (&slots)[2], int64_t elems, int avoid);
  int64_t padded(size_t u) const { return s_.pieces[u].chunk * s_.Z; }
  void start_gather(size_t u, int k);
  const ParamLayout& layout_;
  const StateShard& s_;
  Comm* group_;
  bool gather_, reduce_;  // weights gathered per unit; gradients reduce-scattered per unit
  bool on_host_;          // the master pieces in pinned host memory
  Device dev_;
  Stream stream_;
  const float* params_ = nullptr;
  float* grads_ = nullptr;
  Tracer* tr_ = nullptr;
  CpStats* st_ = nullptr;
  std::vector<size_t> order_;
  size_t at_ = 0;          // the place in order_ of the unit last handed out
  Slot w_[2], g_[2];       // weights: [0] the widest unit, [1] the widest layer; gradients likewise
  int cur_w_ = -1, cur_g_ = -1, last_g_ = -1;  // the slots handed out; the slot last reduced from
  int64_t late_ = 0;
  double host_bytes_ = 0;
};

// Each unit's pieces of every rank of `group` all-gathered, one unit at a time: `use(u, unit)`
// sees unit u whole on the device (unit: its first element), valid until the next call.
// `master`: this rank's shard buffer on the device, or (`on_host`: offload=params) in pinned host
// memory, each piece then copied to the device first (on `stream`: the host must not write
// `master` before the stream has passed; HostParams::upload synchronizes it). `stage`: the unit
// and piece buffers (made on first use). Blocking; collective over `group`.
struct GatherStage {
  Buffer<float> unit, piece;
};
void gather_units(const float* master, bool on_host, const StateShard& s, Comm& group, GatherStage& stage, Device dev,
                  Stream stream, const std::function<void(size_t u, const float* unit)>& use);
// shard=optimizer or grads: after every rank updated its pieces of the master weights (`master`,
// its shard buffer on the device), each unit's pieces all-gathered into the whole flat weights
// `flat` (gather_units).
void gather_weights(const float* master, float* flat, const StateShard& s, Comm& group, GatherStage& stage, Device dev,
                    Stream stream);

}  // namespace ctxpar
