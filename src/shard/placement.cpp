// Balanced placement of packed documents (shard/placement.hpp). Integer arithmetic only, so
// every rank (and every platform) computes the same placement from the same lengths.
#include "shard/placement.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/error.hpp"
#include "shard/partition.hpp"

namespace ctxpar {
namespace {

// Causal pairs of rows [a, b) of one document: row t sees the t + 1 rows [0, t].
int64_t span_pairs(int64_t a, int64_t b) { return (b * (b + 1) - a * (a + 1)) / 2; }

struct Range {
  int64_t begin, end;  // rows [begin, end) of a document
};

// Member k's share of a document of L rows split zigzag over g ranks: chunks k and 2g-1-k of 2g
// chunks whose sizes differ by at most one.
std::pair<Range, Range> zigzag_share(int64_t L, int64_t g, int64_t k) {
  const auto cut = [&](int64_t c) { return c * L / (2 * g); };
  return {{cut(k), cut(k + 1)}, {cut(2 * g - 1 - k), cut(2 * g - k)}};
}
int64_t share_rows(int64_t L, int64_t g, int64_t k) {
  const auto [a, b] = zigzag_share(L, g, k);
  return (a.end - a.begin) + (b.end - b.begin);
}
int64_t share_pairs(int64_t L, int64_t g, int64_t k) {
  const auto [a, b] = zigzag_share(L, g, k);
  return span_pairs(a.begin, a.end) + span_pairs(b.begin, b.end);
}

// The state of a placement under construction.
struct Builder {
  std::vector<int64_t> room, work;
  std::vector<std::vector<Range>> held;  // [rank]: global position ranges
  std::vector<int32_t> spans;
  int64_t total = 0;  // causal pairs of the whole sequence
  int P = 0;
  bool whole_or_all = false;  // groups of one rank or of every rank only
  bool two_d = false;         // a whole document goes where work and rows stay lowest, both against their means
  int64_t n = 0;
  // The rank with room for L rows whose larger share of the mean, of work or of rows, stays lowest.
  std::vector<int> whole_by_both(int64_t L) const {
    int best = -1;
    __int128 best_score = 0;
    const int64_t pairs = span_pairs(0, L);
    for (int r = 0; r < P; ++r) {
      if (room[size_t(r)] < L) continue;
      const __int128 a = __int128(work[size_t(r)] + pairs) * n * P, b = __int128(n - room[size_t(r)] + L) * total;
      const __int128 score = std::max(a, b);
      if (best < 0 || score < best_score) best = r, best_score = score;
    }
    return best < 0 ? std::vector<int>{} : std::vector<int>{best};
  }

  // Whether a rank's work w stays within the slack of the mean (total / P).
  bool within_slack(int64_t w) const {
    return __int128(w) * P * 100 <= __int128(total) * (100 + kBalanceSlackPercent);
  }
  void give(int r, int64_t start, Range x) {
    if (x.end <= x.begin) return;
    held[size_t(r)].push_back({start + x.begin, start + x.end});
    room[size_t(r)] -= x.end - x.begin;
    work[size_t(r)] += span_pairs(x.begin, x.end);
  }
  std::vector<int> by_work() const {  // ranks, least loaded first (ties: lower rank)
    std::vector<int> order(static_cast<size_t>(P));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return work[size_t(a)] < work[size_t(b)]; });
    return order;
  }
  // The g least-loaded ranks with room for a share of a document of L rows split over g, [k] the
  // rank of share k: the larger a share, the more room its rank has (shares differ by a row, and
  // a rank's room may be a row short of the larger one). Empty when g such ranks do not fit.
  std::vector<int> members(const std::vector<int>& order, int64_t L, int64_t g) const {
    std::vector<int64_t> rows(static_cast<size_t>(g));
    for (int64_t k = 0; k < g; ++k) rows[size_t(k)] = share_rows(L, g, k);
    const int64_t smallest = *std::min_element(rows.begin(), rows.end());
    std::vector<int> pick;
    for (int r : order) {
      if (int64_t(pick.size()) == g) break;
      if (room[size_t(r)] >= smallest) pick.push_back(r);
    }
    if (int64_t(pick.size()) < g) return {};
    std::vector<int> share(static_cast<size_t>(g));
    std::iota(share.begin(), share.end(), 0);
    std::stable_sort(share.begin(), share.end(), [&](int a, int b) { return rows[size_t(a)] > rows[size_t(b)]; });
    std::stable_sort(pick.begin(), pick.end(), [&](int a, int b) { return room[size_t(a)] > room[size_t(b)]; });
    std::vector<int> m(static_cast<size_t>(g));
    for (int64_t i = 0; i < g; ++i) {
      if (room[size_t(pick[size_t(i)])] < rows[size_t(share[size_t(i)])]) return {};
      m[size_t(share[size_t(i)])] = pick[size_t(i)];
    }
    return m;
  }
  // The least-loaded rank with room for L rows (ties: the lower rank); empty when none has room.
  std::vector<int> whole_least_loaded(int64_t L) const {
    int best = -1;
    for (int r = 0; r < P; ++r)
      if (room[size_t(r)] >= L && (best < 0 || work[size_t(r)] < work[size_t(best)])) best = r;
    return best < 0 ? std::vector<int>{} : std::vector<int>{best};
  }
  std::vector<int64_t> group_sizes(int64_t L) const;
  void place(int32_t doc, int64_t start, int64_t L);
  void place_contiguous(int32_t doc, int64_t start, int64_t L, const std::vector<int>& order);
};

