// Unit tests for src/shard: partitions (contiguous, zigzag, striped), their inverse maps, causal
// work balance, packed documents, and global label shifting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "core/random.hpp"
#include "shard/partition.hpp"

namespace ctxpar {
namespace {

// ---- partition names and S/P validation ---------------------------------------------------

TEST(PartitionKind, NamesRoundTrip) {
  for (PartitionKind k : {PartitionKind::contiguous, PartitionKind::zigzag, PartitionKind::striped})
    EXPECT_EQ(partition_kind(partition_name(k)), k);
}

TEST(PartitionKind, UnknownNameIsUsageErrorListingValidNames) {
  try {
    partition_kind("zig-zag");
    FAIL() << "no UsageError for an unknown partition";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("zig-zag"), std::string::npos) << msg;
    EXPECT_NE(msg.find("contiguous, zigzag, striped"), std::string::npos) << msg;
  }
  EXPECT_THROW(partition_kind(""), UsageError);
  EXPECT_THROW(partition_kind("Zigzag"), UsageError);  // names are case-sensitive config values
}

TEST(PartitionCheck, AnyPositiveSOnAnyPPasses) {
  for (PartitionKind k : {PartitionKind::contiguous, PartitionKind::zigzag, PartitionKind::striped})
    for (int64_t S : {1, 2, 7, 1000, 1004, 2049})
      for (int P : {1, 2, 3, 4, 5, 6, 8}) EXPECT_EQ(Partition::check(k, S, P), "") << partition_name(k) << " S=" << S << " P=" << P;
}

TEST(PartitionCheck, PaddedLengthIsTheNextMultipleOfTheUnit) {
  EXPECT_EQ(Partition::padded_length(PartitionKind::zigzag, 1000, 3), 1002);
  EXPECT_EQ(Partition::padded_length(PartitionKind::zigzag, 1008, 4), 1008);
  EXPECT_EQ(Partition::padded_length(PartitionKind::zigzag, 1, 6), 12);
  EXPECT_EQ(Partition::padded_length(PartitionKind::zigzag, 7, 1), 8);
  EXPECT_EQ(Partition::padded_length(PartitionKind::contiguous, 7, 1), 7);
  EXPECT_EQ(Partition::padded_length(PartitionKind::striped, 10, 3), 12);
  const Partition p(PartitionKind::zigzag, 1000, 3);
  EXPECT_EQ(p.S(), 1000);
  EXPECT_EQ(p.S_padded(), 1002);
  EXPECT_EQ(p.padding(), 2);
  const std::string note = p.padding_note();
  for (const char* part : {"seq = 1000", "1002 rows", "3 ranks", "2 padding rows"})
    EXPECT_NE(note.find(part), std::string::npos) << "missing '" << part << "' in: " << note;
  EXPECT_EQ(Partition(PartitionKind::zigzag, 1002, 3).padding_note(), "");
}

TEST(PartitionCheck, NonPositiveSOrPRejected) {
  EXPECT_NE(Partition::check(PartitionKind::contiguous, 0, 2), "");
  EXPECT_NE(Partition::check(PartitionKind::zigzag, -8, 2), "");
  EXPECT_NE(Partition::check(PartitionKind::striped, 8, 0), "");
  const std::string msg = Partition::check(PartitionKind::zigzag, 0, 4);
  EXPECT_NE(msg.find("seq = 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("valid: seq >= 1"), std::string::npos) << msg;
}

TEST(PartitionCheck, ConstructorThrowsUsageErrorWithCheckMessage) {
  try {
    Partition p(PartitionKind::zigzag, 0, 4);
    FAIL() << "no UsageError for seq = 0";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), Partition::check(PartitionKind::zigzag, 0, 4));
  }
}

// ---- every partition × several (S, P) -----------------------------------------------------

using Case = std::tuple<PartitionKind, int64_t, int>;  // kind, S, P

class PartitionCases : public ::testing::TestWithParam<Case> {
 protected:
  Partition part() const { return Partition(std::get<0>(GetParam()), std::get<1>(GetParam()), std::get<2>(GetParam())); }
};

// Independent statement of each layout (the definitions in docs/DESIGN.md §3) over the padded
// length (S rounded up to 2P for zigzag, P otherwise), to check the implementation's index math
// against.
static std::vector<int64_t> expected_positions(PartitionKind k, int64_t S_real, int P, int r) {
  const int64_t unit = k == PartitionKind::zigzag ? 2 * P : P;
  const int64_t S = (S_real + unit - 1) / unit * unit;
  std::vector<int64_t> pos;
  if (k == PartitionKind::contiguous) {
    for (int64_t t = 0; t < S; ++t)
      if (t * P / S == r) pos.push_back(t);
  } else if (k == PartitionKind::zigzag) {
    const int64_t C = S / (2 * P);
    for (int64_t t = 0; t < S; ++t) {
      const int64_t chunk = t / C;
      if (chunk == r || chunk == 2 * P - 1 - r) pos.push_back(t);
    }
  } else {
    for (int64_t t = 0; t < S; ++t)
      if (t % P == r) pos.push_back(t);
  }
  return pos;
}

TEST_P(PartitionCases, LayoutMatchesDefinition) {
  const Partition p = part();
  for (int r = 0; r < p.P(); ++r) EXPECT_EQ(p.positions(r), expected_positions(p.kind(), p.S(), p.P(), r)) << "rank " << r;
}

TEST_P(PartitionCases, PositionsAreAPermutation) {
  const Partition p = part();
  std::vector<int64_t> all;
  for (int r = 0; r < p.P(); ++r) {
    const std::vector<int64_t> pos = p.positions(r);
    EXPECT_EQ(int64_t(pos.size()), p.local_size(r));
    EXPECT_EQ(p.local_size(r), p.S_padded() / p.P());  // equal S_loc on every rank
    EXPECT_TRUE(std::is_sorted(pos.begin(), pos.end())) << "rank " << r;
    // The padding rows are a suffix of every rank's rows, real_size() rows come first.
    const int64_t real = std::count_if(pos.begin(), pos.end(), [&](int64_t g) { return g < p.S(); });
    EXPECT_EQ(p.real_size(r), real) << "rank " << r;
    for (int64_t i = 0; i < int64_t(pos.size()); ++i) EXPECT_EQ(p.is_pad(pos[size_t(i)]), i >= real) << "rank " << r;
    all.insert(all.end(), pos.begin(), pos.end());
  }
  EXPECT_LT(p.padding(), p.kind() == PartitionKind::zigzag ? 2 * p.P() : p.P());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> iota(size_t(p.S_padded()));
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(all, iota);
}

TEST_P(PartitionCases, OwnerAndLocalIndexInvertPositions) {
  const Partition p = part();
  std::vector<std::vector<int64_t>> pos(size_t(p.P()));
  for (int r = 0; r < p.P(); ++r) {
    pos[size_t(r)] = p.positions(r);
    for (size_t i = 0; i < pos[size_t(r)].size(); ++i) {
      ASSERT_EQ(p.owner(pos[size_t(r)][i]), r);
      ASSERT_EQ(p.local_index(pos[size_t(r)][i]), int64_t(i));
    }
  }
  for (int64_t g = 0; g < p.S_padded(); ++g) {
    const int r = p.owner(g);
    ASSERT_GE(r, 0);
    ASSERT_LT(r, p.P());
    const int64_t i = p.local_index(g);
    ASSERT_GE(i, 0);
    ASSERT_LT(i, p.local_size(r));
    ASSERT_EQ(pos[size_t(r)][size_t(i)], g);
  }
}

TEST_P(PartitionCases, RangesCoverExactlyThePositions) {
  const Partition p = part();
  for (int r = 0; r < p.P(); ++r) {
    std::vector<int64_t> flat;
    int64_t prev_end = -1;
    for (const auto& [b, e] : p.ranges(r)) {
      EXPECT_LT(b, e);
      EXPECT_GT(b, prev_end) << "ranges must be disjoint, ascending, and not touching (merged)";
      prev_end = e;
      for (int64_t t = b; t < e; ++t) flat.push_back(t);
    }
    std::vector<int64_t> real = p.positions(r);  // ranges() name the real tokens only
    real.resize(size_t(p.real_size(r)));
    EXPECT_EQ(flat, real) << "rank " << r;
  }
}

TEST_P(PartitionCases, ScatterGatherRoundTrip) {
  const Partition p = part();
  const int64_t width = 3;
  std::vector<float> global(size_t(p.S() * width));
  for (size_t i = 0; i < global.size(); ++i) global[i] = float(i) + 0.5f;  // every element distinct
  std::vector<float> back(global.size(), -1.0f);
  for (int r = 0; r < p.P(); ++r) {
    std::vector<float> local(size_t(p.local_size(r) * width), -2.0f);
    p.scatter_rows<float>(global, width, r, local);
    const std::vector<int64_t> pos = p.positions(r);
    for (size_t i = 0; i < pos.size(); ++i)
      for (int64_t c = 0; c < width; ++c)  // padding rows: zeros
        ASSERT_EQ(local[i * width + size_t(c)], p.is_pad(pos[i]) ? 0.0f : global[size_t(pos[i] * width + c)]);
    p.gather_rows<float>(local, width, r, back);
  }
  EXPECT_EQ(back, global);
}

static std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(partition_name(std::get<0>(info.param))) + "_S" + std::to_string(std::get<1>(info.param)) +
         "_P" + std::to_string(std::get<2>(info.param));
}

