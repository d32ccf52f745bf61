// Which key rows a rank's queries can see: the plan of frugal transfers (issue: only visible keys
// move). Every rank of a group holds n rows, which are both its queries and its keys (training);
// from every rank's positions and document ids, gathered once, each rank computes the same
// answer: the rows of rank i that some query of rank j can see under the mask (same document,
// and the key in the query's causal past, within `window` for a window mask; any row of the
// query's document without a mask).
#pragma once
#include <cstdint>
#include <vector>

#include "attn_params.hpp"

namespace ctxpar::cp {

struct VisiblePlan {
  std::vector<std::vector<int32_t>> send;  // [j]: this rank's rows that rank j can see (empty for j = rank)
  std::vector<std::vector<int32_t>> recv;  // [i]: rank i's rows this rank can see (empty for i = rank)
  int64_t send_rows() const;
  int64_t recv_rows() const;
};

// pos [P * n], doc [P * n] or null (one document): rank r's rows at [r * n, (r + 1) * n).
VisiblePlan visible_plan(const int64_t* pos, const int32_t* doc, int64_t n, int P, int rank, MaskKind mask,
                         int64_t window);

}  // namespace ctxpar::cp
