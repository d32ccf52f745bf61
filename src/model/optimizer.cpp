#include "model/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "dist/comm.hpp"
#include "model/offload.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

template <class F> void AdamW::for_each_part(F f) const {
  const auto& units = layout_.units();
  for (size_t u = 0; u < units.size(); ++u) {
    const StateShard::Piece& pc = shard_.pieces[u];
    for (size_t i = units[u].first; i < units[u].last; ++i) {
      const ParamInfo& p = layout_.tensors()[i];
      const int64_t a = std::max(p.offset, pc.lo), b = std::min(p.offset + p.loc_elems(), pc.hi);
      if (a < b) f(p, a, b, pc.at + (a - pc.lo));
    }
  }
}

AdamW::AdamW(const ParamLayout& layout, const AdamWConfig& c, const StateShard& shard, Comm* group,
             bool grads_in_pieces, Device dev, Stream stream, bool offload_moments, int64_t chunk)
    : layout_(layout), shard_(shard), group_(group), grads_in_pieces_(grads_in_pieces), c_(c), dev_(dev),
      stream_(stream), offload_(offload_moments && dev != Device::cpu), chunk_(chunk_elems(layout, chunk)) {
  CTXPAR_CHECK(shard_.n == layout.local_elems() && (!grads_in_pieces || group),
               "AdamW: a shard of " << shard_.n << " elements over a layout of " << layout.local_elems());
  const size_t n = size_t(shard_.elems());
  if (!offload_) {
    m_ = Buffer<float>(n, true, dev, stream);
    v_ = Buffer<float>(n, true, dev, stream);
    return;
  }
  hm_ = static_cast<float*>(pinned_alloc(n * sizeof(float), dev));
  hv_ = static_cast<float*>(pinned_alloc(n * sizeof(float), dev));
  std::fill_n(hm_, n, 0.0f);
  std::fill_n(hv_, n, 0.0f);
  for_each_part([&](const ParamInfo& p, int64_t a, int64_t b, int64_t at) {
    for (int64_t i = a; i < b; i += chunk_) chunks_.push_back({i, at + (i - a), std::min(chunk_, b - i), p.decay});
  });
  copy_stream_ = stream_create(dev);
  for (int s = 0; s < 2; ++s) {
    sm_[s] = Buffer<float>(size_t(chunk_), false, dev, stream);
    sv_[s] = Buffer<float>(size_t(chunk_), false, dev, stream);
  }
  stream_wait_stream(copy_stream_, stream_, dev_);  // the slots exist once the compute stream allocated them
}

AdamW::~AdamW() {
  if (!offload_) return;
  wait_host();
  for (Event e : in_) event_destroy(e, dev_);
  stream_synchronize(stream_, dev_);
  stream_destroy(copy_stream_, dev_);
  pinned_free(hm_, dev_);
  pinned_free(hv_, dev_);
}

void AdamW::wait_host() {
  if (offload_) stream_synchronize(copy_stream_, dev_);
}

int64_t AdamW::chunk_elems(const ParamLayout& layout, int64_t chunk) {
  int64_t largest = 1;
  for (const ParamInfo& p : layout.tensors()) largest = std::max(largest, p.loc_elems());
  return std::min(chunk > 0 ? chunk : kOffloadChunk, largest);
}

double AdamW::device_bytes(const ParamLayout& layout, int64_t elems, bool offload_moments, int64_t chunk,
                           bool offload_params) {
  if (!offload_moments) return 8.0 * double(elems);
  return 2.0 * (offload_params ? 12.0 : 8.0) * double(chunk_elems(layout, chunk));
}

void AdamW::attach(HostParams* hp) {
  CTXPAR_CHECK(offload_ && hp, "offload=params needs offload=optimizer (the weights stream with the moments)");
  hp_ = hp;
  for (int s = 0; s < 2; ++s) sp_[s] = Buffer<float>(size_t(chunk_), false, dev_, stream_);
  // In pieces every chunk streams in and out (upload() then makes the GPU's copies from the host).
  for (const Chunk& c : chunks_) res_.push_back(hp->in_pieces() ? nullptr : hp->resident(c.offset));
  stream_wait_stream(copy_stream_, stream_, dev_);  // the slots exist once the compute stream allocated them
}

void AdamW::copy_in(size_t i) {
  const Chunk& c = chunks_[i];
  const size_t bytes = size_t(c.elems) * sizeof(float), s = i % 2;
  copy_in_async(sm_[s].data(), hm_ + c.at, bytes, dev_, copy_stream_);
  copy_in_async(sv_[s].data(), hv_ + c.at, bytes, dev_, copy_stream_);
  if (hp_ && !res_[i]) copy_in_async(sp_[s].data(), hp_->host() + c.at, bytes, dev_, copy_stream_);
  in_.push_back(event_record(copy_stream_, dev_));
  issued_ = i + 1;
}

