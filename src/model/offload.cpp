#include "model/offload.hpp"

#include <sys/mman.h>

#include <algorithm>

#include "core/error.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

LayerStash::LayerStash(int64_t count, int64_t offloaded, size_t elems, bool offload, Device dev, Stream stream)
    : count_(count), n_host_(offloaded), elems_(elems),
      offload_(offload && dev != Device::cpu && count > kSlots && offloaded > 0), dev_(dev), stream_(stream) {
  CTXPAR_CHECK(offloaded <= count, "LayerStash: " << offloaded << " of " << count << " entries offloaded");
  const int64_t n = offload_ ? kSlots : count_;
  for (int64_t i = 0; i < n; ++i) dev_x_.emplace_back(elems, false, dev, stream);
  if (!offload_) return;
  copy_stream_ = stream_create(dev);
  for (int64_t l = 0; l < n_host_; ++l) host_x_.push_back(static_cast<float*>(pinned_alloc(elems * sizeof(float), dev)));
  occupant_.assign(size_t(kSlots), -1);
  out_.assign(size_t(n_host_), nullptr);
  in_.assign(size_t(n_host_), nullptr);
  stream_wait_stream(copy_stream_, stream_, dev_);  // the slots exist once the compute stream allocated them
}

LayerStash::~LayerStash() {
  if (!offload_) return;
  stream_synchronize(copy_stream_, dev_);
  end_step();
  stream_synchronize(stream_, dev_);
  stream_destroy(copy_stream_, dev_);
  for (float* p : host_x_) pinned_free(p, dev_);
}

double LayerStash::device_bytes(int64_t count, size_t elems, bool offload) {
  const int64_t n = offload ? std::min<int64_t>(count, kSlots) : count;
  return double(n) * double(elems) * sizeof(float);
}

float* LayerStash::at(int64_t l) { return dev_x_[size_t(slot(l))].data(); }

void LayerStash::wait(Event e, Tracer* tr, double bytes) {
  Tracer::Scope sc(tr, Phase::offload, -1, -1, 0, bytes);
  stream_wait_event(stream_, e, dev_);
}

void LayerStash::will_write(int64_t l, Tracer* tr) {
  if (!offload_) return;
  int64_t& o = occupant_[size_t(slot(l))];
  // The slot's previous input must be on the host before it is overwritten.
  if (o >= 0 && o != l && o < n_host_ && out_[size_t(o)]) wait(out_[size_t(o)], tr, 0);
  o = l;
}

void LayerStash::written(int64_t l) {
  if (!offload_ || l >= n_host_) return;  // x_L stays: the backward's first read
  stream_wait_stream(copy_stream_, stream_, dev_);
  const size_t bytes = elems_ * sizeof(float);
  copy_out_async(host_x_[size_t(l)], at(l), bytes, dev_, copy_stream_);
  if (out_[size_t(l)]) event_destroy(out_[size_t(l)], dev_);
  out_[size_t(l)] = event_record(copy_stream_, dev_);
  bytes_ += double(bytes);
}

void LayerStash::prefetch(int64_t l) {
  int64_t& o = occupant_[size_t(slot(l))];
  if (o == l) return;  // still there from the forward
  // Every read of the slot's previous input is issued on the compute stream before this point
  // (the backward of the layers above); the copy in waits for them, not for what comes next.
  stream_wait_stream(copy_stream_, stream_, dev_);
  const size_t bytes = elems_ * sizeof(float);
  copy_in_async(at(l), host_x_[size_t(l)], bytes, dev_, copy_stream_);
  if (in_[size_t(l)]) event_destroy(in_[size_t(l)], dev_);
  in_[size_t(l)] = event_record(copy_stream_, dev_);
  o = l;
  bytes_ += double(bytes);
}

void LayerStash::will_read(int64_t l, Tracer* tr) {
  if (!offload_) return;
  if (l >= 1) prefetch(l - 1);  // the next layer's input comes in while this layer's backward runs
  prefetch(l);                  // a no-op unless the previous call did not bring it (the first layers)
  if (l < n_host_ && in_[size_t(l)]) {
    wait(in_[size_t(l)], tr, double(elems_) * sizeof(float));
    event_destroy(in_[size_t(l)], dev_);
    in_[size_t(l)] = nullptr;
  }
}

void LayerStash::end_step() {
  if (!offload_) return;
  for (auto* v : {&out_, &in_})
    for (Event& e : *v) {
      if (e) event_destroy(e, dev_);
      e = nullptr;
    }
}

int64_t HostParams::resident_elems(const ParamLayout& layout) {
  int64_t n = 0;
  for (const ParamInfo& p : layout.tensors())
    if (is_resident(p)) n += p.loc_elems();
  return n;
}

