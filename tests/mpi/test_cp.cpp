// CP attention strategies at the ctest rank count P: every strategy x {MHA, GQA 4:1, MQA} x
// {causal, packed documents, sliding window}, forward and backward, against the fp64 reference
// on the same global inputs (tolerance policy below); message counts and bytes against the
// strategy's own accounting; validate() messages for invalid shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "cp/common.hpp"
#include "cp/strategy.hpp"
#include "cp/ulysses_core.hpp"
#include "dist/topology.hpp"
#include "mpi_test_env.hpp"
#include "ops.hpp"
#include "ref/attn_ref.hpp"
#include "shard/partition.hpp"

using namespace ctxpar;
using ctxpar::test::world;

namespace {

// ---- tolerance policy (tests/README.md): an fp32 result's max error against the fp64 reference
// must stay within kCpFactor x the error of the naive fp32 reference (ref::attn_* in float, one
// row at a time, the whole sequence on one rank), plus kFloorRel x max|ref| (about one fp32 ulp
// of the tensor's scale) in case the naive error is exactly zero. kCpFactor = 4 rather than the
// kernels' 2: a CP result adds up to P fp32 LSE merges (forward) and a sum of P partial dK/dV
// (backward), each rounding once. The bound does not depend on P, so an error that grows with P
// fails. Measured with this suite (max over cases and ranks, P = 1 / 2 / 4 / 8): ratios to the
// naive error 1.66 / 1.66 / 1.66 / 1.66 (dK), 1.21 / 1.21 / 1.21 / 1.32 (dQ), 1.11-1.14 (O).
constexpr double kCpFactor = 4.0;
constexpr double kFloorRel = 1e-7;

constexpr int64_t kSeq = 128;  // divisible by 2P for P up to 8; several tiles per chunk at P = 1
constexpr int64_t kOddSeq = 101;  // divisible by no 2P: the partition pads (1 to 11 rows at P = 1..8)
constexpr int32_t kHeadDim = 16;
constexpr int64_t kWindow = 24;  // spans zigzag chunk boundaries for every P
// Documents of these lengths (sum kSeq): one shorter than a chunk, others crossing shards.
const std::vector<int64_t> kDocLengths = {37, 5, 50, 36};
const std::vector<int64_t> kOddDocLengths = {37, 5, 50, 9};

struct Heads {
  const char* name;
  int32_t H_q, H_kv;
};
const Heads kHeads[] = {{"mha", 8, 8}, {"gqa", 8, 2}, {"mqa", 8, 1}};

struct Masking {
  const char* name;
  MaskKind mask;
  int64_t window;
  bool docs;
};
const Masking kMasks[] = {{"causal", MaskKind::causal, 0, false},
                          {"docs", MaskKind::causal, 0, true},
                          {"window", MaskKind::window, kWindow, false}};
// With padding rows, mask=none needs document ids to hide them (as modes/workload.cpp gives them).
const Masking kNoMask = {"none", MaskKind::none, 0, false};
// halo (sliding-window layers only): windows within one chunk, across several chunks and
// longer than the sequence (every earlier row is halo), and windows over packed documents.
const Masking kHaloMasks[] = {{"window", MaskKind::window, kWindow, false},
                              {"window_docs", MaskKind::window, kWindow, true},
                              {"window3", MaskKind::window, 3, false},
                              {"window200", MaskKind::window, 200, false}};

struct Case {
  std::string strategy;
  Heads heads;
  Masking mask;
  int64_t S = kSeq;
  bool frugal = false;  // CpSchedule::visible: only the key rows a rank can see move (allgather, ring)
  bool exact = false;   // CpSchedule::exact: the bits of one rank's exact call, on any mesh
};

// The mesh a strategy runs on at P ranks: usp uses both axes where P allows (P = 1, 2 are its
// degenerate cases), ulysses its own axis, the others the ring axis.
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

Topology& topology(const MeshSpec& m) {
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Topology>> cache;
  auto& t = cache[{m.ulysses, m.ring}];
  if (!t) t = Topology::create(world(), m);
  return *t;
}

// Global inputs and the fp64 / naive-fp32 references of one case (same on every rank).
struct Global {
  CpCall shape;  // the problem: S, heads, D, mask (no tensors)
  bool has_docs = false;
  std::vector<int32_t> doc;
  std::vector<int64_t> pos;
  std::vector<float> q, k, v, dout;
  // references: [0] fp64, [1] naive fp32 (as double)
  std::vector<double> o[2], lse[2], dq[2], dk[2], dv[2];
};

template <class T>
void run_ref(const Global& g, const CpCall& p, std::vector<double>* o, std::vector<double>* lse,
             std::vector<double>* dq, std::vector<double>* dk, std::vector<double>* dv) {
  auto conv = [](const std::vector<float>& x) { return std::vector<T>(x.begin(), x.end()); };
  const std::vector<T> q = conv(g.q), k = conv(g.k), v = conv(g.v), dout = conv(g.dout);
  std::vector<T> O(q.size()), L(size_t(p.S_q) * p.H_q), dQ(q.size(), T(0)), dK(k.size(), T(0)), dV(v.size(), T(0));
  ref::attn_fwd<T>(p, q.data(), k.data(), v.data(), O.data(), L.data());
  ref::attn_bwd<T>(p, q.data(), k.data(), v.data(), O.data(), L.data(), dout.data(), dQ.data(), dK.data(), dV.data());
  *o = std::vector<double>(O.begin(), O.end());
  *lse = std::vector<double>(L.begin(), L.end());
  *dq = std::vector<double>(dQ.begin(), dQ.end());
  *dk = std::vector<double>(dK.begin(), dK.end());
  *dv = std::vector<double>(dV.begin(), dV.end());
}

Global make_global(const Case& c, uint64_t seed) {
  Global g;
  const int64_t S = c.S;
  g.shape = attn_problem(S, c.heads.H_q, c.heads.H_kv, kHeadDim, c.mask.mask, c.mask.window);
  const CpCall& s = g.shape;
  g.has_docs = c.mask.docs;
  g.pos.resize(size_t(S));
  for (int64_t i = 0; i < S; ++i) g.pos[size_t(i)] = i;
  if (g.has_docs) g.doc = doc_ids_from_lengths(S == kSeq ? kDocLengths : kOddDocLengths, S);
  auto fill = [&](std::vector<float>& x, uint64_t id, int32_t H) {
    x.resize(size_t(S) * H * s.D);
    fill_rows(seed, id, g.pos, int64_t(H) * s.D, 1.0f, x.data());
  };
  fill(g.q, 1, s.H_q);
  fill(g.k, 2, s.H_kv);
  fill(g.v, 3, s.H_kv);
  fill(g.dout, 4, s.H_q);
  CpCall p;
  p.S_q = p.S_k = S;
  p.H_q = s.H_q;
  p.H_kv = s.H_kv;
  p.D = s.D;
  p.q_pos = p.k_pos = g.pos.data();
  p.q_doc = p.k_doc = g.has_docs ? g.doc.data() : nullptr;
  p.mask = s.mask;
  p.window = s.window;
  run_ref<double>(g, p, &g.o[0], &g.lse[0], &g.dq[0], &g.dk[0], &g.dv[0]);
  run_ref<float>(g, p, &g.o[1], &g.lse[1], &g.dq[1], &g.dk[1], &g.dv[1]);
  return g;
}

// max |a - ref| over rows `pos` of a [S, width] reference; -inf must match exactly, NaN fails.
// Padding rows (pos >= S) have no reference: skipped.
double err_rows(const std::vector<float>& a, const std::vector<double>& ref, const std::vector<int64_t>& pos,
                int64_t width) {
  double e = 0;
  const int64_t S = int64_t(ref.size()) / width;
  for (size_t i = 0; i < pos.size(); ++i)
    for (int64_t c = 0; c < width && pos[i] < S; ++c) {
      const double x = a[i * width + c], r = ref[size_t(pos[i] * width + c)];
      if (std::isnan(x)) return std::numeric_limits<double>::infinity();
      if (std::isinf(r) || std::isinf(x)) {
        if (x != r) return std::numeric_limits<double>::infinity();
        continue;
      }
      e = std::max(e, std::abs(x - r));
    }
  return e;
}
double err_all(const std::vector<double>& a, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!std::isinf(ref[i])) e = std::max(e, std::abs(a[i] - ref[i]));
  return e;
}
double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x)
    if (!std::isinf(v)) m = std::max(m, std::abs(v));
  return m;
}
double max_over_ranks(double x) {
  world().all_reduce(std::span<double>(&x, 1), ReduceOp::max);
  return x;
}

