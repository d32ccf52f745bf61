// halo: the CP attention of a sliding-window (local) layer. A query at position p sees keys in
// [p - window + 1, p], so each zigzag chunk needs, besides the keys it holds, only the window - 1
// keys before its first row: its halo. One neighbour exchange brings every rank the halo rows
// of both its chunks (from whichever ranks hold them; a window longer than a chunk reaches
// further back), while the rank attends its queries to its own keys; then the halo blocks are
// attended and LSE-merged. The backward fetches the halo again (the strategy holds no state
// between calls), and the halo rows' dK/dV go back to their owners the same way, where they are
// added. Bytes per layer grow with the window, not the sequence (the ring moves every block past
// every rank).
//
// The plan (which rows go where) depends only on (P, rows per rank, window), so every rank
// computes every rank's plan alike: no metadata exchange. Layout: zigzag, S_loc = 2c rows per
// rank, chunk j = global positions [j c, (j+1) c) held by rank j (j < P) or 2P-1-j, at local
// rows [0, c) or [c, 2c). Padding rows (the partition's last positions) are in nobody's past.
//
// On a GPU (CpCall::device): the messages carry K and V only, packed by device copies on the
// compute stream and handed to the communicator as device buffers; the receiver knows the halo
// rows' positions from the plan (and their document ids from the group's, gathered on the host
// once per call), uploads them, and adds the returning dK/dV with a device kernel.
#include <algorithm>
#include <stdexcept>
#include <cstring>
#include <map>
#include <span>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar {
namespace {

constexpr int kTagHaloKv = 111;
constexpr int kTagHaloDkv = 112;
constexpr int kProgressParts = 8;

// Rows [begin, end) (global positions) of one chunk, held by `owner` at local row `local`.
struct Seg {
  int owner;
  int64_t begin, end, local;
  int64_t rows() const { return end - begin; }
};

// Zigzag geometry of P ranks with c rows per chunk.
struct Zigzag {
  int P;
  int64_t c;
  int owner(int64_t chunk) const { return int(chunk < P ? chunk : 2 * P - 1 - chunk); }
  int64_t local_row(int64_t pos) const {
    const int64_t j = pos / c;
    return (j < P ? 0 : c) + pos % c;
  }
  // The rows rank `me` needs from other ranks: the window - 1 positions before each of its chunks
  // that it does not hold itself, deduplicated, split at chunk borders, ascending.
  std::vector<Seg> halo_of(int me, int64_t window) const {
    std::vector<std::pair<int64_t, int64_t>> iv;
    for (int64_t j : {int64_t(me), int64_t(2 * P - 1 - me)}) {
      const int64_t first = j * c, lo = std::max<int64_t>(0, first - (window - 1));
      if (lo < first) iv.emplace_back(lo, first);
    }
    std::sort(iv.begin(), iv.end());
    std::vector<Seg> out;
    int64_t done = 0;  // positions below this are already covered
    for (auto [lo, hi] : iv) {
      lo = std::max(lo, done);
      for (int64_t p = lo; p < hi;) {
        const int64_t j = p / c, e = std::min(hi, (j + 1) * c);
        if (owner(j) != me) out.push_back({owner(j), p, e, local_row(p)});
        p = e;
      }
      done = std::max(done, hi);
    }
    return out;
  }
};

// The exchange of one call on this rank: per peer, the segments it sends there (rows this rank
// holds) and the segments it receives from there, each peer's in one message.
struct Plan {
  struct Peer {
    int rank;
    std::vector<Seg> send, recv;
    int64_t send_rows = 0, recv_rows = 0;
  };
  std::vector<Peer> peers;  // ascending rank
};

Plan make_plan(int P, int me, int64_t S_loc, int64_t window) {
  Plan plan;
  if (P <= 1) return plan;
  const Zigzag z{P, S_loc / 2};
  std::map<int, Plan::Peer> by;
  for (const Seg& s : z.halo_of(me, window)) {
    Plan::Peer& p = by[s.owner];
    p.recv.push_back(s);
    p.recv_rows += s.rows();
  }
  for (int t = 0; t < P; ++t) {
    if (t == me) continue;
    for (const Seg& s : z.halo_of(t, window))
      if (s.owner == me) {
        Plan::Peer& p = by[t];
        p.send.push_back(s);
        p.send_rows += s.rows();
      }
  }
  for (auto& [r, p] : by) {
    p.rank = r;
    plan.peers.push_back(std::move(p));
  }
  return plan;
}

// This rank's place in the CP group (Topology::cp(): ring_rank * U + ulysses_rank).
int cp_rank(const Topology& t) { return t.coord(Axis::ring) * t.size(Axis::ulysses) + t.coord(Axis::ulysses); }

class Halo final : public CpStrategy {
 public:
  explicit Halo(Topology& topo) : comm_(topo.cp()) {}
  std::string name() const override { return "halo"; }
  PartitionKind partition() const override { return PartitionKind::zigzag; }

