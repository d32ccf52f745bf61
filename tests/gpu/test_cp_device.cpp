// The CP strategies on device buffers (issue 15, "every strategy on device buffers"), without a
// GPU: the CUDA kernels of kernels/cuda run under the CPU emulator, enqueued on the streams of the
// CUDA runtime test double (tests/gpu/cuda_runtime_mock.cpp: work runs late unless an event
// orders it), and the ranks talk through the staged MPI backend on the same double, one rank per
// process sharing the one mock GPU. Every pointer of the call is "device" memory allocated and
// filled through kernels/ops.hpp's memory operations, as the strategies' own scratch is.
//
// Each case runs one strategy's forward and backward (pass_q: forward) at the ctest rank count on
// bf16 inputs and holds every rank's O, LSE, dQ, dK and dV to the bf16 policy of test_cuda_ops.cpp:
// max error against kernels/ref in fp64 (on the fp32 inputs) at most twice that of the naive bf16
// computation (kernels/ref in fp32 on the bf16-rounded inputs), plus the floor of tolerance.hpp.
// The strategies' fp32 LSE merges and partial dK/dV sums add errors far below bf16's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "core/memory.hpp"
#include "cp/common.hpp"
#include "cp/strategy.hpp"
#include "dist/comm_device.hpp"
#include "dist/topology.hpp"
#include "mpi_test_env.hpp"
#include "ops.hpp"
#include "ref/attn_ref.hpp"
#include "shard/partition.hpp"
#include "tolerance.hpp"

using namespace ctxpar;
using ctxpar::test::world;

namespace {

constexpr int64_t kSeq = 192;  // 2P zigzag chunks for P = 1, 2, 4; several 64-row kernel tiles
constexpr int32_t kHeadDim = 32;
const std::vector<int64_t> kDocLengths = {50, 7, 90, 45};

struct Case {
  std::string strategy;
  int32_t H_q, H_kv;
  MaskKind mask;
  int64_t window;
  bool docs;
  bool derive;  // CpCall::k_pos_zigzag: key positions derived, not gathered
  std::string name() const {
    return strategy + "/" + std::to_string(H_q) + ":" + std::to_string(H_kv) +
           (mask == MaskKind::window ? "/window" : docs ? "/docs" : "/causal") + (derive ? "/derived" : "");
  }
};

// bf16 rounding (nearest, ties to even) of finite floats, as the device stores them
// (kernels/dtype.hpp's bf16_bits gives their bits).
float round_bf16(float x) {
  const uint32_t u = uint32_t(bf16_bits(x)) << 16;
  std::memcpy(&x, &u, 4);
  return x;
}

// The one device stream of the test (the compute stream of every device communicator).
Stream stream() {
  static cudaStream_t s = [] {
    cudaStream_t x = nullptr;
    if (cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking) != cudaSuccess) throw std::runtime_error("stream");
    return x;
  }();
  return s;
}

// The mesh a strategy runs on at P ranks (as test_cp): usp on both axes where P allows, ulysses
// on its own axis, the others on the ring axis; its communicators move device buffers (staged
// MPI, every rank on the one mock GPU) with the test's stream as their compute stream.
MeshSpec mesh_for(const std::string& strategy, int P) {
  MeshSpec m;
  if (strategy == "usp") {
    m.ulysses = P >= 4 ? 2 : 1;
    m.ring = P / m.ulysses;
  } else if (strategy == "ulysses") {
    m.ulysses = P;
  } else {
    m.ring = P;
  }
  return m;
}
Topology& device_topology(const MeshSpec& m) {
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Topology>> cache;
  std::unique_ptr<Topology>& t = cache[{m.ulysses, m.ring}];
  if (!t) {
    t = Topology::create(world(), m);
    t->use_device_comms([](Comm& host) { return make_staged_comm(host, 0); });
    t->cp().set_compute_stream(stream());
    for (int a = 0; a < kNumAxes; ++a) t->axis(Axis(a)).set_compute_stream(stream());
  }
  return *t;
}
Topology& device_topology() { return device_topology(mesh_for("ring", world().size())); }
// The same mesh on host communicators only (for the refusal).
Topology& host_topology() {
  static std::unique_ptr<Topology> t = [] {
    MeshSpec m;
    m.ring = world().size();
    return Topology::create(world(), m);
  }();
  return *t;
}

