// Cost model unit tests: the formulas against model/flops and hand arithmetic, the overlap rule,
// memory arithmetic, the paper's Eq. 1 threshold, the profiles (every shipped one loads, bad
// names and keys are clear errors).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.hpp"
#include "model/flops.hpp"
#include "model/model.hpp"
#include "perf/cost_model.hpp"
#include "perf/hardware.hpp"

using namespace ctxpar;

namespace {

ModelShape llama405b() {
  ModelShape m;
  m.layers = 126, m.dim = 16384, m.ffn = 53248, m.vocab = 128256, m.H_q = 128, m.H_kv = 8, m.D = 128;
  return m;
}
ModelShape small() {
  ModelShape m;
  m.layers = 4, m.dim = 1024, m.ffn = 3584, m.vocab = 8192, m.H_q = 8, m.H_kv = 2, m.D = 128;
  return m;
}

// A profile with round numbers: peak 100 TFLOP/s, efficiency 1, links 10 GB/s, no latency.
HardwareProfile ideal() {
  HardwareProfile h;
  h.name = "ideal";
  h.peak_bf16_flops = 100e12;
  h.hbm_bytes = 80e9;
  h.hbm_bytes_per_s = 1e12;
  h.hbm_eff = 1;
  h.chips_per_node = 8;
  h.intra = {10e9, 0};
  h.inter = {10e9, 0};
  h.gemm_eff.eff_inf = 1;
  h.attn_eff.eff_inf = 1;
  return h;
}

// A ring of n ranks, and a training step of S tokens (the common cases below).
PerfMesh ring_of(int64_t n) {
  PerfMesh mesh;
  mesh.ring = n;
  return mesh;
}
PerfWorkload train_of(int64_t S) {
  PerfWorkload w;
  w.seq = S;
  return w;
}

}  // namespace

TEST(CostModel, TrainFlopsEqualModelFlops) {
  const ModelShape m = small();
  HardwareProfile h = ideal();
  const PerfMesh mesh = ring_of(4);
  PerfWorkload w = train_of(8192);
  const StrategyPrediction p = predict(m, h, mesh, w, "ring");
  ModelDims d;
  d.layers = m.layers, d.dim = m.dim, d.ffn = m.ffn, d.vocab = m.vocab, d.H_q = 8, d.H_kv = 2, d.D = 128;
  const double want = train_matmul_flops(d, 8192) + train_attn_flops(d, causal_visible_pairs({8192}), 0);
  EXPECT_NEAR(p.model_flops, want, 1e-9 * want);
  // Matmul time on the ideal chip is exactly the per-rank matmul FLOPs / peak.
  EXPECT_NEAR(p.gemm_s, train_matmul_flops(d, 8192) / 4 / 100e12, 1e-9);
}

// Local (sliding-window) layers: model FLOPs count the window's pairs; the halo exchange moves
// 2 (window - 1) rows of K and V per rank each way (forward, backward again, dK/dV back), the ring
// every block past every rank: priced so, the halo's communication is the window's, not the
// sequence's, and grows with the window.
TEST(CostModel, LocalLayersPriceTheHaloByTheWindow) {
  ModelShape m = small();
  m.layers = 6;
  m.kinds = "LLLLLG";
  m.window = 1024;
  HardwareProfile h = ideal();
  const PerfMesh mesh = ring_of(4);
  const PerfWorkload w = train_of(32768);
  ModelDims d;
  d.layers = m.layers, d.dim = m.dim, d.ffn = m.ffn, d.vocab = m.vocab, d.H_q = 8, d.H_kv = 2, d.D = 128;
  d.kinds = m.kinds;
  d.window = m.window;
  const double want =
      train_matmul_flops(d, 32768) + train_attn_flops(d, causal_visible_pairs({32768}), window_visible_pairs({32768}, 1024));
  m.local_strategy = "halo";
  const StrategyPrediction halo = predict(m, h, mesh, w, "ring");
  EXPECT_NEAR(halo.model_flops, want, 1e-9 * want);
  m.local_strategy = "ring";
  const StrategyPrediction ring = predict(m, h, mesh, w, "ring");
  EXPECT_DOUBLE_EQ(ring.model_flops, halo.model_flops);
  EXPECT_LE(halo.time_s, ring.time_s);
  // Per local layer: the ring moves 3 hops of 8K rows per pass (+ dK/dV), the halo 2 x 1023
  // rows (+ dK/dV): more than 8x less. All-local models; window = 1 has no halo, which leaves
  // the gradient all-reduce alone.
  ModelShape a = m;
  a.kinds = "LLLLLL";
  a.local_strategy = "halo";
  a.window = 1;
  const double t_grad = predict(a, h, mesh, w, "ring").comm_total_s;
  a.window = 1024;
  const double halo_layer = (predict(a, h, mesh, w, "ring").comm_total_s - t_grad) / 6.0;
  a.local_strategy = "ring";
  const double ring_layer = (predict(a, h, mesh, w, "ring").comm_total_s - t_grad) / 6.0;
  EXPECT_GT(halo_layer, 0);
  EXPECT_LT(halo_layer * 8.0, ring_layer);
  m.local_strategy = "halo";
  m.window = 4096;
  EXPECT_GT(predict(m, h, mesh, w, "ring").comm_total_s, halo.comm_total_s) << "a longer window moves more";
}

