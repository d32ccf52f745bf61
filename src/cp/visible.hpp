// Which key rows a rank's queries can see: the plan of the visible-keys schedules (config frugal=true,
// CpSchedule::visible: visible_allgather.cpp, visible_ring.cpp). Every rank of a group holds n rows,
// which are both its queries and its keys (training); from every rank's positions and document
// ids, gathered once per batch and mask (VisibleCache; positions derived instead where
// CpCall::k_pos_zigzag says the keys are the zigzag shards), each rank computes the same
// answer: the rows of rank i that some query of rank j can see under the mask (same document, and
// the key in the query's causal past, within `window` for a window mask; any row of the query's
// document without a mask).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "attn_params.hpp"
#include "cp/strategy.hpp"
#include "dist/comm.hpp"

namespace ctxpar {
class Tracer;
class Topology;

// The schedule's strategies (registry rows of CpSchedule::visible): visible_allgather.cpp, visible_ring.cpp.
std::unique_ptr<CpStrategy> make_visible_allgather_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_visible_ring_strategy(Topology& topo);

namespace cp {

struct VisiblePlan {
  std::vector<std::vector<int32_t>> send;  // [j]: this rank's rows that rank j can see (empty for j = rank)
  std::vector<std::vector<int32_t>> recv;  // [i]: rank i's rows this rank can see (empty for i = rank)
  int64_t send_rows() const;
  int64_t recv_rows() const;
};

// pos [P * n], doc [P * n] or null (one document): rank r's rows at [r * n, (r + 1) * n).
VisiblePlan visible_plan(const int64_t* pos, const int32_t* doc, int64_t n, int P, int rank, MaskKind mask,
                         int64_t window);

// A call's visible-keys view of its group: every rank's key positions and document ids and the plan.
struct VisibleKeys {
  int64_t n = 0;             // rows per rank (t.S_k)
  std::vector<int64_t> pos;  // [P * n]
  std::vector<int32_t> doc;  // [P * n], empty without documents
  VisiblePlan plan;
  // The positions and document ids of rank i's rows this rank receives (plan.recv[i]).
  std::vector<int64_t> recv_pos(int i) const;
  std::vector<int32_t> recv_doc(int i) const;
};

// Whether `t` is a call the visible-keys schedules serve: K/V rows that are the queries' own (training's
// self-attention: same positions and documents, S_q = S_k), no MLA latent; the others run the
// plain schedule. Throws std::invalid_argument for a device call (the schedules are CPU only).
bool visible_call(const CpCall& t);

// All-gathers document ids (and positions unless derivable) over `c` (blocking, booked as
// all_gather) and computes the plan: identical on every rank.
VisibleKeys gather_visible(Comm& c, const CpCall& t, Tracer* tr, CpStats& st);

// The plans of one batch (CpCall::batch_id), one per mask (a model's global and local layers
// differ): a strategy keeps one and asks it for each such call, so the metadata is gathered and
// the plan computed once per batch and mask, not per layer and pass. Without a batch id (0) every
// call computes its own. The id is the same on every rank, so they all hit or all miss.
class VisibleCache {
 public:
  const VisibleKeys& get(Comm& c, const CpCall& t, Tracer* tr, CpStats& st);

 private:
  struct Entry {
    int64_t batch = 0, n = 0, window = 0;
    MaskKind mask = MaskKind::causal;
    VisibleKeys keys;
  };
  std::vector<std::unique_ptr<Entry>> entries_;  // stable addresses: get()'s result stays valid for the batch
  VisibleKeys scratch_;
};

// Bytes of one K or V row of `t` (H_kv * D elements of t.dtype); of one fp32 gradient row.
size_t kv_row_bytes(const CpCall& t);
size_t grad_row_bytes(const CpCall& t);
// Packs rows `rows` of t.k, then the same rows of t.v, at `out` ([K rows | V rows]).
void pack_visible_rows(const CpCall& t, const std::vector<int32_t>& rows, std::byte* out);
// Adds the fp32 gradients [dK rows | dV rows] at `in` to rows `rows` of t.dk and t.dv.
void add_visible_grads(const CpCall& t, const std::vector<int32_t>& rows, const float* in);

}  // namespace cp
}  // namespace ctxpar