class CpCase : public ::testing::TestWithParam<Case> {};

TEST_P(CpCase, ForwardBackwardMatchReference) {
  const Case& c = GetParam();
  const int P = world().size();
  Topology& topo = topology(mesh_for(c.strategy, P));
  const CpSchedule sched = c.exact ? CpSchedule::exact : c.frugal ? CpSchedule::visible : CpSchedule::plain;
  std::unique_ptr<CpStrategy> strat = make_strategy(c.strategy, topo, sched);
  ASSERT_TRUE(strat != nullptr);
  const Global g = make_global(c, 1234);
  const std::string verr = strat->validate(g.shape, topo);
  ASSERT_EQ(verr, "") << "every case of this suite is valid at P = " << P;

  // deterministic: every chunk whole blocks of the kernel's query tile (the layout pads to them)
  const int64_t block = c.exact ? attn_query_block(g.shape.D) : 1;
  const Partition part(strat->partition(), c.S, topo.cp().size(), block);
  const int r = topo.cp().rank();
  const std::vector<int64_t> pos = part.positions(r);
  const int64_t S_loc = int64_t(pos.size());
  const int64_t wq = int64_t(g.shape.H_q) * g.shape.D, wk = int64_t(g.shape.H_kv) * g.shape.D;
  auto shard = [&](const std::vector<float>& x, int64_t w) {
    std::vector<float> y(size_t(S_loc * w));
    part.scatter_rows(std::span<const float>(x), w, r, std::span<float>(y));
    return y;
  };
  // Padding rows (a seq no 2P divides): zero inputs and dO (scatter_rows), document id -1 where
  // documents or mask=none need one; no result is read from them.
  const std::vector<float> q = shard(g.q, wq), k = shard(g.k, wk), v = shard(g.v, wk), dout = shard(g.dout, wq);
  const bool need_docs = g.has_docs || (part.padding() > 0 && c.mask.mask == MaskKind::none);
  std::vector<int32_t> doc;
  for (int64_t p : pos)
    if (need_docs) doc.push_back(part.is_pad(p) ? -1 : g.has_docs ? g.doc[size_t(p)] : 0);
  std::vector<float> o(q.size(), NAN), lse(size_t(S_loc) * g.shape.H_q, NAN), dq(q.size(), NAN),
      dk(k.size(), NAN), dv(v.size(), NAN);  // NaN: every element must be written
  CpCall t = g.shape;
  t.S_q = t.S_k = S_loc;
  t.q_pos = t.k_pos = pos.data();
  t.q_doc = t.k_doc = doc.empty() ? nullptr : doc.data();
  t.q = q.data();
  t.k = k.data();
  t.v = v.data();
  t.o = o.data();
  t.lse = lse.data();
  t.dout = dout.data();
  t.dq = dq.data();
  t.dk = dk.data();
  t.dv = dv.data();
  // The frugal ring's cases as training calls it: positions derivable (the zigzag shards), so the
  // plan all-gathers document ids only; the all-gather's cases gather positions too.
  // The ring's cases also carry a batch id, as training's calls do: the backward reuses the
  // forward's plan (no second gather of the document ids).
  const bool derive = c.frugal && c.strategy == "ring";
  if (derive) t.k_pos_zigzag = c.S;
  if (derive) t.batch_id = 7;
  t.threads = 1 + r % 2;  // deterministic: the bits do not depend on the thread count either

  CpStats fst, bst;
  strat->forward(t, nullptr, fst);
  strat->backward(t, nullptr, bst);

  // Coverage (train's audit, model/coverage.hpp): over the CP ranks the calls computed every
  // visible pair of the whole layout once per query head, forward and backward (its padding rows
  // are computed too, under the same document ids as on the ranks).
  {
    std::vector<int64_t> all_pos(size_t(part.S_padded()));
    for (size_t i = 0; i < all_pos.size(); ++i) all_pos[i] = int64_t(i);
    std::vector<int32_t> all_doc;
    if (need_docs)
      for (int64_t p : all_pos) all_doc.push_back(part.is_pad(p) ? -1 : g.has_docs ? g.doc[size_t(p)] : 0);
    CpCall whole = g.shape;
    whole.S_q = whole.S_k = part.S_padded();
    whole.q_pos = whole.k_pos = all_pos.data();
    whole.q_doc = whole.k_doc = all_doc.empty() ? nullptr : all_doc.data();
    const double want = double(visible_pairs(whole)) * double(g.shape.H_q);
    double got[2] = {fst.attn_pair_heads[0], bst.attn_pair_heads[1]};
    topo.cp().all_reduce(std::span<double>(got, 2));
    EXPECT_EQ(got[0], want) << "forward: pairs x heads computed over the ranks vs the visible ones";
    EXPECT_EQ(got[1], want) << "backward: pairs x heads computed over the ranks vs the visible ones";
    EXPECT_EQ(fst.attn_pair_heads[1], 0.0) << "the forward counts no backward work";
  }

  struct Check {
    const char* name;
    const std::vector<float>& got;
    const std::vector<double>* ref;
    int64_t width;
  };
  const Check checks[] = {{"O", o, g.o, wq}, {"LSE", lse, g.lse, g.shape.H_q}, {"dQ", dq, g.dq, wq},
                          {"dK", dk, g.dk, wk}, {"dV", dv, g.dv, wk}};
  for (const Check& ch : checks) {
    const double err = max_over_ranks(err_rows(ch.got, ch.ref[0], pos, ch.width));
    const double naive = err_all(ch.ref[1], ch.ref[0]);
    const double bound = kCpFactor * naive + kFloorRel * max_abs(ch.ref[0]);
    EXPECT_LE(err, bound) << ch.name << ": max error vs fp64 " << err << ", naive fp32 error " << naive
                          << " (ratio " << err / std::max(naive, 1e-300) << ", P = " << P << ")";
  }

  if (c.exact) {
    // Bit for bit the single-rank exact result (one call over the whole sequence in position
    // order, its own padding, 2 threads), on every real row of O, LSE, dQ, dK and dV.
    const Partition one(PartitionKind::zigzag, c.S, 1, block);
    const int64_t S1 = one.S_padded();
    std::vector<int64_t> p1 = one.positions(0);
    auto pad = [&](const std::vector<float>& x, int64_t w) {
      std::vector<float> y(size_t(S1 * w));
      one.scatter_rows(std::span<const float>(x), w, 0, std::span<float>(y));
      return y;
    };
    const std::vector<float> Q = pad(g.q, wq), K = pad(g.k, wk), V = pad(g.v, wk), dO = pad(g.dout, wq);
    std::vector<int32_t> D1;
    for (int64_t p : p1)
      if (need_docs || (one.padding() > 0 && c.mask.mask == MaskKind::none))
        D1.push_back(one.is_pad(p) ? -1 : g.has_docs ? g.doc[size_t(p)] : 0);
    std::vector<float> O1(Q.size()), L1(size_t(S1) * g.shape.H_q), dQ1(Q.size()), dK1(K.size()), dV1(K.size());
    std::vector<int64_t> fk(K.size()), fv(K.size());
    CpCall a = g.shape;
    a.S_q = a.S_k = S1;
    a.q_pos = a.k_pos = p1.data();
    a.q_doc = a.k_doc = D1.empty() ? nullptr : D1.data();
    a.q = Q.data(); a.k = K.data(); a.v = V.data(); a.dout = dO.data();
    a.o = O1.data(); a.lse = L1.data(); a.dq = dQ1.data();
    a.dk_fixed = fk.data(); a.dv_fixed = fv.data();
    a.threads = 2;
    attn_fwd(a);
    attn_bwd_exact(a);
    fixed_to_float(fk.data(), dK1.data(), int64_t(fk.size()));
    fixed_to_float(fv.data(), dV1.data(), int64_t(fv.size()));
    int64_t differ = 0;
    auto bits = [&](const std::vector<float>& mine, const std::vector<float>& ref, int64_t w) {
      for (size_t i = 0; i < pos.size(); ++i)
        if (!part.is_pad(pos[i])) differ += std::memcmp(mine.data() + i * w, ref.data() + pos[i] * w, w * sizeof(float)) != 0;
    };
    bits(o, O1, wq);
    bits(lse, L1, g.shape.H_q);
    bits(dq, dQ1, wq);
    bits(dk, dK1, wk);
    bits(dv, dV1, wk);
    EXPECT_EQ(differ, 0) << "rows whose bits differ from the single-rank exact result (P = " << P << ")";
    // Bytes: the packed [K | V | pos | doc] blocks gathered (P - 1 of them), and in the backward
    // again, with dK/dV reduce-scattered as 8-byte integers.
    if (c.strategy == "allgather" || c.strategy == "ring") {
      const int64_t P_cp = topo.cp().size();
      const double blockb = cp::kv_layout(S_loc, g.shape.H_kv, g.shape.D, DType::f32, need_docs, true).bytes;
      EXPECT_DOUBLE_EQ(fst.bytes_sent, double(P_cp - 1) * blockb);
      EXPECT_DOUBLE_EQ(bst.bytes_sent, double(P_cp - 1) * (blockb + 2.0 * double(S_loc * wk) * 8.0));
      EXPECT_EQ(fst.messages, c.strategy == "ring" ? P_cp - 1 : 0);
    }
  }

  // Accounting: forward bytes match the strategy's own model; the ring posts one packed message
  // per hop (forward P-1; backward P-1 K/V hops + P dK/dV hops).
  CpCall padded = g.shape;  // the layout the strategy ran: S_padded() rows
  padded.S_q = padded.S_k = part.S_padded();
  if (c.exact) {
    // counted above
  } else if (c.frugal) {
    // Positions and document ids all-gathered, then exactly the K/V rows of this rank that some
    // query of each other rank can see (counted here pair by pair), each way.
    CpCall vis = g.shape;
    std::vector<int32_t> all_doc_ids;
    std::vector<int64_t> all_p;
    for (int64_t i = 0; i < part.S_padded(); ++i) {
      all_p.push_back(i);
      all_doc_ids.push_back(part.is_pad(i) ? -1 : g.has_docs ? g.doc[size_t(i)] : 0);
    }
    vis.q_pos = vis.k_pos = all_p.data();
    vis.q_doc = vis.k_doc = need_docs ? all_doc_ids.data() : nullptr;
    int64_t rows_out = 0, rows_in = 0;  // this rank's rows another can see; the others' rows this one can
    int64_t peers_out = 0, peers_in = 0;  // ranks that see some row of this one; ranks this one sees a row of
    for (int j = 0; j < topo.cp().size(); ++j) {
      if (j == r) continue;
      const std::vector<int64_t> other = part.positions(j);
      int64_t out_j = 0, in_j = 0;
      for (int64_t kp : pos) {
        bool seen = false;
        for (int64_t qp : other) seen = seen || vis.visible(qp, kp);
        out_j += seen;
      }
      for (int64_t kp : other) {
        bool seen = false;
        for (int64_t qp : pos) seen = seen || vis.visible(qp, kp);
        in_j += seen;
      }
      rows_out += out_j;
      rows_in += in_j;
      peers_out += out_j > 0;
      peers_in += in_j > 0;
    }
    // One message per peer with rows to send: K/V out, dK/dV back (none for an empty direction).
    EXPECT_EQ(fst.messages, peers_out);
    EXPECT_EQ(bst.messages, peers_out + peers_in);
    const int64_t P_cp = topo.cp().size(), n_loc = int64_t(pos.size());
    const double meta = double(P_cp - 1) * double(n_loc) * ((derive ? 0.0 : 8.0) + (need_docs ? 4.0 : 0.0));
    const double row_bytes = 2.0 * double(wk) * sizeof(float);
    EXPECT_DOUBLE_EQ(fst.bytes_sent, meta + double(rows_out) * row_bytes);
    EXPECT_DOUBLE_EQ(bst.bytes_sent, (derive ? 0.0 : meta) + double(rows_out + rows_in) * row_bytes)
        << "the backward sends its rows again and returns the received rows' dK/dV (fp32); with a batch id "
           "it reuses the forward's plan";
    EXPECT_LE(fst.bytes_sent, strat->comm_volume_fwd(padded, need_docs, topo));
  } else {
    EXPECT_DOUBLE_EQ(fst.bytes_sent, strat->comm_volume_fwd(padded, need_docs, topo));
  }
  const int R = c.strategy == "ring" ? P : c.strategy == "usp" ? topo.size(Axis::ring) : 1;
  if (c.frugal || c.exact) {
    // counted above
  } else if (c.strategy == "ring" || c.strategy == "usp") {
    EXPECT_EQ(fst.messages, R - 1) << "forward: one message per hop";
    EXPECT_EQ(bst.messages, R > 1 ? 2 * R - 1 : 0) << "backward: K/V hops and dK/dV hops";
  } else if (c.strategy == "halo") {
    // One message per peer that needs rows of this rank; the backward sends them again and
    // returns one dK/dV message per peer this rank received from. A window within one chunk
    // reaches the neighbouring chunk only: at most 2 peers each way.
    int64_t recv_from = bst.messages - fst.messages;
    world().all_reduce(std::span<int64_t>(&recv_from, 1));
    int64_t sent = fst.messages;
    world().all_reduce(std::span<int64_t>(&sent, 1));
    EXPECT_EQ(recv_from, sent) << "every halo message received is answered by one dK/dV message";
    if (c.mask.window <= part.S_padded() / (2 * P) + 1) {
      EXPECT_LE(fst.messages, 2);
    }
    // The halo moves window-proportional bytes: at most 2 (window - 1) rows of K and V per rank.
    const double row = 2.0 * g.shape.H_kv * g.shape.D * sizeof(float);
    EXPECT_LE(fst.bytes_sent, 2.0 * double(c.mask.window - 1) * row + 4096.0 * fst.messages);
  } else if (!c.frugal) {
    EXPECT_EQ(fst.messages + bst.messages, 0) << "collective strategies post no point-to-point messages";
  }
  // FLOPs summed over ranks equal the convention's count on the whole sequence as laid out
  // (with padding: the pairs the padding queries compute too, counted as work).
  std::vector<int64_t> all_pos(static_cast<size_t>(part.S_padded()));
  std::vector<int32_t> all_doc;
  for (int64_t i = 0; i < part.S_padded(); ++i) {
    all_pos[size_t(i)] = i;
    if (need_docs) all_doc.push_back(part.is_pad(i) ? -1 : g.has_docs ? g.doc[size_t(i)] : 0);
  }
  CpCall full;
  full.S_q = full.S_k = part.S_padded();
  full.H_q = g.shape.H_q;
  full.H_kv = g.shape.H_kv;
  full.D = g.shape.D;
  full.q_pos = full.k_pos = all_pos.data();
  full.q_doc = full.k_doc = need_docs ? all_doc.data() : nullptr;
  full.mask = g.shape.mask;
  full.window = g.shape.window;
  double flops = fst.attn_flops;
  world().all_reduce(std::span<double>(&flops, 1));
  const double want = 4.0 * double(visible_pairs(full)) * g.shape.H_q * g.shape.D;
  const int dp_tp = int(world().size() / topo.cp().size());
  EXPECT_DOUBLE_EQ(flops, want * dp_tp);
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (const std::string& s : strategy_names())
    for (const Heads& h : kHeads)
      for (const Masking& m : kMasks) v.push_back({s, h, m});
  // Any length on any P: a seq no 2P divides, every strategy, every mask (mask=none too: the
  // padding rows then need document ids), GQA.
  for (const std::string& s : strategy_names()) {
    for (const Masking& m : kMasks) v.push_back({s, kHeads[1], m, kOddSeq});
    v.push_back({s, kHeads[1], kNoMask, kOddSeq});
  }
  for (const Heads& h : kHeads)
    for (const Masking& m : kHaloMasks) v.push_back({"halo", h, m});
  for (const Masking& m : kHaloMasks) v.push_back({"halo", kHeads[1], m, kOddSeq});
  // The frugal all-gather and ring: every mask, a padded length, windows within and beyond the chunks.
  // deterministic=true: every mask, MHA and GQA, a padded length, windows within and beyond chunks.
  for (const std::string s : {"allgather", "ring"}) {
    for (const Masking& m : kMasks) v.push_back({s, kHeads[1], m, kSeq, false, true});
    for (const Masking& m : {kMasks[1], kNoMask}) v.push_back({s, kHeads[0], m, kOddSeq, false, true});
    v.push_back({s, kHeads[2], kHaloMasks[3], kSeq, false, true});
  }
  // ulysses and usp: heads that split without replication (MHA), every mask and a padded length.
  for (const std::string s : {"ulysses", "usp"}) {
    for (const Masking& m : kMasks) v.push_back({s, kHeads[0], m, kSeq, false, true});
    v.push_back({s, kHeads[0], kMasks[1], kOddSeq, false, true});
  }
  for (const std::string s : {"allgather", "ring"}) {
    for (const Masking& m : kMasks) v.push_back({s, kHeads[1], m, kSeq, true});
    for (const Masking& m : {kMasks[0], kMasks[1], kNoMask}) v.push_back({s, kHeads[1], m, kOddSeq, true});
    for (const Masking& m : {kHaloMasks[2], kHaloMasks[3]}) v.push_back({s, kHeads[0], m, kSeq, true});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cp, CpCase, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.strategy + (i.param.frugal ? "_frugal" : "") + (i.param.exact ? "_exact" : "") +
                                  "_" + i.param.heads.name +
                                  "_" + i.param.mask.name + (i.param.S == kSeq ? "" : "_S" + std::to_string(i.param.S));
                         });