// Every (kind, S, P) on this grid: P = 1 and P = 8, S from one token up, odd P, shapes where
// zigzag chunks are a single token, and S that no unit divides (padding rows, at most unit - 1).
static std::vector<Case> valid_cases() {
  std::vector<Case> out;
  for (PartitionKind k : {PartitionKind::contiguous, PartitionKind::zigzag, PartitionKind::striped})
    for (int64_t S : {1, 2, 7, 16, 48, 101, 120, 240})
      for (int P : {1, 2, 3, 4, 5, 8})
        if (Partition::check(k, S, P).empty()) out.emplace_back(k, S, P);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shard, PartitionCases, ::testing::ValuesIn(valid_cases()), case_name);

// The grid filter must leave a real test set for every kind, including P = 1 and P = 8.
TEST(PartitionCasesGrid, EnoughValidShapesPerKind) {
  for (PartitionKind k : {PartitionKind::contiguous, PartitionKind::zigzag, PartitionKind::striped}) {
    int n = 0, p1 = 0, p8 = 0;
    for (const Case& c : valid_cases())
      if (std::get<0>(c) == k) {
        ++n;
        p1 += std::get<2>(c) == 1;
        p8 += std::get<2>(c) == 8;
      }
    EXPECT_GE(n, 12) << partition_name(k);
    EXPECT_GE(p1, 4) << partition_name(k);
    EXPECT_GE(p8, 2) << partition_name(k);
  }
}