double HostParams::device_bytes(const ParamLayout& layout, const StateShard& s) {
  if (s.params_sharded()) return 0.0;
  const double n = double(layout.local_elems());
  return 4.0 * double(resident_elems(layout)) + 2.0 * n +
         (s.sharded() ? 4.0 * double(s.widest) * (1.0 + 1.0 / double(s.Z)) : 0.0);
}

HostParams::HostParams(const ParamLayout& layout, const StateShard& s, Comm* group, Device dev, Stream stream)
    : layout_(layout), s_(s), group_(group), dev_(dev), stream_(stream) {
  CTXPAR_CHECK(dev != Device::cpu, "offload=params is for a GPU run");
  CTXPAR_CHECK(!s.sharded() || (group && group->size() == s.Z), "HostParams: no shard group of " << s.Z);
  host_ = static_cast<float*>(pinned_alloc(size_t(s.elems()) * sizeof(float), dev));
  std::fill_n(host_, size_t(s.elems()), 0.0f);
  if (!mirrors()) return;
  const size_t n = size_t(layout.local_elems());
  res_ = Buffer<float>(size_t(resident_elems(layout)), false, dev, stream);
  bf16_ = Buffer<uint16_t>(n, false, dev, stream);
  int64_t at = 0;
  for (const ParamInfo& p : layout.tensors())
    if (is_resident(p)) {
      res_map_.push_back({p.offset, p.loc_elems(), at});
      at += p.loc_elems();
    }
  // The view's base: a layout no kernel reads, its resident tensors moved to their device copies:
  // the master itself when whole; in pieces an address range reserved, never backed (a read of it
  // faults), that only names each tensor's bf16 copy through mirror().
  float* base = host_;
  if (in_pieces()) {
    reserved_ = n * sizeof(float);
    void* r = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CTXPAR_CHECK(r != MAP_FAILED, "HostParams: reserving " << reserved_ << " bytes of address space failed");
    base = static_cast<float*>(r);
  }
  view_ = layout.view(base);
  const auto on_gpu = [&](float*& ptr) { ptr = resident(ptr - base); };
  on_gpu(view_.emb);
  on_gpu(view_.final_norm);
  for (LayerView& l : view_.layers) {
    on_gpu(l.attn_norm);
    on_gpu(l.mlp_norm);
  }
  mirror_ = Bf16Mirror{base, int64_t(n), bf16_.data()};
}

HostParams::~HostParams() {
  stream_synchronize(stream_, dev_);
  pinned_free(host_, dev_);
  if (reserved_ > 0) munmap(const_cast<float*>(mirror_.base), reserved_);
}

float* HostParams::resident(int64_t offset) const {
  for (const Resident& r : res_map_)
    if (offset >= r.offset && offset < r.offset + r.elems) return const_cast<float*>(res_.data()) + r.at + (offset - r.offset);
  return nullptr;
}

void HostParams::upload() {
  if (!mirrors()) return;
  if (in_pieces()) {  // unit by unit, all-gathered from every rank's pieces
    gather_units(host_, true, s_, *group_, stage_, dev_, stream_, [&](size_t u, const float* unit) {
      const ParamUnit& pu = layout_.units()[u];
      for (size_t i = pu.first; i < pu.last; ++i) {
        const ParamInfo& p = layout_.tensors()[i];
        const float* src = unit + (p.offset - pu.begin);
        if (float* dst = resident(p.offset)) device_copy(dst, src, size_t(p.loc_elems()) * sizeof(float), dev_, stream_);
        f32_to_bf16(src, bf16_.data() + p.offset, p.loc_elems(), dev_, stream_);
      }
    });
    stream_synchronize(stream_, dev_);
    return;
  }
  // Tensor by tensor through one staging buffer as long as the largest: resident ones straight to
  // their device copy, every one's bf16 copy from the fp32 values on the device.
  int64_t largest = 1;
  for (const ParamInfo& p : layout_.tensors()) largest = std::max(largest, p.loc_elems());
  Buffer<float> stage(size_t(largest), false, dev_, stream_);
  for (const ParamInfo& p : layout_.tensors()) {
    float* dst = resident(p.offset);
    float* d = dst ? dst : stage.data();
    copy_to_device(d, host_ + p.offset, size_t(p.loc_elems()) * sizeof(float), dev_, stream_);
    f32_to_bf16(d, bf16_.data() + p.offset, p.loc_elems(), dev_, stream_);
    stream_synchronize(stream_, dev_);  // the staging buffer is reused by the next tensor
  }
}

}  // namespace ctxpar