void AdamW::prefetch() {
  if (!offload_ || issued_ > 0) return;
  for (size_t i = 0; i < std::min<size_t>(2, chunks_.size()); ++i) copy_in(i);
}

double AdamW::grad_norm(const float* g, Comm* tp) const {
  double sq[2] = {0, 0};  // sharded, replicated
  if (grads_in_pieces_) {  // this rank's pieces, then the shard group's sum
    for_each_part([&](const ParamInfo& p, int64_t a, int64_t b, int64_t at) {
      sq[p.split == Split::replicated ? 1 : 0] += sum_squares(g + at, b - a, dev_, stream_) / double(p.copies);
    });
    group_->all_reduce(std::span<double>(sq, 2));
  } else {
    for (const ParamInfo& p : layout_.tensors())  // a K/V head held by `copies` tp ranks: once
      sq[p.split == Split::replicated ? 1 : 0] += sum_squares(g + p.offset, p.loc_elems(), dev_, stream_) / double(p.copies);
  }
  if (tp) tp->all_reduce(std::span<double>(sq, 1));
  return std::sqrt(sq[0] + sq[1]);
}

double AdamW::grad_norm_exact(const float* g, Comm* tp, int64_t units) const {
  const int T = tp ? tp->size() : 1;
  const int64_t parts = units / T;  // this rank's parts of a split tensor
  struct Item {
    const ParamInfo* p;
    int64_t part;
  };
  std::vector<Item> items;
  std::vector<size_t> first;  // each tensor's first item
  const int t_rank = tp ? tp->rank() : 0;
  for (const ParamInfo& p : layout_.tensors()) {
    // a K/V head on several tp ranks (its gradient whole on each): each copy sums its share of
    // the global parts, columns [col0 + c0, ...) of the whole tensor's cols / units each
    CTXPAR_CHECK(units % T == 0 && (p.copies == 1 || (p.split == Split::cols && p.cols % units == 0)),
                 "grad_norm_exact: " << p.name << " in " << units << " parts over tp:" << T);
    first.push_back(items.size());
    for (int64_t j = 0; j < (p.split == Split::replicated ? 1 : parts); ++j) items.push_back({&p, j});
  }
  std::vector<double> mine(items.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < items.size(); ++i) {  // one thread per part: its order is fixed
    const ParamInfo& p = *items[i].p;
    const float* x = g + p.offset;
    int64_t r0 = 0, r1 = p.loc_rows, c0 = 0, c1 = p.loc_cols;
    if (p.split == Split::rows) r1 = (r0 = items[i].part * (p.loc_rows / parts)) + p.loc_rows / parts;
    if (p.split == Split::cols && p.copies == 1) c1 = (c0 = items[i].part * (p.loc_cols / parts)) + p.loc_cols / parts;
    if (p.copies > 1) {
      const int64_t w = p.cols / units;
      c0 = (t_rank * parts + items[i].part) * w - p.col0;
      c1 = c0 + w;
      CTXPAR_CHECK(c0 >= 0 && c1 <= p.loc_cols, "grad_norm_exact: " << p.name << "'s part outside its copy");
    }
    double acc[4] = {0, 0, 0, 0};  // four chains (column mod 4), added in a fixed order
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        const double v = x[r * p.loc_cols + c];
        acc[(c - c0) & 3] += v * v;
      }
    mine[i] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  std::vector<double> all(mine.size() * size_t(T));
  if (tp) tp->all_gather(std::span<const double>(mine), std::span<double>(all));
  else all = mine;
  double sq = 0;
  for (size_t t = 0; t < layout_.tensors().size(); ++t) {
    if (layout_.tensors()[t].split == Split::replicated) {  // identical on every tp rank: rank 0's
      sq += all[first[t]];
      continue;
    }
    for (int k = 0; k < T; ++k)  // global part k * parts + j
      for (int64_t j = 0; j < parts; ++j) sq += all[size_t(k) * mine.size() + first[t] + size_t(j)];
  }
  return std::sqrt(sq);
}