TEST(Striped, IsRoundRobin) {
  for (auto [S, P] : std::vector<std::pair<int64_t, int>>{{16, 1}, {16, 2}, {48, 3}, {40, 8}}) {
    const Partition p(PartitionKind::striped, S, P);
    for (int64_t t = 0; t < S; ++t) {
      ASSERT_EQ(p.owner(t), int(t % P));
      ASSERT_EQ(p.local_index(t), t / P);
    }
    for (int r = 0; r < P; ++r) {
      const std::vector<int64_t> pos = p.positions(r);
      for (size_t i = 0; i < pos.size(); ++i) ASSERT_EQ(pos[i], r + int64_t(i) * P);
    }
  }
}

// ---- causal work balance ------------------------------------------------------------------

// Visible (q, k) pairs under a causal mask for queries on rank `r` and keys on rank `src`,
// counted pair by pair (no closed form, so it cannot share a mistake with the layout math).
static int64_t causal_pairs(const Partition& p, int r, int src) {
  int64_t n = 0;
  for (int64_t q : p.positions(r))
    for (int64_t k : p.positions(src)) n += (k <= q);
  return n;
}

TEST(ZigzagBalance, EqualCausalWorkPerRankAndPerRingStep) {
  for (auto [S, P] : std::vector<std::pair<int64_t, int>>{{16, 2}, {48, 3}, {64, 4}, {80, 5}, {128, 8}}) {
    const Partition zz(PartitionKind::zigzag, S, P);
    const Partition ct(PartitionKind::contiguous, S, P);
    const int64_t C = S / (2 * P);  // zigzag chunk
    std::vector<int64_t> zz_total(size_t(P), 0), ct_total(size_t(P), 0);
    for (int step = 0; step < P; ++step) {
      // Ring step `step`: rank r holds the keys of rank (r - step) mod P.
      std::vector<int64_t> zz_step(static_cast<size_t>(P));
      for (int r = 0; r < P; ++r) {
        const int src = (r - step + P) % P;
        zz_step[size_t(r)] = causal_pairs(zz, r, src);
        zz_total[size_t(r)] += zz_step[size_t(r)];
        ct_total[size_t(r)] += causal_pairs(ct, r, src);
      }
      // Zigzag: every rank does the same work at every step (diagonal: C² + C(C+1); off the
      // diagonal: one full chunk pair twice, 2C²), so no rank waits for another.
      const int64_t expect = step == 0 ? C * C + C * (C + 1) : 2 * C * C;
      for (int r = 0; r < P; ++r) EXPECT_EQ(zz_step[size_t(r)], expect) << "S=" << S << " P=" << P << " step " << step << " rank " << r;
    }
    const auto [zmin, zmax] = std::minmax_element(zz_total.begin(), zz_total.end());
    EXPECT_EQ(*zmax - *zmin, 0) << "S=" << S << " P=" << P;
    // All pairs are accounted for: S(S+1)/2 visible pairs in total.
    EXPECT_EQ(std::accumulate(zz_total.begin(), zz_total.end(), int64_t(0)), S * (S + 1) / 2);
    // Contiguous is badly imbalanced: rank r does (S/P)² r + (S/P)(S/P+1)/2, so the spread is
    // (P-1)(S/P)² — the last rank does about 2P-1 times the work of the first.
    const auto [cmin, cmax] = std::minmax_element(ct_total.begin(), ct_total.end());
    const int64_t n = S / P;
    EXPECT_EQ(*cmax - *cmin, (P - 1) * n * n) << "S=" << S << " P=" << P;
    EXPECT_GT(*cmax, 2 * *cmin) << "contiguous should be clearly imbalanced";
  }
}