// DeepSeek latent attention: model FLOPs are model/flops.hpp's for the MLA dims; the ring moves
// the latent (kv_lora + rope values per token) instead of K and V of every head, so its
// communication is that fraction of the same shape's MHA ring (the gradient all-reduce aside)
// and it pays the expansion of every visiting block; ulysses and usp are invalid; tp splits the heads only.
TEST(CostModel, MlaRingMovesTheLatent) {
  ModelShape m = small();
  m.mla = true;
  m.H_q = m.H_kv = 16;
  m.q_lora = 0, m.kv_lora = 512, m.nope = 128, m.rope = 64, m.v_dim = 128;
  m.D = m.nope + m.rope;
  HardwareProfile h = ideal();
  const PerfMesh mesh = ring_of(8);
  const PerfWorkload w = train_of(65536);
  ModelDims d;
  d.layers = m.layers, d.dim = m.dim, d.ffn = m.ffn, d.vocab = m.vocab, d.H_q = d.H_kv = 16, d.D = 192;
  d.mla = true, d.kv_lora = 512, d.nope = 128, d.rope = 64, d.v_dim = 128;
  const double want = train_matmul_flops(d, 65536) + train_attn_flops(d, causal_visible_pairs({65536}), 0);
  const StrategyPrediction ring = predict(m, h, mesh, w, "ring");
  ASSERT_EQ(ring.invalid, "");
  EXPECT_NEAR(ring.model_flops, want, 1e-9 * want);
  // The same heads moving K and V (an MHA model of H_kv = 16 heads of 192): the ring's
  // communication grows with S by bytes per token, the gradient all-reduce does not (zero link
  // latency here), so the growth from S to 2S compares the two.
  ModelShape mha = m;
  mha.mla = false;
  auto growth = [&](const ModelShape& x) {
    return predict(x, h, mesh, train_of(131072), "ring").comm_total_s - predict(x, h, mesh, w, "ring").comm_total_s;
  };
  EXPECT_NEAR(growth(m) / growth(mha), 576.0 / (2.0 * 16 * 192), 1e-9);
  // With links too fast to matter, the latent ring is slower by the expansion of the 7 visiting
  // blocks (forward once, backward three products of that size).
  HardwareProfile fast = h;
  fast.intra = fast.inter = {1e18, 0};
  const double extra = predict(m, fast, mesh, w, "ring").attn_s - predict(mha, fast, mesh, w, "ring").attn_s;
  const double xs = matmul_flops(65536.0 / 8, 512, 16 * 256) / 100e12;
  EXPECT_NEAR(extra, double(m.layers) * 4 * 7 * xs, 1e-6 * extra);  // per layer: 7 blocks, 1 + 3 products
  for (const char* st : {"ulysses", "usp"}) {
    PerfMesh u = mesh;
    if (std::string(st) == "usp") u.ulysses = 2, u.ring = 4;
    const std::string e = predict(m, h, u, w, st).invalid;
    EXPECT_NE(e.find("MLA's K/V latent is shared by every head"), std::string::npos) << e;
  }
  EXPECT_EQ(predict(m, h, mesh, w, "allgather").invalid, "");
  // tp:2 splits the heads but not the latent: the ring moves the same bytes per tp rank, and
  // the projections cost half, plus the replicated latent projections' other half.
  PerfMesh tp = mesh;
  tp.tp = 2;
  const StrategyPrediction t2 = predict(m, h, tp, w, "ring");
  ASSERT_EQ(t2.invalid, "");
  const double rep = 2.0 * m.dim * (512 + 64) * (65536.0 / 8) * 3 * m.layers / 100e12;
  const double head = 2.0 * m.dim * m.vocab * (65536.0 / 8) * 3 / 100e12;  // the LM head, replicated over tp
  EXPECT_NEAR(t2.gemm_s - head, (ring.gemm_s - head - rep) / 2 + rep, 1e-9);
}

TEST(CostModel, RingOverlapIsMaxOfComputeAndComm) {
  EXPECT_DOUBLE_EQ(ring_pipeline_s(4, 2.0, 1.0, 0.0), 3 * 2.0 + 2.0);    // compute bound: comm hidden
  EXPECT_DOUBLE_EQ(ring_pipeline_s(4, 1.0, 3.0, 0.0), 3 * 3.0 + 1.0);    // comm bound: fill + last step
  EXPECT_DOUBLE_EQ(ring_pipeline_s(4, 1.0, 1.5, 0.25), 3 * 1.5 + 1.25);  // overhead counts with compute
  EXPECT_DOUBLE_EQ(ring_pipeline_s(1, 2.0, 9.0, 0.0), 2.0);              // one rank: no communication
}

TEST(CostModel, RingExposedCommOnlyWhenCommBound) {
  ModelShape m = small();
  HardwareProfile h = ideal();
  PerfMesh mesh;
  mesh.ring = 4;
  PerfWorkload w;
  w.seq = 65536;
  const StrategyPrediction fast = predict(m, h, mesh, w, "ring");
  EXPECT_GT(fast.comm_total_s, 0);
  EXPECT_NEAR(fast.exposed_comm_s, 0, 1e-12);  // long sequence: attention per step >> K/V message
  h.intra.bw_bytes_per_s = 1e6;                // a very slow link: the ring waits on every hop
  h.inter.bw_bytes_per_s = 1e6;
  const StrategyPrediction slow = predict(m, h, mesh, w, "ring");
  EXPECT_GT(slow.exposed_comm_s, 0.5 * slow.comm_total_s);
  EXPECT_GT(slow.time_s, fast.time_s + slow.exposed_comm_s * 0.99);
}