  std::string validate(const CpCall& s, const Topology& topo) const override {
    if (s.mask != MaskKind::window)
      return "halo: serves sliding-window (local) layers only (mask = window); under a " +
             std::string(s.mask == MaskKind::causal ? "causal" : "full") +
             " mask a query needs keys of every earlier rank; valid for it: allgather, ulysses, ring or usp";
    return cp::check_common(name(), s, topo.cp_size());
  }

  double comm_volume_fwd(const CpCall& s, bool docs, const Topology& topo) const override {
    const int P = topo.cp_size();
    const Plan plan = make_plan(P, cp_rank(topo), s.S_k / P, s.window);
    double b = 0;
    for (const Plan::Peer& p : plan.peers)
      if (p.send_rows > 0) b += double(cp::kv_layout(p.send_rows, s.H_kv, s.D, s.dtype, docs).bytes);
    return b;
  }
  // Forward: the packed halo messages out and in; backward: those again plus their dK/dV (fp32)
  // both ways. Grows with the window, not with S.
  double buffer_bytes(const CpCall& s, bool docs, const Topology& topo) const override {
    const int P = topo.cp_size();
    const Plan plan = make_plan(P, cp_rank(topo), s.S_k / P, s.window);
    double b = 0;
    for (const Plan::Peer& p : plan.peers) {
      const int64_t rows = p.send_rows + p.recv_rows;
      b += double(cp::kv_layout(rows, s.H_kv, s.D, s.dtype, docs).bytes) + 2.0 * rows * s.H_kv * s.D * sizeof(float);
    }
    return b;
  }

  void forward(const CpCall& a, Tracer* tr, CpStats& st) override {
    if (a.device != Device::cpu) cp::check_device_call(name(), comm_, a);
    Exchange x = post_halo(a, st, tr);
    const int64_t chunk = cp::progress_chunk_rows(a.S_q, kProgressParts, a.device);
    Buffer<float> o_tmp(size_t(chunk) * a.H_q * a.D, false, a.device, a.stream),
        lse_tmp(size_t(chunk) * a.H_q, false, a.device, a.stream);
    // Own keys first (initializes o and lse), while the halo travels.
    timed_call(tr, st, Phase::attn_fwd, 0, a, [&](const CpCall& p) {
      for_near_keys(p, chunk, [&](const CpCall& q) {
        attn_fwd(q);
        x.progress(comm_);
      });
    });
    for (size_t i = 0; i < x.plan.peers.size(); ++i) {
      const Plan::Peer& peer = x.plan.peers[i];
      if (peer.recv_rows == 0) continue;
      cp::timed_wait(comm_, x.req[i], st, tr, int32_t(i + 1), double(x.in_layout[i].bytes));
      CpCall p = x.halo_keys(a, i);
      timed_call(tr, st, Phase::attn_fwd, int32_t(i + 1), p, [&](const CpCall& q) {
        cp::fwd_chunked(q, chunk, true, o_tmp.data(), lse_tmp.data(), [&] { x.progress(comm_); });
      });
    }
    x.finish(comm_, st, tr);
  }