// A host vector on the device (through ops.hpp, as the strategies allocate).
template <class T> Buffer<T> on_device(const std::vector<T>& h) { return cp::to_device(h, Device::cuda, stream()); }
template <class T> std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  copy_to_host(h.data(), d, n * sizeof(T), Device::cuda, stream());
  return h;
}

struct Errors {
  double fast = 0, naive = 0;
};

// Max |x - ref| over this rank's rows (x local, `rows` global indices of width w) and over every
// rank; the naive error is over the whole tensor (the same on every rank).
double rank_max_err(const std::vector<float>& x, const std::vector<double>& ref, const std::vector<int64_t>& rows,
                    int64_t w) {
  double e = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t j = 0; j < w; ++j) {
      const double r = ref[size_t(rows[i] * w + j)], v = x[i * size_t(w) + size_t(j)];
      if (std::isinf(r) && v == r) continue;
      e = std::max(e, std::abs(v - r));
    }
  world().all_reduce(std::span<double>(&e, 1), ReduceOp::max);
  return e;
}
double max_err(const std::vector<float>& x, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (!(std::isinf(ref[i]) && double(x[i]) == ref[i])) e = std::max(e, std::abs(double(x[i]) - ref[i]));
  return e;
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name());
  const int P = world().size(), r = world().rank();
  const int64_t S = kSeq;
  const int32_t D = kHeadDim;
  // Global inputs, the same on every rank.
  std::mt19937_64 rng(1234 + uint64_t(c.H_q) * 7 + uint64_t(c.mask) * 3 + (c.docs ? 1 : 0));
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  const auto draw = [&](int32_t H) {
    std::vector<float> x(size_t(S) * H * D);
    for (float& e : x) e = U(rng);
    return x;
  };
  const std::vector<float> q = draw(c.H_q), k = draw(c.H_kv), v = draw(c.H_kv), dout = draw(c.H_q);
  std::vector<int64_t> pos(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) pos[size_t(i)] = i;
  const std::vector<int32_t> doc = c.docs ? doc_ids_from_lengths(kDocLengths, S) : std::vector<int32_t>{};

  CpCall g = attn_problem(S, c.H_q, c.H_kv, D, c.mask, c.window);
  g.q_pos = g.k_pos = pos.data();
  if (c.docs) g.q_doc = g.k_doc = doc.data();

  // References: fp64 on the fp32 inputs; naive bf16 = fp32 on the bf16-rounded inputs.
  const size_t nq = q.size(), nk = k.size(), nl = size_t(S) * c.H_q;
  std::vector<double> o64(nq), l64(nl), dq64(nq, 0), dk64(nk, 0), dv64(nk, 0);
  {
    const auto d = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
    const std::vector<double> Q = d(q), K = d(k), V = d(v), dO = d(dout);
    ref::attn_fwd<double>(g, Q.data(), K.data(), V.data(), o64.data(), l64.data());
    ref::attn_bwd<double>(g, Q.data(), K.data(), V.data(), o64.data(), l64.data(), dO.data(), dq64.data(), dk64.data(),
                          dv64.data());
  }
  const auto rounded = [](std::vector<float> x) {
    for (float& e : x) e = round_bf16(e);
    return x;
  };
  const std::vector<float> qr = rounded(q), kr = rounded(k), vr = rounded(v), dor = rounded(dout);
  std::vector<float> on(nq), ln(nl), dqn(nq, 0), dkn(nk, 0), dvn(nk, 0);
  ref::attn_fwd<float>(g, qr.data(), kr.data(), vr.data(), on.data(), ln.data());
  ref::attn_bwd<float>(g, qr.data(), kr.data(), vr.data(), on.data(), ln.data(), dor.data(), dqn.data(), dkn.data(),
                       dvn.data());

  // This rank's zigzag shard, as bf16 bits on the device.
  const std::vector<int64_t> rows = Partition(PartitionKind::zigzag, S, P).positions(r);
  const auto shard = [&](const std::vector<float>& x, int32_t H) {
    std::vector<uint16_t> b;
    for (int64_t i : rows)
      for (int64_t j = 0; j < int64_t(H) * D; ++j) b.push_back(bf16_bits(x[size_t(i * H * D + j)]));
    return b;
  };
  std::vector<int32_t> doc_loc;
  for (int64_t i : rows)
    if (c.docs) doc_loc.push_back(doc[size_t(i)]);
  const int64_t n = int64_t(rows.size());
  Buffer<uint16_t> dq_in = on_device(shard(qr, c.H_q)), dk_in = on_device(shard(kr, c.H_kv)),
                   dv_in = on_device(shard(vr, c.H_kv)), ddo = on_device(shard(dor, c.H_q));
  Buffer<int64_t> dpos = on_device(rows);
  Buffer<int32_t> ddoc = on_device(doc_loc);
  Buffer<float> o(size_t(n) * c.H_q * D, false, Device::cuda, stream()), lse(size_t(n) * c.H_q, false, Device::cuda, stream()),
      dq(size_t(n) * c.H_q * D, false, Device::cuda, stream()), dk(size_t(n) * c.H_kv * D, false, Device::cuda, stream()),
      dv(size_t(n) * c.H_kv * D, false, Device::cuda, stream());

  CpCall a = g;
  a.device = Device::cuda;
  a.stream = stream();
  a.dtype = DType::bf16;
  a.S_q = a.S_k = n;
  a.q = dq_in.data();
  a.k = dk_in.data();
  a.v = dv_in.data();
  a.dout = ddo.data();
  a.o = o.data();
  a.lse = lse.data();
  a.dq = dq.data();
  a.dk = dk.data();
  a.dv = dv.data();
  a.q_pos = a.k_pos = dpos.data();
  a.q_pos_host = a.k_pos_host = rows.data();
  a.q_doc = a.k_doc = c.docs ? ddoc.data() : nullptr;
  a.q_doc_host = a.k_doc_host = c.docs ? doc_loc.data() : nullptr;
  a.k_pos_zigzag = c.derive ? S : 0;

  Topology& topo = device_topology(mesh_for(c.strategy, P));
  std::unique_ptr<CpStrategy> s = make_strategy(c.strategy, topo);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->validate(g, topo), "");
  CpStats fwd, bwd;
  s->forward(a, nullptr, fwd);
  const bool train = s->has_backward();
  if (train) s->backward(a, nullptr, bwd);
  stream_synchronize(stream(), Device::cuda);
  fwd.settle();
  bwd.settle();
  EXPECT_TRUE(fwd.device_waits.empty() && bwd.device_waits.empty());
  EXPECT_GE(fwd.exposed_comm_s, 0.0);
  EXPECT_GE(bwd.exposed_comm_s, 0.0);
  if (c.strategy == "ring") {
    EXPECT_EQ(fwd.messages, P - 1);        // one K/V message per hop
    EXPECT_EQ(bwd.messages, P == 1 ? 0 : 2 * P - 1);  // K/V hops and dK/dV hops
    // Every wait on a device transfer timed on the device: one per hop, and per dK/dV hop.
    EXPECT_EQ(fwd.device_waits_timed, P - 1);
    EXPECT_EQ(bwd.device_waits_timed, P == 1 ? 0 : 2 * P - 1);
  }
  if (c.strategy == "allgather" && P > 1) {
    EXPECT_EQ(fwd.device_waits_timed, 2);  // the K and V all-gathers
    EXPECT_EQ(bwd.device_waits_timed, 4);  // K and V again, the dK and dV reduce-scatters
  }
  const double pairs = double(visible_pairs(g));
  double flops = fwd.attn_flops;
  world().all_reduce(std::span<double>(&flops, 1), ReduceOp::sum);
  EXPECT_DOUBLE_EQ(flops, 4.0 * pairs * c.H_q * D) << "forward FLOPs = 4 x visible pairs x H_q x D over the group";

  const std::vector<float> O = to_host(o.data(), o.size()), L = to_host(lse.data(), lse.size()),
                           dQ = to_host(dq.data(), dq.size()), dK = to_host(dk.data(), dk.size()),
                           dV = to_host(dv.data(), dv.size());
  const auto expect = [&](const char* what, const std::vector<float>& x, const std::vector<double>& ref,
                          const std::vector<float>& naive, int64_t w, double floor_factor) {
    const double e = rank_max_err(x, ref, rows, w), en = max_err(naive, ref);
    EXPECT_LE(e, test::tolerance(en, ref, floor_factor)) << what << ": device error " << e << ", naive bf16 " << en;
  };
  expect("O", O, o64, on, int64_t(c.H_q) * D, 1.0);
  expect("LSE", L, l64, ln, c.H_q, 1.0);
  if (!train) return;
  expect("dQ", dQ, dq64, dqn, int64_t(c.H_q) * D, test::kBwdCancellation);
  expect("dK", dK, dk64, dkn, int64_t(c.H_kv) * D, test::kBwdCancellation);
  expect("dV", dV, dv64, dvn, int64_t(c.H_kv) * D, 1.0);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (const char* s : {"ring", "allgather"}) {
    v.push_back({s, 4, 2, MaskKind::causal, 0, false, false});
    v.push_back({s, 4, 2, MaskKind::causal, 0, false, true});
    v.push_back({s, 2, 2, MaskKind::causal, 0, true, true});
    v.push_back({s, 4, 1, MaskKind::window, 40, false, false});
  }
  // Heads split over U <= 4 ranks: H_q = 4; K/V heads split (4), or replicated and their
  // gradients summed (2, 1 at U = 4).
  for (const char* s : {"ulysses", "usp"}) {
    v.push_back({s, 4, 2, MaskKind::causal, 0, false, true});
    v.push_back({s, 4, 4, MaskKind::causal, 0, true, true});
    v.push_back({s, 4, 1, MaskKind::window, 40, false, false});
  }
  // pass-Q (forward only): queries travel; a batched prefill's sequences as documents.
  v.push_back({"pass_q", 4, 2, MaskKind::causal, 0, false, false});
  v.push_back({"pass_q", 2, 2, MaskKind::causal, 0, true, false});
  v.push_back({"pass_q", 4, 1, MaskKind::window, 40, false, false});
  // The halo exchange of local layers: a window reaching over a whole chunk into the one before
  // (40 > 24 rows per chunk at P = 4), and one within a chunk (17) with documents.
  v.push_back({"halo", 4, 1, MaskKind::window, 40, false, false});
  v.push_back({"halo", 4, 2, MaskKind::window, 17, true, false});
  return v;
}

