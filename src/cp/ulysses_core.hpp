// Ulysses (DeepSpeed-Ulysses) head <-> token all-to-all over one communicator of U ranks, and the
// attention around it: ulysses.cpp runs a local kernel inside (U = the whole CP group); usp.cpp
// runs the pass-KV ring on the ring axis inside (U = the ulysses axis).
//
// Token order after the all-to-all: block i of the U*S_loc gathered tokens is rank i's shard, in
// its local order; the positions and document ids are all-gathered in the same order, so the
// mask (data, not structure) stays right without restoring global order.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "cp/strategy.hpp"
#include "dist/comm.hpp"

namespace ctxpar {
class Tracer;
namespace cp {

// How H heads are laid over U ranks: rank j gets heads [first(j), first(j) + H_loc). When
// H >= U, H % U == 0 and the heads are split; when H < U (U % H == 0) every head is replicated
// on U / H consecutive ranks (H_loc = 1), which is what lets GQA/MQA K/V run with more ulysses
// ranks than K/V heads. The query heads on rank j then all belong to K/V head first_kv(j).
struct HeadSplit {
  int U = 1;
  int32_t H = 0, H_loc = 0;
  int32_t first(int j) const { return H >= U ? int32_t(j) * H_loc : int32_t(j / (U / H)); }
  bool replicated() const { return int64_t(H_loc) * U > H; }
};
HeadSplit head_split(int32_t H, int U);

// "" when H_q and H_kv can be laid over U ranks, else the message (what is wrong, what is valid).
std::string check_heads(const std::string& strategy, int32_t H_q, int32_t H_kv, int U);

// Bytes one rank sends in one ulysses forward of `s` (heads, D; Q, K, V out, O and LSE back,
// positions/docs) with S_loc local tokens.
double ulysses_fwd_bytes(const CpCall& s, bool docs, int64_t S_loc, int U);

// The attention inside the all-to-all, on the gathered call `a` (U * S_loc tokens, H_loc heads of
// each kind, buffers owned by the caller of `inner`): a local kernel call, the pass-KV ring over
// the ring axis (usp), or another schedule of those.
using UlyssesInner = std::function<void(const CpCall& a)>;

// Forward/backward of attention on the local shard `t` (queries and keys the same tokens) with
// the ulysses all-to-all over `u` and `inner` inside. ulysses_bwd: the inner's dq, dk, dv come
// back in fp32 (a replicated K/V head's copies added in rank order).
void ulysses_fwd(Comm& u, const CpCall& t, const UlyssesInner& inner, Tracer* tr, CpStats& st);
void ulysses_bwd(Comm& u, const CpCall& t, const UlyssesInner& inner, Tracer* tr, CpStats& st);
// The backward for an inner that sums dK/dV exactly (a.dk_fixed, a.dv_fixed: int64, ops.hpp): a
// K/V head replicated on several ranks comes back as the integer sum of its copies, into
// t.dk_fixed / t.dv_fixed when the caller set them (it adds more), else rounded once into t.dk, t.dv.
void ulysses_bwd_exact(Comm& u, const CpCall& t, const UlyssesInner& inner, Tracer* tr, CpStats& st);

}  // namespace cp
}  // namespace ctxpar