  void backward(const CpCall& a, Tracer* tr, CpStats& st) override {
    if (a.device != Device::cpu) cp::check_device_call(name(), comm_, a);
    const size_t kv_row = size_t(a.H_kv) * a.D;
    device_zero(a.dq, size_t(a.S_q) * a.H_q * a.D * sizeof(float), a.device, a.stream);
    device_zero(a.dk, size_t(a.S_k) * kv_row * sizeof(float), a.device, a.stream);
    device_zero(a.dv, size_t(a.S_k) * kv_row * sizeof(float), a.device, a.stream);
    Exchange x = post_halo(a, st, tr);
    // The dK/dV of the rows this rank sent come back from each peer: posted before any compute.
    const size_t n = x.plan.peers.size();
    std::vector<Buffer<float>> back_in(n), back_out(n);
    std::vector<Request> back_req(n);
    for (size_t i = 0; i < n; ++i) {
      const Plan::Peer& peer = x.plan.peers[i];
      if (peer.send_rows == 0) continue;
      back_in[i] = Buffer<float>(2 * size_t(peer.send_rows) * kv_row, false, a.device, a.stream);
      back_req[i] = comm_.send_recv_async(buf_at<float>(nullptr, 0, a.device), Comm::kNone, buf(back_in[i]), peer.rank,
                                          kTagHaloDkv);
    }
    const int64_t chunk = cp::progress_chunk_rows(a.S_q, kProgressParts, a.device);
    auto progress = [&] {
      x.progress(comm_);
      if (a.device != Device::cpu) return;
      for (Request& r : back_req)
        if (r.pending()) comm_.test(r);
    };
    timed_call(tr, st, Phase::attn_bwd, 0, a, [&](const CpCall& p) {
      for_near_keys(p, chunk, [&](const CpCall& q) {
        attn_bwd(q);
        progress();
      });
    });
    for (size_t i = 0; i < n; ++i) {
      const Plan::Peer& peer = x.plan.peers[i];
      if (peer.recv_rows == 0) continue;
      cp::timed_wait(comm_, x.req[i], st, tr, int32_t(i + 1), double(x.in_layout[i].bytes));
      CpCall p = x.halo_keys(a, i);
      back_out[i] = Buffer<float>(2 * size_t(peer.recv_rows) * kv_row, true, a.device, a.stream);  // the kernel accumulates
      p.dk = back_out[i].data();
      p.dv = back_out[i].data() + size_t(peer.recv_rows) * kv_row;
      timed_call(tr, st, Phase::attn_bwd, int32_t(i + 1), p, [&](const CpCall& q) {
        cp::bwd_chunked(q, chunk, progress);
      });
      // Home to the owner; the receive of the matching message was posted there at the start.
      Request r = comm_.send_recv_async(buf(back_out[i]), peer.rank, buf_at<float>(nullptr, 0, a.device), Comm::kNone,
                                        kTagHaloDkv);
      st.messages += 1;
      st.bytes_sent += double(back_out[i].size() * sizeof(float));
      x.sends.push_back(std::move(r));
    }
    // The returning dK/dV, added to this rank's rows in peer order (a fixed order).
    for (size_t i = 0; i < n; ++i) {
      const Plan::Peer& peer = x.plan.peers[i];
      if (peer.send_rows == 0) continue;
      cp::timed_wait(comm_, back_req[i], st, tr, int32_t(n + 1), double(back_in[i].size() * sizeof(float)));
      const float* dk_in = back_in[i].data();
      const float* dv_in = dk_in + size_t(peer.send_rows) * kv_row;
      for (const Seg& s : peer.send) {
        float* dk = a.dk + size_t(s.local) * kv_row;
        float* dv = a.dv + size_t(s.local) * kv_row;
        const size_t m = size_t(s.rows()) * kv_row;
        add_f32(dk, dk_in, int64_t(m), a.device, a.stream);
        add_f32(dv, dv_in, int64_t(m), a.device, a.stream);
        dk_in += m;
        dv_in += m;
      }
    }
    x.finish(comm_, st, tr);
  }

