// Pieces shared by the CP strategies: the factories the registry lists, timed waits (exposed
// communication), the packed K/V message of the ring, visible-pair counting for FLOP stats, and
// row-chunked kernel calls that let transfers progress while the kernel computes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "attn_params.hpp"
#include "cp/strategy.hpp"
#include "dist/comm.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

class Topology;

// One factory per strategy file; registry.cpp lists them in one table.
std::unique_ptr<CpStrategy> make_allgather_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_ulysses_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_ring_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_usp_strategy(Topology& topo);

namespace cp {

// "" when the sequence can be zigzag-sharded over P ranks and the heads form groups, else a
// message naming the value and what would be valid. Shared by every strategy's validate().
std::string check_common(const std::string& strategy, const AttnShape& s, int P);

// Number of (q, k) pairs visible under the mask and documents, in O((S_q + S_k) log S_k): keys
// are sorted by (document, position); the keys a query sees then form one contiguous range.
// Works for any order of positions and any document labelling (no monotonicity assumed).
int64_t count_visible_pairs(int64_t S_q, const int64_t* q_pos, const int32_t* q_doc, int64_t S_k,
                            const int64_t* k_pos, const int32_t* k_doc, MaskKind mask, int64_t window);

// Attention FLOPs of the DESIGN.md convention (4 * H_q * D per visible pair; backward 2.5x).
inline double attn_fwd_flops(int64_t pairs, int32_t H_q, int32_t D) { return 4.0 * double(pairs) * H_q * D; }
inline double attn_bwd_flops(int64_t pairs, int32_t H_q, int32_t D) { return 2.5 * attn_fwd_flops(pairs, H_q, D); }

// Waits for `r` and books the blocked time as exposed communication (stats, and a comm_wait span
// with `ring_step` when a tracer is given).
void timed_wait(Comm& c, Request& r, CpStats& st, Tracer* tr, int32_t ring_step, double bytes);

// Runs a blocking collective `op` and books its whole duration as exposed (nothing overlaps a
// blocking collective) with phase `ph`.
void timed_collective(Comm& c, CpStats& st, Tracer* tr, Phase ph, double bytes_sent,
                      const std::function<void()>& op);

// The ring's packed message: K, V, positions and (optionally) document ids of one block, in one
// byte buffer (one message per hop). Sections start on 64-byte boundaries so the typed views are
// aligned.
struct KvLayout {
  int64_t S_k = 0;
  int32_t H_kv = 0, D = 0;
  bool has_doc = false;
  size_t k_off = 0, v_off = 0, pos_off = 0, doc_off = 0, bytes = 0;
  size_t kv_elems() const { return size_t(S_k) * size_t(H_kv) * size_t(D); }
};
KvLayout kv_layout(int64_t S_k, int32_t H_kv, int32_t D, bool has_doc);

struct KvView {
  float* k;
  float* v;
  int64_t* pos;
  int32_t* doc;  // null when the layout has no documents
};
KvView kv_view(const KvLayout& L, std::byte* base);
void pack_kv(const KvLayout& L, const float* k, const float* v, const int64_t* pos, const int32_t* doc,
             std::byte* base);

// Query rows per kernel call while a transfer is in flight: OpenMPI moves a large message only
// inside MPI calls, so the block's compute is split into row chunks and the pending requests
// are tested between chunks. About `parts` chunks, each a multiple of 192 rows (whole kernel tiles).
int64_t progress_chunk_rows(int64_t S_q, int parts);

// Calls attn_fwd (or attn_bwd) on query rows [a, b) of `p` for consecutive chunks of `chunk`
// rows, calling `between()` after each chunk. Forward with `merge`: the chunk's (o, lse) are
// computed into the scratch `o_tmp`/`lse_tmp` (chunk rows) and lse-merged into p.o / p.lse.
void fwd_chunked(const AttnParams& p, int64_t chunk, bool merge, float* o_tmp, float* lse_tmp,
                 const std::function<void()>& between);
void bwd_chunked(const AttnParams& p, int64_t chunk, const std::function<void()>& between);

}  // namespace cp
}  // namespace ctxpar