TEST(CpDevice, StrategiesOnDeviceBuffersMatchTheReference) {
  for (const Case& c : cases()) run_case(c);
  EXPECT_EQ(device_mem_current_bytes(), 0) << "every device buffer released";
  EXPECT_GT(device_mem_peak_bytes(), 0);
}

// A deterministic value in [-1, 1) for (tensor, sequence, token, element): the same K/V rows
// whichever rank holds them.
float value(uint64_t tensor, uint64_t b, uint64_t tok, uint64_t j) {
  uint64_t x = (tensor * 1000003u + b) * 0x9E3779B97F4A7C15ull ^ (tok * 131071u + j) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return round_bf16(float(double(x >> 11) / double(1ull << 53) * 2.0 - 1.0));
}

// The decode strategies on device buffers: B sequences with caches spread over the ranks (token i
// of sequence b on rank (i + b) % P), one new token each, owned by rank b / ceil(B/P), stored by
// rank b % P (as test_cp's DecodeStrategiesMatchReference, here with bf16 values on the device).
// Each query's O and LSE against kernels/ref over its sequence's keys and itself, and the new
// token's K/V in the target's device cache after the call.
TEST(CpDevice, DecodeStrategiesOnDeviceBuffers) {
  const int P = world().size(), r = world().rank();
  Topology& topo = device_topology();
  constexpr int64_t B = 3;
  constexpr int32_t Hq = 4, Hkv = 2, D = kHeadDim;
  const int64_t wq = int64_t(Hq) * D, wk = int64_t(Hkv) * D;
  const int64_t Bq = (B + P - 1) / P, b0 = r * Bq, n = std::max<int64_t>(0, std::min(Bq, B - b0));
  std::vector<int64_t> len(B);
  for (int64_t b = 0; b < B; ++b) len[size_t(b)] = 40 + 29 * b;
  const int64_t cap = len[B - 1] + 1;
  const auto rows_of = [&](uint64_t tensor, uint64_t b, const std::vector<int64_t>& toks, int64_t w) {
    std::vector<uint16_t> x;
    for (int64_t t : toks)
      for (int64_t j = 0; j < w; ++j) x.push_back(bf16_bits(value(tensor, b, uint64_t(t), uint64_t(j))));
    return x;
  };
  for (const char* name : {"decode_pass_q", "decode_allgather"}) {
    SCOPED_TRACE(name);
    std::vector<uint16_t> kc(size_t(B * cap * wk), 0), vc(size_t(B * cap * wk), 0);
    std::vector<int64_t> kpos(size_t(B * cap), int64_t(1) << 60), begin(B), here(B), slot(B, -1);
    for (int64_t b = 0; b < B; ++b) {
      begin[size_t(b)] = b * cap;
      std::vector<int64_t> mine;
      for (int64_t i = 0; i < len[size_t(b)]; ++i)
        if ((i + b) % P == r) mine.push_back(i);
      here[size_t(b)] = int64_t(mine.size());
      const std::vector<uint16_t> k = rows_of(1, uint64_t(b), mine, wk), v = rows_of(2, uint64_t(b), mine, wk);
      std::copy(k.begin(), k.end(), kc.begin() + b * cap * wk);
      std::copy(v.begin(), v.end(), vc.begin() + b * cap * wk);
      for (size_t j = 0; j < mine.size(); ++j) kpos[size_t(b * cap) + j] = mine[j];
      if (b % P == r) {
        slot[size_t(b)] = b * cap + here[size_t(b)];
        kpos[size_t(slot[size_t(b)])] = len[size_t(b)];
      }
    }
    std::vector<uint16_t> q, kn, vn;
    std::vector<int64_t> qpos(size_t(std::max<int64_t>(n, 1)));
    std::vector<int32_t> qdoc(size_t(Bq), -1);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = b0 + i;
      qpos[size_t(i)] = len[size_t(b)];
      qdoc[size_t(i)] = int32_t(b);
      const std::vector<int64_t> at = {len[size_t(b)]};
      for (auto [dst, t, w] : {std::tuple{&q, 3, wq}, std::tuple{&kn, 1, wk}, std::tuple{&vn, 2, wk}}) {
        const std::vector<uint16_t> x = rows_of(uint64_t(t), uint64_t(b), at, w);
        dst->insert(dst->end(), x.begin(), x.end());
      }
    }
    for (auto* x : {&q, &kn, &vn}) x->resize(std::max<size_t>(x->size(), 8), 0);
    Buffer<uint16_t> dq = on_device(q), dkn = on_device(kn), dvn = on_device(vn), dkc = on_device(kc), dvc = on_device(vc);
    Buffer<int64_t> dqpos = on_device(qpos), dkpos = on_device(kpos);
    Buffer<int32_t> dqdoc = on_device(qdoc);
    const size_t no = size_t(std::max<int64_t>(Bq, 1));
    Buffer<float> o(no * wq, false, Device::cuda, stream()), lse(no * Hq, false, Device::cuda, stream());
    CpCall t = attn_problem(Bq, Hq, Hkv, D, MaskKind::causal, 0);
    t.device = Device::cuda;
    t.stream = stream();
    t.dtype = DType::bf16;
    t.q = dq.data();
    t.q_pos = dqpos.data();
    t.q_pos_host = qpos.data();
    t.q_doc = dqdoc.data();
    t.q_doc_host = qdoc.data();
    t.k_new = dkn.data();
    t.v_new = dvn.data();
    t.k = t.k_cache = dkc.data();
    t.v = t.v_cache = dvc.data();
    t.k_pos = dkpos.data();
    t.k_pos_host = kpos.data();
    t.S_k = B * cap;
    t.k_doc_begin = begin.data();
    t.k_doc_len = here.data();
    t.k_new_slot = slot.data();
    t.o = o.data();
    t.lse = lse.data();
    std::unique_ptr<CpStrategy> s = make_strategy(name, topo);
    CpStats st;
    s->forward(t, nullptr, st);
    const std::vector<float> O = to_host(o.data(), o.size()), L = to_host(lse.data(), lse.size());
    double err_o = 0, err_l = 0, tol_o = 0, tol_l = 0;
    for (int64_t i = 0; i < n; ++i) {  // each owned query against its sequence's len + 1 keys
      const int64_t b = b0 + i, Lk = len[size_t(b)] + 1;
      std::vector<int64_t> all(static_cast<size_t>(Lk));
      for (int64_t j = 0; j < Lk; ++j) all[size_t(j)] = j;
      const auto as_float = [](const std::vector<uint16_t>& x) {
        std::vector<double> y(x.size());
        for (size_t j = 0; j < x.size(); ++j) {
          const uint32_t u = uint32_t(x[j]) << 16;
          float f;
          std::memcpy(&f, &u, 4);
          y[j] = f;
        }
        return y;
      };
      const std::vector<double> Q = as_float(rows_of(3, uint64_t(b), {len[size_t(b)]}, wq)),
                                K = as_float(rows_of(1, uint64_t(b), all, wk)), V = as_float(rows_of(2, uint64_t(b), all, wk));
      CpCall rp = attn_problem(1, Hq, Hkv, D, MaskKind::causal, 0);
      rp.S_k = Lk;
      rp.q_pos = &qpos[size_t(i)];
      rp.k_pos = all.data();
      std::vector<double> o64(static_cast<size_t>(wq)), l64(static_cast<size_t>(Hq));
      ref::attn_fwd<double>(rp, Q.data(), K.data(), V.data(), o64.data(), l64.data());
      const std::vector<float> Qf(Q.begin(), Q.end()), Kf(K.begin(), K.end()), Vf(V.begin(), V.end());
      std::vector<float> o32(static_cast<size_t>(wq)), l32(static_cast<size_t>(Hq));
      ref::attn_fwd<float>(rp, Qf.data(), Kf.data(), Vf.data(), o32.data(), l32.data());
      // The inputs are bf16 values already, so the naive bf16 computation is ref<float> on them;
      // the kernel also rounds the probabilities P to bf16 before P V (FlashAttention-2), which
      // moves O by at most u * max|V| (u = 2^-9, bf16's unit roundoff; |V| < 1 here).
      const std::vector<float> oi(O.begin() + i * wq, O.begin() + (i + 1) * wq), li(L.begin() + i * Hq, L.begin() + (i + 1) * Hq);
      err_o = std::max(err_o, max_err(oi, o64));
      err_l = std::max(err_l, max_err(li, l64));
      tol_o = std::max(tol_o, test::tolerance(max_err(o32, o64), o64) + 0x1p-9);
      tol_l = std::max(tol_l, test::tolerance(max_err(l32, l64), l64));
    }
    world().all_reduce(std::span<double>(&err_o, 1), ReduceOp::max);
    world().all_reduce(std::span<double>(&err_l, 1), ReduceOp::max);
    world().all_reduce(std::span<double>(&tol_o, 1), ReduceOp::max);
    world().all_reduce(std::span<double>(&tol_l, 1), ReduceOp::max);
    EXPECT_LE(err_o, tol_o) << "O";
    EXPECT_LE(err_l, tol_l) << "LSE";
    // The target rank stored each new token's K/V at its slot (on the device).
    const std::vector<uint16_t> kc_after = to_host(dkc.data(), dkc.size());
    for (int64_t b = 0; b < B; ++b) {
      if (slot[size_t(b)] < 0) continue;
      const std::vector<uint16_t> want = rows_of(1, uint64_t(b), {len[size_t(b)]}, wk);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), kc_after.begin() + slot[size_t(b)] * wk)) << "sequence " << b;
    }
  }
}

