// Per-layer tensors that the forward writes and the backward reads again, in reverse layer order:
// the residual stream's layer inputs x_l, l = 0..L (x_L the final norm's input; their norms and
// the recompute of remat read them), and with remat=none each attention layer's output O and LSE
// (dWo and the attention backward read them). Without offload: one buffer per entry.
// With host offload (offload=layer_inputs / attn_out, a GPU run): kSlots device slots (entry l in
// slot l mod kSlots) and pinned host memory for the first `offloaded` entries (x_0 .. x_{L-1}; every
// attention output); each is copied out on a copy stream as soon as it is written (overlapping the
// next layers' forward), and in the backward entry l - 1 is copied back while layer l's backward
// runs. Events order every copy after the write it reads and before the write that reuses its slot;
// where the compute stream has to wait for a copy, the wait is traced as a span of phase offload
// (the copy time compute did not hide).
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "attn_params.hpp"
#include "core/memory.hpp"
#include "model/layer.hpp"  // Bf16Mirror
#include "model/model.hpp"
#include "model/state_shard.hpp"

namespace ctxpar {

class Tracer;

class LayerStash {
 public:
  static constexpr int64_t kSlots = 3;
  // `count` entries of `elems` floats each (x_l: L + 1 of S_loc * dim; attention outputs: L of
  // S_loc * (q_width + H_q)); with offload, entries 0 .. offloaded - 1 go to the host.
  LayerStash(int64_t count, int64_t offloaded, size_t elems, bool offload, Device dev, Stream stream);
  ~LayerStash();
  LayerStash(const LayerStash&) = delete;
  LayerStash& operator=(const LayerStash&) = delete;

  float* at(int64_t l);                        // entry l's device buffer (with offload: its slot)
  void will_write(int64_t l, Tracer* tr);      // before entry l is written: its slot's last copy out done
  void written(int64_t l);                     // after entry l is written: copied out (l < offloaded)
  void will_read(int64_t l, Tracer* tr);       // backward, before layer l reads entry l (descending l)
  void end_step();                             // releases the step's events
  bool offloaded() const { return offload_; }
  double offload_bytes() const { return bytes_; }  // bytes copied either way so far
  // GPU bytes: `count` buffers, or min(count, kSlots) slots with offload.
  static double device_bytes(int64_t count, size_t elems, bool offload);

 private:
  int64_t slot(int64_t l) const { return offload_ ? l % kSlots : l; }
  void prefetch(int64_t l);
  void wait(Event e, Tracer* tr, double bytes);

  int64_t count_, n_host_;  // entries; entries that go to the host with offload
  size_t elems_;
  bool offload_;
  Device dev_;
  Stream stream_, copy_stream_ = nullptr;
  std::vector<Buffer<float>> dev_x_;       // `count` buffers, or the slots
  std::vector<float*> host_x_;             // offload: pinned copies of entries 0 .. n_host - 1
  std::vector<int64_t> occupant_;          // offload: which x_l each slot holds (-1: none)
  std::vector<Event> out_, in_;            // offload, per l: its copy out / copy in of this step
  double bytes_ = 0;
};

// offload=params (a GPU run, with offload=optimizer): the fp32 master weights live in pinned host
// memory. The GPU keeps the bf16 copy of every weight (the GEMMs' operands, Bf16Mirror) and fp32
// copies of the tensors its kernels read in fp32, the embedding table and the norm weights
// ("resident"). At each update AdamW (model/optimizer.hpp) streams the other tensors' fp32 chunks
// through the GPU beside their moments and refreshes their bf16 copy from the updated chunk; the
// resident ones it updates in place; every updated chunk is copied back to the master, so the
// host holds the current weights once the copy stream is done (AdamW::wait_host). The same bits as
// without: the same kernels on the same fp32 values, the bf16 copy rounded from them.
// With a shard (shard=, model/state_shard.hpp) the host holds this rank's pieces only (its shard
// buffer), and AdamW streams every chunk in and out:
//   optimizer, grads  after the update (upload()) each unit's pieces are all-gathered on the GPU and
//                     the whole bf16 copy and resident tensors made from them, as at the start;
//   params            the GPU keeps no copy: the model's UnitFeed copies each piece in and gathers
//                     the unit just before its use, as it does from the device's pieces without offload.
// The same bits as the same shard level without offload.
class HostParams {
 public:
  // `s`: the pieces this rank holds (StateShard::whole: every element); `group`: the shard group
  // (null unsharded).
  HostParams(const ParamLayout& layout, const StateShard& s, Comm* group, Device dev, Stream stream);
  ~HostParams();
  HostParams(const HostParams&) = delete;
  HostParams& operator=(const HostParams&) = delete;

  float* host() { return host_; }  // the master [s.elems()], pinned: the flat layout, or this rank's pieces
  bool in_pieces() const { return s_.sharded(); }
  // Whether the GPU keeps the whole weights' copies (view(), mirror()): every level but params.
  bool mirrors() const { return !s_.params_sharded(); }
  // After the host wrote host() (initialization, resume) or a sharded update: the GPU's resident
  // tensors and the bf16 copy of every tensor from it (returns when done; collective over the
  // shard group when in pieces; nothing at shard=params).
  void upload();
  // The weights as the model reads them on the GPU (mirrors()): embedding and norms resident on
  // the device, the GEMM weights' pointers into a host layout that no GPU kernel reads (the GEMMs
  // take their bf16 copy through mirror(), whose base is that layout's).
  const ModelView& view() const { return view_; }
  const Bf16Mirror& mirror() const { return mirror_; }
  uint16_t* bf16() { return bf16_.data(); }
  // The device copy of element `offset` (flat index) of a resident tensor, or null.
  float* resident(int64_t offset) const;
  static bool is_resident(const ParamInfo& p) { return p.ones || p.name == "emb"; }
  // fp32 elements that stay on the GPU (the resident tensors).
  static int64_t resident_elems(const ParamLayout& layout);
  // GPU bytes this object holds: the resident tensors and the whole bf16 copy (mirrors()), and in
  // pieces its gather's unit and piece buffers.
  static double device_bytes(const ParamLayout& layout, const StateShard& s);

 private:
  const ParamLayout& layout_;
  const StateShard& s_;
  Comm* group_;
  Device dev_;
  Stream stream_;
  float* host_ = nullptr;
  Buffer<float> res_;                     // the resident tensors, packed in layout order
  struct Resident {
    int64_t offset, elems, at;  // a resident tensor's place in the layout, its size, its place in res_
  };
  std::vector<Resident> res_map_;
  Buffer<uint16_t> bf16_;
  GatherStage stage_;  // in pieces: upload()'s all-gathers
  size_t reserved_ = 0;  // in pieces: the bytes of address space reserved for view()
  ModelView view_;
  Bf16Mirror mirror_;
};

}  // namespace ctxpar
