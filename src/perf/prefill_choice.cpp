#include "perf/prefill_choice.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "core/config.hpp"
#include "core/memory.hpp"
#include "core/random.hpp"
#include "dist/comm.hpp"
#include "model/flops.hpp"
#include "model/model.hpp"
#include "ops.hpp"
#include "core/clock.hpp"

namespace ctxpar {

const char* algo_name(CpAlgo a) { return a == CpAlgo::pass_kv ? "pass_kv" : "pass_q"; }

namespace {

// The margins of a tie (choice_margin): each model's expected error on the hardware it describes.
// A profile (published, or bench calibrate's): its predicted step times and TTFTs are within 5%
// of our runs at the median on one host, and every point across hosts within 20%
// (papers/local-validation); two predictions of one choice share most of their terms, and 10%
// keeps a choice to differences the validation resolves.
constexpr double kProfileModelError = 0.10;
// hardware=measured on CPU ranks (the attention-only model of a running job, measured at its
// start; on GPUs it takes the profiles' margin, not validated on a GPU yet): in 10
// chats of inputs/chat-tiny.toml with varied schedules on a shared 2-core CPU, its predicted
// pass-Q / pass-KV ratio missed the measured TTFT ratio by 10.5% at the median and 32% at the
// 90th percentile of 21 calls; the measured ratio itself moved 1.5x between rounds
// (docs/measurements.md, "cp_algo=auto against measured chats"). 30%: a choice the model makes
// beyond that is one the measurements could confirm.
constexpr double kMeasuredCpuModelError = 0.30;

bool fp32_profile(const HardwareProfile& hw) { return hw.default_precision == Precision::fp32 && hw.peak_fp32_flops > 0; }
double peak_of(const HardwareProfile& hw) { return fp32_profile(hw) ? hw.peak_fp32_flops : hw.peak_bf16_flops; }
// An attention-only profile's C: the rate at a 4K-key call (measure_hardware times that shape).
double attention_rate(const HardwareProfile& hw) { return peak_of(hw) * hw.attn_eff.at(4096); }

// The paper's closed-form rules (Eq. 1, Eq. 5, App. D) for one call, next to the model's choice.
void paper_rules(const AttnCall& c, double C, double BW, double e, Prediction& pr) {
  const double T = double(c.T), cached = double(c.cached), N = double(c.N), miss = T / (T + cached);
  pr.eq1_pass_kv = miss >= 2.0 * c.H_kv / c.H_q;
  pr.eq5_pass_q = miss <= 2.0 * c.H_kv / c.H_q - 4 * T * BW / (N * C * e);
  pr.fitted_pass_kv = -1.059 * std::log(T) + 1.145 * std::log(miss) + 12.112 > 0;
}

// Attention-only profile: the per-layer ring timeline of the header.
Prediction predict_attention_only(const AttnCall& c, const HardwareProfile& hw) {
  Prediction pr;
  const double N = double(c.N), e = fp32_profile(hw) ? 4.0 : 2.0;
  const double T = double(c.T), cached = double(c.cached), Hq = c.H_q, Hkv = c.H_kv, D = c.D;
  const double C = attention_rate(hw), BW = hw.intra.bw_bytes_per_s, lat = hw.intra.latency_s;
  const double A = attn_fwd_flops(partial_prefill_pairs(c.T, c.cached), Hq, D) / N / C;
  const double m_kv = (T + cached) / N * (2 * Hkv * D * e + 8);
  const double m_q = T / N * (Hq * D * e + 8);
  const double a2a = (N - 1) / N * T * Hq * (D + 1) * e;
  auto msg = [&](double bytes) { return lat + bytes / BW; };
  const double a2a_s = lat + a2a / (hw.intra_alltoall_bytes_per_s > 0 ? hw.intra_alltoall_bytes_per_s : BW);
  if (c.N == 1) {
    pr.pass_kv_s = pr.pass_q_s = A;
  } else if (hw.p2p_overlap) {
    pr.pass_kv_s = A / N + (N - 1) * std::max(A / N, msg(m_kv));
    pr.pass_q_s = A / N + (N - 1) * std::max(A / N, msg(m_q)) + a2a_s;
  } else {
    pr.pass_kv_s = A + (N - 1) * msg(m_kv) + m_kv / BW;
    pr.pass_q_s = A + (N - 1) * msg(m_q) + a2a_s;
  }
  pr.pass_kv_s *= double(c.layers);
  pr.pass_q_s *= double(c.layers);
  paper_rules(c, C, BW, e, pr);
  return pr;
}

}  // namespace

double choice_margin(const HardwareProfile& hw) {
  return hw.attention_only && !hw.p2p_overlap ? kMeasuredCpuModelError : kProfileModelError;
}

std::string choice_text(const Prediction& p) {
  const double lo = std::min(p.pass_kv_s, p.pass_q_s), hi = std::max(p.pass_kv_s, p.pass_q_s);
  char b[160];
  if (p.tie)
    std::snprintf(b, sizeof b, "model: a tie, %.1f%% apart, within its %.0f%% error here; pass_kv, the default",
                  lo > 0 ? 100 * (hi / lo - 1) : 0.0, 100 * p.margin);
  else
    std::snprintf(b, sizeof b, "model: %s %.2fx faster, beyond its %.0f%% error here", algo_name(p.choice), hi / lo,
                  100 * p.margin);
  return b;
}

Prediction predict_prefill(const AttnCall& c, const ModelShape& m, const HardwareProfile& hw) {
  Prediction pr;
  if (hw.attention_only) {
    pr = predict_attention_only(c, hw);
  } else {
    const PassChoice ch = predict_partial_prefill(m, hw, c.T, c.cached, c.N);
    pr.pass_kv_s = ch.pass_kv_s;
    pr.pass_q_s = ch.pass_q_s;
    // The kernel rate of one ring step: T/N query rows against one rank's (P+T)/N keys.
    const double kappa = (double(c.cached) + 0.5 * double(c.T)) / double(c.N);
    const double C = peak_of(hw) * hw.attn_eff.at(std::max(1.0, kappa));
    const double BW = c.N <= hw.chips_per_node ? hw.intra.bw_bytes_per_s : hw.inter.bw_bytes_per_s;
    paper_rules(c, C, BW, fp32_profile(hw) ? 4.0 : 2.0, pr);
  }
  pr.margin = choice_margin(hw);
  pr.tie = std::abs(pr.pass_q_s - pr.pass_kv_s) <= pr.margin * std::min(pr.pass_q_s, pr.pass_kv_s);
  pr.choice = !pr.tie && pr.pass_q_s < pr.pass_kv_s ? CpAlgo::pass_q : CpAlgo::pass_kv;
  return pr;
}

namespace {
// measure_hardware's shapes: the attention probe's query and key rows, the links' large message.
constexpr int64_t kProbeQ = 256, kProbeK = 4096;
constexpr size_t kProbeBig = size_t(4) << 20;
}  // namespace

MeasureBytes measure_hardware_bytes(int N, int32_t H_q, int32_t H_kv, int32_t D, Device dev) {
  const double f = sizeof(float), q = double(kProbeQ) * H_q * D, kv = double(kProbeK) * H_kv * D;
  const double rows = f * (q + 2 * kv);                    // q, k, v in fp32 on the host
  const double out = f * (q + double(kProbeQ) * H_q);     // o and lse where the kernel runs
  const double gpu_in = (f + 2.0) * (q + 2 * kv) + 8.0 * double(kProbeQ + kProbeK);  // uploaded, bf16, positions
  // the ring exchange's pair of buffers and the all-to-all's send and receive of N parts (one after
  // the other: counted together, an upper bound)
  const double links = N > 1 ? 2.0 * double(kProbeBig) * (1.0 + double(N)) : 0.0;
  MeasureBytes b;
  if (dev == Device::cpu) {
    b.host = rows + out + links;
  } else {
    b.host = rows;
    b.device = out + gpu_in + links;
  }
  return b;
}

HardwareProfile measure_hardware(Comm& cp, int32_t H_q, int32_t H_kv, int32_t D, Device dev) {
  const bool gpu = dev != Device::cpu;
  const Stream st = gpu ? cp.compute_stream() : nullptr;
  HardwareProfile hw;
  hw.name = "measured";
  hw.description = gpu ? "this job's GPUs, measured at start (bf16 attention rate and device links)"
                       : "this job's ranks, measured at start (attention rate and links)";
  hw.attention_only = true;
  // CPU ranks: MPI's shared-memory copies run on the compute cores. GPUs: the transfers run on a
  // communication stream (NCCL) or the host (staged MPI) while the kernels compute.
  hw.p2p_overlap = gpu;
  hw.default_precision = gpu ? Precision::bf16 : Precision::fp32;
  hw.chips_per_node = cp.size();
  // C: 256 queries after 4K cached keys (the shape of a partial prefill block), best of 3 after a
  // warmup; on a GPU its bf16 kernel on device buffers, timed to the stream's end.
  const int64_t S_q = kProbeQ, S_k = kProbeK;
  Buffer<float> q(size_t(S_q) * H_q * D, false), k(size_t(S_k) * H_kv * D, false), v(size_t(S_k) * H_kv * D, false);
  Buffer<float> o(size_t(S_q) * H_q * D, false, dev, st), lse(size_t(S_q) * H_q, false, dev, st);
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
  // The device call: q, k, v and the positions uploaded, q, k, v rounded to bf16 there (host
  // copies of the positions kept).
  Buffer<uint16_t> qb, kb, vb;
  Buffer<int64_t> qpd, kpd;
  if (gpu) {
    const auto up = [&]<class T>(const T* h, size_t n) {
      Buffer<T> d(n, false, dev, st);
      copy_to_device(d.data(), h, n * sizeof(T), dev, st);
      return d;
    };
    const auto up16 = [&](const Buffer<float>& x) {
      const Buffer<float> f = up(x.data(), x.size());
      Buffer<uint16_t> b(x.size(), false, dev, st);
      f32_to_bf16(f.data(), b.data(), int64_t(x.size()), dev, st);
      return b;
    };
    qb = up16(q), kb = up16(k), vb = up16(v);
    qpd = up(qp.data(), qp.size());
    kpd = up(kp.data(), kp.size());
    p.device = dev;
    p.stream = st;
    p.dtype = DType::bf16;
    p.q = qb.data(); p.k = kb.data(); p.v = vb.data();
    p.q_pos_host = qp.data(); p.k_pos_host = kp.data();
    p.q_pos = qpd.data(); p.k_pos = kpd.data();
  }
  // (A GPU's first call is a warmup, unless it took over 50 ms: a device that slow, such as the
  // emulator of tests/gpu, is timed by that one call.)
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < (gpu ? 4 : 3); ++i) {
    if (gpu) stream_synchronize(st, dev);
    const double t0 = now_s();
    attn_fwd(p);
    if (gpu) stream_synchronize(st, dev);
    const double t = now_s() - t0;
    if (!gpu || i > 0 || t > 0.05) best = std::min(best, t);
    if (gpu && i == 0 && t > 0.05) break;
  }
  double rate[3] = {flops / best, 0, 0}, lat = 0;
  // BW and latency: ring exchanges (send to r+1, receive from r-1) of 8 B and 4 MiB, best of 5,
  // of buffers where the strategies' are (the device's, through its communicator, on a GPU).
  const int N = cp.size(), r = cp.rank();
  if (N > 1) {
    auto xchg = [&](size_t bytes) {
      Buffer<std::byte> s(bytes, true, dev, st), d(bytes, false, dev, st);
      if (gpu) stream_synchronize(st, dev);
      double t = std::numeric_limits<double>::infinity();
      for (int i = 0; i < 5; ++i) {
        cp.barrier();
        const double t0 = now_s();
        Request req = cp.send_recv_async(s.span(), (r + 1) % N, d.span(), (r + N - 1) % N, 77);
        cp.wait(req);
        if (gpu) stream_synchronize(st, dev);
        t = std::min(t, now_s() - t0);
      }
      return t;
    };
    lat = xchg(8);
    const size_t big = kProbeBig;
    rate[1] = rate_after_latency(double(big), xchg(big), lat);
    // pass-Q's all-to-all: `big` bytes per destination, best of 3.
    rate[2] = measure_alltoall_rate(cp, big, lat, 3, dev, st);
  }
  cp.all_reduce(std::span<double>(rate, 3), ReduceOp::min);
  cp.all_reduce(std::span<double>(&lat, 1), ReduceOp::max);
  (gpu ? hw.peak_bf16_flops : hw.peak_fp32_flops) = rate[0];
  hw.intra.bw_bytes_per_s = hw.inter.bw_bytes_per_s = N > 1 ? rate[1] : std::numeric_limits<double>::infinity();
  hw.intra_alltoall_bytes_per_s = N > 1 ? rate[2] : std::numeric_limits<double>::infinity();
  hw.intra.latency_s = hw.inter.latency_s = lat;
  return hw;
}

