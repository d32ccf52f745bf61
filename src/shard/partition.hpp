// Sharding of one global token sequence over the P ranks of a CP group.
//   contiguous: rank r holds tokens [r*S/P, (r+1)*S/P)
//   zigzag:     2P chunks of S/(2P); rank r holds chunks r and 2P-1-r (equal causal work)
//   striped:    token t lives on rank t % P (round-robin, one token wide)
// Every local token knows its global position; inverse maps restore global order.
//
// Any S on any P: the layout is that of S_padded() tokens, S rounded up to the kind's unit (2P for
// zigzag, P for the others), so every rank holds the same number of rows and the strategies move
// equal blocks. The padding rows are global positions [S, S_padded()): the last positions, so on
// every rank they are a suffix of its rows (local order is ascending global order), and under a
// causal or window mask no real query sees them. The callers make them invisible and inert (no
// label, zero inputs and zero dO, a document id of -1 where a mask needs one) and no result shows
// them: scatter_rows gives them zeros and gather_rows leaves them out.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/settings.hpp"

namespace ctxpar {

// PartitionKind: core/settings.hpp (an enumerated setting).
PartitionKind partition_kind(const std::string& name);  // config value → kind; UsageError if unknown
const char* partition_name(PartitionKind k);

class Partition {
 public:
  // Throws UsageError with check()'s message when S < 1 or P < 1.
  // block > 1 (exact numerics: Config's exact_grain): S rounded up to the kind's unit times block,
  // so that every zigzag chunk (contiguous shard) is a whole number of blocks of positions (the
  // exact attention schedule's layout; for striped it only pads).
  Partition(PartitionKind kind, int64_t S, int P, int64_t block = 1);
  PartitionKind kind() const { return kind_; }
  int64_t S() const { return S_; }                 // real tokens
  int64_t S_padded() const { return S_pad_; }      // tokens of the layout (S + padding())
  int64_t padding() const { return S_pad_ - S_; }  // padding rows, < the kind's unit
  bool is_pad(int64_t global_pos) const { return global_pos >= S_; }
  int P() const { return P_; }
  int64_t local_size(int r) const;                 // S_loc of rank r: S_padded() / P on every rank
  int64_t real_size(int r) const;                  // rows of rank r that are real tokens (a prefix)
  std::vector<int64_t> positions(int r) const;     // global position of each local row, ascending
  // [begin, end) ranges of rank r's real tokens, in local order (for printouts).
  std::vector<std::pair<int64_t, int64_t>> ranges(int r) const;
  int owner(int64_t global_pos) const;             // which rank holds a row (< S_padded())
  int64_t local_index(int64_t global_pos) const;   // its index on that rank

  // Global [S, width] → local [S_loc, width] rows of rank r (padding rows zero), and back
  // (padding rows left out).
  template <class T> void scatter_rows(std::span<const T> global, int64_t width, int r, std::span<T> local) const;
  template <class T> void gather_rows(std::span<const T> local, int64_t width, int r, std::span<T> global) const;

  // "" without padding, else one line for logs and plans: "seq = 1000 runs as 1002 rows over 3
  // ranks (2 padding rows: ...)".
  std::string padding_note() const;

  // Requirement on S and P ("" when fine): P >= 1 and S >= 1; any S shards (with padding).
  static std::string check(PartitionKind kind, int64_t S, int P);
  // The layout's length for S tokens: S rounded up to 2P (zigzag) or P (contiguous, striped).
  static int64_t padded_length(PartitionKind kind, int64_t S, int P, int64_t block = 1);

 private:
  std::vector<std::pair<int64_t, int64_t>> layout_ranges(int r) const;  // padding included
  PartitionKind kind_;
  int64_t S_, S_pad_;
  int P_;
  int64_t block_ = 1;
};

template <class T>
void Partition::scatter_rows(std::span<const T> global, int64_t width, int r, std::span<T> local) const {
  CTXPAR_CHECK(int64_t(global.size()) == S_ * width && int64_t(local.size()) == local_size(r) * width,
               "scatter_rows: global " << global.size() << " / local " << local.size() << " elems for S = "
                                       << S_ << ", S_loc = " << local_size(r) << ", width = " << width);
  const std::vector<int64_t> pos = positions(r);
  for (size_t i = 0; i < pos.size(); ++i)
    for (int64_t c = 0; c < width; ++c) local[i * width + c] = is_pad(pos[i]) ? T{} : global[pos[i] * width + c];
}
template <class T>
void Partition::gather_rows(std::span<const T> local, int64_t width, int r, std::span<T> global) const {
  CTXPAR_CHECK(int64_t(global.size()) == S_ * width && int64_t(local.size()) == local_size(r) * width,
               "gather_rows: global " << global.size() << " / local " << local.size() << " elems for S = "
                                      << S_ << ", S_loc = " << local_size(r) << ", width = " << width);
  const std::vector<int64_t> pos = positions(r);
  for (size_t i = 0; i < pos.size(); ++i)
    if (!is_pad(pos[i]))
      for (int64_t c = 0; c < width; ++c) global[pos[i] * width + c] = local[i * width + c];
}

// Packed documents: per-token document ids for a sequence of S tokens.
//   lengths given:  documents of those lengths, in order (they must sum to S)
//   random:         lengths drawn from a seeded geometric distribution with mean `mean`,
//                   the last one cut to fit (core/random.hpp splitmix64 + integer math:
//                   identical on every platform for a given S, mean, seed)
std::vector<int32_t> doc_ids_from_lengths(const std::vector<int64_t>& lengths, int64_t S);
// The inverse: the lengths of the runs of equal ids, in order (one document per run).
std::vector<int64_t> document_lengths(std::span<const int32_t> doc_ids);
std::vector<int64_t> random_doc_lengths(int64_t S, int64_t mean, uint64_t seed);
// Parses the `docs` config value; returns "" when fine, else an error naming what is valid.
//   "none"       → doc_ids empty (the whole sequence is one document)
//   "random"     → doc_ids_from_lengths(random_doc_lengths(S, mean, seed), S)
//   "L1,L2,..."  → those lengths; they must be positive and sum to S
std::string parse_docs(const std::string& docs, int64_t S, int64_t mean, uint64_t seed,
                       std::vector<int32_t>& doc_ids);
// parse_docs' checks without building the ids: validation, in O(list items) for any seq.
std::string check_docs(const std::string& docs, int64_t S, int64_t mean);

// Next-token labels shifted globally before sharding: label[t] = token[t+1] when t+1 is in the
// same document, else -1 (ignored by the loss). Empty doc_ids = one document. Shifting after sharding would be wrong at every
// shard boundary.
std::vector<int32_t> shift_labels(std::span<const int32_t> tokens, std::span<const int32_t> doc_ids);

}  // namespace ctxpar
