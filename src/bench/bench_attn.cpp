// `ctxpar bench attn`: speed of the local attention kernels (kernels/cpu) against the GEMM speed
// of the same machine in the same run, with a correctness column against kernels/ref.
//
// Rows: S = 1K, 2K, ... up to cfg.seq for the configured shape (heads, kv_heads, head_dim,
// mask, window), then fixed rows that cover the kernel's variants (D = 64, MQA, no mask, window)
// and the headline row S = 8K, H_q = 32, H_kv = 8, D = 128, causal.
// Every rank runs every row at the same time (a barrier before each measurement), as ranks
// sharing a node do in a real run; times are the mean over the timed iterations, max over ranks.
// Run with one rank per node for the kernel's own speed.
//
// Per row, the large-sgemm rate is measured right before the row (2048^3, best of 3, the rank's
// threads) so that ratios compare like with like even when the machine's load changes; the FMA
// peak (register-only loop) is measured once and named in the header.
//
// Correctness ("wrong" column: failed checks of the row, 0 = all pass):
//  - O, LSE and dQ of a sample of query rows (first, last, two inside) against the fp64
//    reference run on just those rows (a row's O, LSE and dQ depend only on that row and all
//    keys), within the tests/README.md policy (2x the naive fp32 reference's error + floor);
//  - dK and dV through identities over all rows: sum_j dV_j = sum over the group's heads and the
//    rows that see a key of dO_i (rows of P sum to 1), and sum_j dK_j = 0 (rows of dS sum to 0).
//
// device=cuda (builds with CTXPAR_WITH_CUDA): the same rows plus the issue-8 goal row (S = 16K,
// 32/8, D = 128, causal) on this rank's GPU with the kernels of kernels/cuda (bf16 inputs, fp32
// accumulation): times from CUDA events, TFLOP/s with the same FLOP convention, a cuBLASLt bf16
// GEMM (8192^3) in place of sgemm, and a #wrong column under the bf16 policy of
// tests/gpu/test_cuda_ops.cpp (fp64 reference on the fp32 inputs, naive fp32 on the bf16 inputs):
// O, LSE, dQ of sampled query rows and dK, dV of sampled key rows (a key's dK/dV depends on all
// rows and that key, so the reference runs on just those keys).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "core/config.hpp"
#include "core/memory.hpp"
#include "core/random.hpp"
#include "dist/topology.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "ref/attn_ref.hpp"
#include "trace/trace.hpp"

#if defined(CTXPAR_WITH_CUDA)
#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>

#include "cuda/ops_cuda.hpp"
#include "dist/chips.hpp"
#endif