MeasureBytes cost_model_bytes(const Config& cfg, int N, int tp) {
  if (hardware_name(cfg, HardwareUse::live_choice) != "measured") return {};
  const ModelDims d = model_dims(cfg, tp, 0);
  return measure_hardware_bytes(N, int32_t(cfg.heads / tp), d.cache_heads(), d.cache_dim(), cfg.device);
}

PrefillCostModel::PrefillCostModel(const Config& cfg, Comm& cp, int tp) {
  call_.N = cp.size();
  call_.H_q = int32_t(cfg.heads / tp);
  const ModelDims d = model_dims(cfg, tp, 0);  // MLA: the absorbed call, multi-query over the latent
  call_.H_kv = d.cache_heads();  // a replicated K/V head: one per rank
  call_.D = d.cache_dim();
  call_.layers = cfg.layers;
  shape_ = model_shape(cfg);
  shape_.H_q /= tp;
  shape_.H_kv = std::max<int64_t>(1, shape_.H_kv / tp);
  shape_.ffn /= tp;
  const std::string name = hardware_name(cfg, HardwareUse::live_choice);
  hw_ = name == "measured" ? measure_hardware(cp, call_.H_q, call_.H_kv, call_.D, cfg.device) : load_hardware(name);
  if (name != "measured") warning_ = profile_mismatch(hw_, cfg);
}