// A device call over communicators that move host buffers only, or without the host copies of
// its positions, is refused with a message (on every rank alike), before anything moves.
// The registry's device column (cp/strategy.hpp StrategyRow::cuda): every row claiming
// device = cuda is a plain strategy the tests here run on device buffers; every other row is a
// CPU-only schedule, which RefusesWhatItCannotRun sees refuse a device call.
TEST(CpDevice, RegistryDeviceColumn) {
  std::set<std::string> run = {"decode_pass_q", "decode_allgather"};  // DecodeStrategiesOnDeviceBuffers
  for (const Case& c : cases()) run.insert(c.strategy);
  for (const StrategyRow& r : strategy_rows()) {
    if (r.cuda) {
      EXPECT_TRUE(run.count(r.name)) << r.name << " claims device = cuda, and no device test runs it";
      EXPECT_EQ(r.schedule, CpSchedule::plain) << r.name;
    } else {
      EXPECT_NE(r.schedule, CpSchedule::plain) << r.name;
    }
  }
}

TEST(CpDevice, RefusesWhatItCannotRun) {
  CpCall a = attn_problem(kSeq / world().size(), 4, 2, kHeadDim, MaskKind::causal, 0);
  a.device = Device::cuda;
  a.stream = stream();
  std::vector<int64_t> pos(size_t(a.S_q));
  a.q_pos = a.k_pos = pos.data();  // (never read: refused first)
  const std::string missing = cp::device_call_error("ring", device_topology().cp(), a);
  EXPECT_NE(missing.find("host copies"), std::string::npos) << missing;
  a.q_pos_host = a.k_pos_host = pos.data();
  EXPECT_EQ(cp::device_call_error("ring", device_topology().cp(), a), "");
  {  // the deterministic and frugal schedules are CPU only: refused, not run on device memory
    CpStats st;
    for (const StrategyRow& r : strategy_rows()) {  // every row that does not claim device = cuda
      if (r.cuda) continue;
      std::unique_ptr<CpStrategy> s = make_strategy(r.name, device_topology(), r.schedule);
      try {
        s->forward(a, nullptr, st);
        ADD_FAILURE() << "a device call of a CPU-only schedule was not refused";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("CPU only"), std::string::npos) << e.what();
      }
    }
  }
  if (world().size() > 1) {
    const std::string host = cp::device_call_error("ring", host_topology().cp(), a);
    EXPECT_NE(host.find("moves host buffers only"), std::string::npos) << host;
    std::unique_ptr<CpStrategy> s = make_strategy("ring", host_topology());
    CpStats st;
    EXPECT_THROW(s->forward(a, nullptr, st), std::invalid_argument);
  }
}

}  // namespace