TEST(StripedBalance, WorkDiffersByAtMostOneKeyPerRow) {
  // Striped: rank r's i-th row sees r + iP + 1 keys, so ranks differ by < 1 key per row.
  const int64_t S = 96;
  const int P = 4;
  const Partition st(PartitionKind::striped, S, P);
  std::vector<int64_t> work(size_t(P), 0);
  for (int r = 0; r < P; ++r)
    for (int src = 0; src < P; ++src) work[size_t(r)] += causal_pairs(st, r, src);
  const auto [mn, mx] = std::minmax_element(work.begin(), work.end());
  EXPECT_LT(*mx - *mn, S / P * P);  // fewer than one extra key per local row (S_loc rows, < P keys each)
  EXPECT_EQ(*mx - *mn, (P - 1) * (S / P));
}

// ---- packed documents ---------------------------------------------------------------------

TEST(SplitMix64, MatchesPublishedReferenceSequence) {
  // Reference outputs of Vigna's splitmix64.c stream for seed 1234567; random_doc_lengths
  // draws output t as splitmix64(seed + t·γ). A platform or compiler that changed these would
  // change every "random" document layout.
  const uint64_t seed = 1234567, gamma = 0x9e3779b97f4a7c15ull;
  const uint64_t expect[] = {6457827717110365317ull, 3203168211198807973ull, 9817491932198370423ull,
                             4593380528125082431ull, 16408922859458223821ull};
  for (uint64_t t = 0; t < 5; ++t) EXPECT_EQ(splitmix64(seed + t * gamma), expect[t]) << t;
}

TEST(Docs, RandomLengthsFollowTheDefinition) {
  // The documents for (S, mean, seed) are part of the trace contract (two
  // machines must build the same batch). Recomputed here from the definition — token t ends its
  // document iff splitmix64(seed + t·γ) < floor(2^64 / mean) — to pin the implementation.
  const int64_t S = 200, mean = 10;
  const uint64_t seed = 5, gamma = 0x9e3779b97f4a7c15ull, thr = UINT64_MAX / uint64_t(mean);
  std::vector<int64_t> expect;
  int64_t len = 0;
  for (int64_t t = 0; t < S; ++t) {
    ++len;
    if (splitmix64(seed + uint64_t(t) * gamma) < thr || t == S - 1) {
      expect.push_back(len);
      len = 0;
    }
  }
  EXPECT_EQ(random_doc_lengths(S, mean, seed), expect);
}

TEST(Docs, IdsFromLengths) {
  EXPECT_EQ(doc_ids_from_lengths({3, 1, 4}, 8), (std::vector<int32_t>{0, 0, 0, 1, 2, 2, 2, 2}));
  EXPECT_EQ(doc_ids_from_lengths({5}, 5), (std::vector<int32_t>{0, 0, 0, 0, 0}));
}