// ---- validate(): clear messages for shapes that cannot be laid on the mesh ----------------------

CpCall shape(int64_t S, int32_t H_q, int32_t H_kv) { return attn_problem(S, H_q, H_kv, 16, MaskKind::causal, 0); }

TEST(CpValidate, AnySequenceLengthIsValid) {
  const int P = world().size();
  for (const std::string& name : strategy_names()) {
    Topology& topo = topology(mesh_for(name, P));
    auto s = make_strategy(name, topo);
    for (int64_t S : {int64_t(1), int64_t(7), int64_t(2 * P * 8 + P), int64_t(2 * P * 8)}) EXPECT_EQ(s->validate(shape(S, 8, 8), topo), "") << S;
    const std::string e = s->validate(shape(0, 8, 8), topo);
    EXPECT_NE(e.find(name + ": "), std::string::npos) << e;
    EXPECT_NE(e.find("seq = 0"), std::string::npos) << e;
  }
}

TEST(CpValidate, GroupsMustBeWhole) {
  const int P = world().size();
  Topology& topo = topology(mesh_for("ring", P));
  const std::string e = make_strategy("ring", topo)->validate(shape(2 * P * 8, 8, 3), topo);
  EXPECT_NE(e.find("H_q=8 is not a multiple of kv_heads H_kv=3"), std::string::npos) << e;
  CpCall w = shape(2 * P * 8, 8, 8);
  w.mask = MaskKind::window;
  w.window = 0;
  EXPECT_NE(make_strategy("ring", topo)->validate(w, topo).find("window > 0"), std::string::npos);
}