TEST(CostModel, CollectiveArithmetic) {
  HardwareProfile h = ideal();
  // One node of 8: ring all-reduce moves 2(n-1)/n of the buffer.
  EXPECT_NEAR(allreduce_s(h, 8, 8, 8e9), 2.0 * 7 / 8 * 8e9 / 10e9, 1e-12);
  // All-gather of an 8 GB result over 8 ranks in a node: 7/8 of it arrives over the link.
  EXPECT_NEAR(allgather_s(h, 8, 8, 8e9), 7.0 / 8 * 8e9 / 10e9, 1e-12);
  // Across nodes: NCCL's ring with one channel per NIC is one pipeline; each NIC carries 1/k of
  // the ring's bus bytes, each NVLink the other (k-1)/k; the slower sets the time.
  h.inter.bw_bytes_per_s = 1e9;
  EXPECT_NEAR(allreduce_s(h, 16, 8, 8e9), 2.0 * 15 / 16 * 8e9 / 8 / 1e9, 1e-12);  // NIC bound
  EXPECT_NEAR(allreduce_s(h, 32, 8, 8e9), 2.0 * 31 / 32 * 8e9 / 8 / 1e9, 1e-12);  // 4 nodes: only (n-1)/n more
  EXPECT_NEAR(allgather_s(h, 16, 8, 8e9), 15.0 / 16 * 8e9 / 8 / 1e9, 1e-12);
  h.inter.bw_bytes_per_s = 100e9;  // a NIC faster than 1/(k-1) of NVLink: NVLink bound
  EXPECT_NEAR(allreduce_s(h, 16, 8, 8e9), 2.0 * 15 / 16 * 8e9 / 8 * 7 / 10e9, 1e-12);
  h.inter.bw_bytes_per_s = 1e9;
  EXPECT_NEAR(allreduce_s(h, 4, 1, 8e9), 2.0 * 3 / 4 * 8e9 / 1e9, 1e-12);  // one rank per node: the NICs' ring
  EXPECT_EQ(ranks_per_node(h, 16, 8), 1);  // a ring over hosts (stride = tp = 8): one rank per node
  EXPECT_EQ(ranks_per_node(h, 4, 2), 4);
  EXPECT_DOUBLE_EQ(p2p_s(h, 4, 1, 1e9), 1.0);  // crosses nodes: inter link
  EXPECT_DOUBLE_EQ(p2p_s(h, 4, 4, 1e9), 0.1);  // inside a node: intra link
}

// The attention kernel model: visible pairs plus the causal diagonal's waste, at eff(kappa) with
// kappa = visible keys per query row of one kernel call.
TEST(CostModel, AttentionRateFollowsKeysPerQueryRow) {
  const ModelShape m = small();
  HardwareProfile h = ideal();
  h.attn_eff.eff_inf = 1.0;
  h.attn_eff.x_half = 1024;  // half rate at 1024 keys per query row
  h.intra = {1e15, 0};       // communication free: attention compute only
  h.inter = h.intra;
  const PerfMesh mesh = ring_of(4);
  PerfWorkload w = train_of(8192);
  const double pairs = causal_visible_pairs({8192}), at = 3.5 * 4.0 * 8 * 128 * pairs / 4 * m.layers;  // per rank
  // Ring: 4 steps of S_loc = 2048 query rows against one rank's keys: kappa = S_loc / 2 = 1024.
  const StrategyPrediction ring = predict(m, h, mesh, w, "ring");
  EXPECT_NEAR(ring.attn_s, at / 100e12 / h.attn_eff.at(1024.25), 1e-3 * ring.attn_s);
  // All-gather: one call of the same rows against all keys: kappa = S / 2, twice the rate here.
  const StrategyPrediction ag = predict(m, h, mesh, w, "allgather");
  EXPECT_NEAR(ag.attn_s - ag.exposed_comm_s, at / 100e12 / h.attn_eff.at(4097), 1e-3 * ag.attn_s);
  EXPECT_LT(ag.attn_s, 0.7 * ring.attn_s);
  // The diagonal's masked pairs: each query row computes attn_diag_waste_keys more keys once per layer.
  h.attn_diag_waste_keys = 100;
  const StrategyPrediction ring_w = predict(m, h, mesh, w, "ring");
  const double waste = 3.5 * 4.0 * 8 * 128 * 2048 * 100 * m.layers / 100e12 / h.attn_eff.at(1024.25);
  EXPECT_NEAR(ring_w.attn_s - ring.attn_s, waste, 1e-3 * waste);
}

// A split attention backward (more matmuls than the convention's 2.5) costs time, not model FLOPs.
TEST(CostModel, BackwardWorkChangesTimeNotModelFlops) {
  const ModelShape m = small();
  HardwareProfile h = ideal();
  h.intra = {1e15, 0};
  h.inter = h.intra;
  const PerfMesh mesh = ring_of(4);
  PerfWorkload w = train_of(8192);
  const StrategyPrediction fused = predict(m, h, mesh, w, "ring");
  h.attn_bwd_work = 3.5;
  const StrategyPrediction split = predict(m, h, mesh, w, "ring");
  EXPECT_DOUBLE_EQ(split.model_flops, fused.model_flops);
  EXPECT_NEAR(split.attn_s / fused.attn_s, (1 + 3.5) / (1 + 2.5), 1e-9);  // forward + backward work
}

