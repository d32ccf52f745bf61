// Shared by the inference strategies that move queries instead of keys (pass_q.cpp,
// decode_pass_q.cpp, decode_allgather.cpp): the packed query block that travels, the partial
// results each rank computes for every visiting block, and their return to the owners by one
// all-to-all with the merge in rank order (Meta CP, "pass-Q": the LSE merge of partial
// attention outputs is exact, so the order only fixes the rounding, and a fixed order makes the
// result independent of arrival times).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn_params.hpp"
#include "core/memory.hpp"
#include "cp/strategy.hpp"
#include "dist/comm.hpp"

namespace ctxpar {
class Tracer;
namespace cp {

// One circulating query block of n rows: q [n, H_q, D], with the decode riders also the new
// tokens' k_new, v_new [n, H_kv, D]; positions [n]; with the riders the document (sequence) ids
// [n] as int64 (-1 = padding row); with `docs` (a batched prefill: several sequences, each its
// own document) the queries' document ids [n] as int32, matched against the keys' k_doc. One
// byte buffer (one message per hop), 64-byte aligned sections.
struct QLayout {
  int64_t n = 0;
  int32_t H_q = 0, H_kv = 0, D = 0;
  bool riders = false, docs = false;
  size_t q_off = 0, k_off = 0, v_off = 0, pos_off = 0, doc_off = 0, qdoc_off = 0, bytes = 0;
};
QLayout q_layout(int64_t n, int32_t H_q, int32_t H_kv, int32_t D, DType dtype, bool riders, bool docs = false);

// Packs the first n_rows local query rows (n_rows <= L.n; the rest are padding: tensors
// untouched, position -1, document -1) at `base` on the call's device; returns the metadata
// sections as written (host bytes, meta_bytes(L)). A block lives on the call's device
// (CpCall::device); its metadata sections (positions and document ids, from pos_off to the
// end) are also read on the host, from `meta`: the block's own bytes on the CPU, a host copy of
// every rank's (BlockMeta) for a device call.
inline size_t meta_bytes(const QLayout& L) { return L.bytes - L.pos_off; }
std::vector<std::byte> pack_queries(const QLayout& L, const CpCall& local, int64_t n_rows, std::byte* base);
// The host metadata of every rank's block of a device call: all-gathered once (host buffers, on
// the device backend's host communicator), so that no ring step reads device memory on the host.
struct BlockMeta {
  size_t bytes = 0;
  std::vector<std::byte> all;  // [N][bytes]
  const std::byte* of(int j) const { return all.data() + size_t(j) * bytes; }
  // The host metadata of rank j's block at `block`: the host copy when gathered (a device call),
  // else the block's own sections (a CPU call).
  const std::byte* of(int j, const QLayout& L, const std::byte* block) const {
    return all.empty() ? block + L.pos_off : of(j);
  }
};
BlockMeta gather_block_meta(Comm& c, const QLayout& L, const std::vector<std::byte>& mine, Tracer* tr, CpStats& st);
// The call of the block at `base` (origin rank's queries; `meta` its host metadata) against this
// rank's keys of `local`, its outputs at `o`, `lse` (n rows).
CpCall visiting_block(const QLayout& L, std::byte* base, const std::byte* meta, const CpCall& local, float* o,
                          float* lse);
// The document id of row i of the block (riders only), from its host metadata.
int64_t block_doc(const QLayout& L, const std::byte* meta, int64_t i);

// Decode: the partials of a visiting block of new tokens (riders) against this rank's KV cache
// (`local`'s k_doc_begin / k_doc_len / k_new_slot, host arrays): a row whose sequence is stored here
// first appends its own K/V (so it also sees itself); a row with nothing here (or a padding row)
// gets o = 0, lse = -inf. One kernel call per row. Returns the visible (query, key) pairs it
// computed per head: every row's cached keys (and itself), a window's within it.
double decode_visit(const QLayout& L, std::byte* base, const std::byte* meta, const CpCall& local, float* o,
                    float* lse);
// decode_visit into `part` (one block's partial_elems(L.n) floats: o, then lse), counted in `st`
// and traced as an attn_fwd span at ring step `step`.
void decode_visit_traced(const QLayout& L, std::byte* base, const std::byte* meta, const CpCall& local, float* part,
                         int step, Tracer* tr, CpStats& st);

// What a visit computes: the partials of the block at `block` (rank `origin`'s queries, `meta` its
// host metadata, at ring step `step`) against this rank's keys, into `part` (partial_elems(L.n)
// floats: o, then lse). It may test() `req`, the next hop in flight, so the transfer progresses.
using QueryVisit =
    std::function<void(std::byte* block, const std::byte* meta, int origin, int step, Request& req, float* part)>;

// One pass-Q forward: this rank's first n_rows rows of `local` packed into a block of L (L.n
// rows, the rest padding), N ring steps (at step s the block of rank (r - s) mod N is here; the
// next hop is posted before `visit` runs, double-buffered, and the wait after it is the exposed
// time; one message per hop), then return_and_merge into local.o, local.lse (n_rows rows).
void pass_q_forward(Comm& c, const QLayout& L, const CpCall& local, int64_t n_rows, int tag, Tracer* tr,
                    CpStats& st, const QueryVisit& visit);

// The forward-only strategies (pass_q, decode_*): a backward is refused.
class ForwardOnlyStrategy : public CpStrategy {
 public:
  bool has_backward() const override { return false; }
  void backward(const CpCall&, Tracer*, CpStats&) override;
};

// What the two decode strategies share: validate (the head groups), the bytes of one forward
// (`s.S_q`: the padded query rows of one rank's block; the block with its riders, and the
// partials returned), and the leading rows of a block that are this rank's sequences.
class DecodeStrategy : public ForwardOnlyStrategy {
 public:
  PartitionKind partition() const override { return PartitionKind::contiguous; }
  std::string validate(const CpCall& s, const Topology& topo) const override;
  double comm_volume_fwd(const CpCall& s, bool docs, const Topology& topo) const override;

 protected:
  static int64_t local_rows(const CpCall& p);
};

// Floats of one block's partial result: [o (n H_q D) | lse (n H_q)].
size_t partial_elems(int64_t n, int32_t H_q, int32_t D);

// `part` holds, block j, rank j's queries against this rank's keys (partial_elems(n_block) each).
// One all-to-all sends every block home; the first n_rows rows of every returned block are
// lse-merged in rank order into local.o [n_rows, H_q, D], local.lse [n_rows, H_q] (on its device).
void return_and_merge(Comm& c, Buffer<float>& part, int64_t n_block, int64_t n_rows, const CpCall& local,
                      Tracer* tr, CpStats& st);

}  // namespace cp
}  // namespace ctxpar
