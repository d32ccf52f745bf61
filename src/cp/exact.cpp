#include "cp/exact.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <stdexcept>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar::cp {

namespace {

constexpr int kTagHop = 131;

// The group's key rows in position order, and where each came from.
struct ExactRows {
  int64_t n = 0;                // rows per rank
  Buffer<std::byte> k, v;       // [P n] rows, position order
  std::vector<int64_t> pos;     // [P n], ascending
  std::vector<int32_t> doc;     // [P n] or empty
  std::vector<int64_t> origin;  // [P n]: the row's index in rank-block order (rank * n + local row)
  CpCall call(const CpCall& t) const {
    CpCall p = t;
    p.k = k.data();
    p.v = v.data();
    p.S_k = int64_t(pos.size());
    p.k_pos = pos.data();
    p.k_doc = t.k_doc ? doc.data() : nullptr;
    return p;
  }
};

// Every rank's packed [K | V | pos | doc] block, in rank order: one all-gather, or P - 1 hops.
Buffer<std::byte> gather_blocks(Comm* cp, const KvLayout& L, const CpCall& t, bool ring_hops, Tracer* tr,
                                CpStats& st) {
  const int P = cp ? cp->size() : 1, r = cp ? cp->rank() : 0;
  Buffer<std::byte> all(L.bytes * size_t(P), false);
  Buffer<std::byte> mine(L.bytes, false);
  pack_kv(L, t, mine.data());
  if (P == 1) return mine;
  Comm& c = *cp;
  if (!ring_hops) {
    if (tr) tr->progress(Phase::all_gather);
    timed_collective(c, st, tr, Phase::all_gather, double((P - 1) * L.bytes),
                     [&] { c.all_gather(mine.span(), all.span()); });
    return all;
  }
  std::memcpy(all.data() + size_t(r) * L.bytes, mine.data(), L.bytes);
  for (int s = 1; s < P; ++s) {  // hop s: the block of rank r - s arrives, the one of r - s + 1 goes on
    const int have = (r - s + 1 + P) % P, get = (r - s + P) % P;
    if (tr) tr->progress(Phase::attn_fwd);
    Request q = c.send_recv_async(std::span<std::byte>(all.data() + size_t(have) * L.bytes, L.bytes), (r + 1) % P,
                                  std::span<std::byte>(all.data() + size_t(get) * L.bytes, L.bytes), (r - 1 + P) % P,
                                  kTagHop);
    st.messages += 1;
    st.bytes_sent += double(L.bytes);
    timed_wait(c, q, st, tr, s, double(L.bytes));
  }
  return all;
}

ExactRows gather_exact(Comm* c, const CpCall& t, bool ring_hops, Tracer* tr, CpStats& st) {
  const int P = c ? c->size() : 1;
  const KvLayout L = kv_layout(t.S_k, t.H_kv, t.D, t.dtype, t.k_doc != nullptr, /*has_pos=*/true);
  Buffer<std::byte> blocks = gather_blocks(c, L, t, ring_hops, tr, st);
  ExactRows g;
  g.n = t.S_k;
  const int64_t total = g.n * P;
  std::vector<int64_t> pos(static_cast<size_t>(total));
  std::vector<int32_t> doc(t.k_doc ? size_t(total) : 0);
  for (int j = 0; j < P; ++j) {
    CpCall b = t;
    point_keys_at(L, blocks.data() + size_t(j) * L.bytes, b);
    std::copy_n(b.k_pos, g.n, pos.data() + j * g.n);
    if (t.k_doc) std::copy_n(b.k_doc, g.n, doc.data() + j * g.n);
  }
  g.origin.resize(size_t(total));
  std::iota(g.origin.begin(), g.origin.end(), int64_t(0));
  std::stable_sort(g.origin.begin(), g.origin.end(), [&](int64_t a, int64_t b) { return pos[size_t(a)] < pos[size_t(b)]; });
  const size_t row = size_t(t.H_kv) * t.D * dtype_bytes(t.dtype);
  g.k.resize(size_t(total) * row, false);
  g.v.resize(size_t(total) * row, false);
  g.pos.resize(size_t(total));
  if (t.k_doc) g.doc.resize(size_t(total));
  for (int64_t m = 0; m < total; ++m) {
    const int64_t src = g.origin[size_t(m)], j = src / g.n, i = src % g.n;
    const std::byte* base = blocks.data() + size_t(j) * L.bytes;
    std::memcpy(g.k.data() + size_t(m) * row, base + L.k_off + size_t(i) * row, row);
    std::memcpy(g.v.data() + size_t(m) * row, base + L.v_off + size_t(i) * row, row);
    g.pos[size_t(m)] = pos[size_t(src)];
    if (t.k_doc) g.doc[size_t(m)] = doc[size_t(src)];
  }
  return g;
}

}  // namespace