// Ranks sharing a core, and the slowest rank of a synchronous step.
TEST(CostModel, SharedCoresAndRankJitter) {
  EXPECT_DOUBLE_EQ(expected_max_normal(1), 0);
  EXPECT_NEAR(expected_max_normal(2), 1 / std::sqrt(M_PI), 1e-4);  // E[max of 2] = 1/sqrt(pi)
  EXPECT_NEAR(expected_max_normal(4), 1.0294, 1e-3);
  EXPECT_NEAR(expected_max_normal(64), 2.3437, 1e-3);  // (Monte Carlo: 2.343)
  const ModelShape m = small();
  HardwareProfile h = ideal();
  h.compute_units_per_node = 2;
  PerfMesh two, four;
  two.ring = 2;
  four.ring = 4;
  PerfWorkload w;
  w.seq = 8192;
  const StrategyPrediction p2 = predict(m, h, two, w, "ring"), p4 = predict(m, h, four, w, "ring");
  EXPECT_NEAR(p4.gemm_s, p2.gemm_s, 1e-9 * p2.gemm_s);  // half the rows per rank, half a core each
  h.shared_core_eff = 0.8;
  EXPECT_NEAR(predict(m, h, four, w, "ring").gemm_s, p2.gemm_s / 0.8, 1e-9 * p2.gemm_s);
  EXPECT_NEAR(predict(m, h, two, w, "ring").gemm_s, p2.gemm_s, 1e-12);  // not oversubscribed: unchanged
  // Jitter: the others wait for the slowest rank, sigma * E[max of n] of the compute, exposed.
  h.shared_core_eff = 1;
  h.rank_jitter = 0.1;
  const StrategyPrediction j2 = predict(m, h, two, w, "ring");
  const double compute = p2.gemm_s + p2.attn_s - p2.exposed_comm_s + p2.other_s;
  EXPECT_NEAR(j2.time_s - p2.time_s, 0.1 * expected_max_normal(2) * compute, 1e-6 * compute);
  EXPECT_NEAR(j2.exposed_comm_s - p2.exposed_comm_s, j2.time_s - p2.time_s, 1e-12);
  EXPECT_NEAR(j2.gemm_s, p2.gemm_s, 1e-12);
}

// The memory-bound parts at the profile's measured rates, against the cost model's byte counts.
TEST(CostModel, MemoryBoundPartsUseTheirMeasuredRates) {
  const ModelShape m = small();
  HardwareProfile h = ideal();
  const PerfMesh mesh = ring_of(2);
  PerfWorkload w = train_of(8192);
  const double tokens = 4096, params = m.params_total();
  const StrategyPrediction base = predict(m, h, mesh, w, "ring");
  const double want_base = (elementwise_bytes(m, 1, tokens, true, 2) + loss_bytes(m, tokens, 2) + optimizer_bytes(params)) / 1e12;
  EXPECT_NEAR(base.other_s, want_base, 1e-9 * want_base);
  h.elementwise_bytes_per_s = 100e9, h.loss_bytes_per_s = 10e9, h.optimizer_bytes_per_s = 50e9;
  const StrategyPrediction p = predict(m, h, mesh, w, "ring");
  const double want = elementwise_bytes(m, 1, tokens, true, 2) / 100e9 + loss_bytes(m, tokens, 2) / 10e9 + optimizer_bytes(params) / 50e9;
  EXPECT_NEAR(p.other_s, want, 1e-9 * want);
  w.mode = PerfMode::prefill;  // forward only, no loss or optimizer
  const StrategyPrediction f = predict(m, h, mesh, w, "pass_kv");
  EXPECT_NEAR(f.other_s, elementwise_bytes(m, 1, tokens, false, 2) / 100e9, 1e-9 * f.other_s);
}

TEST(CostModel, AllToAllUsesItsOwnRateWhenMeasured) {
  HardwareProfile h = ideal();
  // Without an all-to-all rate: the collective rate (= intra here); 3/4 of 8 GB leave a rank.
  EXPECT_NEAR(alltoall_s(h, 4, 4, 8e9), 3.0 / 4 * 8e9 / 10e9, 1e-12);
  h.intra_alltoall_bytes_per_s = 2.5e9;  // measured by bench calibrate (shared-memory MPI)
  EXPECT_NEAR(alltoall_s(h, 4, 4, 8e9), 3.0 / 4 * 8e9 / 2.5e9, 1e-12);
  // All-gather, all-reduce and point-to-point keep their own rates.
  EXPECT_NEAR(allgather_s(h, 8, 8, 8e9), 7.0 / 8 * 8e9 / 10e9, 1e-12);
  EXPECT_DOUBLE_EQ(p2p_s(h, 4, 4, 1e9), 0.1);
  // The rate survives the profile writer and reader.
  const std::string f = testing::TempDir() + "/a2a_profile.toml";
  h.peak_fp32_flops = 1e12;
  std::ofstream(f) << hardware_toml(h, {}, {});
  EXPECT_DOUBLE_EQ(load_hardware(f).intra_alltoall_bytes_per_s, 2.5e9);
}

