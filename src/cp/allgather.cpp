// allgather: every rank all-gathers K and V (with positions and document ids) of the whole CP
// group and attends its local queries to all of them (Meta's CP, "all-gather KV"). Queries stay
// zigzag-sharded, so causal work is equal on every rank. The gathered keys stay in rank-block
// order: the mask comes from their global positions, so no reordering copy is needed, and the
// backward's dK/dV come out in the same rank-block order, which is exactly what reduce_scatter
// hands back to the owners. K/V of grouped-query attention are gathered with H_kv heads only.
// The same forward serves a pass-KV prefill over a KV cache (S_k equal on every rank); keys and
// values that are the same memory (MLA's absorbed inference) are gathered once.
// MLA (moves_latent): the latent rows are gathered instead of K and V, the other ranks' blocks
// expanded here; the backward turns the gathered dK/dV into the latent's gradient (the
// expansion's weight gradient accumulates on this rank) and reduce-scatters that. The other
// schedules of the all-gather are strategies of their own (registry.cpp).
#include <algorithm>
#include <cstring>
#include <span>

#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar {
namespace {

class AllGather final : public CpStrategy {
 public:
  explicit AllGather(Topology& topo) : comm_(topo.cp()) {}
  std::string name() const override { return "allgather"; }
  PartitionKind partition() const override { return PartitionKind::zigzag; }

  std::string validate(const CpCall& s, const Topology& topo) const override {
    return cp::check_common(name(), s, topo.cp_size());
  }

  bool moves_latent() const override { return true; }

  double comm_volume_fwd(const CpCall& s, bool docs, const Topology& topo) const override {
    const int P = topo.cp_size();
    const double S_loc = double(s.S_k) / P;
    return (P - 1) * S_loc * (key_bytes(s) + sizeof(int64_t) + (docs ? sizeof(int32_t) : 0));
  }
  // The whole sequence's K/V gathered, and its dK/dV (fp32) before the reduce-scatter: grows with
  // S whatever P. MLA: the gathered latent and its gradient besides.
  double buffer_bytes(const CpCall& s, bool docs, const Topology& topo) const override {
    if (topo.cp_size() <= 1) return 0;
    const double kv = 2.0 * s.H_kv * s.D;
    return double(s.S_k) * (kv * double(dtype_bytes(s.dtype)) + sizeof(int64_t) + (docs ? sizeof(int32_t) : 0) +
                            kv * sizeof(float) + 2.0 * s.latent_width * sizeof(float));
  }

  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    Gathered g = gather(local, tr, st);
    const CpCall p = with_gathered_keys(local, g);
    if (tr) tr->progress(Phase::attn_fwd);
    cp::counted_fwd(p, tr, st, -1);
  }

  void backward(const CpCall& local, Tracer* tr, CpStats& st) override {
    // K/V are gathered again rather than kept from forward: the strategy holds no state between
    // calls (a model with L layers calls forward L times before the first backward).
    Gathered g = gather(local, tr, st);
    const int P = comm_.size();
    const size_t loc = size_t(local.S_k) * local.H_kv * local.D;
    const Device dev = local.device;
    // zeroed: the kernel accumulates
    Buffer<float> dk_all(loc * P, true, dev, local.stream), dv_all(loc * P, true, dev, local.stream);
    device_zero(local.dq, size_t(local.S_q) * local.H_q * local.D * sizeof(float), dev, local.stream);
    CpCall p = with_gathered_keys(local, g);
    p.dk = dk_all.data();
    p.dv = dv_all.data();
    if (tr) tr->progress(Phase::attn_bwd);
    cp::counted_bwd(p, tr, st, -1);
    // Block j of the gathered keys belongs to rank j: reduce-scatter sums every rank's
    // contribution and leaves each owner its own rows.
    if (local.expander) {  // MLA: the latent's gradient instead of dK/dV
      const size_t lat = size_t(local.S_k) * local.latent_width;
      Buffer<float> dlat_all(lat * P);
      local.expander->backward(g.latent.data(), p.S_k, dk_all.data(), dv_all.data(), dlat_all.data());
      if (tr) tr->progress(Phase::reduce_scatter);
      cp::timed_collective(comm_, st, tr, Phase::reduce_scatter, double((P - 1) * lat * sizeof(float)), [&] {
        comm_.reduce_scatter(dlat_all.span(), std::span<float>(local.dlatent, lat));
      });
      return;
    }
    const double bytes = double((P - 1) * loc * sizeof(float));
    if (tr) tr->progress(Phase::reduce_scatter);
    cp::timed_collective(
        comm_, st, tr, Phase::reduce_scatter, bytes, [&] { comm_.reduce_scatter(buf(dk_all), buf_at(local.dk, loc, dev)); },
        dev);
    cp::timed_collective(
        comm_, st, tr, Phase::reduce_scatter, bytes, [&] { comm_.reduce_scatter(buf(dv_all), buf_at(local.dv, loc, dev)); },
        dev);
  }

 private:
  struct Gathered {
    Buffer<std::byte> k, v;
    Buffer<int64_t> pos;
    Buffer<int32_t> doc;
    Buffer<float> latent;  // MLA
    bool shared_kv = false;  // v is k's rows (g.v unused)
    cp::GroupKeyRows rows;   // a device call's positions and document ids (pos, doc unused)
    bool device = false;
    int ranks = 0;
  };