namespace ctxpar {

namespace {

struct Row {
  int64_t S;
  int32_t H_q, H_kv, D;
  MaskKind mask;
  int64_t window;
};

// The configured shape's rows: S = 1K, 2K, ... up to cfg.seq (both devices start with these).
std::vector<Row> configured_rows(const Config& cfg) {
  const MaskKind mask = cfg.mask;
  std::vector<Row> rows;
  for (int64_t S = 1024; S <= std::max<int64_t>(cfg.seq, 1024); S *= 2)
    rows.push_back({S, int32_t(cfg.heads), int32_t(cfg.kv_heads), int32_t(cfg.head_dim), mask, cfg.window});
  return rows;
}

// AttnParams with a row's shape and mask over positions `pos` (0 … S-1); no tensors set.
AttnParams row_params(const Row& row, const int64_t* pos) {
  AttnParams p;
  p.S_q = p.S_k = row.S;
  p.H_q = row.H_q;
  p.H_kv = row.H_kv;
  p.D = row.D;
  p.q_pos = p.k_pos = pos;
  p.mask = row.mask;
  p.window = row.window;
  return p;
}

// Timed iterations of a row: as many as fit in `budget_s` after a warm-up of `warm_s`, at least
// one and at most `max_iters`; the same on every rank (the minimum).
int64_t iters_within(Comm& world, double warm_s, double budget_s, int64_t max_iters) {
  double n = std::clamp(std::floor(budget_s / std::max(warm_s, 1e-9)), 1.0, double(max_iters));
  world.all_reduce(std::span<double>(&n, 1), ReduceOp::min);
  return int64_t(n);
}

// One row's results agreed over the ranks (slowest time, slowest GEMM, all failures) and its
// trace step. Times in seconds.
void finish_row(BenchContext& ctx, int64_t& step, int64_t S, double fwd_flops, double bwd_flops, double& fwd_s,
                double& bwd_s, double& gemm, int32_t& wrong, double t_step0_us) {
  Comm& world = ctx.topo.world();
  world.all_reduce(std::span<double>(&fwd_s, 1), ReduceOp::max);
  world.all_reduce(std::span<double>(&bwd_s, 1), ReduceOp::max);
  world.all_reduce(std::span<double>(&gemm, 1), ReduceOp::min);
  world.all_reduce(std::span<int32_t>(&wrong, 1), ReduceOp::sum);
  StepRecord rec;
  rec.step = step++;
  rec.tokens = S;
  rec.model_flops = (fwd_flops + bwd_flops) * world.size();
  rec.time_s = (ctx.tracer.now_us() - t_step0_us) * 1e-6;
  rec.tflops_per_rank = (fwd_flops + bwd_flops) / (fwd_s + bwd_s) / 1e12;
  rec.peak_bytes = mem_peak_bytes();
  ctx.tracer.end_step(rec);
}

const char* mask_name(MaskKind m) {
  return m == MaskKind::none ? "none" : m == MaskKind::causal ? "causal" : "window";
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Large-GEMM rate of this rank (its OpenMP threads), best of 3 after one warm-up.
double sgemm_gflops() {
  const int64_t N = 2048;
  Buffer<float> a(N * N, false), b(N * N, false), c(N * N, true);
  for (int64_t i = 0; i < N * N; ++i) {
    a[i] = uniform_pm1(uint64_t(i) * 2 + 1);
    b[i] = uniform_pm1(uint64_t(i) * 2 + 2);
  }
  sgemm(false, false, N, N, N, 1.f, a.data(), N, b.data(), N, 0.f, c.data(), N);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = seconds_now();
    sgemm(false, false, N, N, N, 1.f, a.data(), N, b.data(), N, 0.f, c.data(), N);
    best = std::min(best, seconds_now() - t0);
  }
  return 2.0 * double(N) * N * N / best / 1e9;
}

double max_abs_err(const float* a, const double* ref, int64_t n) {
  double e = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(ref[i])) return std::numeric_limits<double>::infinity();
    if (std::isinf(ref[i]) || std::isinf(a[i])) {
      if (double(a[i]) != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    e = std::max(e, std::abs(double(a[i]) - ref[i]));
  }
  return e;
}

// The tests/README.md policy: fast error <= 2 x naive fp32 error + floor * 1e-6 * max(1, |ref|).
bool within_policy(const float* fast, const float* naive, const double* ref, int64_t n, double floor_factor) {
  double mag = 1;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(ref[i])) mag = std::max(mag, std::abs(ref[i]));
  const double e_naive = max_abs_err(naive, ref, n);
  if (!std::isfinite(e_naive)) return false;
  return max_abs_err(fast, ref, n) <= 2.0 * e_naive + floor_factor * 1e-6 * mag;
}

// Checks of one row (see the file comment); returns the number that failed.
int check_row(const AttnParams& p, const std::vector<int64_t>& pos) {
  const int64_t S = p.S_q;
  const int32_t H_q = p.H_q, H_kv = p.H_kv, D = p.D, group = H_q / H_kv;
  const float *pq = p.q_as<float>(), *pk = p.k_as<float>(), *pv = p.v_as<float>(), *pdo = p.dout_as<float>();
  int wrong = 0;
  // --- sampled query rows against the reference
  std::vector<int64_t> rows = {0, S / 3, (2 * S) / 3 + 1, S - 1};
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const int64_t n = int64_t(rows.size()), row_elems = int64_t(H_q) * D;
  std::vector<float> q(n * row_elems), o(n * row_elems), d_o(n * row_elems), lse(n * H_q);
  std::vector<int64_t> q_pos(n);
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(pq + rows[r] * row_elems, row_elems, q.begin() + r * row_elems);
    std::copy_n(p.o + rows[r] * row_elems, row_elems, o.begin() + r * row_elems);
    std::copy_n(pdo + rows[r] * row_elems, row_elems, d_o.begin() + r * row_elems);
    std::copy_n(p.lse + rows[r] * H_q, H_q, lse.begin() + r * H_q);
    q_pos[r] = pos[rows[r]];
  }
  AttnParams sub = p;
  sub.S_q = n;
  sub.q_pos = q_pos.data();
  const int64_t nk = p.S_k * H_kv * D;
  const std::vector<double> q64(q.begin(), q.end()), k64(pk, pk + nk), v64(pv, pv + nk),
      o_fast64(o.begin(), o.end()), lse_fast64(lse.begin(), lse.end()), do64(d_o.begin(), d_o.end());
  std::vector<double> o64(n * row_elems), lse64(n * H_q);
  std::vector<float> o32(n * row_elems), lse32(n * H_q);
  ref::attn_fwd<double>(sub, q64.data(), k64.data(), v64.data(), o64.data(), lse64.data());
  ref::attn_fwd<float>(sub, q.data(), pk, pv, o32.data(), lse32.data());
  wrong += !within_policy(o.data(), o32.data(), o64.data(), n * row_elems, 1.0);
  wrong += !within_policy(lse.data(), lse32.data(), lse64.data(), n * H_q, 1.0);
  // dQ of the sampled rows: both references start from the fast forward's O and LSE, as the
  // fast backward did; dK/dV of this partial call are discarded.
  std::vector<double> dq64(n * row_elems), dk_scratch64(nk), dv_scratch64(nk);
  ref::attn_bwd<double>(sub, q64.data(), k64.data(), v64.data(), o_fast64.data(), lse_fast64.data(),
                        do64.data(), dq64.data(), dk_scratch64.data(), dv_scratch64.data());
  std::vector<float> dq32(n * row_elems), dk_scratch(nk), dv_scratch(nk), dq_fast(n * row_elems);
  ref::attn_bwd<float>(sub, q.data(), pk, pv, o.data(), lse.data(), d_o.data(), dq32.data(),
                       dk_scratch.data(), dv_scratch.data());
  for (int64_t r = 0; r < n; ++r) std::copy_n(p.dq + rows[r] * row_elems, row_elems, dq_fast.begin() + r * row_elems);
  wrong += !within_policy(dq_fast.data(), dq32.data(), dq64.data(), n * row_elems, 8.0);
  // --- dV and dK identities over all rows, per (kv head, d)
  std::vector<double> dv_sum(H_kv * D, 0), dv_want(H_kv * D, 0), dv_abs(H_kv * D, 0), dk_sum(H_kv * D, 0),
      dk_abs(H_kv * D, 0);
  for (int64_t j = 0; j < p.S_k; ++j)
    for (int64_t x = 0; x < H_kv * D; ++x) {
      dv_sum[x] += p.dv[j * H_kv * D + x];
      dk_sum[x] += p.dk[j * H_kv * D + x];
      dk_abs[x] += std::abs(p.dk[j * H_kv * D + x]);
    }
  for (int64_t i = 0; i < S; ++i)
    for (int32_t h = 0; h < H_q; ++h) {
      if (p.lse[i * H_q + h] == -INFINITY) continue;
      for (int32_t d = 0; d < D; ++d) {
        const float g = pdo[(i * H_q + h) * D + d];
        dv_want[(h / group) * D + d] += g;
        dv_abs[(h / group) * D + d] += std::abs(g);
      }
    }
  int bad_dv = 0, bad_dk = 0;
  for (int64_t x = 0; x < H_kv * D; ++x) {
    // fp32 sums of S terms: a bound of a few 1e-5 relative to the sum of magnitudes
    bad_dv += std::abs(dv_sum[x] - dv_want[x]) > 1e-4 * dv_abs[x] + 1e-6;
    bad_dk += std::abs(dk_sum[x]) > 1e-4 * dk_abs[x] + 1e-6;
  }
  wrong += bad_dv > 0;
  wrong += bad_dk > 0;
  return wrong;
}