void reduce_replicated_kv_grads(const ParamLayout& layout, float* grads, Comm& tp, Device dev, Stream stream,
                                const StateShard* pieces) {
  const auto& units = layout.units();
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t i = units[u].first; i < units[u].last; ++i) {
      const ParamInfo& p = layout.tensors()[i];
      if (!p.kv || p.copies <= 1) continue;
      // This rank's part of the tensor: the whole of it, or its overlap with the rank's piece of the
      // unit (the same part on every tp rank: their layouts match), at `at` in `grads`.
      int64_t a = 0, b = p.loc_elems(), at = p.offset;
      if (pieces) {
        const StateShard::Piece& pc = pieces->pieces[u];
        a = std::max(p.offset, pc.lo) - p.offset;
        b = std::min(p.offset + p.loc_elems(), pc.hi) - p.offset;
        at = pc.at + (a + p.offset - pc.lo);
      }
      // Every tp rank writes its head's columns of the part's rows into the whole tensor's place
      // (zeros elsewhere); the sum over tp leaves each head's columns summed over its copies. A
      // rank whose piece misses the tensor still joins the sum (b <= a: an empty part).
      const int64_t r0 = b > a ? a / p.loc_cols : 0, r1 = b > a ? (b - 1) / p.loc_cols + 1 : 0;
      std::vector<float> all(size_t((r1 - r0) * p.cols), 0.0f), g(size_t(std::max<int64_t>(b - a, 0)));
      const size_t bytes = g.size() * sizeof(float);
      if (!g.empty()) copy_to_host(g.data(), grads + at, bytes, dev, stream);
      for (int64_t e = a; e < b; ++e)
        all[size_t((e / p.loc_cols - r0) * p.cols + p.col0 + e % p.loc_cols)] = g[size_t(e - a)];
      tp.all_reduce(std::span<float>(all));
      for (int64_t e = a; e < b; ++e)
        g[size_t(e - a)] = all[size_t((e / p.loc_cols - r0) * p.cols + p.col0 + e % p.loc_cols)];
      if (!g.empty()) copy_to_device(grads + at, g.data(), bytes, dev, stream);
    }
}

void AdamW::update(float* params, const float* grads, double norm, Tracer* tr) {
  ++step_;
  AdamWStep hp;
  hp.lr = c_.lr;
  hp.beta1 = c_.beta1;
  hp.beta2 = c_.beta2;
  hp.eps = c_.eps;
  hp.step = step_;
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  hp.grad_scale = c_.grad_clip > 0 && norm > c_.grad_clip ? c_.grad_clip / (norm + 1e-6) : 1.0;
  if (!offload_) {
    for_each_part([&](const ParamInfo& p, int64_t a, int64_t b, int64_t at) {
      hp.weight_decay = p.decay ? c_.weight_decay : 0.0;
      adamw_update(params + at, grads + (grads_in_pieces_ ? at : a), m_.data() + at, v_.data() + at, b - a, hp, dev_,
                   stream_);
    });
    return;
  }
  // Offloaded moments, chunk by chunk through the two slots (the update is elementwise: the
  // chunking does not change a bit).
  // With offload=params the weights' chunks too: in (unless resident) and out, and the bf16 copy.
  CTXPAR_CHECK(!hp_ || params == hp_->host(), "offload=params: update() takes the host master");
  prefetch();
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    const size_t s = i % 2;
    float* res = hp_ ? res_[i] : nullptr;
    const double moved = 16.0 * double(c.elems) + (hp_ ? (res ? 4.0 : 8.0) * double(c.elems) : 0.0);
    {  // the compute stream idles here only while the chunk is still on its way: the unhidden copy time
      Tracer::Scope sc(tr, Phase::offload, -1, -1, 0, moved);
      stream_wait_event(stream_, in_[i], dev_);
    }
    hp.weight_decay = c.decay ? c_.weight_decay : 0.0;
    float* p = !hp_ ? params + c.at : res ? res : sp_[s].data();
    adamw_update(p, grads + (grads_in_pieces_ ? c.at : c.offset), sm_[s].data(), sv_[s].data(), c.elems, hp, dev_,
                 stream_);
    if (hp_ && !res && !hp_->in_pieces()) f32_to_bf16(p, hp_->bf16() + c.offset, c.elems, dev_, stream_);
    stream_wait_stream(copy_stream_, stream_, dev_);  // the copies out after the update
    const size_t bytes = size_t(c.elems) * sizeof(float);
    copy_out_async(hm_ + c.at, sm_[s].data(), bytes, dev_, copy_stream_);
    copy_out_async(hv_ + c.at, sv_[s].data(), bytes, dev_, copy_stream_);
    if (hp_) copy_out_async(hp_->host() + c.at, p, bytes, dev_, copy_stream_);
    offload_bytes_ += moved;
    if (i + 2 < chunks_.size()) copy_in(i + 2);  // into slot s, after its copy out on the same stream
  }
  for (Event e : in_) event_destroy(e, dev_);
  in_.clear();
  issued_ = 0;
  // shard=params: the model's next gathers copy pieces in from the master on the compute stream,
  // after its copies out.
  if (hp_ && !hp_->mirrors()) stream_wait_stream(stream_, copy_stream_, dev_);
}

}  // namespace ctxpar
