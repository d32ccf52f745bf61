// cp_algo=auto: the choice between pass-KV and pass-Q for one prefill call (Meta, "Context
// Parallelism for Scalable Million-Token Inference", MLSys 2025, §3.4 and App. D), from the cost
// model of src/perf and a HardwareProfile (perf/hardware.hpp), with the paper's closed-form rules
// beside it.
//
// Symbols (as in the paper): T new tokens, P cached tokens (`cached` in the code, where P is the
// CP size), N CP ranks, N_H query heads, N_KV K/V
// heads, D head dim, C attention FLOP/s per rank, BW bytes/s per rank, e bytes per element.
//   Eq. 1  pass-KV sends fewer bytes than pass-Q when T/(T+P) >= 2 N_KV / N_H
//   Eq. 2  pass-KV's transfers hide under compute when T >= N C N_KV e / (2 N_H BW)
//   Eq. 3  pass-Q's transfers hide when T + P >= N e C / (4 BW)
//   Eq. 5  with pass-Q's all-to-all counted, pass-Q wins when T/(T+P) <= 2 N_KV/N_H - 4 T BW / (N C e)
//   App. D fitted: pass-KV when -1.059 ln T + 1.145 ln(T/(T+P)) + 12.112 > 0
//
// The prediction of both variants comes from the profile:
//  - a full profile (inputs/hardware/*.toml): both variants' whole TTFT by the cost model's
//    partial-prefill prediction (predict_partial_prefill, cost_model.hpp), the one `ctxpar
//    predict` uses; the rules with C = peak x attention efficiency at a ring step's keys per
//    row and BW = the link the ring crosses;
//  - an attention-only profile (HardwareProfile::attention_only: the attention rate and the links
//    measured by the running job, measure_hardware below, hardware=measured): the dense work is
//    the same for both variants and cancels in the choice, so the model is the per-layer ring
//    timeline of the attention and its transfers:
//      compute per rank  A = 4 N_H D (T P + T(T+1)/2) / N / C
//      pass-KV message   m_kv = (T+P)/N * 2 N_KV D e (+ 8 bytes of position per token)
//      pass-Q message    m_q  = T/N * N_H D e (+ positions), all-to-all a2a = (N-1)/N * T * N_H (D+1) e
//      overlap (p2p_overlap: a NIC or DMA engine moves data while the cores compute, as on H100 hosts):
//        t = A/N + (N-1) max(A/N, lat + m/BW)   [+ lat + a2a/BW_a2a for pass-Q]
//      no overlap (shared-memory MPI on a CPU: the copy runs on the same cores as the compute):
//        t = A + (N-1)(lat + m/BW)  [+ m_kv/BW for pass-KV's pack of the block, + lat + a2a/BW_a2a for pass-Q]
//    BW_a2a, pass-Q's all-to-all rate, is measured apart from the ring's BW: on shared-memory MPI
//    it is several times slower (the receive buffer is new memory; each block is copied twice).
//    With overlap and A/N dominating, pass-KV vs pass-Q reduces to the paper's Eq. 5.
#pragma once
#include <cstdint>
#include <string>

#include "dtype.hpp"  // Device
#include "perf/cost_model.hpp"

namespace ctxpar {
class Comm;
struct Config;

enum class CpAlgo { pass_kv, pass_q };
const char* algo_name(CpAlgo a);

// One prefill call: T new tokens after `cached` ones on N CP ranks, per layer H_q, H_kv, D.
struct AttnCall {
  int64_t T = 0, cached = 0;
  int N = 1;
  int32_t H_q = 0, H_kv = 0, D = 0;
  int64_t layers = 1;
};

struct Prediction {
  // Predicted time of one call: the attention of all layers (attention-only profile) or the whole
  // prefill (full profile). Only the difference decides.
  double pass_kv_s = 0, pass_q_s = 0;
  // The faster of the two, unless they differ by less than `margin` (the model's expected error
  // on this hardware, choice_margin): then a tie, and pass-KV, the default (the paper's for a
  // full prefill; it sends no all-to-all).
  CpAlgo choice = CpAlgo::pass_kv;
  bool tie = false;
  double margin = 0;
  bool eq1_pass_kv = true;             // paper Eq. 1
  bool eq5_pass_q = false;             // paper Eq. 5
  bool fitted_pass_kv = true;          // paper App. D
};
// The relative difference below which two predicted times are a tie: the model's expected error
// on this hardware (docs/cost-model.md, "Choices and ties", states where each value comes from).
double choice_margin(const HardwareProfile& hw);
// The model's verdict for logs: "pass_q 1.44x faster, beyond the model's 25% here" or "a tie:
// 1.3% apart, within the model's 25% here; pass_kv, the default".
std::string choice_text(const Prediction& p);
// The one chooser. `m`: the model (full profiles; unused by attention-only ones).
Prediction predict_prefill(const AttnCall& c, const ModelShape& m, const HardwareProfile& hw);

// hardware=measured: the attention-only profile of the running job. Collective over `cp`: C from
// a timed attn_fwd of the model's head shape (a partial-prefill-like block), BW and latency from
// timed ring exchanges, BW_a2a from a timed all-to-all of pass-Q's shape into new buffers;
// minimum over ranks of the rates, maximum of the latency (the slowest rank sets the pace).
// On the CPU (`dev` = cpu): fp32, no overlap of transfers with compute. On a GPU (cp a device
// communicator with its compute stream set): the bf16 device kernel, device buffers on the links,
// transfers overlapping compute.
HardwareProfile measure_hardware(Comm& cp, int32_t H_q, int32_t H_kv, int32_t D, Device dev = Device::cpu);
// What measure_hardware allocates while it runs, freed when it returns (the memory plans count it):
// on the host, and on `dev` when that is a GPU; on N ranks (the all-to-all's buffers grow with N).
struct MeasureBytes {
  double host = 0, device = 0;
};
MeasureBytes measure_hardware_bytes(int N, int32_t H_q, int32_t H_kv, int32_t D, Device dev = Device::cpu);
// The same for a run's cp_algo model (PrefillCostModel below): zero unless it measures (hardware
// = measured, or auto).
MeasureBytes cost_model_bytes(const Config& cfg, int N, int tp);

// cp_algo=auto's model for one run, from the config: the profile `hardware` names for a live
// choice (measured, by default; collective over `cp` then) and the config's model shape. With
// tensor parallel `tp` the model is one tp slice (heads and ffn_dim / tp: what each CP group
// runs; the tp all-reduces are the same for both variants and not priced).
class PrefillCostModel {
 public:
  PrefillCostModel(const Config& cfg, Comm& cp, int tp = 1);
  Prediction predict(int64_t T, int64_t cached) const;
  // One line for logs and bench headers: the profile and its rates.
  std::string describe() const;
  // A profile read from a file and measured elsewhere (profile_mismatch): one warning line, or "".
  const std::string& warning() const { return warning_; }
  const HardwareProfile& profile() const { return hw_; }
  // The rates the choice reads, for the trace's attributes: attention FLOP/s per rank (peak x
  // efficiency at a 4K-key call), the point-to-point link, its latency, the all-to-all rate
  // (0 = not measured).
  double attn_flops_per_s() const;
  double bw_bytes_per_s() const { return hw_.intra.bw_bytes_per_s; }
  double latency_s() const { return hw_.intra.latency_s; }
  double a2a_bytes_per_s() const { return hw_.intra_alltoall_bytes_per_s; }

 private:
  AttnCall call_;
  HardwareProfile hw_;
  ModelShape shape_;
  std::string warning_;
};

}  // namespace ctxpar