// The group sizes a document of L rows may take, smallest first: one rank, the powers of two
// below min(P, L), and min(P, L) (whole_or_all: the first and the last).
std::vector<int64_t> Builder::group_sizes(int64_t L) const {
  const int64_t g_max = std::min<int64_t>(P, L);
  std::vector<int64_t> sizes = {1};
  if (!whole_or_all)
    for (int64_t g = 2; g < g_max; g *= 2) sizes.push_back(g);
  if (g_max > 1) sizes.push_back(g_max);
  return sizes;
}

void Builder::place(int32_t doc, int64_t start, int64_t L) {
  std::vector<int> order;  // ranks by work: sorted once, when a group of several ranks is tried
  std::vector<int> best;
  int64_t best_max = -1;
  for (int64_t g : group_sizes(L)) {
    if (g > 1 && order.empty()) order = by_work();
    std::vector<int> m = g > 1 ? members(order, L, g) : two_d ? whole_by_both(L) : whole_least_loaded(L);
    if (m.empty()) continue;
    int64_t top = 0;
    for (int64_t k = 0; k < g; ++k) top = std::max(top, work[size_t(m[size_t(k)])] + share_pairs(L, g, k));
    if (best_max < 0 || top < best_max) best = m, best_max = top;
    if (within_slack(top)) {
      best = std::move(m);
      break;
    }
  }
  if (best.empty()) return place_contiguous(doc, start, L, order.empty() ? by_work() : order);
  const int64_t g = int64_t(best.size());
  for (int64_t k = 0; k < g; ++k) {
    const auto [a, b] = zigzag_share(L, g, k);
    give(best[size_t(k)], start, a);
    give(best[size_t(k)], start, b);
  }
  spans[size_t(doc)] = int32_t(g);
}

// No group has room for even shares: the document's rows in order, filling the least-loaded ranks' room.
void Builder::place_contiguous(int32_t doc, int64_t start, int64_t L, const std::vector<int>& order) {
  int64_t at = 0;
  int32_t used = 0;
  for (int r : order) {
    const int64_t take = std::min(room[size_t(r)], L - at);
    if (take <= 0) continue;
    give(r, start, {at, at + take});
    at += take;
    ++used;
    if (at == L) break;
  }
  CTXPAR_CHECK(at == L, "placement: no room left for rows " << at << ".." << L << " of document " << doc);
  spans[size_t(doc)] = used;
}

// Each rank's rows from its ranges: ascending, then padding positions S, S+1, ... up to n rows.
std::vector<std::vector<int64_t>> rows_of(const std::vector<std::vector<Range>>& held, int64_t S, int64_t n) {
  std::vector<std::vector<int64_t>> rows(held.size());
  int64_t pad = S;
  for (size_t r = 0; r < held.size(); ++r) {
    std::vector<int64_t>& x = rows[r];
    x.reserve(size_t(n));
    std::vector<Range> ranges = held[r];  // disjoint: in position order, their rows ascend
    std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
    for (const Range& g : ranges)
      for (int64_t p = g.begin; p < g.end; ++p) x.push_back(p);
    CTXPAR_CHECK(int64_t(x.size()) <= n, "placement: rank " << r << " holds " << x.size() << " rows, more than " << n);
    while (int64_t(x.size()) < n) x.push_back(pad++);
  }
  return rows;
}

}  // namespace