// Across hosts: each collective at its own fitted node-crossing rate (bench calibrate on a
// cluster), the ring's steps that cross hosts lose the measured time per byte to the transport,
// and hosts that share one machine's cores have fractional compute units.
TEST(CostModel, CrossHostRatesOverlapLossAndSharedMachines) {
  HardwareProfile h = ideal();
  h.inter.bw_bytes_per_s = 1e9;
  const double ar = allreduce_s(h, 4, 1, 8e9), ag = allgather_s(h, 4, 1, 8e9), a2a = alltoall_s(h, 4, 1, 8e9);
  h.inter_collective_bytes_per_s = 0.5e9;  // the all-reduce's rate; the all-gather follows it by default
  EXPECT_NEAR(allreduce_s(h, 4, 1, 8e9), 2 * ar, 1e-9 * ar);
  EXPECT_NEAR(allgather_s(h, 4, 1, 8e9), 2 * ag, 1e-9 * ag);
  h.inter_allgather_bytes_per_s = 0.25e9;
  EXPECT_NEAR(allgather_s(h, 4, 1, 8e9), 4 * ag, 1e-9 * ag);
  EXPECT_NEAR(allreduce_s(h, 4, 1, 8e9), 2 * ar, 1e-9 * ar);
  EXPECT_NEAR(alltoall_s(h, 4, 1, 8e9), a2a, 1e-12);  // the all-to-all keeps the link's rate ...
  h.inter_alltoall_bytes_per_s = 0.5e9;               // ... until it has its own
  EXPECT_NEAR(alltoall_s(h, 4, 1, 8e9), 3.0 / 4 * 8e9 / 0.5e9, 1e-12);
  EXPECT_NEAR(allgather_s(h, 4, 4, 8e9), 3.0 / 4 * 8e9 / 10e9, 1e-12);  // inside a node: untouched

  // The ring's overlap loss: only where the ring crosses nodes, per byte sent + received.
  const ModelShape m = small();
  HardwareProfile g = ideal();
  g.chips_per_node = 1;
  const PerfMesh mesh = ring_of(4);
  PerfWorkload w = train_of(65536);  // long: each step compute-bound, the transfer hidden
  w.mode = PerfMode::prefill;
  const StrategyPrediction base = predict(m, g, mesh, w, "pass_kv");
  EXPECT_DOUBLE_EQ(ring_step_loss_s(g, 4, 1, 1e6), 0.0);
  g.inter_overlap_loss_s_per_byte = 1e-9;
  EXPECT_DOUBLE_EQ(ring_step_loss_s(g, 4, 1, 1e6), 1e-3);
  EXPECT_DOUBLE_EQ(ring_step_loss_s(g, 4, 4, 1e6), 0.0);  // inside a node
  const StrategyPrediction lossy = predict(m, g, mesh, w, "pass_kv");
  // A prefill ring of 4 steps per layer, each sending and receiving one rank's K/V (2 bytes).
  const double kv = 65536.0 / 4 * 2 * m.H_kv * m.D * 2;
  EXPECT_NEAR(lossy.time_s - base.time_s, double(m.layers) * 4 * 2 * kv * 1e-9, 1e-9);
  g.chips_per_node = 8;  // the same ring inside one node: no loss
  g.compute_units_per_node = 8;
  EXPECT_NEAR(predict(m, g, mesh, w, "pass_kv").time_s, predict(m, ideal(), mesh, w, "pass_kv").time_s, 1e-12);

  // Two hosts on one 2-core machine, 2 ranks each: one core per host, so each rank gets half.
  HardwareProfile s = ideal();
  s.chips_per_node = 2;
  s.compute_units_per_node = 1;
  PerfWorkload t = train_of(8192);
  const StrategyPrediction shared = predict(m, s, ring_of(4), t, "ring");
  s.compute_units_per_node = 2;
  EXPECT_NEAR(shared.gemm_s, 2 * predict(m, s, ring_of(4), t, "ring").gemm_s, 1e-9 * shared.gemm_s);
  s.compute_units_per_node = 0.5;  // 4 hosts of 1 rank on 2 cores
  s.chips_per_node = 1;
  EXPECT_NEAR(predict(m, s, ring_of(4), t, "ring").gemm_s, shared.gemm_s, 1e-9 * shared.gemm_s);
  const std::string f = testing::TempDir() + "/cross_host_profile.toml";
  h.peak_fp32_flops = s.peak_fp32_flops = 1e12;
  h.compute_units_per_node = 0.5;
  h.inter_overlap_loss_s_per_byte = 2e-9;
  std::ofstream(f) << hardware_toml(h, {}, {});
  const HardwareProfile r = load_hardware(f);
  EXPECT_DOUBLE_EQ(r.compute_units_per_node, 0.5);
  EXPECT_DOUBLE_EQ(r.inter_collective_bytes_per_s, 0.5e9);
  EXPECT_DOUBLE_EQ(r.inter_allgather_bytes_per_s, 0.25e9);
  EXPECT_DOUBLE_EQ(r.inter_alltoall_bytes_per_s, 0.5e9);
  EXPECT_NEAR(r.inter_overlap_loss_s_per_byte, 2e-9, 1e-21);
}