Prediction PrefillCostModel::predict(int64_t T, int64_t cached) const {
  AttnCall c = call_;
  c.T = T;
  c.cached = cached;
  return predict_prefill(c, shape_, hw_);
}

double PrefillCostModel::attn_flops_per_s() const { return attention_rate(hw_); }

std::string PrefillCostModel::describe() const {
  char b[320];
  if (!hw_.attention_only) {
    std::snprintf(b, sizeof b, "profile %s (%s): whole-prefill TTFT of both variants by the src/perf cost model",
                  hw_.name.c_str(), hw_.source_file.c_str());
  } else {
    const double a2a = hw_.intra_alltoall_bytes_per_s > 0 ? hw_.intra_alltoall_bytes_per_s : hw_.intra.bw_bytes_per_s;
    std::snprintf(b, sizeof b,
                  "measured: %sattention %.1f GFLOP/s per rank, p2p %.2f GB/s, all-to-all %.2f GB/s, latency %.1f us; "
                  "attention time of all layers, %s",
                  hw_.p2p_overlap ? "bf16 GPU " : "", attn_flops_per_s() / 1e9, hw_.intra.bw_bytes_per_s / 1e9, a2a / 1e9, hw_.intra.latency_s * 1e6,
                  hw_.p2p_overlap ? "transfers overlapping the kernels" : "transfers on the compute cores");
  }
  return b;
}

}  // namespace ctxpar