double Placement::imbalance() const {
  const int64_t sum = std::accumulate(work.begin(), work.end(), int64_t(0));
  if (sum == 0) return 1.0;
  return double(*std::max_element(work.begin(), work.end())) * double(work.size()) / double(sum);
}

int64_t Placement::split_documents() const {
  return std::count_if(spans.begin(), spans.end(), [](int32_t s) { return s > 1; });
}

Placement balanced_placement(const std::vector<int64_t>& lengths, int P, int64_t n) {
  CTXPAR_CHECK(P >= 1 && n >= 1, "placement over " << P << " ranks of " << n << " rows");
  Builder empty;
  empty.P = P;
  empty.room.assign(size_t(P), n);
  empty.work.assign(size_t(P), 0);
  empty.held.resize(size_t(P));
  empty.spans.assign(lengths.size(), 0);
  std::vector<int64_t> start(lengths.size());
  int64_t S = 0;
  for (size_t d = 0; d < lengths.size(); ++d) {
    CTXPAR_CHECK(lengths[d] >= 1, "placement: document " << d << " has length " << lengths[d]);
    start[d] = S;
    S += lengths[d];
    empty.total += span_pairs(0, lengths[d]);
  }
  CTXPAR_CHECK(n * P >= S, "placement: " << S << " tokens do not fit " << P << " ranks of " << n << " rows");
  std::vector<int32_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t c) { return lengths[size_t(a)] > lengths[size_t(c)]; });
  // Four greedy passes: groups of the fewest ranks within the slack, or of one rank or all (a
  // document split over every rank takes the same rows and work from each, so it never leaves one
  // rank short of room); a whole document to the least-loaded rank, or to the one whose work and
  // rows stay lowest against their means. Then the zigzag partition's own rows, so the placement is
  // never less balanced than zigzag. The best balance wins; of those within the slack, the one that
  // splits fewer rows (less to exchange, fewer chunk borders in the kernels). Every document over
  // every rank would always be balanced, but measured slower than a 12% imbalance
  // (docs/measurements.md): it is not a candidate.
  // The passes' rows are expanded only for the one that wins (`held`: their position ranges).
  std::vector<Placement> candidates;
  std::vector<std::vector<std::vector<Range>>> held;
  for (int pass = 0; pass < 4; ++pass) {
    Builder b = empty;
    b.whole_or_all = pass & 1;
    b.two_d = pass & 2;
    b.n = n;
    for (int32_t d : order) b.place(d, start[size_t(d)], lengths[size_t(d)]);
    Placement p;
    p.S = S;
    p.n = n;
    p.work = std::move(b.work);
    p.spans = std::move(b.spans);
    candidates.push_back(std::move(p));
    held.push_back(std::move(b.held));
  }
  if (Partition::padded_length(PartitionKind::zigzag, S, P) == n * P) candidates.push_back(zigzag_placement(lengths, P));
  const auto split_rows = [&](const Placement& p) {
    int64_t rows = 0;
    for (size_t d = 0; d < lengths.size(); ++d) rows += p.spans[d] > 1 ? lengths[d] : 0;
    return rows;
  };
  const auto top = [](const Placement& p) { return *std::max_element(p.work.begin(), p.work.end()); };
  size_t best = 0;
  for (size_t i = 1; i < candidates.size(); ++i) {
    const bool both_fit = empty.within_slack(top(candidates[i])) && empty.within_slack(top(candidates[best]));
    if (both_fit ? split_rows(candidates[i]) < split_rows(candidates[best]) : top(candidates[i]) < top(candidates[best]))
      best = i;
  }
  if (best < held.size()) candidates[best].rows = rows_of(held[best], S, n);
  return std::move(candidates[best]);
}