#if defined(CTXPAR_WITH_CUDA)
// ---------------------------------------------------------------------------------------------
// device=cuda

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("bench attn (cuda): ") + what + ": " + cudaGetErrorString(e));
}

// Device array (owning), zero-initialized.
template <class T>
class DevArray {
 public:
  explicit DevArray(size_t n) : n_(n) {
    cuda_ok(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    cuda_ok(cudaMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(T)), "cudaMemset");
  }
  ~DevArray() { cudaFree(p_); }
  DevArray(const DevArray&) = delete;
  DevArray& operator=(const DevArray&) = delete;
  T* get() const { return p_; }
  void upload(const T* h) { cuda_ok(cudaMemcpy(p_, h, n_ * sizeof(T), cudaMemcpyHostToDevice), "upload"); }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    cuda_ok(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  void zero() { cuda_ok(cudaMemset(p_, 0, n_ * sizeof(T)), "cudaMemset"); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

float round_bf16(float x) { return cuda::round_bf16_host(x); }
std::vector<cuda::bf16> bf16_of_rounded(const std::vector<float>& x) {
  std::vector<cuda::bf16> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    r[i] = cuda::bf16(__nv_bfloat16_raw{uint16_t(u >> 16)});
  }
  return r;
}

// Mean milliseconds of `iters` calls of f, from CUDA events on the default stream.
template <class F>
double event_ms(F&& f, int64_t iters) {
  cudaEvent_t e0, e1;
  cuda_ok(cudaEventCreate(&e0), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&e1), "cudaEventCreate");
  cuda_ok(cudaEventRecord(e0), "cudaEventRecord");
  for (int64_t i = 0; i < iters; ++i) f();
  cuda_ok(cudaEventRecord(e1), "cudaEventRecord");
  cuda_ok(cudaEventSynchronize(e1), "kernel execution");
  float ms = 0;
  cuda_ok(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return double(ms) / double(iters);
}

// cuBLASLt bf16 GEMM rate (TFLOP/s), N^3, best of 3 after one warm-up (plan creation).
double gemm_tflops(const DevArray<cuda::bf16>& a, const DevArray<cuda::bf16>& b, DevArray<cuda::bf16>& c, int64_t N) {
  auto run = [&] { cuda::gemm_bf16(false, false, N, N, N, 1.f, a.get(), N, b.get(), N, 0.f, c.get(), N); };
  run();
  double best_ms = 1e30;
  for (int rep = 0; rep < 3; ++rep) best_ms = std::min(best_ms, event_ms(run, 1));
  return 2.0 * double(N) * double(N) * double(N) / (best_ms * 1e-3) / 1e12;
}

// The checks of one row (see the file comment): the fp64 reference on the fp32 inputs, the naive
// fp32 reference on the bf16-rounded inputs, the device result; both references of the backward
// start from the device's O and LSE, as the device backward did. Returns the failed checks.
struct CudaRowData {
  const AttnParams* p;                         // shape, mask, host positions
  std::vector<float> q, k, v, dout;            // fp32 inputs
  std::vector<float> qr, kr, vr, dor;          // the same rounded to bf16 (what the GPU saw)
  std::vector<float> o, lse, dq, dk, dv;       // device results
};

int check_row_cuda(const CudaRowData& r, const std::vector<int64_t>& pos) {
  const AttnParams& p = *r.p;
  const int64_t S = p.S_q, qw = int64_t(p.H_q) * p.D, kw = int64_t(p.H_kv) * p.D;
  std::vector<int64_t> rows = {0, S / 3, (2 * S) / 3 + 1, S - 1}, keys = {0, S / 2 + 1, S - 1};
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  const int64_t nr = int64_t(rows.size()), nk = int64_t(keys.size());
  // shared read-only double copies for the fp64 reference
  const std::vector<double> q64(r.q.begin(), r.q.end()), k64(r.k.begin(), r.k.end()), v64(r.v.begin(), r.v.end()),
      do64(r.dout.begin(), r.dout.end()), o_dev64(r.o.begin(), r.o.end()), lse_dev64(r.lse.begin(), r.lse.end());
  // outputs per sampled row / key: [fp64 | naive fp32] references
  std::vector<double> o64(nr * qw), lse64(nr * p.H_q), dq64(nr * qw), dk64(nk * kw), dv64(nk * kw);
  std::vector<float> o32(nr * qw), lse32(nr * p.H_q), dq32(nr * qw), dk32(nk * kw), dv32(nk * kw);
  // Independent reference computations (each serial): spread over the rank's threads.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < 2 * (nr + nk); ++task) {
    const bool f64 = task % 2 == 0;
    const int64_t t = task / 2;
    if (t < nr) {  // query row i: O, LSE (own forward), dQ (from the device's O and LSE)
      const int64_t i = rows[size_t(t)];
      AttnParams sub = p;
      sub.S_q = 1;
      sub.q_pos = &pos[size_t(i)];
      if (f64) {
        std::vector<double> dk_s(p.S_k * kw), dv_s(p.S_k * kw);
        ref::attn_fwd<double>(sub, &q64[i * qw], k64.data(), v64.data(), &o64[t * qw], &lse64[t * p.H_q]);
        ref::attn_bwd<double>(sub, &q64[i * qw], k64.data(), v64.data(), &o_dev64[i * qw], &lse_dev64[i * p.H_q],
                              &do64[i * qw], &dq64[t * qw], dk_s.data(), dv_s.data());
      } else {
        std::vector<float> dk_s(p.S_k * kw), dv_s(p.S_k * kw);
        ref::attn_fwd<float>(sub, &r.qr[i * qw], r.kr.data(), r.vr.data(), &o32[t * qw], &lse32[t * p.H_q]);
        ref::attn_bwd<float>(sub, &r.qr[i * qw], r.kr.data(), r.vr.data(), &r.o[i * qw], &r.lse[i * p.H_q],
                             &r.dor[i * qw], &dq32[t * qw], dk_s.data(), dv_s.data());
      }
    } else {  // key j: dK, dV over all query rows
      const int64_t u = t - nr, j = keys[size_t(u)];
      AttnParams sub = p;
      sub.S_k = 1;
      sub.k_pos = &pos[size_t(j)];
      if (f64) {
        std::vector<double> dq_s(S * qw);
        ref::attn_bwd<double>(sub, q64.data(), &k64[j * kw], &v64[j * kw], o_dev64.data(), lse_dev64.data(),
                              do64.data(), dq_s.data(), &dk64[u * kw], &dv64[u * kw]);
      } else {
        std::vector<float> dq_s(S * qw);
        ref::attn_bwd<float>(sub, r.qr.data(), &r.kr[j * kw], &r.vr[j * kw], r.o.data(), r.lse.data(), r.dor.data(),
                             dq_s.data(), &dk32[u * kw], &dv32[u * kw]);
      }
    }
  }
  auto gather = [](const std::vector<float>& x, const std::vector<int64_t>& idx, int64_t w) {
    std::vector<float> g(idx.size() * size_t(w));
    for (size_t a = 0; a < idx.size(); ++a) std::copy_n(x.begin() + idx[a] * w, w, g.begin() + int64_t(a) * w);
    return g;
  };
  int wrong = 0;
  wrong += !within_policy(gather(r.o, rows, qw).data(), o32.data(), o64.data(), nr * qw, 1.0);
  wrong += !within_policy(gather(r.lse, rows, p.H_q).data(), lse32.data(), lse64.data(), nr * p.H_q, 1.0);
  wrong += !within_policy(gather(r.dq, rows, qw).data(), dq32.data(), dq64.data(), nr * qw, 8.0);
  wrong += !within_policy(gather(r.dk, keys, kw).data(), dk32.data(), dk64.data(), nk * kw, 8.0);
  wrong += !within_policy(gather(r.dv, keys, kw).data(), dv32.data(), dv64.data(), nk * kw, 1.0);
  return wrong;
}

int bench_attn_cuda(BenchContext& ctx) {
  const Config& cfg = ctx.cfg;
  Comm& world = ctx.topo.world();
  const int device = select_device(ctx.topo.local_rank(), ctx.topo.local_size());
  const std::string dev_name = cuda::device_description();

  std::vector<Row> rows = configured_rows(cfg);
  rows.push_back({8192, 32, 8, 64, MaskKind::causal, 0});      // D = 64
  rows.push_back({8192, 32, 1, 128, MaskKind::causal, 0});     // MQA
  rows.push_back({4096, 32, 8, 128, MaskKind::none, 0});       // no mask (full square)
  rows.push_back({16384, 32, 8, 128, MaskKind::window, 1024}); // sliding window
  rows.push_back({8192, 32, 8, 128, MaskKind::causal, 0});     // the CPU headline row
  rows.push_back({16384, 32, 8, 128, MaskKind::causal, 0});    // issue 8 performance goal row
  constexpr int64_t kGemmN = 8192;
  constexpr double kGoalFwd = 450, kGoalBwd = 300, kGoalGemm = 650;  // TFLOP/s, issue 8 (one H200)

  Table table(
      "ctxpar bench attn — CUDA flash attention (bf16 in, fp32 accumulate; " + dev_name + ", " +
          std::to_string(world.size()) + " rank(s) running at once)",
      {{"S", "S", "tokens", 7, 0}, {"H_q", "H_q", "", 5, 0}, {"H_kv", "H_kv", "", 5, 0}, {"D", "D", "", 5, 0},
       {"mask", "mask", "", 8, 0}, {"fwd_ms", "fwd", "ms", 10, 3}, {"bwd_ms", "bwd", "ms", 10, 3},
       {"fwd_tflops", "fwd", "TFLOP/s", 9, 1}, {"bwd_tflops", "bwd", "TFLOP/s", 9, 1},
       {"gemm_tflops", "gemm", "TFLOP/s", 9, 1}, {"fwd_vs_gemm", "fwd/gemm", "", 9, 2},
       {"bwd_vs_gemm", "bwd/gemm", "", 9, 2}, {"wrong", "#wrong", "", 7, 0}},
      {std::string("FLOP convention: ") + kFlopConvention,
       std::string("gemm: ") + cuda::gemm_library_name() + ", bf16 in/out, fp32 accumulate, " +
           std::to_string(kGemmN) + "^3, best of 3, measured before each row",
       "time: CUDA events, mean of the timed iterations after one warm-up, max over ranks; device " +
           std::to_string(device) + " of rank 0",
       "#wrong: failed checks against kernels/ref under the bf16 policy (sampled query rows: O, LSE, dQ; "
       "sampled keys: dK, dV)"});

  DevArray<cuda::bf16> ga(size_t(kGemmN * kGemmN)), gb(size_t(kGemmN * kGemmN)), gc(size_t(kGemmN * kGemmN));
  {
    std::vector<float> h(size_t(kGemmN * kGemmN));
    for (size_t i = 0; i < h.size(); ++i) h[i] = round_bf16(uniform_pm1(uint64_t(i) * 2 + 1));
    ga.upload(bf16_of_rounded(h).data());
    for (size_t i = 0; i < h.size(); ++i) h[i] = round_bf16(uniform_pm1(uint64_t(i) * 2 + 2));
    gb.upload(bf16_of_rounded(h).data());
  }

  int wrong_total = 0;
  int64_t step = 0;
  double goal_fwd = 0, goal_bwd = 0, goal_gemm = 0;
  for (const Row& row : rows) {
    if (ctx.tracer.stop_signal() != 0) break;  // a stop signal: report the rows measured so far
    ctx.tracer.begin_step(step);
    const double t_step0 = ctx.tracer.now_us();
    const int64_t S = row.S, nq = S * row.H_q * row.D, nk = S * row.H_kv * row.D;
    std::vector<int64_t> pos(S);
    for (int64_t i = 0; i < S; ++i) pos[i] = i;
    CudaRowData rd;
    rd.q.resize(nq);
    rd.k.resize(nk);
    rd.v.resize(nk);
    rd.dout.resize(nq);
    fill_rows(uint64_t(cfg.seed), 1, pos, row.H_q * row.D, 1.f, rd.q.data());
    fill_rows(uint64_t(cfg.seed), 2, pos, row.H_kv * row.D, 1.f, rd.k.data());
    fill_rows(uint64_t(cfg.seed), 3, pos, row.H_kv * row.D, 1.f, rd.v.data());
    fill_rows(uint64_t(cfg.seed), 4, pos, row.H_q * row.D, 1.f, rd.dout.data());
    auto round_all = [](const std::vector<float>& x) {
      std::vector<float> y(x.size());
      for (size_t i = 0; i < x.size(); ++i) y[i] = round_bf16(x[i]);
      return y;
    };
    rd.qr = round_all(rd.q);
    rd.kr = round_all(rd.k);
    rd.vr = round_all(rd.v);
    rd.dor = round_all(rd.dout);
    DevArray<cuda::bf16> q(nq), k(nk), v(nk), dout(nq);
    DevArray<float> o(nq), lse(S * row.H_q), dq(nq), dk(nk), dv(nk);
    DevArray<int64_t> dpos(S);
    q.upload(bf16_of_rounded(rd.qr).data());
    k.upload(bf16_of_rounded(rd.kr).data());
    v.upload(bf16_of_rounded(rd.vr).data());
    dout.upload(bf16_of_rounded(rd.dor).data());
    dpos.upload(pos.data());

    const AttnParams p = row_params(row, pos.data());  // host view: shape, mask, positions (FLOP count and references)
    AttnParams a = p;  // the device call: bf16 tensors and positions on the GPU
    a.device = Device::cuda;
    a.dtype = DType::bf16;
    a.q = q.get();
    a.k = k.get();
    a.v = v.get();
    a.o = o.get();
    a.lse = lse.get();
    a.dout = dout.get();
    a.dq = dq.get();
    a.dk = dk.get();
    a.dv = dv.get();
    a.q_pos = a.k_pos = dpos.get();
    const double pairs = double(visible_pairs(p));
    const double fwd_flops = attn_fwd_flops(pairs, row.H_q, row.D), bwd_flops = attn_bwd_flops(pairs, row.H_q, row.D);

    world.barrier();
    double gemm = gemm_tflops(ga, gb, gc, kGemmN);
    // warm-up calls (zeroed gradients) give the results that are checked
    world.barrier();
    const double fwd_warm_ms = event_ms([&] { attn_fwd(a); }, 1);
    const double bwd_warm_ms = event_ms([&] { attn_bwd(a); }, 1);
    rd.p = &p;
    rd.o = o.download();
    rd.lse = lse.download();
    rd.dq = dq.download();
    rd.dk = dk.download();
    rd.dv = dv.download();
    int32_t wrong = check_row_cuda(rd, pos);
    // Timed iterations: as many as fit in ~1 s, at most bench_iters.
    const int64_t fwd_iters = iters_within(world, fwd_warm_ms * 1e-3, 1.0, cfg.bench_iters);
    const int64_t bwd_iters = iters_within(world, bwd_warm_ms * 1e-3, 1.0, cfg.bench_iters);
    world.barrier();
    double tb = ctx.tracer.now_us();
    double fwd_ms = event_ms([&] { attn_fwd(a); }, fwd_iters);
    ctx.tracer.add_span(Phase::attn_fwd, -1, -1, tb, ctx.tracer.now_us(), fwd_flops * double(fwd_iters));
    world.barrier();
    tb = ctx.tracer.now_us();
    double bwd_ms = event_ms([&] { attn_bwd(a); }, bwd_iters);  // accumulates; values unused
    ctx.tracer.add_span(Phase::attn_bwd, -1, -1, tb, ctx.tracer.now_us(), bwd_flops * double(bwd_iters));

    double fwd_s = fwd_ms * 1e-3, bwd_s = bwd_ms * 1e-3;
    finish_row(ctx, step, S, fwd_flops, bwd_flops, fwd_s, bwd_s, gemm, wrong, t_step0);
    wrong_total += wrong;
    const double fwd_tf = fwd_flops / fwd_s / 1e12, bwd_tf = bwd_flops / bwd_s / 1e12;
    if (row.S == 16384 && row.H_q == 32 && row.H_kv == 8 && row.D == 128 && row.mask == MaskKind::causal) {
      goal_fwd = fwd_tf;
      goal_bwd = bwd_tf;
      goal_gemm = gemm;
    }
    table.add_row({std::to_string(S), std::to_string(row.H_q), std::to_string(row.H_kv), std::to_string(row.D),
                   mask_name(row.mask), table.cell(5, fwd_s * 1e3), table.cell(6, bwd_s * 1e3), table.cell(7, fwd_tf),
                   table.cell(8, bwd_tf), table.cell(9, gemm), table.cell(10, fwd_tf / gemm),
                   table.cell(11, bwd_tf / gemm), std::to_string(wrong)});
  }
  if (world.rank() == 0) {
    print_table(table, ctx);
    // Performance against the goal is reported, not counted as wrong (#wrong is correctness).
    const bool met = goal_fwd >= kGoalFwd && goal_bwd >= kGoalBwd && goal_gemm >= kGoalGemm;
    if (!cfg.csv)
      std::printf("performance goal (issue 8, one H200; S=16K, 32/8, D=128, causal): fwd %.1f / %.0f, bwd %.1f / %.0f, "
                  "gemm %.1f / %.0f TFLOP/s: %s\n",
                  goal_fwd, kGoalFwd, goal_bwd, kGoalBwd, goal_gemm, kGoalGemm, met ? "met" : "NOT met");
  }
  print_verdict("bench attn (cuda)", wrong_total, cfg.csv);
  return wrong_total;
}
#endif  // CTXPAR_WITH_CUDA

}  // namespace

