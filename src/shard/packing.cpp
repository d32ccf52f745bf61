// Packed documents and next-token labels.
// Random document lengths use splitmix64 (core/random.hpp) and integer-only arithmetic (no
// std::*_distribution, no libm), so a (S, mean, seed) triple gives the same documents on every
// platform and standard library: traces from different machines can be compared token for token.
#include <cctype>
#include <limits>
#include <sstream>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/random.hpp"
#include "shard/partition.hpp"

namespace ctxpar {


std::vector<int32_t> doc_ids_from_lengths(const std::vector<int64_t>& lengths, int64_t S) {
  CTXPAR_CHECK(int64_t(lengths.size()) <= int64_t(std::numeric_limits<int32_t>::max()),
               lengths.size() << " documents do not fit int32 document ids");
  std::vector<int32_t> ids;
  ids.reserve(size_t(S));
  for (size_t d = 0; d < lengths.size(); ++d) {
    CTXPAR_CHECK(lengths[d] >= 1, "document " << d << " has length " << lengths[d]);
    CTXPAR_CHECK(int64_t(ids.size()) + lengths[d] <= S,
                 "document lengths exceed S = " << S << " at document " << d);
    ids.insert(ids.end(), size_t(lengths[d]), int32_t(d));
  }
  CTXPAR_CHECK(int64_t(ids.size()) == S, "document lengths sum to " << ids.size() << ", not S = " << S);
  return ids;
}

std::vector<int64_t> document_lengths(std::span<const int32_t> doc_ids) {
  std::vector<int64_t> lengths;
  for (size_t i = 0; i < doc_ids.size(); ++i)
    if (i == 0 || doc_ids[i] != doc_ids[i - 1]) lengths.push_back(1);
    else ++lengths.back();
  return lengths;
}

// Each token ends its document with probability 1/mean, independently: the lengths are
// geometric on {1, 2, ...} with mean `mean` (standard deviation ≈ mean, a long tail like real
// corpora), and the last document is cut at S. The Bernoulli draw is u < floor(2^64/mean) on a
// uniform 64-bit u, exact up to 2^-64 — no floating point involved.
std::vector<int64_t> random_doc_lengths(int64_t S, int64_t mean, uint64_t seed) {
  CTXPAR_CHECK(S >= 1, "S = " << S);
  CTXPAR_CHECK(mean >= 1, "mean document length " << mean);
  std::vector<int64_t> lengths;
  if (mean == 1) {  // every token is its own document (the threshold below would be 2^64)
    lengths.assign(size_t(S), 1);
    return lengths;
  }
  const uint64_t threshold = std::numeric_limits<uint64_t>::max() / uint64_t(mean);
  int64_t len = 0;
  for (int64_t t = 0; t < S; ++t) {
    ++len;
    // Token t's draw is splitmix64 at counter seed + t·γ: the t-th output of the splitmix64
    // stream seeded with `seed` (the form the published reference values use).
    if (splitmix64(seed + uint64_t(t) * 0x9e3779b97f4a7c15ull) < threshold) {
      lengths.push_back(len);
      len = 0;
    }
  }
  if (len > 0) lengths.push_back(len);
  return lengths;
}

namespace {
// The checks of a docs setting, and for a list its lengths; no document ids are built (so a check
// costs O(items), whatever seq).
std::string docs_lengths(const std::string& docs, int64_t S, int64_t mean, std::vector<int64_t>& lengths) {
  lengths.clear();
  if (docs == "none") return "";
  if (S < 1) return "docs needs seq >= 1 (seq = " + std::to_string(S) + ")";
  if (docs == "random")
    return mean < 1 ? "docs = random with doc_mean = " + std::to_string(mean) + "; valid: doc_mean >= 1" : "";
  // A comma-separated list of positive lengths in tokens.
  int64_t sum = 0;
  const std::string valid = "valid: none, random, or positive lengths L1,L2,... summing to seq = " +
                            std::to_string(S);
  std::vector<std::string> items;
  if (const std::string err = split_list(docs, ',', items); !err.empty()) return "docs = '" + docs + "': " + err + "; " + valid;
  constexpr int64_t kSumCap = int64_t(4) << 60;  // far above any S, far below INT64_MAX - 10^18
  size_t n_items = 0;
  for (const std::string& tok : items) {
    ++n_items;
    bool digits = !tok.empty() && tok.size() <= 18;  // 18 digits cannot overflow int64
    for (char c : tok) digits = digits && c >= '0' && c <= '9';
    if (!digits)
      return "docs item " + std::to_string(n_items) + " '" + tok + "' is not a document length; " + valid;
    const int64_t L = std::stoll(tok);
    if (L < 1) return "docs item " + std::to_string(n_items) + " is 0; " + valid;
    lengths.push_back(L);
    // Saturate instead of overflowing: each L < 10^18, so one addition cannot wrap, and once the
    // sum passes the cap it is already known to be wrong.
    sum = sum > kSumCap ? sum : sum + L;
  }
  if (sum != S) {
    std::ostringstream os;
    os << "docs lengths sum to " << (sum > kSumCap ? "more than " : "") << sum << " tokens but seq = "
       << S << "; the lengths must sum to seq";
    if (sum <= kSumCap)
      os << (sum > S ? " (over by " : " (short by ") << (sum > S ? sum - S : S - sum) << ")";
    return os.str();
  }
  return "";
}
}  // namespace

std::string check_docs(const std::string& docs, int64_t S, int64_t mean) {
  std::vector<int64_t> lengths;
  return docs_lengths(docs, S, mean, lengths);
}

std::string parse_docs(const std::string& docs, int64_t S, int64_t mean, uint64_t seed,
                       std::vector<int32_t>& doc_ids) {
  doc_ids.clear();
  std::vector<int64_t> lengths;
  const std::string err = docs_lengths(docs, S, mean, lengths);
  if (!err.empty() || docs == "none") return err;  // none: empty ids, the whole sequence is one document
  doc_ids = doc_ids_from_lengths(docs == "random" ? random_doc_lengths(S, mean, seed) : lengths, S);
  return "";
}

std::vector<int32_t> shift_labels(std::span<const int32_t> tokens, std::span<const int32_t> doc_ids) {
  const size_t S = tokens.size();
  CTXPAR_CHECK(doc_ids.empty() || doc_ids.size() == S,
               "doc_ids has " << doc_ids.size() << " entries for " << S << " tokens");
  std::vector<int32_t> labels(S, -1);
  for (size_t t = 0; t + 1 < S; ++t)
    if (doc_ids.empty() || doc_ids[t + 1] == doc_ids[t]) labels[t] = tokens[t + 1];
  return labels;
}

}  // namespace ctxpar