// A document's rows are the positions [start, start + L): rank j, whose last row of it is at
// position m, sees its rows up to m, m - start + 1 of them, of which it holds own_j.
std::vector<int64_t> rows_received(const Placement& p, const std::vector<int64_t>& lengths) {
  std::vector<int64_t> start(lengths.size()), doc_of(size_t(p.S));
  for (size_t d = 0, at = 0; d < lengths.size(); at += size_t(lengths[d]), ++d) {
    start[d] = int64_t(at);
    std::fill_n(doc_of.begin() + int64_t(at), lengths[d], int64_t(d));
  }
  std::vector<int64_t> got(size_t(p.P()), 0);
  for (int j = 0; j < p.P(); ++j) {
    const std::vector<int64_t>& rows = p.rows[size_t(j)];
    for (size_t i = 0; i < rows.size() && rows[i] < p.S;) {  // runs of one document, ascending
      const int64_t d = doc_of[size_t(rows[i])];
      size_t e = i;
      while (e < rows.size() && rows[e] < p.S && doc_of[size_t(rows[e])] == d) ++e;
      got[size_t(j)] += (rows[e - 1] - start[size_t(d)] + 1) - int64_t(e - i);
      i = e;
    }
  }
  return got;
}

Placement zigzag_placement(const std::vector<int64_t>& lengths, int P) {
  const int64_t S = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
  const Partition part(PartitionKind::zigzag, S, P);
  std::vector<int64_t> doc_start;  // per position: where its document starts
  doc_start.reserve(size_t(S));
  std::vector<int32_t> doc;
  for (size_t d = 0, at = 0; d < lengths.size(); at += size_t(lengths[d]), ++d)
    for (int64_t i = 0; i < lengths[d]; ++i) doc_start.push_back(int64_t(at)), doc.push_back(int32_t(d));
  Placement p;
  p.S = S;
  p.n = part.local_size(0);
  p.spans.assign(lengths.size(), 0);
  std::vector<int> last(lengths.size(), -1);  // the last rank a document was seen on (ranks in order)
  for (int r = 0; r < P; ++r) {
    p.rows.push_back(part.positions(r));
    int64_t w = 0;
    for (int64_t x : p.rows.back()) {
      if (part.is_pad(x)) continue;
      w += x - doc_start[size_t(x)] + 1;
      const size_t d = size_t(doc[size_t(x)]);
      if (last[d] != r) last[d] = r, ++p.spans[d];
    }
    p.work.push_back(w);
  }
  return p;
}

Placement document_placement(const std::vector<int64_t>& lengths, int P) {
  CTXPAR_CHECK(P >= 1, "placement over " << P << " ranks");
  const int64_t S = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
  const int64_t chunks = 2 * int64_t(P);
  Placement p;
  p.S = S;
  p.n = Partition::padded_length(PartitionKind::zigzag, S, P) / P;
  p.work.assign(size_t(P), 0);
  p.spans.assign(lengths.size(), 0);
  std::vector<std::vector<Range>> held(static_cast<size_t>(P));
  int64_t start = 0, cursor = 0;  // the chunk that takes the next remainder row
  for (size_t d = 0; d < lengths.size(); ++d) {
    const int64_t L = lengths[d], base = L / chunks, extra = L % chunks;
    CTXPAR_CHECK(L >= 1, "placement: document " << d << " has length " << L);
    std::vector<int64_t> size(static_cast<size_t>(chunks), base);
    for (int64_t i = 0; i < extra; ++i) ++size[size_t((cursor + i) % chunks)];
    cursor = (cursor + extra) % chunks;
    std::vector<bool> on(static_cast<size_t>(P), false);
    for (int64_t c = 0, at = 0; c < chunks; at += size[size_t(c)], ++c) {
      if (size[size_t(c)] == 0) continue;
      const int r = int(c < P ? c : chunks - 1 - c);
      held[size_t(r)].push_back({start + at, start + at + size[size_t(c)]});
      p.work[size_t(r)] += span_pairs(at, at + size[size_t(c)]);
      on[size_t(r)] = true;
    }
    p.spans[d] = int32_t(std::count(on.begin(), on.end(), true));
    start += L;
  }
  p.rows = rows_of(held, S, p.n);
  return p;
}

Placement place_documents(PlacementKind kind, const std::vector<int64_t>& lengths, int P, int64_t n) {
  switch (kind) {
    case PlacementKind::zigzag: return zigzag_placement(lengths, P);
    case PlacementKind::balanced: return balanced_placement(lengths, P, n);
    case PlacementKind::document: return document_placement(lengths, P);
    case PlacementKind::automatic: break;
  }
  CTXPAR_CHECK(false, "place_documents: placement = auto prices two placements; place one of them");
  return {};
}

}  // namespace ctxpar
