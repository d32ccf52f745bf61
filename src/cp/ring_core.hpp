// Pass-KV ring attention over one communicator, forward and backward; used by ring.cpp (ring over
// the whole CP group, also the pass-KV prefill over a KV cache) and usp.cpp (ring over the ring
// axis, after the ulysses all-to-all). With no communicator (null) or one of size 1 it is one
// local kernel call.
//
// The call `a` (kernels/attn_params.hpp) is one rank's part: S_q local queries and the S_k
// keys/values this rank owns (its block; blocks travel, queries stay). S_k is the same on every
// rank of the ring (a message has one size); positions global; documents optional.
#pragma once
#include "attn_params.hpp"
#include "cp/strategy.hpp"
#include "dist/comm.hpp"

namespace ctxpar {
class Tracer;
namespace cp {

// Packed size of one hop's K/V message (K, V, positions unless derivable, document ids).
double ring_kv_message_bytes(int64_t S_k, int32_t H_kv, int32_t D, DType dtype, bool has_doc, bool has_pos = true);
// Bytes of one hop's dK/dV message in backward (fp32).
double ring_dkv_message_bytes(int64_t S_k, int32_t H_kv, int32_t D);
// MLA: one hop's latent message (latent rows fp32, positions, document ids); its backward
// message is the latent's gradient, S_k * latent_width fp32.
double ring_latent_message_bytes(int64_t S_k, int32_t latent_width, bool has_doc, bool has_pos = true);

// With a.k_pos_zigzag set (training: every rank's keys are its zigzag shard) the messages carry
// no positions: each rank derives the visiting block's from its owner's rank.
//
// Forward: P steps; at step s the block of rank (r - s) mod P is here. The next hop is posted
// before the block is computed (double buffer); the block's compute is split into row chunks
// with test() between them so the transfer progresses; the wait after the compute is the
// exposed time. Step 0 writes (o, lse); later steps lse-merge into them.
// Messages posted: P - 1 (one packed K/V message per hop).
void ring_fwd(Comm* ring, const CpCall& a, Tracer* tr, CpStats& st);

// Backward: K/V circulate as in forward; each rank computes the block's dK/dV contribution into
// a fresh buffer while the previous holders' partial sum (dK/dV) travels on a second stream; on
// arrival it is added and the sum is sent on, so after P hops every block's dK/dV is home. dQ
// accumulates locally. dq, dk, dv are overwritten. Messages posted: (P - 1) K/V + P dK/dV (none
// when P = 1).
//
// MLA (a.expander set, both directions): the latent rows travel instead of K and V (per token
// latent_width values instead of 2 H_kv D); a visiting block is expanded before it is computed
// (the own block's K/V are the caller's); each block's dK/dV become the latent's gradient on the
// rank that computed them (the expansion's weight gradient accumulates there), and that partial
// sum is what travels home, into a.dlatent (dk, dv unused).
void ring_bwd(Comm* ring, const CpCall& a, Tracer* tr, CpStats& st);

}  // namespace cp
}  // namespace ctxpar