double bench_attn_memory(const Config& cfg, Topology&) {
  // The largest row of the CPU bench: q, o, dout, dq [S, H_q, D] and lse; k, v, dk, dv [S, H_kv, D]
  // and the checks' float and double scratch of k's size; the 2048^3 sgemm's three matrices.
  const int64_t S = std::max<int64_t>(cfg.seq, 8192);
  const double h_q = double(std::max<int64_t>(cfg.heads, 32)), h_kv = double(std::max<int64_t>(cfg.kv_heads, 8));
  const double d = double(std::max<int64_t>(cfg.head_dim, 128));
  return 4.0 * double(S) * (4 * h_q * d + h_q + 4 * h_kv * d) + 24.0 * double(S) * h_kv * d + 3.0 * 4 * 2048.0 * 2048.0;
}

double bench_attn_device_memory(const Config& cfg, Topology&) {
  // The CUDA bench's largest row (S up to max(seq, 16K); 32/8 heads, D = 128 in the fixed rows):
  // bf16 q, k, v, dout; fp32 o, lse, dq, dk, dv; and the 8192^2 bf16 GEMM with its fp32 output.
  const double S = double(std::max<int64_t>(cfg.seq, 16384));
  const double h_q = double(std::max<int64_t>(cfg.heads, 32)), h_kv = double(std::max<int64_t>(cfg.kv_heads, 8));
  const double d = double(std::max<int64_t>(cfg.head_dim, 128));
  return S * (h_q * d * (2 * 2 + 4 * 2) + h_q * 4 + h_kv * d * (2 * 2 + 4 * 2)) + 8192.0 * 8192.0 * (2 + 2 + 4);
}

