// Pass-KV ring attention over one communicator, forward and backward; used by ring.cpp (ring over
// the whole CP group) and usp.cpp (ring over the ring axis, after the ulysses all-to-all).
// With no communicator (null) or one of size 1 it is one local kernel call.
#pragma once
#include <cstdint>

#include "attn_params.hpp"
#include "cp/strategy.hpp"
#include "dist/comm.hpp"

namespace ctxpar {
class Tracer;
namespace cp {

// One rank's tensors for the ring: S_q local queries and the S_k keys/values this rank owns
// (its block; blocks travel, queries stay). Token-major; positions global; docs optional.
struct BlockAttn {
  int64_t S_q = 0, S_k = 0;
  int32_t H_q = 0, H_kv = 0, D = 0;
  MaskKind mask = MaskKind::causal;
  int64_t window = 0;
  const float* q = nullptr;
  const int64_t* q_pos = nullptr;
  const int32_t* q_doc = nullptr;
  const float *k = nullptr, *v = nullptr;
  const int64_t* k_pos = nullptr;
  const int32_t* k_doc = nullptr;
  float *o = nullptr, *lse = nullptr;              // forward outputs; backward inputs
  const float* dout = nullptr;                     // backward input
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;  // backward outputs (overwritten)
};

// Packed size of one hop's K/V message (K, V, positions, document ids).
double ring_kv_message_bytes(int64_t S_k, int32_t H_kv, int32_t D, bool has_doc);
// Bytes of one hop's dK/dV message in backward.
double ring_dkv_message_bytes(int64_t S_k, int32_t H_kv, int32_t D);

// Forward: P steps; at step s the block of rank (r - s) mod P is here. The next hop is posted
// before the block is computed (double buffer); the block's compute is split into row chunks
// with test() between them so the transfer progresses; the wait after the compute is the
// exposed time. Step 0 writes (o, lse); later steps lse-merge into them.
// Messages posted: P - 1 (one packed K/V message per hop).
void ring_fwd(Comm* ring, const BlockAttn& a, Tracer* tr, CpStats& st);

// Backward: K/V circulate as in forward; each rank computes the block's dK/dV contribution into
// a fresh buffer while the previous holders' partial sum (dK/dV) travels on a second stream; on
// arrival it is added and the sum is sent on, so after P hops every block's dK/dV is home. dQ
// accumulates locally. Messages posted: (P - 1) K/V + P dK/dV (none when P = 1).
void ring_bwd(Comm* ring, const BlockAttn& a, Tracer* tr, CpStats& st);

}  // namespace cp
}  // namespace ctxpar