TEST(CpValidate, UlyssesHeadsMustSplitOrReplicate) {
  const int P = world().size();
  for (const char* name : {"ulysses", "usp"}) {
    Topology& topo = topology(mesh_for(name, P));
    const int U = topo.size(Axis::ulysses);
    auto s = make_strategy(name, topo);
    if (U == 1) {  // nothing to split: any head count is valid
      EXPECT_EQ(s->validate(shape(2 * P * 8, 3, 3), topo), "");
      continue;
    }
    // H_q not divisible by U.
    std::string e = s->validate(shape(2 * P * 8, 3, 3), topo);
    EXPECT_NE(e.find("H_q=3 cannot be split over the ulysses degree U=" + std::to_string(U)), std::string::npos) << e;
    EXPECT_NE(e.find("valid for H_q=3, H_kv=3: 1, 3"), std::string::npos) << e;
    // H_kv = 3 neither divisible by U (2, 4, 8) nor dividing it.
    e = s->validate(shape(2 * P * 8, 3 * U, 3), topo);
    EXPECT_NE(e.find("H_kv=3 can be neither split over nor replicated on U=" + std::to_string(U)), std::string::npos) << e;
    // Fewer K/V heads than U: replicated (valid), e.g. MQA.
    EXPECT_EQ(s->validate(shape(2 * P * 8, U, 1), topo), "");
  }
}

// The strategies copy whole rows of their inputs: strided views (a kernel-level feature) are
// refused by every strategy's validate, naming what it takes.
TEST(CpValidate, StridedInputsAreRefused) {
  Topology& topo = topology(mesh_for("ring", world().size()));
  std::vector<std::string> all = strategy_names();
  for (const std::string& n : inference_strategy_names()) all.push_back(n);
  for (const std::string& name : all) {
    auto s = make_strategy(name, topo);
    ASSERT_TRUE(s != nullptr) << name;
    CpCall g = shape(2 * world().size() * 8, 8, 2);  // ulysses: 8 query heads split over up to 8 ranks
    EXPECT_EQ(s->validate(g, topo), "") << name;
    g.k_stride = 3 * 2 * kHeadDim;  // k as a view into a wider row
    const std::string e = s->validate(g, topo);
    EXPECT_NE(e.find(name + ": takes packed q, k, v, dout"), std::string::npos) << e;
  }
}

TEST(CpRegistry, NamesInConfigOrderAndUnknownIsNull) {
  const std::vector<std::string> want = {"allgather", "ulysses", "ring", "usp"};
  EXPECT_EQ(strategy_names(), want);
  Topology& topo = topology(mesh_for("ring", world().size()));
  for (const std::string& n : want) EXPECT_EQ(make_strategy(n, topo)->name(), n);
  EXPECT_EQ(make_strategy("bogus", topo), nullptr);
  const std::vector<std::string> local = {"halo", "allgather", "ulysses", "ring", "usp"};
  EXPECT_EQ(local_strategy_names(), local);
}

// A schedule is a registry row of its own: every training strategy has an exact one, the
// all-gather and the ring a visible-keys one, pass_q (the inference engine's exact) an exact one,
// nothing else does; a schedule's strategy reports the
// plain strategy's name and partition, and a missing row builds nothing.
TEST(CpRegistry, SchedulesAreRowsOfTheirOwn) {
  Topology& topo = topology(mesh_for("ring", world().size()));
  for (const std::string& n : strategy_names()) {
    const bool frugal = n == "allgather" || n == "ring";
    EXPECT_TRUE(has_schedule(n, CpSchedule::plain)) << n;
    EXPECT_TRUE(has_schedule(n, CpSchedule::exact)) << n;
    EXPECT_EQ(has_schedule(n, CpSchedule::visible), frugal) << n;
    for (CpSchedule s : {CpSchedule::exact, CpSchedule::visible}) {
      std::unique_ptr<CpStrategy> x = make_strategy(n, topo, s);
      if (s == CpSchedule::visible && !frugal) {
        EXPECT_EQ(x, nullptr) << n;
        continue;
      }
      ASSERT_NE(x, nullptr) << n;
      EXPECT_EQ(x->name(), n);
      EXPECT_EQ(x->partition(), make_strategy(n, topo)->partition()) << n;
    }
  }
  for (const std::string& n : inference_strategy_names()) {  // pass_q's: the engine's with exact numerics
    EXPECT_EQ(has_schedule(n, CpSchedule::exact), n == "pass_q") << n;
    EXPECT_FALSE(has_schedule(n, CpSchedule::visible)) << n;
  }
  EXPECT_FALSE(has_schedule("halo", CpSchedule::visible));
  EXPECT_EQ(make_strategy("bogus", topo, CpSchedule::exact), nullptr);
  EXPECT_EQ(strategies_with(CpSchedule::exact), "allgather, ulysses, ring or usp");
  EXPECT_EQ(strategies_with(CpSchedule::visible, "all"), "allgather, ring or all");
  // the configuration's schedule refused once, by the registry, naming the setting and what serves it
  EXPECT_EQ(schedule_refusal("ring", CpSchedule::visible), "");
  EXPECT_EQ(schedule_refusal("usp", CpSchedule::exact), "");
  const std::string v = schedule_refusal("ulysses", CpSchedule::visible, "all");
  EXPECT_EQ(v.rfind("config: frugal = true: strategy = ulysses", 0), 0u) << v;
  EXPECT_NE(v.find("valid: strategy=allgather, ring or all, or frugal=false"), std::string::npos) << v;
  EXPECT_EQ(schedule_key(CpSchedule::exact) + schedule_suffix(CpSchedule::exact), "deterministic:det");
}