std::string check_exact(const CpCall& t) {
  if (t.q_pos != t.k_pos || t.q_doc != t.k_doc || t.S_q != t.S_k)
    return "deterministic = true serves training's self-attention calls (queries are the keys' rows)";
  if (t.expander) return "deterministic = true does not yet serve MLA's latent K/V";
  if (t.device != Device::cpu) return "deterministic = true runs on the CPU only so far";
  return "";
}

void refuse_device_call(const CpCall& t) {
  if (t.device != Device::cpu)
    throw std::invalid_argument(std::string("deterministic = true on device = ") + name_of(t.device) +
                                ": CPU only so far");
}

void exact_fwd(Comm* c, const CpCall& t, bool ring_hops, Tracer* tr, CpStats& st) {
  refuse_device_call(t);
  const std::string err = check_exact(t);
  CTXPAR_CHECK(err.empty(), err);
  const ExactRows g = gather_exact(c, t, ring_hops, tr, st);
  if (tr) tr->progress(Phase::attn_fwd);
  counted_fwd(g.call(t), tr, st, -1);
}

void exact_bwd(Comm* c, const CpCall& t, bool ring_hops, Tracer* tr, CpStats& st) {
  refuse_device_call(t);
  const std::string err = check_exact(t);
  CTXPAR_CHECK(err.empty(), err);
  const ExactRows g = gather_exact(c, t, ring_hops, tr, st);
  const int P = c ? c->size() : 1;
  const size_t w = size_t(t.H_kv) * t.D, total = g.origin.size(), own = size_t(t.S_k) * w;
  Buffer<int64_t> dk(total * w), dv(total * w);  // zeroed: the kernel adds
  std::fill_n(t.dq, size_t(t.S_q) * t.H_q * t.D, 0.f);
  CpCall p = g.call(t);
  p.dk = p.dv = nullptr;
  p.dk_fixed = dk.data();
  p.dv_fixed = dv.data();
  if (tr) tr->progress(Phase::attn_bwd);
  counted_bwd(p, tr, st, -1, attn_bwd_exact);
  // Back to rank-block order, then every owner gets the exact sum of its rows over the group.
  Buffer<int64_t> blocks(2 * total * w, false);  // [rank][dK rows | dV rows]
  for (size_t m = 0; m < total; ++m) {
    const int64_t src = g.origin[m], j = src / g.n, i = src % g.n;
    int64_t* dst = blocks.data() + size_t(j) * 2 * own;
    std::copy_n(dk.data() + m * w, w, dst + size_t(i) * w);
    std::copy_n(dv.data() + m * w, w, dst + own + size_t(i) * w);
  }
  Buffer<int64_t> mine(P > 1 ? 2 * own : 0, false);
  if (P > 1) {
    if (tr) tr->progress(Phase::reduce_scatter);
    timed_collective(*c, st, tr, Phase::reduce_scatter, double(size_t(P - 1) * 2 * own * sizeof(int64_t)),
                     [&] { c->reduce_scatter(blocks.span(), mine.span()); });
  } else {
    mine = std::move(blocks);
  }
  if (t.dk_fixed) {  // the caller adds more integer sums (K/V heads replicated over ulysses or tp ranks)
    std::copy_n(mine.data(), own, t.dk_fixed);
    std::copy_n(mine.data() + own, own, t.dv_fixed);
    return;
  }
  fixed_to_float(mine.data(), t.dk, int64_t(own));
  fixed_to_float(mine.data() + own, t.dv, int64_t(own));
}

