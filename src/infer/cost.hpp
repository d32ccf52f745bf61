// Choice between pass-KV and pass-Q for one prefill call (Meta, "Context Parallelism for Scalable
// Million-Token Inference", MLSys 2025, §3.4 and App. D), and the predicted attention time of both
// variants that the choice is made from.
//
// Symbols (as in the paper): T new tokens, P cached tokens, N CP ranks, N_H query heads, N_KV K/V
// heads, D head dim, C attention FLOP/s per rank, BW bytes/s per rank, e bytes per element.
//   Eq. 1  pass-KV sends fewer bytes than pass-Q when T/(T+P) >= 2 N_KV / N_H
//   Eq. 2  pass-KV's transfers hide under compute when T >= N C N_KV e / (2 N_H BW)
//   Eq. 3  pass-Q's transfers hide when T + P >= N e C / (4 BW)
//   Eq. 5  with pass-Q's all-to-all counted, pass-Q wins when T/(T+P) <= 2 N_KV/N_H - 4 T BW / (N C e)
//   App. D fitted: pass-KV when -1.059 ln T + 1.145 ln(T/(T+P)) + 12.112 > 0
// The cost model behind `auto` (predict()) is the per-layer ring timeline these rules come from:
//   compute per rank  A = 4 N_H D (T P + T(T+1)/2) / N / C
//   pass-KV message   m_kv = (T+P)/N * 2 N_KV D e (+ 8 bytes of position per token)
//   pass-Q message    m_q  = T/N * N_H D e (+ positions), all-to-all a2a = (N-1)/N * T * N_H (D+1) e
//   overlap (a NIC or DMA engine moves data while the cores compute, as on H100 hosts):
//     t = A/N + (N-1) max(A/N, lat + m/BW)   [+ lat + a2a/BW for pass-Q]
//   no overlap (shared-memory MPI on a CPU: the copy runs on the same cores as the compute):
//     t = A + (N-1)(lat + m/BW)  [+ m_kv/BW for pass-KV's pack of the block, + lat + a2a/BW_a2a for pass-Q]
//   BW_a2a, pass-Q's all-to-all rate, is calibrated apart from the ring's BW: on shared-memory MPI
//   it is several times slower (the receive buffer is new memory; each block is copied twice).
// With overlap and A/N dominating, pass-KV vs pass-Q reduces to the paper's Eq. 5.
// That per-layer model, with C, BW and BW_a2a measured at start, is hw_profile=measured (the
// default: it describes the ranks actually running). hw_profile=<name> instead takes a profile of
// inputs/hardware/ (h100-gtt, h100-gti, local, ...) and the whole-prefill cost model of src/perf
// (predict_partial_prefill), the one `ctxpar predict` uses.
#pragma once
#include <cstdint>
#include <string>

#include "perf/cost_model.hpp"

namespace ctxpar {
class Comm;
struct Config;
}

namespace ctxpar::infer {

enum class CpAlgo { pass_kv, pass_q };
const char* algo_name(CpAlgo a);

struct HwProfile {
  std::string name;
  double attn_flops_per_s = 0;  // C: attention FLOP/s per rank
  double bw_bytes_per_s = 0;    // BW: point-to-point bytes/s per rank
  double latency_s = 0;         // per message
  double elem_bytes = 4;        // e
  bool overlap = false;         // transfers proceed without the cores (NIC/DMA)
  // All-to-all bytes/s per rank as the engine meets it (pass-Q's return of partial outputs into a
  // freshly allocated buffer); 0 = the point-to-point BW.
  double a2a_bytes_per_s = 0;
};

// Collective over `cp`: C from a timed attn_fwd of the model's head shape (a partial-prefill-like
// block, `threads` OpenMP threads), BW and latency from timed ring exchanges, BW_a2a from a timed
// all-to-all of pass-Q's shape into new buffers; minimum over ranks of the rates, maximum of the
// latency (the slowest rank sets the pace).
HwProfile measure_profile(Comm& cp, int32_t H_q, int32_t H_kv, int32_t D);

struct AttnCall {
  int64_t T = 0, P = 0;
  int N = 1;
  int32_t H_q = 0, H_kv = 0, D = 0;
  int64_t layers = 1;
};

struct Prediction {
  // Predicted time of one call: the attention of all layers (measured profile) or the whole
  // prefill (a hardware profile of src/perf). Only the difference decides.
  double pass_kv_s = 0, pass_q_s = 0;
  CpAlgo choice = CpAlgo::pass_kv;     // the smaller of the two (ties: pass-KV)
  bool eq1_pass_kv = true;             // paper Eq. 1
  bool eq5_pass_q = false;             // paper Eq. 5
  bool fitted_pass_kv = true;          // paper App. D
};
Prediction predict(const AttnCall& c, const HwProfile& hw);
// The same choice from a hardware profile of the cost model (src/perf): both variants' TTFT by
// predict_partial_prefill; the paper's rules with C = peak * attention efficiency at the call's
// block size and BW = the link the ring crosses (inside a node or across nodes).
Prediction predict(const AttnCall& c, const ModelShape& m, const HardwareProfile& hw);

// cp_algo=auto's model for one run, from the config: hw_profile=measured (measure_profile over
// `cp`, collective) or a profile of inputs/hardware/ with the config's model shape.
class PrefillCostModel {
 public:
  PrefillCostModel(const Config& cfg, Comm& cp);
  Prediction predict(int64_t T, int64_t P) const;
  // One line for logs and bench headers: the profile and its rates.
  std::string describe() const;
  // Rates for the trace's attributes (for a hardware profile: its peak x attention efficiency
  // at a 1K block, the intra-node link).
  const HwProfile& rates() const { return hw_; }

 private:
  AttnCall call_;
  HwProfile hw_;
  bool from_file_ = false;
  HardwareProfile file_;
  ModelShape shape_;
};

}  // namespace ctxpar::infer