  // Bytes per token of what is gathered for the keys: K and V, or the latent.
  static double key_bytes(const CpCall& s) {
    return s.latent_width > 0 ? double(s.latent_width) * sizeof(float) : 2.0 * s.H_kv * s.D * double(dtype_bytes(s.dtype));
  }

  Gathered gather(const CpCall& t, Tracer* tr, CpStats& st) {
    const int P = comm_.size(), r = comm_.rank();
    const size_t n = size_t(t.S_k), loc = n * t.H_kv * t.D * dtype_bytes(t.dtype);
    Gathered g;
    if (t.device != Device::cpu) return gather_on_device(t, tr, st);
    g.k.resize(loc * P, false);
    if (t.k != t.v || t.expander) g.v.resize(loc * P, false);
    g.pos.resize(n * P, false);
    if (tr) tr->progress(Phase::all_gather);
    const double kv_bytes = double((P - 1) * loc);
    const auto bytes_of = [&](const void* x) { return std::span<const std::byte>(static_cast<const std::byte*>(x), loc); };
    if (t.expander) {  // MLA: gather the latent, expand the other ranks' blocks, copy the own
      const size_t lat = n * t.latent_width;
      g.latent.resize(lat * P, false);
      cp::timed_collective(comm_, st, tr, Phase::all_gather, double((P - 1) * lat * sizeof(float)),
                           [&] { comm_.all_gather(std::span<const float>(t.latent, lat), g.latent.span()); });
      for (int j = 0; j < P; ++j) {
        std::byte* k = g.k.data() + size_t(j) * loc;
        std::byte* v = g.v.data() + size_t(j) * loc;
        if (j == r) {
          std::memcpy(k, t.k, loc);
          std::memcpy(v, t.v, loc);
        } else {
          t.expander->expand(g.latent.data() + size_t(j) * lat, t.S_k, reinterpret_cast<float*>(k),
                             reinterpret_cast<float*>(v));
        }
      }
    } else {
      cp::timed_collective(comm_, st, tr, Phase::all_gather, kv_bytes, [&] { comm_.all_gather(bytes_of(t.k), g.k.span()); });
      g.shared_kv = t.k == t.v;  // the same rows (MLA's absorbed inference: the latent): gathered once
      if (!g.shared_kv)
        cp::timed_collective(comm_, st, tr, Phase::all_gather, kv_bytes, [&] { comm_.all_gather(bytes_of(t.v), g.v.span()); });
    }
    cp::timed_collective(comm_, st, tr, Phase::all_gather, double((P - 1) * n * sizeof(int64_t)),
                         [&] { comm_.all_gather(std::span<const int64_t>(t.k_pos, n), g.pos.span()); });
    if (t.k_doc) {
      g.doc.resize(n * P, false);
      cp::timed_collective(comm_, st, tr, Phase::all_gather, double((P - 1) * n * sizeof(int32_t)),
                           [&] { comm_.all_gather(std::span<const int32_t>(t.k_doc, n), g.doc.span()); });
    }
    return g;
  }

  // A device call: K and V gathered on the device (one all-gather each, or one for shared rows),
  // every rank's positions and document ids gathered on the host and uploaded once
  // (cp::group_key_rows; derived where they are the zigzag shards).
  Gathered gather_on_device(const CpCall& t, Tracer* tr, CpStats& st) {
    cp::check_device_call(name(), comm_, t);
    const int P = comm_.size();
    const size_t loc = size_t(t.S_k) * t.H_kv * t.D * dtype_bytes(t.dtype);
    Gathered g;
    g.device = true;
    g.ranks = P;
    if (tr) tr->progress(Phase::all_gather);
    g.k = Buffer<std::byte>(loc * P, false, t.device, t.stream);
    g.shared_kv = t.k == t.v;
    const double kv_bytes = double((P - 1) * loc);
    const auto gather_rows = [&](const void* x, Buffer<std::byte>& into) {
      cp::timed_collective(
          comm_, st, tr, Phase::all_gather, kv_bytes,
          [&] { comm_.all_gather(buf_at(static_cast<const std::byte*>(x), loc, t.device), buf(into)); }, t.device);
    };
    gather_rows(t.k, g.k);
    if (!g.shared_kv) {
      g.v = Buffer<std::byte>(loc * P, false, t.device, t.stream);
      gather_rows(t.v, g.v);
    }
    g.rows = cp::group_key_rows(comm_, t, tr, st);
    return g;
  }

  // The local queries against every rank's keys.
  static CpCall with_gathered_keys(const CpCall& local, const Gathered& g) {
    CpCall p = local;
    p.k = g.k.data();
    p.v = g.shared_kv ? g.k.data() : g.v.data();
    if (g.device) {
      g.rows.point(p, 0, g.ranks);
      return p;
    }
    p.S_k = int64_t(g.pos.size());
    p.k_pos = g.pos.data();
    p.k_doc = local.k_doc ? g.doc.data() : nullptr;
    return p;
  }

  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_allgather_strategy(Topology& topo) { return std::make_unique<AllGather>(topo); }

}  // namespace ctxpar