 private:
  // The halo messages of one call, in flight: per peer, the packed rows sent and the buffer
  // received (KvLayout sections: K, V, positions, document ids).
  struct Exchange {
    Plan plan;
    std::vector<cp::KvLayout> in_layout;
    std::vector<Buffer<std::byte>> out, in;
    // On a GPU, per peer: the halo rows' positions and document ids, on the host and the device.
    std::vector<std::vector<int64_t>> in_pos;
    std::vector<std::vector<int32_t>> in_doc;
    std::vector<Buffer<int64_t>> in_pos_dev;
    std::vector<Buffer<int32_t>> in_doc_dev;
    std::vector<Request> req;    // per peer: its receive (and, when both, its send)
    std::vector<Request> sends;  // sends whose completion only the end awaits
    bool gpu = false;
    void progress(Comm& c) {
      if (gpu) return;
      for (Request& r : req)
        if (r.pending()) c.test(r);
    }
    // The local queries that can see peer i's halo rows, against those rows.
    CpCall halo_keys(const CpCall& a, size_t i) const {
      CpCall p = a;
      cp::point_keys_at(in_layout[i], const_cast<std::byte*>(in[i].data()), p);
      if (a.device != Device::cpu) {
        p.k_pos = in_pos_dev[i].data();
        p.k_pos_host = in_pos[i].data();
        p.k_doc = a.k_doc ? in_doc_dev[i].data() : nullptr;
        p.k_doc_host = a.k_doc ? in_doc[i].data() : nullptr;
      }
      // Queries that see positions [lo, hi) lie in [lo, hi + window - 1): a contiguous run of the
      // ascending local rows.
      const int64_t lo = plan.peers[i].recv.front().begin, hi = plan.peers[i].recv.back().end;
      const int64_t* qp = a.device == Device::cpu ? a.q_pos : a.q_pos_host;
      const int64_t r0 = std::lower_bound(qp, qp + a.S_q, lo) - qp;
      const int64_t r1 = std::lower_bound(qp, qp + a.S_q, hi + a.window - 1) - qp;
      return p.query_rows(r0, std::max<int64_t>(r1 - r0, 0));
    }
    void finish(Comm& c, CpStats& st, Tracer* tr) {
      for (size_t i = 0; i < req.size(); ++i) cp::timed_wait(c, req[i], st, tr, -1, 0);
      for (Request& r : sends) cp::timed_wait(c, r, st, tr, -1, 0);
    }
  };

  Exchange post_halo(const CpCall& a, CpStats& st, Tracer* tr) {
    const int P = comm_.size(), me = comm_.rank();
    const bool gpu = a.device != Device::cpu;
    CTXPAR_CHECK(a.S_q == a.S_k && a.S_k % 2 == 0, "halo: takes the zigzag training layout (S_q = S_k, even); got S_q = "
                                                        << a.S_q << ", S_k = " << a.S_k);
    const int64_t c = a.S_k / 2;
    const int64_t* kp = gpu ? a.k_pos_host : a.k_pos;
    CTXPAR_CHECK(P == 1 || (kp[0] == me * c && kp[c] == (2 * P - 1 - me) * c),
                 "halo: rank " << me << "'s rows are not zigzag chunks " << me << " and " << 2 * P - 1 - me
                               << " of " << c << " rows");
    Exchange x;
    x.gpu = gpu;
    x.plan = make_plan(P, me, a.S_k, a.window);
    const size_t n = x.plan.peers.size();
    x.in_layout.resize(n);
    x.out.resize(n);
    x.in.resize(n);
    x.req.resize(n);
    const bool docs = a.k_doc != nullptr;
    const size_t row = size_t(a.H_kv) * a.D * dtype_bytes(a.dtype);
    // A GPU's messages hold K and V only: every rank's document ids on the host, once (positions
    // follow from the plan).
    cp::GroupKeyRows group;
    if (gpu && docs && P > 1) group = cp::group_key_rows(comm_, a, tr, st);  // collective: every rank
    if (gpu) {
      x.in_pos.resize(n);
      x.in_doc.resize(n);
      x.in_pos_dev.resize(n);
      x.in_doc_dev.resize(n);
    }
    for (size_t i = 0; i < n; ++i) {
      const Plan::Peer& peer = x.plan.peers[i];
      x.in_layout[i] = cp::kv_layout(peer.recv_rows, a.H_kv, a.D, a.dtype, docs && !gpu, !gpu);
      x.in[i] = Buffer<std::byte>(x.in_layout[i].bytes, false, a.device, a.stream);
      const cp::KvLayout out = cp::kv_layout(peer.send_rows, a.H_kv, a.D, a.dtype, docs && !gpu, !gpu);
      x.out[i] = Buffer<std::byte>(out.bytes, false, a.device, a.stream);
      std::byte* base = x.out[i].data();
      int64_t at = 0;  // rows packed so far
      for (const Seg& s : peer.send) {
        const size_t m = size_t(s.rows());
        const auto copy = [&](size_t off, const void* src, size_t bytes) {
          device_copy(base + off, src, bytes, a.device, a.stream);
        };
        copy(out.k_off + at * row, static_cast<const std::byte*>(a.k) + s.local * row, m * row);
        copy(out.v_off + at * row, static_cast<const std::byte*>(a.v) + s.local * row, m * row);
        if (!gpu) {
          std::memcpy(base + out.pos_off + at * sizeof(int64_t), a.k_pos + s.local, m * sizeof(int64_t));
          if (docs) std::memcpy(base + out.doc_off + at * sizeof(int32_t), a.k_doc + s.local, m * sizeof(int32_t));
        }
        at += int64_t(m);
      }
      if (gpu) {  // the halo rows' positions and document ids, from the plan and the group's
        for (const Seg& s : peer.recv)
          for (int64_t p = s.begin; p < s.end; ++p) {
            x.in_pos[i].push_back(p);
            if (docs) x.in_doc[i].push_back(group.doc[size_t(s.owner) * size_t(group.S_k) + size_t(s.local + p - s.begin)]);
          }
        x.in_pos_dev[i] = cp::to_device(x.in_pos[i], a.device, a.stream);
        if (docs) x.in_doc_dev[i] = cp::to_device(x.in_doc[i], a.device, a.stream);
      }
      const bool send = peer.send_rows > 0, recv = peer.recv_rows > 0;
      // Buffers where they live (buf: a device's go through the communicator's device backend).
      x.req[i] = comm_.send_recv_async(buf(x.out[i]), send ? peer.rank : Comm::kNone, buf(x.in[i]),
                                       recv ? peer.rank : Comm::kNone, kTagHaloKv);
      if (send) {
        st.messages += 1;
        st.bytes_sent += double(out.bytes);
      }
    }
    return x;
  }

