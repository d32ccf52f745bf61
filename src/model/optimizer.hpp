// AdamW over the flat parameter buffer (model.hpp layout) with global gradient-norm clipping.
// Weight decay applies to matrices (ParamInfo::decay), not to norm weights.
#pragma once
#include <cstdint>
#include <vector>

#include "core/memory.hpp"
#include "model/model.hpp"
#include "model/state_shard.hpp"
#include "ops.hpp"

namespace ctxpar {

class Comm;
class Tracer;

struct AdamWConfig {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0;
};

// Training with fewer K/V heads than tp: each K/V head's projection columns live on tp / H_kv
// tp ranks, each of which computed the gradient from its own query heads; sums those copies (a
// collective over tp, in place; a no-op without replicated heads). `grads` on `dev` (a GPU's
// tensors are staged through the host: a small tensor, once per step): the whole flat gradient,
// or (`pieces`, shard=grads and params) this rank's pieces of it (model/state_shard.hpp), the same
// pieces on every tp rank.
void reduce_replicated_kv_grads(const ParamLayout& layout, float* grads, Comm& tp, Device dev = Device::cpu,
                                Stream stream = nullptr, const StateShard* pieces = nullptr);

// The moments live on `dev` (Device::cuda: every operation ordered on `stream`), as do the
// params and grads passed to it. They cover this rank's pieces of the layout (model/state_shard.hpp;
// the whole layout without sharding), in its shard buffer's order: update() takes the master
// weights of the pieces (a shard buffer; without sharding the flat weights themselves) and the
// gradient, whole (flat) or, `grads_in_pieces`, as a shard buffer too.
//
// Host offload (`offload_moments`, offload=optimizer, a GPU run): the moments live in pinned host
// memory, and update() streams them through the GPU in chunks of `chunk` elements (config
// offload_chunk) with two device slots: a copy stream brings chunk i + 1 in while the compute
// stream updates chunk i (the same kernel, so the same bits as without offload) and takes chunk
// i - 1 out; events order each copy after the slot's last use. prefetch() issues the first two
// chunks' copies early (at the start of a step, hidden under the forward); the last chunk's copy
// out overlaps the next step. The compute stream waits only where a chunk has not arrived: that
// wait is the copy time compute did not hide, traced as a span of phase offload (with the bytes).
// With the master weights offloaded too (attach(HostParams*), offload=params): `params` of update()
// is the pinned master; each chunk of a tensor the GPU does not keep in fp32 comes in beside its
// moments and, updated, refreshes its bf16 copy; resident chunks (embedding, norms) are updated in
// place on the GPU; every updated chunk goes back to the master.
class HostParams;
class AdamW {
 public:
  static constexpr int64_t kOffloadChunk = int64_t(1) << 22;  // default elements per chunk (16 MiB each of m, v)
  // `chunk`: elements per streamed chunk with offload (0: kOffloadChunk).
  // `group`: the shard group (the norm of a gradient in pieces sums over it; null: no shard).
  AdamW(const ParamLayout& layout, const AdamWConfig& c, const StateShard& shard, Comm* group, bool grads_in_pieces,
        Device dev = Device::cpu, Stream stream = nullptr, bool offload_moments = false, int64_t chunk = 0);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;
  // Global L2 norm of the gradient: tp-sharded tensors summed over `tp` (null when tp = 1),
  // replicated tensors counted once (they are identical on every tp rank); a gradient in pieces
  // summed over the shard group first.
  double grad_norm(const float* grads, Comm* tp) const;
  // exact numerics (CPU): the same norm with the same bits for any tp dividing `units`
  // (exact_tp_units) and any thread count: each tensor's squares summed in fixed parts
  // (a replicated tensor whole; a tp-split one in `units` parts of its split dimension), each
  // part in order in double, the parts gathered over tp and added in (tensor, part) order. A K/V
  // head replicated over tp (its gradient whole on every copy) gives each copy its share of the parts.
  double grad_norm_exact(const float* grads, Comm* tp, int64_t units) const;
  // One step (increments step()); scales the gradient by min(1, grad_clip / norm). `tr`: offload's
  // waits are traced as spans of phase offload.
  void update(float* params, const float* grads, double norm, Tracer* tr = nullptr);
  // Offload: start copying the first chunks in now (a no-op otherwise, or when already started).
  void prefetch();
  // offload=params: the master weights and their GPU copies (needs offloaded moments).
  void attach(HostParams* hp);
  int64_t step() const { return step_; }
  void set_step(int64_t s) { step_ = s; }
  // The moments [elems()] of the pieces (a shard buffer): on the device, or (offloaded()) in
  // pinned host memory, which the host may read or write after wait_host().
  float* m() { return offload_ ? hm_ : m_.data(); }
  float* v() { return offload_ ? hv_ : v_.data(); }
  bool offloaded() const { return offload_; }
  void wait_host();  // offload: the host waits for every copy of the moments (else: nothing)
  int64_t elems() const { return shard_.elems(); }
  // Bytes copied between the GPU and the host by offload, over all updates so far.
  double offload_bytes() const { return offload_bytes_; }
  // GPU memory the moments of `elems` elements take: 8 bytes per element, or the two slots of m
  // and v with offload (each as long as the largest tensor, up to the chunk), and with
  // offload=params two of the weights' too.
  static double device_bytes(const ParamLayout& layout, int64_t elems, bool offload_moments, int64_t chunk = 0,
                             bool offload_params = false);
  static int64_t chunk_elems(const ParamLayout& layout, int64_t chunk = 0);

 private:
  struct Chunk {
    int64_t offset, at, elems;  // flat offset, place in the shard buffer
    bool decay;
  };
  // f(tensor, flat a, flat b, shard index of a) for every tensor's part in this rank's pieces.
  template <class F> void for_each_part(F f) const;
  void copy_in(size_t i);  // chunk i into slot i % 2, on the copy stream

  const ParamLayout& layout_;
  const StateShard shard_;
  Comm* group_;
  bool grads_in_pieces_;
  AdamWConfig c_;
  Device dev_;
  Stream stream_;
  bool offload_ = false;
  Buffer<float> m_, v_;      // on the device (without offload)
  float* hm_ = nullptr;      // pinned host (offload)
  float* hv_ = nullptr;
  int64_t chunk_ = kOffloadChunk;
  std::vector<Chunk> chunks_;     // offload: every tensor's chunks, in order
  Stream copy_stream_ = nullptr;  // offload: the copies
  Buffer<float> sm_[2], sv_[2];   // offload: the two device slots of m and v
  HostParams* hp_ = nullptr;      // offload=params: the master weights (null: on the device)
  Buffer<float> sp_[2];           // offload=params: the two device slots of the weights
  std::vector<float*> res_;       // offload=params, per chunk: its resident device copy, or null
  std::vector<Event> in_;         // offload: chunk i arrived (recorded on the copy stream)
  size_t issued_ = 0;             // offload: chunks whose copy in is issued this step
  double offload_bytes_ = 0;
  int64_t step_ = 0;
};

}  // namespace ctxpar
