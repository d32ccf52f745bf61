// GdnCp: context parallelism for Gated DeltaNet layers (the op: kernels/ops.hpp, gdn_*). A rank
// holds contiguous pieces of the sequence (its partition's runs: one under contiguous sharding,
// two under zigzag); the only thing that crosses a piece border is the state, H x Dv x Dk floats,
// forward, and its gradient, backward. A linear-time layer costs the same per token wherever the
// token sits, so zigzag brings it no balance; it serves the attention layers of a hybrid model and
// costs the GDN layers a chain twice as long. Two schedules, one file each:
//   ring (gdn_ring.cpp): the state travels piece to piece along the chain, one group of heads at
//     a time, so the pieces work as a pipeline ((J G + Q - 1) group steps for G groups and J
//     pieces per rank, against J G alone).
//   scan (gdn_scan.cpp): every piece runs from a zero state and, where needed, forms its
//     transition S -> S T + B (T [Dk, Dk] per head); an exclusive scan of these affine maps along
//     the chain (ceil(log2 Q) exchange rounds) gives each piece its true start state, and a
//     correction pass (gdn_state_apply) adds what that state contributes. The backward does the
//     same with the transposed maps in reverse order. No piece waits for Q - 1 others; the price
//     is the transition and the correction passes.
// Both are exact rewritings of the single-rank computation (results equal to rounding).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cp/strategy.hpp"
#include "dist/comm.hpp"
#include "ops.hpp"

namespace ctxpar {

// The global sequence as a chain of Q pieces in order; piece q is held by rank owner[q]. Every
// rank builds the same chain from the partition (contiguous: one piece per rank; zigzag: 2P
// pieces, rank r holding pieces r and 2P-1-r).
struct GdnChain {
  static constexpr int kMaxPieces = 7700;  // the schedules tag messages by piece (MPI: tags <= 32767)
  std::vector<int> owner;
  static GdnChain contiguous(int P);  // std::invalid_argument beyond kMaxPieces
  static GdnChain zigzag(int P);
  int size() const { return int(owner.size()); }
  std::vector<int> positions_of(int rank) const;  // ascending
};

// What a forward keeps for its backward, per piece of this rank.
struct GdnCpContext {
  std::vector<std::vector<float>> s_start;  // [H, Dv, Dk] the piece's start state
  std::vector<std::vector<float>> T;        // [H, Dk, Dk] the piece's transition (scan, where needed)
};

class GdnCp {
 public:
  virtual ~GdnCp() = default;
  virtual std::string name() const = 0;
  // pieces[j] describes this rank's j-th piece (chain.positions_of(rank)[j]); T may differ between
  // pieces, 0 included; H, Dk, Dv and the chunk agree everywhere. The s0 of the piece at position 0
  // is the sequence's initial state (nullptr: zero); the piece at position Q-1 writes s_out (if
  // set); no other piece reads s0 or writes s_out. Writes every piece's o.
  virtual void forward(Comm& comm, const GdnChain& chain, const std::vector<GdnParams>& pieces, GdnCpContext& ctx,
                       CpStats* stats) = 0;
  // After forward with the same pieces and ctx: the piece at position Q-1 reads ds_out, the piece
  // at position 0 writes ds0; dq, dk, dv, dg, dbeta of every piece are OVERWRITTEN (d_o required).
  virtual void backward(Comm& comm, const GdnChain& chain, const std::vector<GdnParams>& pieces, GdnCpContext& ctx,
                        CpStats* stats) = 0;
};

std::unique_ptr<GdnCp> make_gdn_ring();
std::unique_ptr<GdnCp> make_gdn_scan();
// "ring" or "scan"; nullptr for any other name.
std::unique_ptr<GdnCp> make_gdn_cp(const std::string& schedule);
const std::vector<std::string>& gdn_cp_names();

// The state exchanged between ranks, in floats (H * Dv * Dk).
inline int64_t gdn_state_floats(const GdnParams& p) { return int64_t(p.H) * p.Dv * p.Dk; }

}  // namespace ctxpar

namespace ctxpar {

// The short causal convolution's halo along a chain: each piece needs the last `rows` rows
// ([rows, width] floats) of the piece before it (zeros for the chain's head); every piece holds at
// least `rows` rows. Forward: tail[j] points at the first of the last `rows` rows of this rank's
// piece j (ascending chain position), halo[j] receives its predecessor's. Backward: dhalo[j], the
// gradient of piece j's halo, is added to the predecessor's last rows (dtail). A predecessor on
// the same rank is served by a copy.
void chain_halo_fwd(Comm& comm, const GdnChain& chain, const std::vector<const float*>& tail, int64_t rows,
                    int64_t width, std::vector<std::vector<float>>& halo, CpStats* stats);
void chain_halo_bwd(Comm& comm, const GdnChain& chain, const std::vector<float*>& dtail, int64_t rows, int64_t width,
                    const std::vector<std::vector<float>>& dhalo, CpStats* stats);

}  // namespace ctxpar