int bench_attn(BenchContext& ctx) {
#if defined(CTXPAR_WITH_CUDA)
  if (ctx.cfg.device == Device::cuda) return bench_attn_cuda(ctx);
#endif
  const Config& cfg = ctx.cfg;
  Comm& world = ctx.topo.world();
  const int threads = cfg.threads > 0 ? int(cfg.threads) : omp_get_max_threads();

  std::vector<Row> rows = configured_rows(cfg);
  rows.push_back({4096, 32, 8, 64, MaskKind::causal, 0});    // D = 64
  rows.push_back({4096, 32, 1, 128, MaskKind::causal, 0});   // MQA
  rows.push_back({2048, 32, 8, 128, MaskKind::none, 0});     // no mask (full square)
  rows.push_back({8192, 32, 8, 128, MaskKind::window, 1024});  // sliding window
  rows.push_back({8192, 32, 8, 128, MaskKind::causal, 0});   // headline

  const FmaPeak fp = measure_fma_peak(ctx, threads);
  const double peak = fp.gflops;
  Table table(
      "ctxpar bench attn — CPU flash attention (fp32, " + std::to_string(threads) + " threads per rank, " +
          std::to_string(world.size()) + " rank(s) running at once)",
      {{"S", "S", "tokens", 7, 0}, {"H_q", "H_q", "", 5, 0}, {"H_kv", "H_kv", "", 5, 0}, {"D", "D", "", 5, 0},
       {"mask", "mask", "", 8, 0}, {"fwd_ms", "fwd", "ms", 10, 2}, {"bwd_ms", "bwd", "ms", 10, 2},
       {"fwd_gflops", "fwd", "GFLOP/s", 9, 1}, {"bwd_gflops", "bwd", "GFLOP/s", 9, 1},
       {"sgemm_gflops", "sgemm", "GFLOP/s", 9, 1}, {"fwd_vs_sgemm", "fwd/gemm", "", 9, 2},
       {"bwd_vs_sgemm", "bwd/gemm", "", 9, 2}, {"sgemm_vs_peak", "gemm/pk", "", 8, 2},
       {"wrong", "#wrong", "", 7, 0}},
      {std::string("FLOP convention: ") + kFlopConvention,
       "fma peak (measured, register-only " + std::string(fp.isa_name) + " FMA loop, " +
           std::to_string(fp.vector_bits) + "-bit vectors, " + std::to_string(threads) +
           " threads): " + std::to_string(int(peak + 0.5)) + " GFLOP/s per rank",
       std::string("sgemm: ") + blas_name() + ", 2048^3, best of 3, measured before each row",
       "time: mean of the timed iterations after one warm-up, max over ranks; window rows: window = 1024",
       "#wrong: failed checks against kernels/ref (sampled rows: O, LSE, dQ; all rows: dK, dV sums)"});

  Table breakdown(
      "where the time goes — shares of the kernel's thread time in one more call per row (rank 0), "
      "measured by the kernel itself (AttnProfile)",
      {{"S", "S", "tokens", 7, 0}, {"H_q", "H_q", "", 5, 0}, {"H_kv", "H_kv", "", 5, 0}, {"D", "D", "", 5, 0},
       {"mask", "mask", "", 8, 0}, {"pass", "pass", "", 5, 0}, {"gemm_pct", "gemm", "%", 6, 1},
       {"softmax_pct", "softmax", "%", 8, 1}, {"mask_pct", "mask", "%", 6, 1}, {"transpose_pct", "transp", "%", 7, 1},
       {"pack_pct", "pack", "%", 6, 1}, {"dq_order_pct", "dQ-order", "%", 9, 1}, {"idle_pct", "idle", "%", 6, 1},
       {"rest_pct", "rest", "%", 6, 1}, {"tile_gemm_gflops", "in-gemm", "GFLOP/s", 9, 1},
       {"tile_gemm_vs_peak", "gemm/pk", "", 8, 2}, {"overhead_pct", "overhead", "%", 9, 1}},
      {"gemm: the tile GEMMs (fwd: S = QK^T, O += PV; bwd: S, dP, dV, dK, dQ); softmax: fwd online softmax and "
       "O rescale, bwd P and dS from LSE; mask: per-element masks of partial tiles; transp: bwd P^T, dS^T; "
       "pack: operand packing (bwd: with lse2, D_i); dQ-order: dQ added in key-tile order (adds and waits); "
       "idle: waiting for other threads at the end; rest: task set-up, epilogues, scheduling",
       "in-gemm: the tile GEMMs' FLOPs (2 D per computed pair per GEMM: tile area, padding columns excluded) "
       "over their own time per thread: the micro-kernel's rate while it runs; gemm/pk against the FMA peak",
       "overhead: the profiled call's time against the timed mean (noise included)"});
  int wrong_total = 0;
  int64_t step = 0;
  for (const Row& row : rows) {
    if (ctx.tracer.stop_signal() != 0) break;  // a stop signal: report the rows measured so far
    ctx.tracer.begin_step(step);
    const double t_step0 = ctx.tracer.now_us();
    const int64_t S = row.S, nq = S * row.H_q * row.D, nk = S * row.H_kv * row.D;
    Buffer<float> q(nq, false), k(nk, false), v(nk, false), dout(nq, false), o(nq), lse(S * row.H_q),
        dq(nq), dk(nk), dv(nk);
    std::vector<int64_t> pos(S);
    for (int64_t i = 0; i < S; ++i) pos[i] = i;
    fill_rows(uint64_t(cfg.seed), 1, pos, row.H_q * row.D, 1.f, q.data());
    fill_rows(uint64_t(cfg.seed), 2, pos, row.H_kv * row.D, 1.f, k.data());
    fill_rows(uint64_t(cfg.seed), 3, pos, row.H_kv * row.D, 1.f, v.data());
    fill_rows(uint64_t(cfg.seed), 4, pos, row.H_q * row.D, 1.f, dout.data());
    AttnParams p = row_params(row, pos.data());
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.o = o.data();
    p.lse = lse.data();
    p.dout = dout.data();
    p.dq = dq.data();
    p.dk = dk.data();
    p.dv = dv.data();
    p.threads = threads;
    const double pairs = double(visible_pairs(p));
    const double fwd_flops = attn_fwd_flops(pairs, row.H_q, row.D), bwd_flops = attn_bwd_flops(pairs, row.H_q, row.D);

    world.barrier();
    double gemm = sgemm_gflops();
    // warm-up calls (zeroed gradients) give the results that are checked
    world.barrier();
    double t0 = seconds_now();
    attn_fwd(p);
    const double fwd_warm_s = seconds_now() - t0;
    t0 = seconds_now();
    attn_bwd(p);
    const double bwd_warm_s = seconds_now() - t0;
    int32_t wrong = check_row(p, pos);
    // Timed iterations: as many as fit in ~2 s, at most bench_iters (long rows run once).
    const int64_t fwd_iters = iters_within(world, fwd_warm_s, 2.0, cfg.bench_iters);
    const int64_t bwd_iters = iters_within(world, bwd_warm_s, 2.0, cfg.bench_iters);
    world.barrier();
    double tb = ctx.tracer.now_us();
    t0 = seconds_now();
    for (int64_t it = 0; it < fwd_iters; ++it) attn_fwd(p);
    double fwd_s = (seconds_now() - t0) / double(fwd_iters);
    ctx.tracer.add_span(Phase::attn_fwd, -1, -1, tb, ctx.tracer.now_us(), fwd_flops * double(fwd_iters));
    world.barrier();
    tb = ctx.tracer.now_us();
    t0 = seconds_now();
    for (int64_t it = 0; it < bwd_iters; ++it) attn_bwd(p);  // accumulates; values unused
    double bwd_s = (seconds_now() - t0) / double(bwd_iters);
    ctx.tracer.add_span(Phase::attn_bwd, -1, -1, tb, ctx.tracer.now_us(), bwd_flops * double(bwd_iters));

    // One more call of each with the kernel's own time breakdown (outside the timed mean; its
    // time against the mean is the overhead column).
    AttnProfile prof[2];
    AttnStats work[2];
    double prof_s[2];
    for (int pass = 0; pass < 2; ++pass) {
      p.profile = &prof[pass];
      p.stats = &work[pass];
      world.barrier();
      t0 = seconds_now();
      if (pass == 0) attn_fwd(p);
      else attn_bwd(p);
      prof_s[pass] = seconds_now() - t0;
    }
    p.profile = nullptr;
    p.stats = nullptr;

    finish_row(ctx, step, S, fwd_flops, bwd_flops, fwd_s, bwd_s, gemm, wrong, t_step0);
    wrong_total += wrong;
    for (int pass = 0; pass < 2; ++pass) {
      const AttnProfile& f = prof[pass];
      auto share = [&](double x) { return breakdown.cell(7, 100.0 * x / f.total); };
      // tile-GEMM FLOPs actually run: 2 GEMMs of 2 D FLOP per computed pair forward, 5 backward
      const double tile_flops = (pass == 0 ? 4.0 : 10.0) * double(work[pass].pairs_computed) * row.D;
      const double tile_gf = tile_flops / (f.gemm / threads) / 1e9;
      breakdown.add_row({std::to_string(S), std::to_string(row.H_q), std::to_string(row.H_kv), std::to_string(row.D),
                         mask_name(row.mask), pass == 0 ? "fwd" : "bwd", share(f.gemm), share(f.softmax),
                         share(f.mask), share(f.transpose), share(f.pack), share(f.dq_order), share(f.idle),
                         share(f.rest()), breakdown.cell(14, tile_gf), breakdown.cell(15, tile_gf / peak),
                         breakdown.cell(16, 100.0 * (prof_s[pass] / (pass == 0 ? fwd_s : bwd_s) - 1.0))});
    }
    const double fwd_gf = fwd_flops / fwd_s / 1e9, bwd_gf = bwd_flops / bwd_s / 1e9;
    table.add_row({std::to_string(S), std::to_string(row.H_q), std::to_string(row.H_kv), std::to_string(row.D),
                   mask_name(row.mask), table.cell(5, fwd_s * 1e3), table.cell(6, bwd_s * 1e3),
                   table.cell(7, fwd_gf), table.cell(8, bwd_gf), table.cell(9, gemm), table.cell(10, fwd_gf / gemm),
                   table.cell(11, bwd_gf / gemm), table.cell(12, gemm / peak), std::to_string(wrong)});
  }
  if (world.rank() == 0) {
    print_table(table, ctx);
    print_table(breakdown, ctx);
  }
  print_verdict("bench attn", wrong_total, cfg.csv);
  return wrong_total;
}

}  // namespace ctxpar
