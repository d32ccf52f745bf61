// GdnCp: context parallelism for Gated DeltaNet layers (the op: kernels/ops.hpp, gdn_*). A rank
// holds one contiguous piece of the sequence (a linear-time layer costs the same per token
// wherever the token sits, so zigzag sharding brings it no balance); the only thing that crosses
// a rank border is the state, H x Dv x Dk floats, forward, and its gradient, backward. Two
// schedules, one file each:
//   ring (gdn_ring.cpp): the state travels rank to rank, P - 1 sequential hops; each rank does
//     the state-independent work of its chunks (gdn_fwd_prepare) while it waits.
//   scan (gdn_scan.cpp): every rank runs its piece from a zero state and, where needed, forms its
//     piece's transition S -> S T + B (T [Dk, Dk] per head); an exclusive scan of these affine
//     maps over the ranks (log2 P exchange rounds) gives each rank its true start state, and a
//     correction pass (gdn_state_apply) adds what that state contributes. The backward does the
//     same with the transposed maps in reverse rank order. No rank waits for P - 1 others; the
//     price is the transition and the correction passes.
// Both are exact rewritings of the single-rank computation (results equal to rounding).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cp/strategy.hpp"
#include "dist/comm.hpp"
#include "ops.hpp"

namespace ctxpar {

// What a forward keeps for its backward.
struct GdnCpContext {
  std::vector<float> s_start;  // [H, Dv, Dk] this rank's start state
  std::vector<float> T;        // [H, Dk, Dk] this rank's transition (scan, where it was needed)
};

class GdnCp {
 public:
  virtual ~GdnCp() = default;
  virtual std::string name() const = 0;
  // p describes this rank's tokens (p.T may differ between ranks, 0 included; H, Dk, Dv and the
  // chunk must agree). p.s0 is the whole sequence's initial state (read on rank 0; nullptr: zero)
  // and p.s_out its final state (written on the last rank only). Writes p.o.
  virtual void forward(Comm& comm, const GdnParams& p, GdnCpContext& ctx, CpStats* stats) = 0;
  // After forward with the same p and ctx: p.ds_out is read on the last rank, p.ds0 written on
  // rank 0; dq, dk, dv, dg, dbeta of the local tokens are OVERWRITTEN (p.d_o required).
  virtual void backward(Comm& comm, const GdnParams& p, GdnCpContext& ctx, CpStats* stats) = 0;
};

std::unique_ptr<GdnCp> make_gdn_ring();
std::unique_ptr<GdnCp> make_gdn_scan();
// "ring" or "scan"; nullptr for any other name.
std::unique_ptr<GdnCp> make_gdn_cp(const std::string& schedule);
const std::vector<std::string>& gdn_cp_names();

// The state exchanged between ranks, in floats (H * Dv * Dk).
inline int64_t gdn_state_floats(const GdnParams& p) { return int64_t(p.H) * p.Dv * p.Dk; }

}  // namespace ctxpar