// Every registry row's claims (cp/strategy.hpp StrategyRow) against the strategy's own answers:
// training and local rows have a backward, inference rows do not; the partition; MLA: a row
// that moves the latent says so (moves_latent) and accepts a latent call, one that takes the
// expanded K/V does not move the latent and accepts the expanded call, a refusing row refuses
// the latent call, an inference row (MLA's absorbed attention) accepts a one-K/V-head call.
TEST(CpRegistry, RowsStateWhatTheStrategiesDo) {
  const int P = world().size();
  ASSERT_EQ(strategy_rows().size(), 15u);
  for (const StrategyRow& r : strategy_rows()) {
    Topology& topo = topology(mesh_for(r.name, P));
    std::unique_ptr<CpStrategy> s = make_strategy(r.name, topo, r.schedule);
    const std::string id = std::string(r.name) + " schedule " + std::to_string(int(r.schedule));
    ASSERT_NE(s, nullptr) << id;
    EXPECT_EQ(strategy_row(r.name, r.schedule), &r) << id;
    EXPECT_EQ(s->has_backward(), r.use != StrategyUse::inference) << id;
    EXPECT_EQ(s->partition(), r.partition) << id;
    EXPECT_EQ(s->moves_latent(), r.mla == MlaSupport::latent) << id;
    const MaskKind mask = r.use == StrategyUse::local ? MaskKind::window : MaskKind::causal;
    CpCall latent = attn_problem(2 * P * 64, 8, 8, 24, mask, mask == MaskKind::window ? 16 : 0);
    latent.latent_width = 40;
    CpCall expanded = latent;
    expanded.latent_width = 0;
    const CpCall mqa = attn_problem(2 * P * 64, 8, 1, 24, mask, 0);
    switch (r.mla) {
      case MlaSupport::latent: EXPECT_EQ(s->validate(latent, topo), "") << id; break;
      case MlaSupport::expanded: EXPECT_EQ(s->validate(expanded, topo), "") << id; break;
      case MlaSupport::refused: EXPECT_NE(s->validate(latent, topo), "") << id; break;
      case MlaSupport::absorbed: EXPECT_EQ(s->validate(mqa, topo), "") << id; break;
    }
    // The message pattern the cost model prices: one per strategy (every schedule's row has its
    // plain row's), and one that splits the heads refuses query heads its all-to-all cannot split.
    EXPECT_EQ(r.comm, strategy_row(r.name)->comm) << id;
    const CpCall odd = attn_problem(2 * P * 64, 3, 3, 24, mask, mask == MaskKind::window ? 16 : 0);
    if (r.use != StrategyUse::inference && P > 1) {
      EXPECT_EQ(!s->validate(odd, topo).empty(), splits_heads(r.comm) && topo.size(Axis::ulysses) > 1) << id;
    }
  }
  EXPECT_EQ(strategy_row("bogus"), nullptr);
  const std::string table = strategy_features_table();
  for (const StrategyRow& r : strategy_rows()) EXPECT_NE(table.find(r.name), std::string::npos) << r.name;
}

// halo serves sliding-window layers only: a causal or unmasked call is refused, naming why and
// what serves it.
TEST(CpValidate, HaloNeedsAWindow) {
  Topology& topo = topology(mesh_for("halo", world().size()));
  auto s = make_strategy("halo", topo);
  for (MaskKind m : {MaskKind::causal, MaskKind::none}) {
    const std::string e = s->validate(attn_problem(64, 8, 8, 16, m, 0), topo);
    EXPECT_NE(e.find("halo: serves sliding-window (local) layers only"), std::string::npos) << e;
    EXPECT_NE(e.find("valid for it: allgather, ulysses, ring or usp"), std::string::npos) << e;
  }
  EXPECT_EQ(s->validate(attn_problem(64, 8, 8, 16, MaskKind::window, 5), topo), "");
}

// ---- training rings: key positions derived, not sent --------------------------------------------

// With k_pos_zigzag (every rank's keys are its zigzag shard, as in training) the ring's messages
// drop the positions: results bit-identical to the ring that sends them, bytes as the model's
// with the flag and smaller by exactly the positions' sections; with documents, a padded length,
// and inside usp (whose ring runs over gathered rows: positions travel there).
TEST(CpRing, DerivedPositionsDoNotTravel) {
  const int P = world().size();
  for (const char* name : {"ring", "usp"})
    for (const Case& c : {Case{name, kHeads[1], kMasks[0]}, Case{name, kHeads[1], kMasks[1], kOddSeq}}) {
      SCOPED_TRACE(std::string(name) + " " + c.mask.name + " S=" + std::to_string(c.S));
      Topology& topo = topology(mesh_for(name, P));
      std::unique_ptr<CpStrategy> strat = make_strategy(name, topo);
      const Global g = make_global(c, 5);
      const Partition part(PartitionKind::zigzag, c.S, topo.cp().size());
      const int r = topo.cp().rank();
      const std::vector<int64_t> pos = part.positions(r);
      const int64_t n = int64_t(pos.size()), wq = int64_t(g.shape.H_q) * g.shape.D, wk = int64_t(g.shape.H_kv) * g.shape.D;
      auto shard = [&](const std::vector<float>& x, int64_t w) {
        std::vector<float> y(size_t(n * w));
        part.scatter_rows(std::span<const float>(x), w, r, std::span<float>(y));
        return y;
      };
      const std::vector<float> q = shard(g.q, wq), k = shard(g.k, wk), v = shard(g.v, wk), dout = shard(g.dout, wq);
      std::vector<int32_t> doc;
      if (g.has_docs)
        for (int64_t p : pos) doc.push_back(part.is_pad(p) ? -1 : g.doc[size_t(p)]);
      struct Out {
        std::vector<float> o, lse, dq, dk, dv;
        CpStats f, b;
      } run[2];
      for (int derive = 0; derive < 2; ++derive) {
        Out& x = run[derive];
        x.o.resize(q.size()); x.lse.resize(size_t(n) * g.shape.H_q); x.dq.resize(q.size());
        x.dk.resize(k.size()); x.dv.resize(v.size());
        CpCall t = g.shape;
        t.S_q = t.S_k = n;
        t.q_pos = t.k_pos = pos.data();
        t.q_doc = t.k_doc = doc.empty() ? nullptr : doc.data();
        t.q = q.data(); t.k = k.data(); t.v = v.data(); t.dout = dout.data();
        t.o = x.o.data(); t.lse = x.lse.data(); t.dq = x.dq.data(); t.dk = x.dk.data(); t.dv = x.dv.data();
        t.k_pos_zigzag = derive ? c.S : 0;
        strat->forward(t, nullptr, x.f);
        strat->backward(t, nullptr, x.b);
      }
      EXPECT_EQ(run[1].o, run[0].o);
      EXPECT_EQ(run[1].lse, run[0].lse);
      EXPECT_EQ(run[1].dq, run[0].dq);
      EXPECT_EQ(run[1].dk, run[0].dk);
      EXPECT_EQ(run[1].dv, run[0].dv);
      CpCall shape = g.shape;
      shape.S_q = shape.S_k = part.S_padded();
      shape.k_pos_zigzag = c.S;
      EXPECT_DOUBLE_EQ(run[1].f.bytes_sent, strat->comm_volume_fwd(shape, g.has_docs, topo));
      if (std::string(name) == "ring") {
        const double pos_section = double(cp::align64(size_t(n) * sizeof(int64_t)));
        EXPECT_DOUBLE_EQ(run[0].f.bytes_sent - run[1].f.bytes_sent, double(P - 1) * pos_section);
      } else {
        EXPECT_DOUBLE_EQ(run[1].f.bytes_sent, run[0].f.bytes_sent) << "usp's ring moves gathered rows: positions travel";
      }
    }
}

