#include "infer/cost.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "core/config.hpp"
#include "core/memory.hpp"
#include "core/random.hpp"
#include "dist/comm.hpp"
#include "model/flops.hpp"
#include "ops.hpp"

namespace ctxpar::infer {

const char* algo_name(CpAlgo a) { return a == CpAlgo::pass_kv ? "pass_kv" : "pass_q"; }

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// The paper's closed-form rules (Eq. 1, Eq. 5, App. D) for one call, next to the model's choice.
void paper_rules(const AttnCall& c, double C, double BW, double e, Prediction& pr) {
  const double T = double(c.T), P = double(c.P), N = double(c.N), miss = T / (T + P);
  pr.eq1_pass_kv = miss >= 2.0 * c.H_kv / c.H_q;
  pr.eq5_pass_q = miss <= 2.0 * c.H_kv / c.H_q - 4 * T * BW / (N * C * e);
  pr.fitted_pass_kv = -1.059 * std::log(T) + 1.145 * std::log(miss) + 12.112 > 0;
}
}  // namespace

HwProfile measure_profile(Comm& cp, int32_t H_q, int32_t H_kv, int32_t D) {
  HwProfile hw;
  hw.name = "measured";
  hw.elem_bytes = sizeof(float);
  hw.overlap = false;  // CPU ranks: MPI's shared-memory copies run on the compute cores
  // C: 256 queries after 4K cached keys (the shape of a partial prefill block), best of 3.
  const int64_t S_q = 256, S_k = 4096;
  Buffer<float> q(size_t(S_q) * H_q * D, false), k(size_t(S_k) * H_kv * D, false), v(size_t(S_k) * H_kv * D, false);
  Buffer<float> o(size_t(S_q) * H_q * D, false), lse(size_t(S_q) * H_q, false);
  std::vector<int64_t> qp(static_cast<size_t>(S_q)), kp(static_cast<size_t>(S_k));
  for (int64_t i = 0; i < S_k; ++i) kp[size_t(i)] = i;
  for (int64_t i = 0; i < S_q; ++i) qp[size_t(i)] = S_k - S_q + i;
  fill_rows(7, 1, qp, int64_t(H_q) * D, 1.0f, q.data());
  fill_rows(7, 2, kp, int64_t(H_kv) * D, 1.0f, k.data());
  fill_rows(7, 3, kp, int64_t(H_kv) * D, 1.0f, v.data());
  AttnParams p;
  p.q = q.data(); p.k = k.data(); p.v = v.data(); p.o = o.data(); p.lse = lse.data();
  p.S_q = S_q; p.S_k = S_k; p.H_q = H_q; p.H_kv = H_kv; p.D = D;
  p.q_pos = qp.data(); p.k_pos = kp.data();
  const double flops = attn_fwd_flops(double(visible_pairs(p)), H_q, D);
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 3; ++i) {
    const double t0 = now_s();
    attn_fwd(p);
    best = std::min(best, now_s() - t0);
  }
  double rate[3] = {flops / best, 0, 0}, lat = 0;
  // BW and latency: ring exchanges (send to r+1, receive from r-1) of 8 B and 4 MiB, best of 5.
  const int N = cp.size(), r = cp.rank();
  if (N > 1) {
    auto xchg = [&](size_t bytes) {
      Buffer<std::byte> s(bytes, true), d(bytes, false);
      double t = std::numeric_limits<double>::infinity();
      for (int i = 0; i < 5; ++i) {
        cp.barrier();
        const double t0 = now_s();
        Request req = cp.send_recv_async(s.span(), (r + 1) % N, d.span(), (r + N - 1) % N, 77);
        cp.wait(req);
        t = std::min(t, now_s() - t0);
      }
      return t;
    };
    lat = xchg(8);
    const size_t big = size_t(4) << 20;
    rate[1] = double(big) / std::max(xchg(big) - lat, 1e-9);
    // pass-Q's all-to-all: `big` bytes per destination, best of 3.
    rate[2] = measure_alltoall_rate(cp, big, lat, 3);
  }
  cp.all_reduce(std::span<double>(rate, 3), ReduceOp::min);
  cp.all_reduce(std::span<double>(&lat, 1), ReduceOp::max);
  hw.attn_flops_per_s = rate[0];
  hw.bw_bytes_per_s = N > 1 ? rate[1] : std::numeric_limits<double>::infinity();
  hw.a2a_bytes_per_s = N > 1 ? rate[2] : std::numeric_limits<double>::infinity();
  hw.latency_s = lat;
  return hw;
}