TEST(Docs, RandomLengthsSumToSAndArePositive) {
  for (int64_t S : {1, 7, 1000, 4096})
    for (int64_t mean : {1, 3, 64, 5000}) {
      const std::vector<int64_t> L = random_doc_lengths(S, mean, 42);
      EXPECT_EQ(std::accumulate(L.begin(), L.end(), int64_t(0)), S) << "S=" << S << " mean=" << mean;
      for (int64_t l : L) ASSERT_GE(l, 1);
    }
  EXPECT_EQ(random_doc_lengths(10, 1, 7), std::vector<int64_t>(10, 1));
}

TEST(Docs, RandomLengthsDeterministicPerSeed) {
  const std::vector<int64_t> a = random_doc_lengths(100000, 300, 42);
  EXPECT_EQ(a, random_doc_lengths(100000, 300, 42));
  EXPECT_NE(a, random_doc_lengths(100000, 300, 43));
  ASSERT_GT(a.size(), 10u);
}

TEST(Docs, RandomLengthsMeanAndSpread) {
  // Geometric lengths: mean `mean`, standard deviation ≈ mean. With ~2048 documents the sample
  // mean has a relative standard error of ~2.2%; 10% is a 4.5-sigma bound.
  const int64_t S = int64_t(1) << 20, mean = 512;
  const std::vector<int64_t> L = random_doc_lengths(S, mean, 2024);
  ASSERT_GT(L.size(), 1000u);
  const std::vector<int64_t> full(L.begin(), L.end() - 1);  // the last one is cut at S
  double m = 0, v = 0;
  for (int64_t l : full) m += double(l);
  m /= double(full.size());
  for (int64_t l : full) v += (double(l) - m) * (double(l) - m);
  const double sd = std::sqrt(v / double(full.size() - 1));
  EXPECT_NEAR(m, double(mean), 0.10 * double(mean));
  EXPECT_NEAR(sd, double(mean), 0.20 * double(mean));  // not fixed-length documents
}

TEST(ParseDocs, NoneMeansOneDocument) {
  std::vector<int32_t> ids{1, 2, 3};
  EXPECT_EQ(parse_docs("none", 64, 16, 1, ids), "");
  EXPECT_TRUE(ids.empty());
}

TEST(ParseDocs, RandomUsesSeededLengths) {
  std::vector<int32_t> ids;
  ASSERT_EQ(parse_docs("random", 4096, 100, 9, ids), "");
  EXPECT_EQ(ids, doc_ids_from_lengths(random_doc_lengths(4096, 100, 9), 4096));
  std::vector<int32_t> other;
  ASSERT_EQ(parse_docs("random", 4096, 100, 10, other), "");
  EXPECT_NE(ids, other);
}

TEST(ParseDocs, ExplicitList) {
  std::vector<int32_t> ids;
  ASSERT_EQ(parse_docs("3,1,4", 8, 0, 0, ids), "");
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 0, 0, 1, 2, 2, 2, 2}));
  ASSERT_EQ(parse_docs(" 2 , 6", 8, 0, 0, ids), "");  // spaces around items are allowed
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 0, 1, 1, 1, 1, 1, 1}));
  ASSERT_EQ(parse_docs("8", 8, 0, 0, ids), "");
  EXPECT_EQ(ids, std::vector<int32_t>(8, 0));
}

TEST(ParseDocs, WrongSumNamesSumAndS) {
  std::vector<int32_t> ids;
  std::string err = parse_docs("3,1,3", 8, 0, 0, ids);
  EXPECT_NE(err.find("sum to 7"), std::string::npos) << err;
  EXPECT_NE(err.find("seq = 8"), std::string::npos) << err;
  EXPECT_TRUE(ids.empty());
  err = parse_docs("5,5", 8, 0, 0, ids);
  EXPECT_NE(err.find("sum to 10"), std::string::npos) << err;
  EXPECT_NE(err.find("seq = 8"), std::string::npos) << err;
  err = parse_docs("999999999999999999,999999999999999999,999999999999999999,999999999999999999,"
                   "999999999999999999,999999999999999999", 8, 0, 0, ids);  // no int64 overflow
  EXPECT_NE(err.find("more than"), std::string::npos) << err;
}

