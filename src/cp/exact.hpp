// The exact schedule (config deterministic=true; CpSchedule::exact: the strategies of
// exact.cpp for the all-gather and the ring, exact_ulysses.cpp for ulysses and usp
// around their all-to-all): results whose bits do not depend on the number of ranks, the strategy
// or the thread count. Every rank gathers the whole group's K/V rows (all-gather, or the ring's
// P - 1 hops), puts them in position order, and attends its own queries to all of them in one
// kernel call, so each query row meets the same keys in the same key tiles on any mesh (the CPU
// kernel's rows do not depend on the other rows of the call). The backward sums dK/dV exactly
// (CpCall::dk_fixed: integers per aligned query block and head) and adds the ranks' sums with
// an integer reduce-scatter, which has one result whatever the order.
//
// The layout must give every rank's chunks whole blocks of attn_query_block(D) positions, or of
// CpCall::fixed_rows when set (Partition's block: the caller pads), and the call must be
// training's self-attention (the queries are the keys' rows). Under ulysses and usp a K/V head replicated on several ranks
// (each holding part of its group's query heads) is summed as integers over them, in parts of
// CpCall::fixed_heads query heads. Costs: the memory of the all-gather (the ring loses its
// O(S/P) buffers and its overlap), and dK/dV travel as 8-byte integers.
#pragma once
#include <memory>
#include <string>

#include "attn_params.hpp"
#include "cp/strategy.hpp"
#include "dist/comm.hpp"

namespace ctxpar {
class Tracer;
class Topology;

// The schedule's strategies (registry rows of CpSchedule::exact): exact.cpp's all-gather,
// ring and pass_q (inference), exact_ulysses.cpp's ulysses and usp.
std::unique_ptr<CpStrategy> make_exact_allgather_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_exact_ring_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_exact_ulysses_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_exact_usp_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_exact_pass_q_strategy(Topology& topo);

namespace cp {

// "" when `t` can run the exact schedule, else why not.
std::string check_exact(const CpCall& t);
// A device call (the schedule runs on the CPU only so far) is the caller's mistake, not a broken
// invariant: refused with std::invalid_argument before anything moves.
void refuse_device_call(const CpCall& t);

// ring_hops: gather by P - 1 ring hops (ring) instead of one all-gather (allgather). A null
// communicator: this rank's rows are all the keys (ulysses, after its all-to-all; one rank).
void exact_fwd(Comm* c, const CpCall& t, bool ring_hops, Tracer* tr, CpStats& st);

// Inference with exact numerics (prefill over a KV cache, decode): the keys stay where they
// are, and a result's bits do not depend on how they are spread over the ranks. The group's
// query rows (the same count on every rank; their positions, documents, and with a decode call
// their new K/V rows) are all-gathered; every rank stores the new K/V of the sequences whose
// cache slot it holds (CpCall::k_new_slot), then scores every query against its own keys
// with ops.hpp attn_exact_max / attn_exact_sums: the maxima all-reduced (max), the integer sums
// all-reduced (sum), and each rank finishes its own rows. `t` is a plain call (keys k, v, k_pos,
// k_doc of this rank) or a KV-cache call (k_doc_begin / k_doc_len per document, q_doc the row's
// document, -1 for a padding row). Costs: one exact add per (query, key, head, value element),
// and (D + 1) 16-byte integers per query row and head all-reduced over the group.
void exact_infer_fwd(Comm& c, const CpCall& t, Tracer* tr, CpStats& st);
// dK/dV into t.dk and t.dv; or, with t.dk_fixed and t.dv_fixed set, this rank's rows of the exact
// sums as integers (=, [S_k, H_kv, D] each, ops.hpp fixed_to_float converts), for a caller that adds
// more of them first (ulysses: a K/V head replicated on several ranks, each with part of its group).
void exact_bwd(Comm* c, const CpCall& t, bool ring_hops, Tracer* tr, CpStats& st);

}  // namespace cp
}  // namespace ctxpar
