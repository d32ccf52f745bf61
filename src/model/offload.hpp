// The residual stream's layer inputs x_l, l = 0..L (x_L the final norm's input), which the
// backward reads again (its norms, and the recompute of remat). Without offload: L + 1 buffers.
// With host offload (offload=layer_inputs, a GPU run): kSlots device slots (x_l in slot l mod
// kSlots) and pinned host memory for x_0 .. x_{L-1}; each is copied out on a copy stream as soon as
// it is written (overlapping the next layers' forward), and in the backward the input of layer
// l - 1 is copied back while layer l's backward runs. Events order every copy after the write it
// reads and before the write that reuses its slot; where the compute stream has to wait for a copy,
// the wait is traced as a span of phase offload (the copy time compute did not hide).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attn_params.hpp"
#include "core/memory.hpp"

namespace ctxpar {

class Tracer;

class LayerInputs {
 public:
  static constexpr int64_t kSlots = 3;
  // `elems`: floats of one x_l (S_loc * dim).
  LayerInputs(int64_t layers, size_t elems, bool offload, Device dev, Stream stream);
  ~LayerInputs();
  LayerInputs(const LayerInputs&) = delete;
  LayerInputs& operator=(const LayerInputs&) = delete;

  float* at(int64_t l);                        // x_l's device buffer (with offload: its slot)
  void will_write(int64_t l, Tracer* tr);      // before x_l is written: its slot's last copy out done
  void written(int64_t l);                     // after x_l is written: copied out (l < L)
  void will_read(int64_t l, Tracer* tr);       // backward, before layer l reads x_l (l = L-1 .. 0 in order)
  void end_step();                             // releases the step's events
  bool offloaded() const { return offload_; }
  double offload_bytes() const { return bytes_; }  // bytes copied either way so far
  // GPU bytes of the layer inputs: (L + 1) buffers, or min(L + 1, kSlots) slots with offload.
  static double device_bytes(int64_t layers, size_t elems, bool offload);

 private:
  int64_t slot(int64_t l) const { return offload_ ? l % kSlots : l; }
  void prefetch(int64_t l);
  void wait(Event e, Tracer* tr, double bytes);

  int64_t L_;
  size_t elems_;
  bool offload_;
  Device dev_;
  Stream stream_, copy_stream_ = nullptr;
  std::vector<Buffer<float>> dev_x_;       // (L + 1) buffers, or the slots
  std::vector<float*> host_x_;             // offload: pinned copies of x_0 .. x_{L-1}
  std::vector<int64_t> occupant_;          // offload: which x_l each slot holds (-1: none)
  std::vector<Event> out_, in_;            // offload, per l: its copy out / copy in of this step
  double bytes_ = 0;
};

}  // namespace ctxpar
