// AdamW over the flat parameter buffer (model.hpp layout) with global gradient-norm clipping.
// Weight decay applies to matrices (ParamInfo::decay), not to norm weights.
#pragma once
#include <cstdint>

#include "core/memory.hpp"
#include "model/model.hpp"
#include "ops.hpp"

namespace ctxpar {

class Comm;

struct AdamWConfig {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0;
};

// Training with fewer K/V heads than tp: each K/V head's projection columns live on tp / H_kv
// tp ranks, each of which computed the gradient from its own query heads; sums those copies (a
// collective over tp, in place; a no-op without replicated heads). `grads` on `dev` (a GPU's
// tensors are staged through the host: a small tensor, once per step).
void reduce_replicated_kv_grads(const ParamLayout& layout, float* grads, Comm& tp, Device dev = Device::cpu,
                                Stream stream = nullptr);

// The moments live on `dev` (Device::cuda: every operation ordered on `stream`), as do the
// params and grads passed to it.
class AdamW {
 public:
  AdamW(const ParamLayout& layout, const AdamWConfig& c, Device dev = Device::cpu, Stream stream = nullptr);
  // Global L2 norm of the gradient: tp-sharded tensors summed over `tp` (null when tp = 1),
  // replicated tensors counted once (they are identical on every tp rank).
  double grad_norm(const float* grads, Comm* tp) const;
  // One step (increments step()); scales the gradient by min(1, grad_clip / norm).
  void update(float* params, const float* grads, double norm);
  int64_t step() const { return step_; }
  void set_step(int64_t s) { step_ = s; }
  Buffer<float>& m() { return m_; }
  Buffer<float>& v() { return v_; }

 private:
  const ParamLayout& layout_;
  AdamWConfig c_;
  Device dev_;
  Stream stream_;
  Buffer<float> m_, v_;
  int64_t step_ = 0;
};

}  // namespace ctxpar
