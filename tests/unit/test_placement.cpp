// Unit tests for shard/placement: every row placed exactly once, n rows on every rank (padding
// last), the same placement from the same lengths, the work it reports equal to the work of its
// rows, and the balance it promises on mixes where a balance exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/random.hpp"
#include "shard/partition.hpp"
#include "shard/placement.hpp"

namespace ctxpar {
namespace {

// The causal work of each rank's rows, counted row by row from the lengths (not from the placement's own sums).
std::vector<int64_t> work_of_rows(const Placement& p, const std::vector<int64_t>& lengths) {
  std::vector<int64_t> start;  // per position: its document's first position
  for (size_t d = 0, at = 0; d < lengths.size(); at += size_t(lengths[d]), ++d)
    for (int64_t i = 0; i < lengths[d]; ++i) start.push_back(int64_t(at));
  std::vector<int64_t> w;
  for (const auto& rows : p.rows) {
    int64_t x = 0;
    for (int64_t pos : rows)
      if (pos < p.S) x += pos - start[size_t(pos)] + 1;
    w.push_back(x);
  }
  return w;
}

// Every position < S on exactly one rank, n rows per rank ascending with the padding (S, S+1, ...)
// last, and the reported work that of the rows.
void expect_valid(const Placement& p, const std::vector<int64_t>& lengths, int P, int64_t n) {
  const int64_t S = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
  ASSERT_EQ(p.S, S);
  ASSERT_EQ(p.P(), P);
  ASSERT_EQ(p.n, n);
  std::vector<int> seen(size_t(n) * size_t(P), 0);
  for (int r = 0; r < P; ++r) {
    const std::vector<int64_t>& rows = p.rows[size_t(r)];
    ASSERT_EQ(int64_t(rows.size()), n) << "rank " << r;
    ASSERT_TRUE(std::is_sorted(rows.begin(), rows.end())) << "rank " << r;
    for (int64_t x : rows) {
      ASSERT_GE(x, 0);
      ASSERT_LT(x, n * P);
      ++seen[size_t(x)];
    }
  }
  for (int64_t x = 0; x < n * P; ++x) ASSERT_EQ(seen[size_t(x)], 1) << "position " << x;
  EXPECT_EQ(p.work, work_of_rows(p, lengths));
  ASSERT_EQ(p.spans.size(), lengths.size());
  for (size_t d = 0; d < lengths.size(); ++d) {
    EXPECT_GE(p.spans[d], 1);
    EXPECT_LE(p.spans[d], std::min<int64_t>(P, lengths[d]));
  }
}

// Long-tail mixes: geometric lengths of a random mean, a document longer than S/P, one-token
// documents, and a sequence that is one document.
std::vector<int64_t> random_mix(uint64_t seed, int64_t S, int P) {
  uint64_t k = seed << 32;
  const auto next = [&] { return splitmix64(k++); };
  std::vector<int64_t> L;
  const int64_t mean = 1 + int64_t(next() % uint64_t(S / 2));
  if (seed % 4 == 0) L.push_back(std::min(S, S / P + 1 + int64_t(next() % uint64_t(S / P))));  // longer than S/P
  int64_t left = S - (L.empty() ? 0 : L[0]);
  while (left > 0) {
    int64_t len = seed % 4 == 1 ? 1 : 1 + int64_t(next() % uint64_t(2 * mean));
    len = std::min(len, left);
    L.push_back(len);
    left -= len;
  }
  if (seed % 7 == 0) L = {S};
  return L;
}

TEST(Placement, EveryRowOnceOnRandomMixes) {
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const int P = 1 + int(seed % 8);
    const int64_t S = 16 + int64_t(seed * 37 % 3000);
    const std::vector<int64_t> L = random_mix(seed, S, P);
    const int64_t n = Partition::padded_length(PartitionKind::zigzag, S, P) / P;
    SCOPED_TRACE(testing::Message() << "seed " << seed << ", S " << S << ", P " << P << ", " << L.size() << " documents");
    const Placement p = balanced_placement(L, P, n);
    expect_valid(p, L, P, n);
    // A pure function of the lengths: what every rank computes on its own.
    const Placement again = balanced_placement(L, P, n);
    EXPECT_EQ(again.rows, p.rows);
    const Placement z = zigzag_placement(L, P);
    expect_valid(z, L, P, n);
    // Every document zigzag on its own: the same rows per rank as zigzag (the remainders dealt in
    // turn), a document of at least 2P rows on every rank, and the dispatcher's answers the same.
    const Placement d = document_placement(L, P);
    expect_valid(d, L, P, n);
    for (size_t k = 0; k < L.size(); ++k) {
      if (L[k] >= 2 * P) {
        EXPECT_EQ(d.spans[k], P) << "document " << k << " of " << L[k];
      }
    }
    EXPECT_EQ(place_documents(PlacementKind::document, L, P, n).rows, d.rows);
    EXPECT_EQ(place_documents(PlacementKind::balanced, L, P, n).rows, p.rows);
    EXPECT_EQ(place_documents(PlacementKind::zigzag, L, P, n).rows, z.rows);
    // Never less balanced than zigzag (its rows are a candidate), unless both are within the slack
    // (then the one that splits fewer rows is taken).
    const double total = double(std::accumulate(p.work.begin(), p.work.end(), int64_t(0)));
    const double bound = std::max(double(*std::max_element(z.work.begin(), z.work.end())),
                                  total / P * (1.0 + kBalanceSlackPercent / 100.0));
    EXPECT_LE(double(*std::max_element(p.work.begin(), p.work.end())), bound);
  }
}

// rows_received against a pair-by-pair count: row x of rank i is received by rank j != i when
// some row of j is in x's document at or after x.
TEST(Placement, RowsReceivedMatchAPairByPairCount) {
  for (uint64_t seed = 0; seed < 60; ++seed) {
    const int P = 2 + int(seed % 5);
    const int64_t S = 40 + int64_t(seed * 53 % 700);
    const std::vector<int64_t> L = random_mix(seed, S, P);
    const int64_t n = Partition::padded_length(PartitionKind::zigzag, S, P) / P;
    std::vector<int64_t> doc;
    for (size_t d = 0; d < L.size(); ++d) doc.insert(doc.end(), size_t(L[d]), int64_t(d));
    for (const Placement& p : {balanced_placement(L, P, n), zigzag_placement(L, P), document_placement(L, P)}) {
      std::vector<int64_t> want(size_t(P), 0);
      for (int j = 0; j < P; ++j)
        for (int i = 0; i < P; ++i) {
          if (i == j) continue;
          for (int64_t x : p.rows[size_t(i)]) {
            if (x >= S) continue;
            bool seen = false;
            for (int64_t q : p.rows[size_t(j)]) seen = seen || (q < S && q >= x && doc[size_t(q)] == doc[size_t(x)]);
            want[size_t(j)] += seen;
          }
        }
      EXPECT_EQ(rows_received(p, L), want) << "seed " << seed << ", P " << P;
    }
  }
}

TEST(Placement, ShortDocumentsStayWhole) {
  // 64 documents of 16 tokens over 4 ranks: 16 whole documents on each, none split, work equal.
  const std::vector<int64_t> L(64, 16);
  const Placement p = balanced_placement(L, 4, 256);
  expect_valid(p, L, 4, 256);
  EXPECT_EQ(p.split_documents(), 0);
  EXPECT_EQ(p.imbalance(), 1.0);
}

TEST(Placement, OneDocumentIsTheZigzagShard) {
  // One document over the whole sequence: split over every rank, each rank's rows its zigzag shard.
  const int64_t S = 4096;
  for (int P : {2, 3, 4, 8}) {
    const int64_t n = Partition::padded_length(PartitionKind::zigzag, S, P) / P;
    const Placement p = balanced_placement({S}, P, n);
    expect_valid(p, {S}, P, n);
    EXPECT_EQ(p.spans[0], P);
    EXPECT_LE(p.imbalance(), 1.0 + 2.0 * P / double(S)) << "P " << P;  // chunk sizes differ by one row at most
    // It receives 3/4 of the plain ring's rows (every other rank's), the least that any placement
    // within 5% of the mean work receives (scripts/placement_bound.py, ctest placement_bound: 0.750
    // at P = 2, 3, 4 on 8, 12, 16 blocks): one long document leaves no placement fewer bytes.
    const std::vector<int64_t> got = rows_received(p, {S});
    const double ratio = double(std::accumulate(got.begin(), got.end(), int64_t(0))) / double((P - 1) * S);
    EXPECT_NEAR(ratio, 0.75, 2.0 * P / double(S)) << "P " << P;
  }
}

TEST(Placement, DocumentLayoutIsZigzagPerDocument) {
  // Documents whose lengths 2P divides: each rank holds chunks k and 2P-1-k of every document, so
  // the work is equal on every rank (2P c^2 + c pairs per document of 2P chunks of c rows).
  const int P = 4;
  const std::vector<int64_t> L = {8, 64, 800, 16, 120};  // 1008 tokens
  const Placement d = document_placement(L, P);
  expect_valid(d, L, P, Partition::padded_length(PartitionKind::zigzag, 1008, P) / P);
  EXPECT_EQ(d.imbalance(), 1.0);
  for (int r = 0; r < P; ++r) {  // rank r's rows of the first document (8 rows, chunks of 1): r and 7 - r
    std::vector<int64_t> first;
    for (int64_t x : d.rows[size_t(r)])
      if (x < 8) first.push_back(x);
    EXPECT_EQ(first, (std::vector<int64_t>{r, 7 - r})) << "rank " << r;
  }
  // One-token documents: one rank each, dealt in turn over the chunks (ranks 0, 1, 2, 3, 3, 2, 1, 0),
  // so no rank holds more than its n rows.
  const std::vector<int64_t> ones(16, 1);
  const Placement o = document_placement(ones, P);
  expect_valid(o, ones, P, 4);
  for (int r = 0; r < P; ++r) EXPECT_EQ(o.rows[size_t(r)].back(), 15 - r) << "rank " << r;
}

TEST(Placement, LongTailWithinTheSlackWhereZigzagIsNot) {
  // One long document and a tail of short ones (S = 32K, P = 4): zigzag puts the long document's
  // heavy end where its positions fall; balanced keeps every rank within 2% of the mean.
  std::vector<int64_t> L = {3000, 12000, 500, 700, 9000};
  int64_t left = 32768 - std::accumulate(L.begin(), L.end(), int64_t(0));
  for (int64_t i = 0; left > 0; ++i) {
    const int64_t len = std::min<int64_t>(left, 20 + (i * 97) % 400);
    L.push_back(len);
    left -= len;
  }
  const Placement b = balanced_placement(L, 4, 8192), z = zigzag_placement(L, 4);
  expect_valid(b, L, 4, 8192);
  EXPECT_LE(b.imbalance(), 1.0 + kBalanceSlackPercent / 100.0);
  EXPECT_GT(z.imbalance(), 1.2);  // what the balance buys here
  EXPECT_LT(b.split_documents(), int64_t(L.size()) / 4);
}

}  // namespace
}  // namespace ctxpar