// Keys and values that are the same rows (MLA's absorbed inference: the latent is both) travel
// once: the ring's and the all-gather's forward give the same floats as with a separate copy of
// V, and send one K/V section less per hop (per gathered block).
TEST(CpRing, SharedKeysAndValuesTravelOnce) {
  const int P = world().size();
  for (const char* name : {"ring", "allgather"}) {
  SCOPED_TRACE(name);
  Topology& topo = topology(mesh_for(name, P));
  std::unique_ptr<CpStrategy> strat = make_strategy(name, topo);
  const Case c{"ring", kHeads[2], kMasks[0]};
  const Global g = make_global(c, 11);
  const Partition part(PartitionKind::zigzag, c.S, P);
  const int r = topo.cp().rank();
  const std::vector<int64_t> pos = part.positions(r);
  const int64_t n = int64_t(pos.size()), wq = int64_t(g.shape.H_q) * g.shape.D, wk = int64_t(g.shape.H_kv) * g.shape.D;
  std::vector<float> q(size_t(n * wq)), k(size_t(n * wk));
  part.scatter_rows(std::span<const float>(g.q), wq, r, std::span<float>(q));
  part.scatter_rows(std::span<const float>(g.k), wk, r, std::span<float>(k));
  const std::vector<float> v_copy = k;
  std::vector<float> o[2], lse[2];
  CpStats st[2];
  for (int shared = 0; shared < 2; ++shared) {
    o[shared].resize(q.size());
    lse[shared].resize(size_t(n) * g.shape.H_q);
    CpCall t = g.shape;
    t.S_q = t.S_k = n;
    t.q_pos = t.k_pos = pos.data();
    t.q = q.data(); t.k = k.data(); t.v = shared ? k.data() : v_copy.data();
    t.o = o[shared].data(); t.lse = lse[shared].data();
    strat->forward(t, nullptr, st[shared]);
  }
  EXPECT_EQ(o[1], o[0]);
  EXPECT_EQ(lse[1], lse[0]);
  const size_t kv_bytes = size_t(n * wk) * sizeof(float);  // the ring's message sections are 64-byte aligned
  EXPECT_DOUBLE_EQ(st[0].bytes_sent - st[1].bytes_sent,
                   double(P - 1) * double(std::string(name) == "ring" ? cp::align64(kv_bytes) : kv_bytes));
  }
}

// ---- MLA: strategies that move a latent instead of K and V ------------------------------------

// K = X A_k, V = X A_v from latent rows X [rows, W] (a linear expansion as MLA's, fixed loop
// order, so K/V expanded on any rank are the same floats); the backward accumulates
// dX += dK A_k^T + dV A_v^T and the "weight" gradients dA_k += X^T dK, dA_v += X^T dV.
class LinearExpander final : public KvExpander {
 public:
  LinearExpander(int32_t W, int64_t KW, uint64_t seed) : W_(W), KW_(KW), ak_(size_t(W * KW)), av_(size_t(W * KW)),
                                                         dak_(ak_.size(), 0.0), dav_(av_.size(), 0.0) {
    std::vector<int64_t> idx(static_cast<size_t>(W));
    for (int32_t i = 0; i < W; ++i) idx[size_t(i)] = i;
    fill_rows(seed, 7, idx, KW, 0.5f, ak_.data());
    fill_rows(seed, 8, idx, KW, 0.5f, av_.data());
  }
  void expand(const float* x, int64_t rows, float* k, float* v) override {
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t j = 0; j < KW_; ++j) {
        float sk = 0, sv = 0;
        for (int32_t w = 0; w < W_; ++w) {
          sk += x[t * W_ + w] * ak_[size_t(w * KW_ + j)];
          sv += x[t * W_ + w] * av_[size_t(w * KW_ + j)];
        }
        k[t * KW_ + j] = sk;
        v[t * KW_ + j] = sv;
      }
    expanded_rows += rows;
  }
  void backward(const float* x, int64_t rows, const float* dk, const float* dv, float* dx) override {
    for (int64_t t = 0; t < rows; ++t)
      for (int32_t w = 0; w < W_; ++w) {
        double s = 0;
        for (int64_t j = 0; j < KW_; ++j) {
          s += double(dk[t * KW_ + j]) * ak_[size_t(w * KW_ + j)] + double(dv[t * KW_ + j]) * av_[size_t(w * KW_ + j)];
          dak_[size_t(w * KW_ + j)] += double(x[t * W_ + w]) * dk[t * KW_ + j];
          dav_[size_t(w * KW_ + j)] += double(x[t * W_ + w]) * dv[t * KW_ + j];
        }
        dx[t * W_ + w] += float(s);
      }
  }
  // The latent gradient of rows with dK, dV, in fp64 (the reference).
  std::vector<double> project(const std::vector<double>& dk, const std::vector<double>& dv) const {
    const int64_t rows = int64_t(dk.size()) / KW_;
    std::vector<double> dx(size_t(rows * W_), 0.0);
    for (int64_t t = 0; t < rows; ++t)
      for (int32_t w = 0; w < W_; ++w)
        for (int64_t j = 0; j < KW_; ++j)
          dx[size_t(t * W_ + w)] += dk[size_t(t * KW_ + j)] * ak_[size_t(w * KW_ + j)] +
                                    dv[size_t(t * KW_ + j)] * av_[size_t(w * KW_ + j)];
    return dx;
  }
  int32_t W_;
  int64_t KW_;
  std::vector<float> ak_, av_;
  std::vector<double> dak_, dav_;
  int64_t expanded_rows = 0;
};

