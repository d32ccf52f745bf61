#include "model/optimizer.hpp"

#include <cmath>
#include <span>

#include "dist/comm.hpp"

namespace ctxpar {

AdamW::AdamW(const ParamLayout& layout, const AdamWConfig& c)
    : layout_(layout), c_(c), m_(size_t(layout.local_elems())), v_(size_t(layout.local_elems())) {}

double AdamW::grad_norm(const float* g, Comm* tp) const {
  double sq[2] = {0, 0};  // sharded, replicated
  for (const ParamInfo& p : layout_.tensors())
    sq[p.split == Split::replicated ? 1 : 0] += sum_squares(g + p.offset, p.loc_elems());
  if (tp) tp->all_reduce(std::span<double>(sq, 1));
  return std::sqrt(sq[0] + sq[1]);
}

void AdamW::update(float* params, const float* grads, double norm) {
  ++step_;
  AdamWStep hp;
  hp.lr = c_.lr;
  hp.beta1 = c_.beta1;
  hp.beta2 = c_.beta2;
  hp.eps = c_.eps;
  hp.step = step_;
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  hp.grad_scale = c_.grad_clip > 0 && norm > c_.grad_clip ? c_.grad_clip / (norm + 1e-6) : 1.0;
  for (const ParamInfo& p : layout_.tensors()) {
    hp.weight_decay = p.decay ? c_.weight_decay : 0.0;
    adamw_update(params + p.offset, grads + p.offset, m_.data() + p.offset, v_.data() + p.offset, p.loc_elems(), hp);
  }
}

}  // namespace ctxpar
