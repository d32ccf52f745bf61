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
#include <vector>

#include "attn_params.hpp"
#include "core/memory.hpp"

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

}  // namespace ctxpar