// ring and allgather with a latent (CpCall::expander) against the same strategy on the
// expanded K/V: O and dQ the same floats (the same K/V rows meet the same kernel), the latent's
// gradient and the expansion's weight gradient (summed over ranks) equal to the projection of
// the reference dK/dV within the suite's bound; bytes as the strategy's model, the latent's
// width per token instead of 2 H_kv D; ulysses and usp refuse a latent, saying why.
TEST(CpLatent, RingAndAllgatherMoveTheLatent) {
  const int P = world().size();
  constexpr int32_t kW = 12;  // latent width, well under 2 H_kv D = 2 * 2 * 16
  for (const char* name : {"ring", "allgather"})
    for (const Masking& m : {kMasks[0], kMasks[1]}) {
      SCOPED_TRACE(std::string(name) + " " + m.name);
      Topology& topo = topology(mesh_for(name, P));
      std::unique_ptr<CpStrategy> strat = make_strategy(name, topo);
      ASSERT_TRUE(strat->moves_latent());
      const Case c{name, kHeads[0], m};
      Global g = make_global(c, 99);  // q, dout and positions; K/V from the latent below
      const int64_t S = c.S, KW = int64_t(g.shape.H_kv) * g.shape.D, wq = int64_t(g.shape.H_q) * g.shape.D;
      LinearExpander ex(kW, KW, 4321);
      std::vector<float> X(size_t(S * kW));
      fill_rows(77, 9, g.pos, kW, 1.0f, X.data());
      ex.expand(X.data(), S, g.k.data(), g.v.data());
      // The references on the expanded inputs: attention in fp64, then through the expansion.
      CpCall full = g.shape;
      full.S_q = full.S_k = S;
      full.q_pos = full.k_pos = g.pos.data();
      full.q_doc = full.k_doc = g.has_docs ? g.doc.data() : nullptr;
      run_ref<double>(g, full, &g.o[0], &g.lse[0], &g.dq[0], &g.dk[0], &g.dv[0]);
      run_ref<float>(g, full, &g.o[1], &g.lse[1], &g.dq[1], &g.dk[1], &g.dv[1]);
      const std::vector<double> dX[2] = {ex.project(g.dk[0], g.dv[0]), ex.project(g.dk[1], g.dv[1])};
      std::vector<double> dA[2];
      for (int i = 0; i < 2; ++i) {
        dA[i].assign(size_t(kW * KW), 0.0);
        for (int64_t t = 0; t < S; ++t)
          for (int32_t w = 0; w < kW; ++w)
            for (int64_t j = 0; j < KW; ++j) dA[i][size_t(w * KW + j)] += X[size_t(t * kW + w)] * g.dk[i][size_t(t * KW + j)];
      }

      const Partition part(strat->partition(), S, topo.cp().size());
      const int r = topo.cp().rank();
      const std::vector<int64_t> pos = part.positions(r);
      const int64_t n = int64_t(pos.size());
      auto shard = [&](const std::vector<float>& x, int64_t w) {
        std::vector<float> y(size_t(n * w));
        part.scatter_rows(std::span<const float>(x), w, r, std::span<float>(y));
        return y;
      };
      const std::vector<float> q = shard(g.q, wq), k = shard(g.k, KW), v = shard(g.v, KW), dout = shard(g.dout, wq),
                               x = shard(X, kW);
      std::vector<int32_t> doc;
      if (g.has_docs)
        for (int64_t p : pos) doc.push_back(g.doc[size_t(p)]);
      CpCall t = g.shape;
      t.S_q = t.S_k = n;
      t.q_pos = t.k_pos = pos.data();
      t.q_doc = t.k_doc = doc.empty() ? nullptr : doc.data();
      t.q = q.data(); t.k = k.data(); t.v = v.data(); t.dout = dout.data();
      // Plain: K/V move.
      std::vector<float> o0(q.size()), lse0(size_t(n) * g.shape.H_q), dq0(q.size()), dk0(k.size()), dv0(v.size());
      CpCall a = t;
      a.o = o0.data(); a.lse = lse0.data(); a.dq = dq0.data(); a.dk = dk0.data(); a.dv = dv0.data();
      CpStats f0, b0;
      strat->forward(a, nullptr, f0);
      strat->backward(a, nullptr, b0);
      // Latent: X moves; dk, dv must stay untouched.
      std::vector<float> o1(q.size(), NAN), lse1(lse0.size(), NAN), dq1(q.size(), NAN), dx(x.size(), NAN);
      std::vector<float> untouched(k.size(), 7.0f), untouched_v(k.size(), 7.0f);
      CpCall b = t;
      b.o = o1.data(); b.lse = lse1.data(); b.dq = dq1.data(); b.dk = untouched.data(); b.dv = untouched_v.data();
      b.latent_width = kW;
      b.latent = x.data();
      b.dlatent = dx.data();
      b.expander = &ex;
      CpStats f1, b1;
      strat->forward(b, nullptr, f1);
      strat->backward(b, nullptr, b1);

      EXPECT_EQ(o1, o0) << "the same K/V rows: the same output";
      EXPECT_EQ(lse1, lse0);
      EXPECT_EQ(dq1, dq0);
      EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](float f) { return f == 7.0f; }));
      EXPECT_TRUE(std::all_of(untouched_v.begin(), untouched_v.end(), [](float f) { return f == 7.0f; }));
      const double ex_err = max_over_ranks(err_rows(dx, dX[0], pos, kW));
      EXPECT_LE(ex_err, kCpFactor * err_all(dX[1], dX[0]) + kFloorRel * max_abs(dX[0])) << "dlatent";
      std::vector<double> dak = ex.dak_;  // this rank's blocks' part; the sum over ranks is the whole
      world().all_reduce(std::span<double>(dak.data(), dak.size()));
      EXPECT_LE(err_all(dak, dA[0]), kCpFactor * err_all(dA[1], dA[0]) + kFloorRel * max_abs(dA[0])) << "dA_k";

      // Bytes: the model's, with the latent's width; per token kW * 4 instead of 2 H_kv D * 4.
      CpCall shape_lat = g.shape;  // as laid out: S_padded() rows
      shape_lat.S_q = shape_lat.S_k = part.S_padded();
      shape_lat.latent_width = kW;
      EXPECT_DOUBLE_EQ(f1.bytes_sent, strat->comm_volume_fwd(shape_lat, g.has_docs, topo));
      EXPECT_EQ(f1.messages, f0.messages);
      EXPECT_EQ(b1.messages, b0.messages);
      if (P > 1) {
        const double per_token_lat = kW * 4.0, per_token_kv = 2.0 * KW * 4.0, meta = 8.0 + (g.has_docs ? 4.0 : 0.0);
        EXPECT_LE(f1.bytes_sent / f0.bytes_sent, (per_token_lat + meta) / (per_token_kv + meta) * 1.05);
        EXPECT_LT(b1.bytes_sent, b0.bytes_sent);
      }
    }
  // Head-splitting strategies refuse a latent.
  for (const char* name : {"ulysses", "usp"}) {
    Topology& topo = topology(mesh_for(name, P));
    CpCall s = shape(2 * P * 8, 8, 8);
    s.latent_width = 576;
    const std::string e = make_strategy(name, topo)->validate(s, topo);
    EXPECT_NE(e.find(std::string(name) + ": attention = mla: every head's K and V are expanded from one latent"),
              std::string::npos) << e;
    EXPECT_NE(e.find("valid: ring or allgather, which move the latent"), std::string::npos) << e;
    EXPECT_FALSE(make_strategy(name, topo)->moves_latent());
  }
}

// ---- inference strategies: pass_q and the decode strategies against the reference ---------------

// The error bound of the suite (kCpFactor x the naive fp32 error + kFloorRel x max|ref|).
double bound_of(const std::vector<double>& ref64, const std::vector<double>& naive) {
  return kCpFactor * err_all(naive, ref64) + kFloorRel * max_abs(ref64);
}

TEST(CpInference, PassQMatchesReference) {
  const int P = world().size();
  Topology& topo = topology(mesh_for("ring", P));
  std::unique_ptr<CpStrategy> strat = make_strategy("pass_q", topo);
  ASSERT_TRUE(strat != nullptr);
  EXPECT_FALSE(strat->has_backward());
  for (const Heads& h : kHeads)
    for (const Masking& m : {kMasks[0], kMasks[2]}) {  // one document per sequence in inference
      const Global g = make_global({"pass_q", h, m}, 99);
      ASSERT_EQ(strat->validate(g.shape, topo), "");
      const Partition part(strat->partition(), kSeq, topo.cp().size());
      const int r = topo.cp().rank();
      const std::vector<int64_t> pos = part.positions(r);
      const int64_t S_loc = int64_t(pos.size()), wq = int64_t(h.H_q) * kHeadDim, wk = int64_t(h.H_kv) * kHeadDim;
      auto shard = [&](const std::vector<float>& x, int64_t w) {
        std::vector<float> y(size_t(S_loc * w));
        part.scatter_rows(std::span<const float>(x), w, r, std::span<float>(y));
        return y;
      };
      const std::vector<float> q = shard(g.q, wq), k = shard(g.k, wk), v = shard(g.v, wk);
      std::vector<float> o(q.size(), NAN), lse(size_t(S_loc) * h.H_q, NAN);
      CpCall t = g.shape;
      t.S_q = t.S_k = S_loc;
      t.q_pos = t.k_pos = pos.data();
      t.q = q.data(); t.k = k.data(); t.v = v.data(); t.o = o.data(); t.lse = lse.data();
      CpStats st;
      strat->forward(t, nullptr, st);
      const double eo = max_over_ranks(err_rows(o, g.o[0], pos, wq));
      const double el = max_over_ranks(err_rows(lse, g.lse[0], pos, h.H_q));
      EXPECT_LE(eo, bound_of(g.o[0], g.o[1])) << h.name << " " << m.name;
      EXPECT_LE(el, bound_of(g.lse[0], g.lse[1])) << h.name << " " << m.name;
      EXPECT_DOUBLE_EQ(st.bytes_sent, strat->comm_volume_fwd(g.shape, false, topo)) << h.name << " " << m.name;
      EXPECT_EQ(st.messages, P - 1) << "one query block per hop";
    }
}

