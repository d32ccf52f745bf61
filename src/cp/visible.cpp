#include "cp/visible.hpp"

#include <algorithm>
#include <limits>
#include <utility>

namespace ctxpar::cp {

namespace {

// Rank j's queries as (document, position), sorted: the lookups below are binary searches.
using Queries = std::vector<std::pair<int32_t, int64_t>>;

Queries queries_of(const int64_t* pos, const int32_t* doc, int64_t n, int j) {
  Queries q(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) q[size_t(i)] = {doc ? doc[j * n + i] : 0, pos[j * n + i]};
  std::sort(q.begin(), q.end());
  return q;
}

// Can some query of `q` see a key at position p of document d (pair_visible, kernels/attn_params.hpp)?
bool seen(const Queries& q, int32_t d, int64_t p, MaskKind mask, int64_t window) {
  if (mask == MaskKind::none) {
    const auto it = std::lower_bound(q.begin(), q.end(), std::make_pair(d, std::numeric_limits<int64_t>::min()));
    return it != q.end() && it->first == d;
  }
  // The first query of document d at or after p: causal sees it; a window needs it within reach.
  const auto it = std::lower_bound(q.begin(), q.end(), std::make_pair(d, p));
  if (it == q.end() || it->first != d) return false;
  return mask == MaskKind::causal || it->second - p < window;
}

std::vector<int32_t> rows_seen(const Queries& q, const int64_t* pos, const int32_t* doc, int64_t n, int i,
                               MaskKind mask, int64_t window) {
  std::vector<int32_t> rows;
  for (int64_t k = 0; k < n; ++k)
    if (seen(q, doc ? doc[i * n + k] : 0, pos[i * n + k], mask, window)) rows.push_back(int32_t(k));
  return rows;
}

}  // namespace

int64_t VisiblePlan::send_rows() const {
  int64_t s = 0;
  for (const auto& v : send) s += int64_t(v.size());
  return s;
}
int64_t VisiblePlan::recv_rows() const {
  int64_t s = 0;
  for (const auto& v : recv) s += int64_t(v.size());
  return s;
}

VisiblePlan visible_plan(const int64_t* pos, const int32_t* doc, int64_t n, int P, int rank, MaskKind mask,
                         int64_t window) {
  VisiblePlan plan;
  plan.send.resize(size_t(P));
  plan.recv.resize(size_t(P));
  const Queries mine = queries_of(pos, doc, n, rank);
  for (int j = 0; j < P; ++j) {
    if (j == rank) continue;
    plan.send[size_t(j)] = rows_seen(queries_of(pos, doc, n, j), pos, doc, n, rank, mask, window);
    plan.recv[size_t(j)] = rows_seen(mine, pos, doc, n, j, mask, window);
  }
  return plan;
}

}  // namespace ctxpar::cp
