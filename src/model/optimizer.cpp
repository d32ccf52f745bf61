#include "model/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "dist/comm.hpp"

namespace ctxpar {

AdamW::AdamW(const ParamLayout& layout, const AdamWConfig& c, Device dev, Stream stream)
    : layout_(layout), c_(c), dev_(dev), stream_(stream), m_(size_t(layout.local_elems()), true, dev, stream),
      v_(size_t(layout.local_elems()), true, dev, stream) {}

double AdamW::grad_norm(const float* g, Comm* tp) const {
  double sq[2] = {0, 0};  // sharded, replicated
  for (const ParamInfo& p : layout_.tensors())  // a K/V head held by `copies` tp ranks: once
    sq[p.split == Split::replicated ? 1 : 0] += sum_squares(g + p.offset, p.loc_elems(), dev_, stream_) / double(p.copies);
  if (tp) tp->all_reduce(std::span<double>(sq, 1));
  return std::sqrt(sq[0] + sq[1]);
}

void reduce_replicated_kv_grads(const ParamLayout& layout, float* grads, Comm& tp, Device dev, Stream stream) {
  for (const ParamInfo& p : layout.tensors()) {
    if (!p.kv || p.copies <= 1) continue;
    // Every tp rank writes its head's columns into the whole tensor's place (zeros elsewhere);
    // the sum over tp leaves each head's columns summed over its copies.
    std::vector<float> all(size_t(p.rows * p.cols), 0.0f), g(size_t(p.loc_elems()));
    const size_t bytes = g.size() * sizeof(float);
    copy_to_host(g.data(), grads + p.offset, bytes, dev, stream);
    for (int64_t r = 0; r < p.rows; ++r)
      std::copy_n(g.data() + r * p.loc_cols, p.loc_cols, all.data() + r * p.cols + p.col0);
    tp.all_reduce(std::span<float>(all));
    for (int64_t r = 0; r < p.rows; ++r)
      std::copy_n(all.data() + r * p.cols + p.col0, p.loc_cols, g.data() + r * p.loc_cols);
    copy_to_device(grads + p.offset, g.data(), bytes, dev, stream);
  }
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
    adamw_update(params + p.offset, grads + p.offset, m_.data() + p.offset, v_.data() + p.offset, p.loc_elems(), hp,
                 dev_, stream_);
  }
}

}  // namespace ctxpar