void exact_infer_fwd(Comm& c, const CpCall& t, Tracer* tr, CpStats& st) {
  CTXPAR_CHECK(t.device == Device::cpu && t.dtype == DType::f32 && !t.expander,
               "exact inference: CPU fp32 calls of K/V heads");
  const int P = c.size(), r = c.rank();
  const int64_t R = t.S_q, H = t.H_q, D = t.D, kw = int64_t(t.H_kv) * D, qw = H * D;
  {
    int64_t mine[2] = {R, -R};  // every rank the same number of query rows
    c.all_reduce(std::span<int64_t>(mine, 2), ReduceOp::max);
    CTXPAR_CHECK(mine[0] == -mine[1], "exact inference: query rows differ over the ranks (" << R << " here)");
  }
  const bool cache = t.k_doc_len != nullptr, news = t.k_new != nullptr;
  // one packed row: q, then (decode) the new K and V, as floats; position and document apart
  const int64_t rw = qw + (news ? 2 * kw : 0);
  Buffer<float> rows(static_cast<size_t>(R * rw), false), all_rows(static_cast<size_t>(P * R * rw), false);
  std::vector<int64_t> pos(static_cast<size_t>(R)), all_pos(static_cast<size_t>(P * R));
  std::vector<int32_t> doc(static_cast<size_t>(R), 0), all_doc(static_cast<size_t>(P * R));
  for (int64_t i = 0; i < R; ++i) {
    std::copy_n(t.q_as<float>() + i * t.q_ld(), qw, rows.data() + i * rw);
    if (news) {
      std::copy_n(static_cast<const float*>(t.k_new) + i * kw, kw, rows.data() + i * rw + qw);
      std::copy_n(static_cast<const float*>(t.v_new) + i * kw, kw, rows.data() + i * rw + qw + kw);
    }
    pos[size_t(i)] = t.q_pos[i];
    if (t.q_doc) doc[size_t(i)] = t.q_doc[i];
  }
  if (tr) tr->progress(Phase::all_gather);
  timed_collective(c, st, tr, Phase::all_gather, double(P - 1) * double(R) * double(rw * 4 + 12), [&] {
    c.all_gather(std::span<const float>(rows.data(), rows.size()), all_rows.span());
    c.all_gather(std::span<const int64_t>(pos), std::span<int64_t>(all_pos));
    c.all_gather(std::span<const int32_t>(doc), std::span<int32_t>(all_doc));
  });
  // Keys of this rank: a KV-cache call's documents as ids (-2: a row of no document), and the new
  // token of every sequence whose slot this rank holds stored there first (visible from now on).
  std::vector<int32_t> kdoc;
  if (cache) {
    kdoc.assign(size_t(t.S_k), -2);
    int64_t docs = 0;
    for (int32_t d : all_doc) docs = std::max<int64_t>(docs, d + 1);
    for (int64_t d = 0; d < docs; ++d) {
      for (int64_t j = t.k_doc_begin[d]; j < t.k_doc_begin[d] + t.k_doc_len[d]; ++j) kdoc[size_t(j)] = int32_t(d);
      if (t.k_new_slot && t.k_new_slot[d] >= 0) kdoc[size_t(t.k_new_slot[d])] = int32_t(d);
    }
    if (news)
      for (int64_t g = 0; g < P * R; ++g) {
        const int32_t d = all_doc[size_t(g)];
        if (d < 0 || !t.k_new_slot || t.k_new_slot[d] < 0) continue;
        const int64_t slot = t.k_new_slot[d];
        std::copy_n(all_rows.data() + g * rw + qw, kw, static_cast<float*>(t.k_cache) + slot * t.k_ld());
        std::copy_n(all_rows.data() + g * rw + qw + kw, kw, static_cast<float*>(t.v_cache) + slot * t.v_ld());
      }
  }
  CpCall a = t;
  a.q = all_rows.data();
  a.q_stride = rw;
  a.S_q = P * R;
  a.q_pos = all_pos.data();
  a.q_doc = t.q_doc || cache ? all_doc.data() : nullptr;  // a cache call: the row's document
  a.k_doc = cache ? kdoc.data() : t.k_doc;
  a.k_doc_begin = a.k_doc_len = nullptr;
  a.k_new = a.v_new = nullptr;
  a.k_new_slot = nullptr;
  if (tr) tr->progress(Phase::attn_fwd);
  const size_t n = size_t(P * R * H), w = size_t(D + 1);
  const int64_t pairs = visible_pairs(a);  // every query with this rank's keys
  const double flops = attn_fwd_flops(double(pairs), a.H_q, a.D);
  std::vector<float> M(n);
  double t0 = tr ? tr->stamp() : 0;
  attn_exact_max(a, M.data());
  if (tr) tr->add_span(Phase::attn_fwd, -1, -1, t0, tr->stamp(), 0, 0);
  timed_collective(c, st, tr, Phase::all_reduce, double(n) * 4, [&] { c.all_reduce(std::span<float>(M), ReduceOp::max); });
  Buffer<int64_t> hi(n * w + 1), lo(n * w);  // zeroed; hi's last: the count of values out of range
  t0 = tr ? tr->stamp() : 0;
  hi[n * w] = attn_exact_sums(a, M.data(), hi.data(), lo.data());
  st.count_attn(pairs, a.H_q, flops, false);
  if (tr) tr->add_span(Phase::attn_fwd, -1, -1, t0, tr->stamp(), flops, 0);
  timed_collective(c, st, tr, Phase::all_reduce, double(n * w) * 16, [&] {
    c.all_reduce(hi.span());
    c.all_reduce(lo.span());
  });
  CTXPAR_CHECK(hi[n * w] == 0, "exact inference: an attention value beyond the exact sums' range (|x| >= 2^"
                                   << kExactRange << ", or NaN)");
  CpCall f = t;
  const size_t off = size_t(r) * size_t(R * H);
  attn_exact_finish(f, M.data() + off, hi.data() + off * w, lo.data() + off * w);
}

}  // namespace ctxpar::cp