  // Calls f on consecutive blocks of `chunk` query rows of `p` (the rank's own keys), each with
  // only the keys its window reaches: positions [first - window + 1, last] of the block, a
  // contiguous run of the ascending local rows. The kernel packs the keys of a call, so a block
  // against all local keys would cost S_loc per block instead of chunk + window.
  template <class F> static void for_near_keys(const CpCall& p, int64_t chunk, F&& f) {
    const bool gpu = p.device != Device::cpu;  // positions read from the host copies there
    const int64_t* kp = gpu ? p.k_pos_host : p.k_pos;
    for (int64_t a0 = 0; a0 < p.S_q; a0 += chunk) {
      const int64_t n = std::min(chunk, p.S_q - a0);
      const CpCall q = p.query_rows(a0, n);
      const int64_t* qp = gpu ? q.q_pos_host : q.q_pos;
      const int64_t k0 = std::lower_bound(kp, kp + p.S_k, qp[0] - (p.window - 1)) - kp;
      const int64_t k1 = std::upper_bound(kp, kp + p.S_k, qp[n - 1]) - kp;
      f(q.key_rows(k0, k1 - k0));
    }
  }

  template <class F> static void timed_call(Tracer* tr, CpStats& st, Phase ph, int32_t step, const CpCall& p, F&& f) {
    const int64_t pairs = visible_pairs(p);
    if (step > 0 && (pairs == 0 || p.S_q == 0)) return;  // step 0 initializes o, lse even when empty
    const double flops = ph == Phase::attn_fwd ? attn_fwd_flops(double(pairs), p.H_q, p.D)
                                               : attn_bwd_flops(double(pairs), p.H_q, p.D);
    const double t0 = tr ? tr->stamp() : 0;
    if (tr) tr->progress(ph);
    f(p);
    st.count_attn(pairs, p.H_q, flops, ph != Phase::attn_fwd);
    if (tr) tr->add_span(ph, -1, step, t0, tr->stamp(), flops, 0);
  }

  Comm& comm_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_halo_strategy(Topology& topo) { return std::make_unique<Halo>(topo); }

}  // namespace ctxpar