TEST(CostModel, MemoryArithmetic) {
  const ModelShape m = llama405b();
  HardwareProfile h = ideal();
  h.peak_fp8_flops = 200e12;
  PerfMesh mesh;
  mesh.tp = 8;
  mesh.ring = 4;
  PerfWorkload w;
  w.mode = PerfMode::prefill;
  w.seq = 131072;
  w.precision = Precision::fp8_ffn;
  const StrategyPrediction p = predict(m, h, mesh, w, "pass_kv");
  // Weights: attention projections in BF16 (2 B), FFN in FP8 (1 B), embedding + head in BF16, / tp.
  const double want_w = (m.attn_params_per_layer() * 2 + m.ffn_params_per_layer() * 1) * 126 / 8 + 2.0 * 128256 * 16384 * 2 / 8;
  EXPECT_NEAR(p.mem_weights_bytes, want_w, 1e-6 * want_w);
  // KV cache: S/N tokens x 1 K/V head per tp rank x D x (K, V) x 2 B x layers.
  EXPECT_NEAR(p.mem_kv_bytes, 131072.0 / 4 * 1 * 128 * 2 * 2 * 126, 1.0);
  EXPECT_NEAR(p.mem_bytes, p.mem_weights_bytes + p.mem_state_bytes + p.mem_act_bytes + p.mem_kv_bytes + p.mem_buf_bytes, 1.0);
  EXPECT_EQ(p.fits, p.mem_bytes <= h.hbm_bytes);
  // Training state: 16 bytes per parameter per tp slice; ZeRO divides it over dp*cp.
  PerfWorkload t;
  t.seq = 8192;
  PerfMesh m1;
  m1.tp = 8, m1.ring = 4;
  const StrategyPrediction s1 = predict(small(), h, m1, t, "ring");
  EXPECT_NEAR(s1.mem_state_bytes, 16.0 * small().params_total() / 8, 1.0);
  // shard= (model/state_shard.hpp) over dp*cp = 4 ranks: the pieces, the whole buffers a level
  // keeps, and the units it gathers or reduces through, as the train plan counts them.
  const ModelShape sm = small();
  const double P = sm.params_total() / 8, layer = (sm.attn_params_per_layer() + sm.ffn_params_per_layer()) / 8,
               edge = double(sm.vocab) * double(sm.dim) / 8, wide = std::max(edge, layer);
  // (a UnitFeed's pair of unit buffers: the widest unit and the widest layer)
  const double want[] = {16 * P, 8 * P + 12 * P / 4 + 4 * wide, 4 * P + 16 * P / 4 + 4 * wide + 4 * (wide + layer),
                         16 * P / 4 + 8 * (wide + layer)};
  for (const auto& [level, name] : kShardNames) {
    t.shard = level;
    const StrategyPrediction s2 = predict(sm, h, m1, t, "ring");
    EXPECT_NEAR(s2.mem_state_bytes, want[int(level)], 1.0) << name;
  }
  // The collectives that keep the state: reduce-scatter + all-gather move what the all-reduce does
  // (grads: the same bandwidth term, a latency per unit more); params gathers the weights twice more
  // per step; optimizer adds one all-gather to the all-reduce.
  const double bytes = 4 * P, ar = allreduce_s(h, 4, 4, bytes), ag = allgather_s(h, 4, 4, bytes);
  EXPECT_DOUBLE_EQ(state_sync_s(h, sm, ShardLevel::none, 4, 4, 8), ar);
  EXPECT_DOUBLE_EQ(state_sync_s(h, sm, ShardLevel::optimizer, 4, 4, 8), ar + ag);
  EXPECT_GE(state_sync_s(h, sm, ShardLevel::grads, 4, 4, 8), 2 * ag);
  const double grads = state_sync_s(h, sm, ShardLevel::grads, 4, 4, 8);  // 2 gathers + 2 x the units' latency
  EXPECT_NEAR(state_sync_s(h, sm, ShardLevel::params, 4, 4, 8) - grads, ag + (grads - 2 * ag) / 2, 1e-12);
  EXPECT_EQ(state_sync_s(h, sm, ShardLevel::params, 1, 1, 8), 0.0);
  // What the step waits for: everything without overlap; with it, only what no compute covers.
  HardwareProfile serial = h;
  serial.overlap_collectives = false;
  ASSERT_TRUE(h.overlap_collectives);
  for (const auto& [level, name] : kShardNames)
    EXPECT_DOUBLE_EQ(state_sync_exposed_s(serial, sm, level, 4, 4, 8, 1.0), state_sync_s(h, sm, level, 4, 4, 8)) << name;
  const double ag_edge = allgather_s(h, 4, 4, 4 * edge), ag_layer = allgather_s(h, 4, 4, 4 * layer);
  const double lots = 1e3;  // seconds of compute: every layer's collectives hidden
  EXPECT_EQ(state_sync_exposed_s(h, sm, ShardLevel::none, 4, 4, 8, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(state_sync_exposed_s(h, sm, ShardLevel::optimizer, 4, 4, 8, lots), ag);
  EXPECT_DOUBLE_EQ(state_sync_exposed_s(h, sm, ShardLevel::grads, 4, 4, 8, lots), ag + ag_edge);
  EXPECT_DOUBLE_EQ(state_sync_exposed_s(h, sm, ShardLevel::params, 4, 4, 8, lots), 2 * ag_edge);
  // no compute: every layer's two gathers and reduce-scatter exposed
  EXPECT_NEAR(state_sync_exposed_s(h, sm, ShardLevel::params, 4, 4, 8, 0.0), 2 * ag_edge + double(sm.layers) * 3 * ag_layer,
              1e-12);
}

// A placed batch's attention (placement=auto's price): a single document on zigzag rows is
// predict()'s ring; the busier rank and the more rows it receives, the longer; and the same for
// the frugal all-gather's.
TEST(CostModel, PlacedAttentionIsTheRingsForOneDocument) {
  const HardwareProfile h = load_hardware("h100-gtt");
  const ModelShape m = small();
  PerfMesh mesh;
  mesh.ring = 4;
  PerfWorkload w;
  w.seq = 8192;
  for (Remat remat : {Remat::none, Remat::full}) {
    w.remat = remat;
    const StrategyPrediction ring = predict(m, h, mesh, w, "ring");
    ASSERT_TRUE(ring.invalid.empty()) << ring.invalid;
    const double S = double(w.seq), n = S / 4, pairs = S * (S + 1) / 2 / 4;
    const double placed = placed_attention_s(m, h, mesh, w, pairs, 3 * n);
    EXPECT_NEAR(placed, ring.attn_s, 1e-9 * ring.attn_s) << name_of(remat);
    EXPECT_GT(placed_attention_s(m, h, mesh, w, 1.5 * pairs, 3 * n), placed);
    EXPECT_LT(placed_attention_s(m, h, mesh, w, pairs, 0.1 * n), placed + 1e-12);
  }
  // One rank: no exchange, the whole sequence's pairs.
  PerfMesh one;
  const double S = double(w.seq), n = S / 4, pairs = S * (S + 1) / 2 / 4;
  EXPECT_NEAR(placed_attention_s(m, h, one, w, S * (S + 1) / 2, 0), predict(m, h, one, w, "ring").attn_s,
              1e-9 * predict(m, h, one, w, "ring").attn_s);
  // The frugal all-gather's price (strategy allgather): its exchange is not hidden, so it grows
  // with every row received and the busier rank; with nothing to move (one rank) it is the ring's.
  const double none = placed_attention_s(m, h, mesh, w, pairs, 0, CommPattern::gather);
  const double some = placed_attention_s(m, h, mesh, w, pairs, n, CommPattern::gather);
  const double all = placed_attention_s(m, h, mesh, w, pairs, 3 * n, CommPattern::gather);
  EXPECT_LT(none, some);
  EXPECT_LT(some, all);
  EXPECT_GT(placed_attention_s(m, h, mesh, w, 1.5 * pairs, n, CommPattern::gather), some);
  // Twice the rows, twice the exchange's bandwidth share: the growth from n to 3n rows is about
  // twice that from 0 to n (the latency is paid once either way).
  EXPECT_GT(all - some, 1.5 * (some - none) - 1e-12);
  // The ring hides its transfer under the compute of its steps; the all-gather's waits.
  EXPECT_GE(all, placed_attention_s(m, h, mesh, w, pairs, 3 * n) - 1e-12);
  EXPECT_NEAR(placed_attention_s(m, h, one, w, S * (S + 1) / 2, 0, CommPattern::gather),
              placed_attention_s(m, h, one, w, S * (S + 1) / 2, 0), 1e-12);
}

TEST(CostModel, PaperEq1Threshold) {
  // Meta CP Eq. 1: pass-KV when T/(T+P) >= 2 H_kv / H_q = 12.5% for Llama 3 405B.
  EXPECT_DOUBLE_EQ(pass_kv_miss_rate_threshold(llama405b()), 0.125);
  EXPECT_DOUBLE_EQ(partial_prefill_pairs(4, 10), 4 * 10 + 10);  // T*P + T(T+1)/2
}

TEST(CostModel, PassQWinsAtLowMissRatePassKvAtHigh) {
  const HardwareProfile h = load_hardware(std::string(CTXPAR_TEST_SOURCE_DIR) + "/inputs/hardware/h100-gtt.toml");
  const ModelShape m = llama405b();
  const PassChoice low = predict_partial_prefill(m, h, 1280, 126720, 4, 8);
  const PassChoice high = predict_partial_prefill(m, h, 64000, 64000, 4, 8);
  EXPECT_TRUE(low.use_pass_q);
  EXPECT_FALSE(high.use_pass_q);
  EXPECT_GT(low.pass_kv_s, 0);
  EXPECT_GT(high.pass_q_s, high.pass_kv_s);
}

TEST(CostModel, InvalidStrategiesSayWhy) {
  PerfMesh mesh;
  mesh.ring = 3;  // 8 query heads not divisible by 3
  PerfWorkload w;
  w.seq = 3 * 4096;
  const StrategyPrediction p = predict(small(), ideal(), mesh, w, "ulysses");
  EXPECT_NE(p.invalid.find("divisible"), std::string::npos) << p.invalid;
  // usp runs on any mesh: with ulysses:1 it is the ring, priced the same (the one mesh rule of
  // runs and predict).
  const StrategyPrediction u = predict(small(), ideal(), mesh, w, "usp");
  const StrategyPrediction ring = predict(small(), ideal(), mesh, w, "ring");
  EXPECT_TRUE(u.invalid.empty()) << u.invalid;
  EXPECT_NEAR(u.time_s, ring.time_s, 1e-9 * ring.time_s);
  std::vector<StrategyPrediction> v = {p, ring};
  EXPECT_EQ(recommend(v), 1);
}

TEST(Hardware, EveryShippedProfileLoads) {
  const std::string dir = std::string(CTXPAR_TEST_SOURCE_DIR) + "/inputs/hardware/";
  for (const char* n : {"h100-ndr", "h100-gtt", "h100-gti", "h200", "tpu-v5p", "tpu7x"}) {
    const HardwareProfile h = load_hardware(dir + n + ".toml");
    EXPECT_EQ(h.name, n);
    EXPECT_GT(h.intra.bw_bytes_per_s, 0);
    EXPECT_GT(h.attn_eff.at(8192), 0);
    EXPECT_LE(h.attn_eff.at(8192), 1);
  }
  // GTT is 400 Gb/s RDMA, GTI 100 Gb/s TCP: the profiles keep that order.
  EXPECT_GT(load_hardware(dir + "h100-gtt.toml").inter.bw_bytes_per_s, load_hardware(dir + "h100-gti.toml").inter.bw_bytes_per_s);
}

TEST(Hardware, BadNameAndUnknownKeyAreClearErrors) {
  try {
    load_hardware("no-such-gpu");
    FAIL() << "no error for a missing profile";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-gpu"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("valid"), std::string::npos);
  }
  // A directory given as the profile is named as one, not as missing.
  for (const std::string& dir : {testing::TempDir(), testing::TempDir() + "/dir.toml"}) {
    std::filesystem::create_directories(dir);
    try {
      load_hardware(dir);
      FAIL() << "no error for a directory " << dir;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
    }
  }
  const std::string f = testing::TempDir() + "/bad_profile.toml";
  std::ofstream(f) << "name = \"x\"\nhbm_gb = 1\nhbm_tb_s = 1\nchips_per_node = 1\nintra_gb_s = 1\nintra_latency_us = 1\n"
                      "inter_gb_s = 1\ninter_latency_us = 1\npeak_tflops_bf16 = 1\npeak_tflop_bf16 = 2\n";
  try {
    load_hardware(f);
    FAIL() << "no error for an unknown key";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("peak_tflop_bf16"), std::string::npos);
  }
}

// Values outside a physical machine's range are refused on load, naming the key, the value as
// written, the unit and the range (the audit's 1e-300 peak and memory, 1e300 latency).
TEST(Hardware, ValuesOutsideAPhysicalRangeAreRefused) {
  const std::string base = "name = \"x\"\nchips_per_node = 1\nintra_gb_s = 1\ninter_gb_s = 1\n"
                           "inter_latency_us = 1\n";
  const std::string f = testing::TempDir() + "/range_profile.toml";
  const char* const good = "hbm_gb = 1\nhbm_tb_s = 1\nintra_latency_us = 1\npeak_tflops_bf16 = 1\n";
  std::ofstream(f) << base << good;
  EXPECT_NO_THROW(load_hardware(f));
  const std::pair<const char*, const char*> cases[] = {
      {"peak_tflops_bf16 = 1e-300\nhbm_gb = 1\nhbm_tb_s = 1\nintra_latency_us = 1\n", "peak_tflops_bf16 in"},
      {"peak_tflops_bf16 = 1\nhbm_gb = 1e-300\nhbm_tb_s = 1\nintra_latency_us = 1\n", "hbm_gb in"},
      {"peak_tflops_bf16 = 1\nhbm_gb = 1\nhbm_tb_s = 1\nintra_latency_us = 1e300\n", "intra_latency_us in"},
      {"peak_tflops_bf16 = 1e6\nhbm_gb = 1\nhbm_tb_s = 1\nintra_latency_us = 1\n", "peak_tflops_bf16 in"},
  };
  for (const auto& [text, key] : cases) {
    std::ofstream(f) << base << text;
    try {
      load_hardware(f);
      FAIL() << "no error for " << text;
    } catch (const UsageError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(key), std::string::npos) << m;
      EXPECT_NE(m.find("physical"), std::string::npos) << m;
      EXPECT_EQ(m.find("0.000000"), std::string::npos) << "the value as written, not rounded away: " << m;
    }
  }
  // The value is quoted as written: 1e-300, not 0.000000.
  std::ofstream(f) << base << "peak_tflops_bf16 = 1\nhbm_gb = 1e-300\nhbm_tb_s = 1\nintra_latency_us = 1\n";
  try {
    load_hardware(f);
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("is 1e-300 GB"), std::string::npos) << e.what();
  }
  // A count of chips is whole: 3.5 was read as 3 without a word.
  std::ofstream(f) << "name = \"x\"\nchips_per_node = 3.5\nintra_gb_s = 1\ninter_gb_s = 1\ninter_latency_us = 1\n" << good;
  try {
    load_hardware(f);
    FAIL() << "chips_per_node = 3.5 accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("whole number of chips (got 3.5)"), std::string::npos) << e.what();
  }
}