namespace ctxpar {
namespace {

// allgather's and ring's exact schedule (CpSchedule::exact): the exact call,
// its K/V rows gathered by one all-gather or by the ring's P - 1 hops.
class Exact final : public ScheduleOf {
 public:
  Exact(Topology& topo, std::unique_ptr<CpStrategy> plain, bool ring_hops)
      : ScheduleOf(std::move(plain)), comm_(topo.cp()), ring_hops_(ring_hops) {}
  bool moves_latent() const override { return false; }  // the exact call moves MLA's expanded K/V
  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    cp::exact_fwd(&comm_, local, ring_hops_, tr, st);
  }
  void backward(const CpCall& local, Tracer* tr, CpStats& st) override {
    cp::exact_bwd(&comm_, local, ring_hops_, tr, st);
  }

 private:
  Comm& comm_;
  bool ring_hops_;
};

// pass_q's exact schedule, the inference engine's with exact numerics (prefill and decode, full
// or over a cache, whatever cp_algo and decode_algo say): the keys stay, as in pass-Q, but every
// rank's query rows (and a decode step's new K/V) are all-gathered and the attention summed
// exactly over the ranks' keys (cp::exact_infer_fwd).
class ExactInfer final : public ScheduleOf {
 public:
  explicit ExactInfer(Topology& topo) : ScheduleOf(make_pass_q_strategy(topo)), comm_(topo.cp()) {}
  bool has_backward() const override { return false; }
  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    cp::refuse_device_call(local);
    cp::exact_infer_fwd(comm_, local, tr, st);
  }
  void backward(const CpCall&, Tracer*, CpStats&) override {
    CTXPAR_FATAL(name() << "'s exact inference schedule has no backward");
  }
  // The rows gathered (q, position, document), the maxima and the exact sums all-reduced (ring
  // all-reduce: twice the buffer), for a prefill of S_q rows without new K/V riders.
  double comm_volume_fwd(const CpCall& s, bool docs, const Topology& topo) const override {
    (void)docs;
    const int P = topo.cp_size();
    const double R = double(s.S_q / P), n = double(s.S_q) * s.H_q, frac = double(P - 1) / P;
    return double(P - 1) * R * (4.0 * s.H_q * s.D + 12.0) + 2.0 * frac * n * (4.0 + 16.0 * (s.D + 1));
  }

 private:
  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_exact_pass_q_strategy(Topology& topo) {
  return std::make_unique<ExactInfer>(topo);
}
std::unique_ptr<CpStrategy> make_exact_allgather_strategy(Topology& topo) {
  return std::make_unique<Exact>(topo, make_allgather_strategy(topo), /*ring_hops=*/false);
}
std::unique_ptr<CpStrategy> make_exact_ring_strategy(Topology& topo) {
  return std::make_unique<Exact>(topo, make_ring_strategy(topo), /*ring_hops=*/true);
}

}  // namespace ctxpar
