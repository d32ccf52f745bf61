#include "cp/visible.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "cp/common.hpp"
#include "trace/trace.hpp"

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

std::vector<int64_t> VisibleKeys::recv_pos(int i) const {
  std::vector<int64_t> out;
  for (int32_t m : plan.recv[size_t(i)]) out.push_back(pos[size_t(i * n + m)]);
  return out;
}
std::vector<int32_t> VisibleKeys::recv_doc(int i) const {
  std::vector<int32_t> out;
  if (!doc.empty())
    for (int32_t m : plan.recv[size_t(i)]) out.push_back(doc[size_t(i * n + m)]);
  return out;
}

bool visible_call(const CpCall& t) {
  if (t.device != Device::cpu)
    throw std::invalid_argument(std::string("frugal = true on device = ") + name_of(t.device) + ": CPU only so far");
  return !t.expander && t.q_pos == t.k_pos && t.q_doc == t.k_doc && t.S_q == t.S_k;
}

VisibleKeys gather_visible(Comm& c, const CpCall& t, Tracer* tr, CpStats& st) {
  const int P = c.size(), r = c.rank();
  VisibleKeys v;
  v.n = t.S_k;
  const size_t n = size_t(t.S_k);
  if (tr) tr->progress(Phase::all_gather);
  const std::vector<std::vector<int64_t>> derived = derived_key_positions(t, P, r);
  if (!derived.empty()) {  // the zigzag shards: known here, nothing travels
    for (const auto& d : derived) v.pos.insert(v.pos.end(), d.begin(), d.end());
  } else {
    v.pos.resize(n * P);
    timed_collective(c, st, tr, Phase::all_gather, double((P - 1) * n * sizeof(int64_t)),
                     [&] { c.all_gather(std::span<const int64_t>(t.k_pos, n), std::span<int64_t>(v.pos)); });
  }
  if (t.k_doc) {
    v.doc.resize(n * P);
    timed_collective(c, st, tr, Phase::all_gather, double((P - 1) * n * sizeof(int32_t)),
                     [&] { c.all_gather(std::span<const int32_t>(t.k_doc, n), std::span<int32_t>(v.doc)); });
  }
  v.plan = visible_plan(v.pos.data(), t.k_doc ? v.doc.data() : nullptr, t.S_k, P, r, t.mask, t.window);
  return v;
}

const VisibleKeys& VisibleCache::get(Comm& c, const CpCall& t, Tracer* tr, CpStats& st) {
  if (t.batch_id <= 0) {
    scratch_ = gather_visible(c, t, tr, st);
    return scratch_;
  }
  for (const auto& e : entries_)
    if (e->batch == t.batch_id && e->n == t.S_k && e->mask == t.mask && e->window == t.window) return e->keys;
  std::erase_if(entries_, [&](const auto& e) { return e->batch != t.batch_id; });  // an older batch's
  entries_.push_back(std::make_unique<Entry>(Entry{t.batch_id, t.S_k, t.window, t.mask, gather_visible(c, t, tr, st)}));
  return entries_.back()->keys;
}

size_t kv_row_bytes(const CpCall& t) { return size_t(t.H_kv) * size_t(t.D) * dtype_bytes(t.dtype); }
size_t grad_row_bytes(const CpCall& t) { return size_t(t.H_kv) * size_t(t.D) * sizeof(float); }

void pack_visible_rows(const CpCall& t, const std::vector<int32_t>& rows, std::byte* out) {
  const size_t row = kv_row_bytes(t), m = rows.size();
  for (size_t i = 0; i < m; ++i) {
    std::memcpy(out + i * row, static_cast<const std::byte*>(t.k) + size_t(rows[i]) * row, row);
    std::memcpy(out + (m + i) * row, static_cast<const std::byte*>(t.v) + size_t(rows[i]) * row, row);
  }
}

void add_visible_grads(const CpCall& t, const std::vector<int32_t>& rows, const float* in) {
  const size_t w = size_t(t.H_kv) * size_t(t.D), m = rows.size();
  for (size_t i = 0; i < m; ++i) {
    float* dk = t.dk + size_t(rows[i]) * w;
    float* dv = t.dv + size_t(rows[i]) * w;
    const float* gk = in + i * w;
    const float* gv = in + (m + i) * w;
    for (size_t e = 0; e < w; ++e) {
      dk[e] += gk[e];
      dv[e] += gv[e];
    }
  }
}

}  // namespace ctxpar::cp