Prediction predict(const AttnCall& c, const HwProfile& hw) {
  Prediction pr;
  const double T = double(c.T), P = double(c.P), N = double(c.N), e = hw.elem_bytes;
  const double Hq = c.H_q, Hkv = c.H_kv, D = c.D;
  const double A = attn_fwd_flops(partial_prefill_pairs(c.T, c.P), Hq, D) / N / hw.attn_flops_per_s;
  const double m_kv = (T + P) / N * (2 * Hkv * D * e + 8);
  const double m_q = T / N * (Hq * D * e + 8);
  const double a2a = (N - 1) / N * T * Hq * (D + 1) * e;
  auto msg = [&](double bytes) { return hw.latency_s + bytes / hw.bw_bytes_per_s; };
  const double a2a_s = hw.latency_s + a2a / (hw.a2a_bytes_per_s > 0 ? hw.a2a_bytes_per_s : hw.bw_bytes_per_s);
  if (c.N == 1) {
    pr.pass_kv_s = pr.pass_q_s = A;
  } else if (hw.overlap) {
    pr.pass_kv_s = A / N + (N - 1) * std::max(A / N, msg(m_kv));
    pr.pass_q_s = A / N + (N - 1) * std::max(A / N, msg(m_q)) + a2a_s;
  } else {
    pr.pass_kv_s = A + (N - 1) * msg(m_kv) + m_kv / hw.bw_bytes_per_s;
    pr.pass_q_s = A + (N - 1) * msg(m_q) + a2a_s;
  }
  pr.pass_kv_s *= double(c.layers);
  pr.pass_q_s *= double(c.layers);
  pr.choice = pr.pass_q_s < pr.pass_kv_s ? CpAlgo::pass_q : CpAlgo::pass_kv;
  paper_rules(c, hw.attn_flops_per_s, hw.bw_bytes_per_s, e, pr);
  return pr;
}

Prediction predict(const AttnCall& c, const ModelShape& m, const HardwareProfile& hw) {
  const PassChoice ch = predict_partial_prefill(m, hw, c.T, c.P, c.N);
  Prediction pr;
  pr.pass_kv_s = ch.pass_kv_s;
  pr.pass_q_s = ch.pass_q_s;
  pr.choice = ch.use_pass_q ? CpAlgo::pass_q : CpAlgo::pass_kv;
  const bool fp32 = hw.default_precision == "fp32" && hw.peak_fp32_flops > 0;
  const double peak = fp32 ? hw.peak_fp32_flops : hw.peak_bf16_flops;
  // The kernel rate of one ring step: T/N query rows against one rank's (P+T)/N keys.
  const double kappa = (double(c.P) + 0.5 * double(c.T)) / double(c.N);
  const double C = peak * hw.attn_eff.at(std::max(1.0, kappa));
  const double BW = c.N <= hw.chips_per_node ? hw.intra.bw_bytes_per_s : hw.inter.bw_bytes_per_s;
  paper_rules(c, C, BW, fp32 ? 4.0 : 2.0, pr);
  return pr;
}

PrefillCostModel::PrefillCostModel(const Config& cfg, Comm& cp) {
  call_.N = cp.size();
  call_.H_q = int32_t(cfg.heads);
  call_.H_kv = int32_t(cfg.kv_heads);
  call_.D = int32_t(cfg.head_dim);
  call_.layers = cfg.layers;
  if (cfg.hw_profile == "measured") {
    hw_ = measure_profile(cp, call_.H_q, call_.H_kv, call_.D);
    return;
  }
  from_file_ = true;
  file_ = load_hardware(cfg.hw_profile);
  shape_ = model_shape(cfg);
  hw_.name = file_.name;
  const bool fp32 = file_.default_precision == "fp32" && file_.peak_fp32_flops > 0;
  hw_.elem_bytes = fp32 ? 4 : 2;
  hw_.attn_flops_per_s = (fp32 ? file_.peak_fp32_flops : file_.peak_bf16_flops) * file_.attn_eff.at(4096);  // ~the measured call: 4K keys per row
  hw_.bw_bytes_per_s = file_.intra.bw_bytes_per_s;
  hw_.latency_s = file_.intra.latency_s;
  hw_.overlap = true;
}

Prediction PrefillCostModel::predict(int64_t T, int64_t P) const {
  AttnCall c = call_;
  c.T = T;
  c.P = P;
  return from_file_ ? infer::predict(c, shape_, file_) : infer::predict(c, hw_);
}

std::string PrefillCostModel::describe() const {
  char b[320];
  if (from_file_) {
    std::snprintf(b, sizeof b, "profile %s (%s): whole-prefill TTFT of both variants by the src/perf cost model",
                  file_.name.c_str(), file_.source_file.c_str());
  } else {
    std::snprintf(b, sizeof b,
                  "measured: attention %.1f GFLOP/s per rank, p2p %.2f GB/s, all-to-all %.2f GB/s, latency %.1f us; "
                  "attention time of all layers, transfers on the compute cores",
                  hw_.attn_flops_per_s / 1e9, hw_.bw_bytes_per_s / 1e9,
                  (hw_.a2a_bytes_per_s > 0 ? hw_.a2a_bytes_per_s : hw_.bw_bytes_per_s) / 1e9, hw_.latency_s * 1e6);
  }
  return b;
}

}  // namespace ctxpar::infer