// The analytic curve's keys are read (an earlier reader built "attn_eff_half_tokens" and never
// saw attn_half_tokens), an impossible asymptote is an error, and renamed keys say what replaced them.
TEST(Hardware, AnalyticCurvesReadTheirKeys) {
  const std::string base = "name = \"x\"\nhbm_gb = 1\nhbm_tb_s = 1\nchips_per_node = 1\nintra_gb_s = 1\nintra_latency_us = 1\n"
                           "inter_gb_s = 1\ninter_latency_us = 1\npeak_tflops_bf16 = 1\n";
  const std::string f = testing::TempDir() + "/curve_profile.toml";
  std::ofstream(f) << base << "attn_eff = 0.5\nattn_eff_at_keys = 1024\nattn_half_keys = 1024\n"
                   << "gemm_eff = 0.4\ngemm_half_rows = 128\nattn_diag_waste_keys = 70\nrank_jitter = 0.05\n";
  const HardwareProfile h = load_hardware(f);
  EXPECT_DOUBLE_EQ(h.attn_eff.at(1024), 0.5);
  EXPECT_DOUBLE_EQ(h.attn_eff.eff_inf, 1.0);
  EXPECT_DOUBLE_EQ(h.gemm_eff.at(128), 0.2);
  EXPECT_DOUBLE_EQ(h.attn_diag_waste_keys, 70);
  EXPECT_DOUBLE_EQ(h.rank_jitter, 0.05);
  std::ofstream(f) << base << "attn_eff = 0.8\nattn_eff_at_keys = 256\nattn_half_keys = 1024\n";
  try {
    load_hardware(f);
    FAIL() << "no error for an asymptotic efficiency > 1";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("> 1"), std::string::npos) << e.what();
  }
  std::ofstream(f) << base << "attn_eff = 0.5\nattn_half_tokens = 256\n";
  try {
    load_hardware(f);
    FAIL() << "no error for a renamed key";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("attn_half_keys"), std::string::npos) << e.what();
  }
}

TEST(Hardware, EffCurveInterpolatesAndClamps) {
  EffCurve c;
  c.x = {256, 1024};
  c.eff = {0.2, 0.6};
  EXPECT_DOUBLE_EQ(c.at(100), 0.2);
  EXPECT_DOUBLE_EQ(c.at(4096), 0.6);
  EXPECT_NEAR(c.at(512), 0.4, 1e-12);  // halfway in log(x)
  EffCurve f;
  f.eff_inf = 0.8;
  f.x_half = 256;
  EXPECT_DOUBLE_EQ(f.at(256), 0.4);
}