// B sequences with caches spread over the ranks (token i of sequence b on rank (i + b) % P), one
// new token each; its owner (dense work) is rank b / ceil(B/P), its cache target rank b % P. Every
// query's O and LSE against the reference over its sequence's cached keys and itself, and the new
// token's K/V in the target's cache after the call.
TEST(CpInference, DecodeStrategiesMatchReference) {
  const int P = world().size(), r = world().rank();
  Topology& topo = topology(mesh_for("ring", P));
  constexpr int64_t B = 3;
  const int64_t Bq = (B + P - 1) / P, b0 = r * Bq, n = std::max<int64_t>(0, std::min(Bq, B - b0));
  for (const char* name : {"decode_pass_q", "decode_allgather"})
    for (const Heads& h : kHeads) {
      std::unique_ptr<CpStrategy> strat = make_strategy(name, topo);
      ASSERT_TRUE(strat != nullptr) << name;
      const int64_t wq = int64_t(h.H_q) * kHeadDim, wk = int64_t(h.H_kv) * kHeadDim;
      std::vector<int64_t> len(B);
      for (int64_t b = 0; b < B; ++b) len[size_t(b)] = 9 + 7 * b;  // cached tokens; the new one at position len
      const int64_t cap = len[B - 1] + 1;
      // This rank's cache: one array per tensor, sequence b's slab at row b * cap.
      std::vector<float> kc(size_t(B * cap * wk), 0.f), vc(size_t(B * cap * wk), 0.f);
      std::vector<int64_t> kpos(size_t(B * cap), int64_t(1) << 60), begin(B), here(B), slot(B, -1);
      for (int64_t b = 0; b < B; ++b) {
        begin[size_t(b)] = b * cap;
        std::vector<int64_t> mine;
        for (int64_t i = 0; i < len[size_t(b)]; ++i)
          if ((i + b) % P == r) mine.push_back(i);
        here[size_t(b)] = int64_t(mine.size());
        fill_rows(7, uint64_t(10 + b), mine, wk, 1.0f, kc.data() + b * cap * wk);
        fill_rows(7, uint64_t(20 + b), mine, wk, 1.0f, vc.data() + b * cap * wk);
        for (size_t j = 0; j < mine.size(); ++j) kpos[size_t(b * cap) + j] = mine[j];
        if (b % P == r) {  // this rank stores the new token: its slot reserved, its position set
          slot[size_t(b)] = b * cap + here[size_t(b)];
          kpos[size_t(slot[size_t(b)])] = len[size_t(b)];
        }
      }
      // This rank's query rows (padded to Bq): the new tokens of sequences b0 .. b0 + n - 1.
      std::vector<float> q(size_t(std::max<int64_t>(n, 1) * wq)), kn(size_t(std::max<int64_t>(n, 1) * wk)),
          vn(size_t(std::max<int64_t>(n, 1) * wk));
      std::vector<int64_t> qpos(size_t(std::max<int64_t>(n, 1)));
      std::vector<int32_t> qdoc(size_t(Bq), -1);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t b = b0 + i;
        qpos[size_t(i)] = len[size_t(b)];
        qdoc[size_t(i)] = int32_t(b);
        const std::vector<int64_t> at = {len[size_t(b)]};
        fill_rows(7, uint64_t(30 + b), at, wq, 1.0f, q.data() + i * wq);
        fill_rows(7, uint64_t(10 + b), at, wk, 1.0f, kn.data() + i * wk);
        fill_rows(7, uint64_t(20 + b), at, wk, 1.0f, vn.data() + i * wk);
      }
      std::vector<float> o(size_t(std::max<int64_t>(n, 1) * wq), NAN), lse(size_t(std::max<int64_t>(n, 1) * h.H_q), NAN);
      CpCall t = attn_problem(Bq, h.H_q, h.H_kv, kHeadDim, MaskKind::causal, 0);
      t.q = q.data(); t.q_pos = qpos.data(); t.q_doc = qdoc.data(); t.k_new = kn.data(); t.v_new = vn.data();
      t.k = t.k_cache = kc.data(); t.v = t.v_cache = vc.data(); t.k_pos = kpos.data(); t.S_k = B * cap;
      t.k_doc_begin = begin.data(); t.k_doc_len = here.data(); t.k_new_slot = slot.data();
      t.o = o.data(); t.lse = lse.data();
      CpStats st;
      strat->forward(t, nullptr, st);
      // The reference: each owned query against all len + 1 keys of its sequence (fp64 and naive fp32).
      double err_o = 0, err_l = 0, bound_o = 0, bound_l = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t b = b0 + i, L = len[size_t(b)] + 1;
        std::vector<int64_t> all(static_cast<size_t>(L));
        for (int64_t j = 0; j < L; ++j) all[size_t(j)] = j;
        std::vector<float> K(size_t(L * wk)), V(size_t(L * wk));
        fill_rows(7, uint64_t(10 + b), all, wk, 1.0f, K.data());
        fill_rows(7, uint64_t(20 + b), all, wk, 1.0f, V.data());
        CpCall rp = attn_problem(1, h.H_q, h.H_kv, kHeadDim, MaskKind::causal, 0);
        rp.S_k = L;
        rp.q_pos = &qpos[size_t(i)];
        rp.k_pos = all.data();
        const std::vector<double> q64(q.begin() + i * wq, q.begin() + (i + 1) * wq), K64(K.begin(), K.end()),
            V64(V.begin(), V.end());
        std::vector<double> o64(static_cast<size_t>(wq)), l64(static_cast<size_t>(h.H_q));
        ref::attn_fwd<double>(rp, q64.data(), K64.data(), V64.data(), o64.data(), l64.data());
        std::vector<float> o32(static_cast<size_t>(wq)), l32(static_cast<size_t>(h.H_q));
        ref::attn_fwd<float>(rp, q.data() + i * wq, K.data(), V.data(), o32.data(), l32.data());
        const std::vector<int64_t> row0 = {0};
        err_o = std::max(err_o, err_rows(std::vector<float>(o.begin() + i * wq, o.begin() + (i + 1) * wq), o64, row0, wq));
        err_l = std::max(err_l, err_rows(std::vector<float>(lse.begin() + i * h.H_q, lse.begin() + (i + 1) * h.H_q), l64,
                                         row0, h.H_q));
        bound_o = std::max(bound_o, bound_of(o64, std::vector<double>(o32.begin(), o32.end())));
        bound_l = std::max(bound_l, bound_of(l64, std::vector<double>(l32.begin(), l32.end())));
      }
      EXPECT_LE(max_over_ranks(err_o), max_over_ranks(bound_o)) << name << " " << h.name;
      EXPECT_LE(max_over_ranks(err_l), max_over_ranks(bound_l)) << name << " " << h.name;
      // The target rank stored each new token's K/V at its slot.
      for (int64_t b = 0; b < B; ++b) {
        if (slot[size_t(b)] < 0) continue;
        std::vector<float> want(static_cast<size_t>(wk));
        const std::vector<int64_t> at = {len[size_t(b)]};
        fill_rows(7, uint64_t(10 + b), at, wk, 1.0f, want.data());
        EXPECT_TRUE(std::equal(want.begin(), want.end(), kc.begin() + slot[size_t(b)] * wk)) << name << " seq " << b;
      }
      EXPECT_DOUBLE_EQ(st.bytes_sent, strat->comm_volume_fwd(t, false, topo)) << name;
    }
}

// ---- helpers ---------------------------------------------------------------------------------

TEST(CpHelpers, CountVisiblePairsMatchesTheMaskDefinition) {
  // Zigzag-like positions in arbitrary order, documents, every mask kind.
  std::vector<int64_t> qp = {40, 3, 17, 18, 63, 0, 31}, kp = {5, 0, 62, 18, 17, 40, 39, 63, 2};
  std::vector<int32_t> qd = {2, 0, 1, 1, 3, 0, 1}, kd = {0, 0, 3, 1, 1, 2, 2, 3, 0};
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::window})
    for (bool docs : {false, true}) {
      CpCall p;
      p.S_q = int64_t(qp.size());
      p.S_k = int64_t(kp.size());
      p.q_pos = qp.data();
      p.k_pos = kp.data();
      p.q_doc = docs ? qd.data() : nullptr;
      p.k_doc = docs ? kd.data() : nullptr;
      p.mask = m;
      p.window = 3;
      int64_t brute = 0;
      for (int64_t i = 0; i < p.S_q; ++i)
        for (int64_t j = 0; j < p.S_k; ++j) brute += p.visible(i, j);
      EXPECT_EQ(visible_pairs(p), brute)
          << "mask " << int(m) << " docs " << docs;
    }
}

TEST(CpHelpers, HeadSplitReplicatesFewKvHeads) {
  const cp::HeadSplit a = cp::head_split(8, 4);
  EXPECT_EQ(a.H_loc, 2);
  EXPECT_FALSE(a.replicated());
  EXPECT_EQ(a.first(3), 6);
  const cp::HeadSplit b = cp::head_split(2, 8);  // GQA 4:1 K/V heads on 8 ulysses ranks
  EXPECT_EQ(b.H_loc, 1);
  EXPECT_TRUE(b.replicated());
  // Query heads 8/8 = 1 per rank; rank j's query head j belongs to K/V head j / 4.
  for (int j = 0; j < 8; ++j) EXPECT_EQ(b.first(j), j / 4);
}

}  // namespace