TEST(ParseDocs, MalformedInputsAreErrors) {
  std::vector<int32_t> ids;
  for (const char* bad : {"", "3,x", "3,,5", "0,8", "8,", "-2,10", "3.5,4.5", "Random", "none,8",
                          "1234567890123456789012"}) {
    const std::string err = parse_docs(bad, 8, 4, 0, ids);
    EXPECT_FALSE(err.empty()) << "'" << bad << "' accepted";
    EXPECT_NE(err.find("valid"), std::string::npos) << "'" << bad << "': " << err;
    EXPECT_TRUE(ids.empty());
  }
  const std::string err = parse_docs("random", 8, 0, 0, ids);
  EXPECT_NE(err.find("doc_mean = 0"), std::string::npos) << err;
}

// ---- labels -------------------------------------------------------------------------------

// Distinct token values so that any wrong label is visible.
static std::vector<int32_t> distinct_tokens(int64_t S) {
  std::vector<int32_t> t(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) t[size_t(i)] = int32_t(1000 + 7 * i);
  return t;
}

TEST(ShiftLabels, NextTokenWithinDocumentElseMinusOne) {
  const std::vector<int64_t> lengths{5, 1, 3, 7};
  const int64_t S = 16;
  const std::vector<int32_t> tok = distinct_tokens(S), doc = doc_ids_from_lengths(lengths, S);
  const std::vector<int32_t> lab = shift_labels(tok, doc);
  ASSERT_EQ(lab.size(), size_t(S));
  std::set<int64_t> doc_last{4, 5, 8, 15};  // last token of each document
  for (int64_t t = 0; t < S; ++t) {
    if (doc_last.count(t)) EXPECT_EQ(lab[size_t(t)], -1) << t;
    else EXPECT_EQ(lab[size_t(t)], tok[size_t(t + 1)]) << t;
  }
  // One document (empty ids): only the last token has no label.
  const std::vector<int32_t> one = shift_labels(tok, {});
  for (int64_t t = 0; t + 1 < S; ++t) EXPECT_EQ(one[size_t(t)], tok[size_t(t + 1)]);
  EXPECT_EQ(one.back(), -1);
}

// Shifting globally and then sharding is the right order. Shifting each rank's local tokens
// instead gives a different label exactly at the last token of every local range that is
// followed by another token (a shard boundary) — and nowhere else.
TEST(ShiftLabels, GlobalShiftDiffersFromShiftAfterShardExactlyAtShardBoundaries) {
  for (PartitionKind k : {PartitionKind::contiguous, PartitionKind::zigzag, PartitionKind::striped})
    for (int P : {1, 2, 4}) {
      const int64_t S = 48;
      const Partition p(k, S, P);
      const std::vector<int32_t> tok = distinct_tokens(S);
      const std::vector<int32_t> global_labels = shift_labels(tok, {});
      std::set<int64_t> differs, boundaries;
      for (int r = 0; r < P; ++r) {
        std::vector<int32_t> tok_loc(size_t(p.local_size(r))), lab_loc(tok_loc.size());
        p.scatter_rows<int32_t>(tok, 1, r, tok_loc);
        p.scatter_rows<int32_t>(global_labels, 1, r, lab_loc);
        const std::vector<int32_t> naive = shift_labels(tok_loc, {});  // wrong: shift after shard
        const std::vector<int64_t> pos = p.positions(r);
        for (size_t i = 0; i < pos.size(); ++i) {
          // The right label on every rank is the global next token.
          ASSERT_EQ(lab_loc[i], pos[i] + 1 < S ? tok[size_t(pos[i] + 1)] : -1);
          if (naive[i] != lab_loc[i]) differs.insert(pos[i]);
        }
        for (const auto& [b, e] : p.ranges(r))
          if (e < S) boundaries.insert(e - 1);
      }
      EXPECT_EQ(differs, boundaries) << partition_name(k) << " P=" << P;
      // Count the boundaries independently of ranges(): contiguous has P-1, zigzag 2P-2 (each
      // of the 2P chunks ends at a boundary except the last chunk and chunk P-1, whose successor
      // chunk P is on the same rank), and
      // striped has S-1 (every token's successor lives on another rank when P > 1).
      const size_t expect = P == 1 ? 0
                            : k == PartitionKind::contiguous ? size_t(P - 1)
                            : k == PartitionKind::zigzag     ? size_t(2 * P - 2)
                                                             : size_t(S - 1);
      EXPECT_EQ(differs.size(), expect) << partition_name(k) << " P=" << P;
    }
}

}  // namespace
}  // namespace ctxpar
