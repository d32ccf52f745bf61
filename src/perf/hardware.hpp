// Hardware profiles of the cost model (inputs/hardware/<name>.toml): peak throughput, memory,
// the two link levels (inside a node = scale-up: NVLink / ICI; across nodes = scale-out: NIC /
// DCN) with ACHIEVED per-chip bandwidth and latency, and the achieved efficiencies of the
// kernels (GEMM, attention as a function of block size). Every value in a profile carries its
// source in a comment of the TOML file; `ctxpar bench calibrate` writes `local.toml` from
// measurements on this machine.
//
// Units in names: _flops (FLOP/s), _bytes, _bytes_per_s, _s (seconds).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/settings.hpp"

namespace ctxpar {

// An efficiency curve: eff(x) interpolated linearly in log(x) between measured points
// (clamped at both ends), or, with no points, eff_inf * x / (x + x_half) (a kernel reaches half
// its asymptotic efficiency at x_half rows/tokens — tile fill and per-call overhead).
struct EffCurve {
  std::vector<double> x, eff;  // measured points, x ascending
  double eff_inf = 1, x_half = 0;
  double at(double x) const;
};

struct Link {
  double bw_bytes_per_s = 0;  // achieved, one direction, per chip
  double latency_s = 0;       // per message (startup + one hop)
};

struct HardwareProfile {
  std::string name, description, source_file;
  // Where `bench calibrate` measured it ("" in a published profile): the host, its CPU model and
  // the model shapes (calibrated_shapes); a choice made from it elsewhere warns (profile_mismatch).
  std::string measured_host, measured_cpu, measured_shapes;
  // One core's FMA-loop rate (bench calibrate, rank 0 alone; 0 = not measured): a CPU run's MFU
  // peak per thread on the host that measured it (calibrated_core_peak_flops).
  double core_fma_flops = 0;
  // Peak dense FLOP/s per chip for each precision the model can use (0 = not available).
  double peak_bf16_flops = 0, peak_fp8_flops = 0, peak_fp32_flops = 0;
  Precision default_precision = Precision::bf16;  // bf16 | fp8_ffn | fp32
  double hbm_bytes = 0;                    // memory capacity per chip
  double hbm_bytes_per_s = 0;              // peak memory bandwidth per chip
  double hbm_eff = 0.8;                    // achieved fraction for streaming kernels
  int64_t chips_per_node = 8;              // scale-up domain size (ranks sharing the fast link)
  // Chips (or cores) of a node that compute at once; 0 = chips_per_node. Fractional where hosts
  // share one machine's cores (the cluster tests/cluster makes on one machine: 2 cores, 4 hosts = 0.5).
  double compute_units_per_node = 0;
  Link intra, inter;
  // Bandwidth per chip of a collective inside the node (0 = intra.bw): a torus collective
  // streams over several links at once while a ring hop uses one.
  double intra_collective_bytes_per_s = 0;
  double intra_collective_bps() const { return intra_collective_bytes_per_s > 0 ? intra_collective_bytes_per_s : intra.bw_bytes_per_s; }
  // All-to-all inside a node (bytes leaving a rank per second); default = the collective rate.
  // Shared-memory MPI moves an all-to-all slower than a point-to-point exchange.
  double intra_alltoall_bytes_per_s = 0;
  double intra_alltoall_bps() const { return intra_alltoall_bytes_per_s > 0 ? intra_alltoall_bytes_per_s : intra_collective_bps(); }
  // Node-crossing rates of the collectives (0 = inter.bw), each the rate that makes the cost
  // model's formula give the time `bench calibrate` measured for that collective across hosts:
  // over TCP, with one NIC shared by a node's ranks, MPI's all-reduce, all-gather and all-to-all
  // each reach their own fraction of a point-to-point stream.
  double inter_collective_bytes_per_s = 0;  // all-reduce, reduce-scatter
  double inter_allgather_bytes_per_s = 0;   // all-gather (0 = the all-reduce's)
  double inter_alltoall_bytes_per_s = 0;    // all-to-all, bytes leaving a rank across nodes
  // Time a ring step loses per byte it sends and receives across nodes while it computes
  // (0 where the transfer hides under compute: RDMA, NVLink, NCCL on its own SMs). Over TCP the
  // transport runs on the computing cores, and MPI moves a large message only inside its calls.
  double inter_overlap_loss_s_per_byte = 0;
  double inter_collective_bps() const { return inter_collective_bytes_per_s > 0 ? inter_collective_bytes_per_s : inter.bw_bytes_per_s; }
  double inter_allgather_bps() const { return inter_allgather_bytes_per_s > 0 ? inter_allgather_bytes_per_s : inter_collective_bps(); }
  double inter_alltoall_bps() const { return inter_alltoall_bytes_per_s > 0 ? inter_alltoall_bytes_per_s : inter.bw_bytes_per_s; }
  EffCurve gemm_eff;  // vs rows (tokens) of the activation matrix
  // Attention efficiency of one kernel call vs kappa = visible keys per query row of the call
  // (the work each query row amortizes its fixed costs over: Q tile load, output normalization,
  // the backward's row terms; a split-KV GPU kernel fills its SMs the same way). Applies to the
  // visible pairs and to the masked pairs computed anyway on the causal diagonal:
  double attn_diag_waste_keys = 0;  // masked keys computed per query row on a causal diagonal (tile shape)
  // Matmul work of the attention backward relative to the forward, for time (the FLOP convention
  // stays 2.5): 2.5 for a fused FlashAttention-2 backward (S, dP, dV, dQ, dK), 3.5 for split dQ
  // and dK/dV kernels that each recompute the scores (Splash's default on TPU).
  double attn_bwd_work = 2.5;
  EffCurve attn_eff;
  // Achieved rates of the memory-bound parts, each against the cost model's own byte count
  // (perf/cost_model.hpp: elementwise_bytes, loss_bytes, optimizer_bytes); 0 = hbm * hbm_eff.
  double elementwise_bytes_per_s = 0;  // norms, RoPE, SwiGLU, residual adds
  double loss_bytes_per_s = 0;         // cross-entropy over the vocabulary
  double optimizer_bytes_per_s = 0;    // AdamW
  double step_overhead_s = 0;      // fixed cost of one ring step (launches, merge, sync)
  // Rank-to-rank speed jitter: relative standard deviation of one rank's time for the same work
  // between two synchronizations. A synchronous step waits for the slowest of its n ranks,
  // E[max of n standard normals] standard deviations above the mean (0 = no jitter).
  double rank_jitter = 0;
  // Throughput two ranks sharing one compute unit get together, relative to one rank alone
  // (time slicing, shared caches); applies when ranks outnumber compute_units_per_node.
  double shared_core_eff = 1;
  bool overlap_collectives = true; // data-parallel gradient reduction hidden under backward
  // Point-to-point transfers proceed while the chip computes (a NIC or DMA engine moves them);
  // false for CPU ranks, whose shared-memory MPI copies run on the compute cores.
  bool p2p_overlap = true;
  // Only the attention rate (peak x attn_eff) and the links are known: a profile measured by a
  // running job (hardware=measured, perf/prefill_choice.hpp), enough for cp_algo=auto's choice,
  // not for `predict`.
  bool attention_only = false;
};

// The profile the `hardware` setting names for a use. hardware=auto (the default) is
// "measured" for a live choice (cp_algo=auto: the running job's ranks, measured at start) and
// "local" (out/hardware/local.toml, `bench calibrate`'s, else the example in inputs/hardware/) for a plan (predict, strategy=auto,
// bench calibrate's output). hardware=measured is only for a live choice: a UsageError otherwise.
enum class HardwareUse { live_choice, plan };
struct Config;
std::string hardware_name(const Config& cfg, HardwareUse use);

// This machine's host name, and its CPU model as /proc/cpuinfo names it ("" where it does not).
std::string this_host();
std::string this_cpu();
// The model shapes a calibration runs at: "dim=256 ffn_dim=768 vocab=1024 H_q=8 H_kv=2 D=64".
std::string calibrated_shapes(const Config& cfg);
// One warning line ("" when none) when a calibrated profile was measured on another host, another
// CPU or with other model shapes than `cfg`'s, naming each difference; published profiles (no
// measured_host) describe hardware, not this machine, and get none.
std::string profile_mismatch(const HardwareProfile& hw, const Config& cfg);
// The MFU peak per thread `train` divides by on this host: core_fma_flops of the calibrated
// profile (kCalibratedProfile) when it was measured on this host and CPU, else 0 (measure it).
double calibrated_core_peak_flops();
// Where `bench calibrate` writes by default and hardware=local reads first (outside the tracked
// tree): out/hardware/local.toml under the working directory.
inline constexpr const char* kCalibratedProfile = "out/hardware/local.toml";

// Loads a profile: `name_or_path` is a name (inputs/hardware/<name>.toml, looked up from the
// working directory, then from the source tree) or a path to a .toml file. Unknown keys and
// missing required keys are errors. Throws UsageError with a message naming the file and what
// would be valid (the list of profiles found).
HardwareProfile load_hardware(const std::string& name_or_path);
// Names of the profiles found in inputs/hardware/ (sorted), for messages and tests.
std::vector<std::string> hardware_names();
// Directory holding the profiles: ./inputs/hardware if present, else the source tree's.
std::string hardware_dir();
// TOML text of a profile (used by `bench calibrate`); `notes` become comment lines at the top,
// `sources` (key → source text) a comment after each key.
std::string hardware_toml(const HardwareProfile& h, const std::vector<std::string>& notes,
                          const std::vector<std::pair<std::string, std::string>>& sources);

}  // namespace ctxpar
