// Where the rows of one packed sequence live over the P ranks of a CP group, per batch
// (config placement):
//   zigzag    the sequence's positions cut into 2P chunks, rank r chunks r and 2P-1-r
//             (shard/partition.hpp): blind to documents, so a short document may be cut over
//             ranks and a rank's causal work depends on where the long documents fall.
//   balanced  from the document lengths alone (the same answer on every rank): the documents
//             longest first, each kept whole on the least-loaded rank with room for it when that
//             keeps the rank within kBalanceSlackPercent of the mean causal work, else split
//             zigzag (2g chunks of the document, member k chunks k and 2g-1-k) over the smallest
//             group of g least-loaded ranks that does (g = 2, 4, 8, ... or min(P, L)); when no
//             group has room, the document fills the least-loaded ranks' room in contiguous
//             pieces. Four such greedy passes and the zigzag rows compete (placement.cpp): the best
//             balance wins, of those within the slack the one that splits fewer rows.
//   document  every document zigzag over all P ranks on its own (2P chunks of it, rank r chunks r
//             and 2P-1-r): the layout Transformer Engine and Megatron-LM give packed (THD)
//             sequences under context parallelism, the baseline of the dynamic-CP papers. Balanced
//             per document; every document longer than a chunk is split over the ranks (the most
//             rows to exchange, the most chunk borders). They pad each document to a multiple of
//             2P; here its L mod 2P remainder rows go to the chunks in turn, the cursor carried
//             from one document to the next, so no rank holds more than zigzag's n rows.
// Every rank holds exactly n rows (n * P >= S; the zigzag partition's n, so buffers and per-token
// work are the same as zigzag's): its real rows in ascending position order, then padding rows
// (global positions >= S, inert as in shard/partition.hpp). The work balanced is the causal
// (query, key) pairs within documents, sum over a rank's rows of (position in its document + 1);
// the per-token layers are equal by construction (n rows everywhere). Window masks (local layers)
// are served but not balanced for.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/settings.hpp"

namespace ctxpar {

// A document may stay whole on a rank (or a group stay that small) while the rank's causal work
// stays within this fraction of the mean: 2%.
inline constexpr int64_t kBalanceSlackPercent = 2;

struct Placement {
  int64_t S = 0;                           // real tokens of the sequence
  int64_t n = 0;                           // rows per rank, padding included
  std::vector<std::vector<int64_t>> rows;  // [P]: global positions; ascending, padding (>= S) last
  std::vector<int64_t> work;               // [P]: causal visible pairs of the rank's real rows
  std::vector<int32_t> spans;              // [documents]: how many ranks each document's rows sit on
  int P() const { return int(rows.size()); }
  double imbalance() const;                // max / mean of work (1 when there is none)
  int64_t split_documents() const;         // documents on more than one rank
};

// The placement of documents of `lengths` (in sequence order, each >= 1, summing to S) over P ranks
// of n rows each; CTXPAR_CHECKs n * P >= S.
Placement balanced_placement(const std::vector<int64_t>& lengths, int P, int64_t n);
// Per rank: the rows of other ranks some of its queries can see (causal, within documents; the
// forward K/V rows of the frugal exchange), for the documents of `lengths` the placement holds.
std::vector<int64_t> rows_received(const Placement& p, const std::vector<int64_t>& lengths);

// The zigzag partition's rows (n = its padded length / P) in the same form, with their work.
Placement zigzag_placement(const std::vector<int64_t>& lengths, int P);
// Every document zigzag over all P ranks on its own (placement = document), n as zigzag's.
Placement document_placement(const std::vector<int64_t>& lengths, int P);
// The placement `kind` (zigzag, balanced or document; not auto, which prices two of them) of
// documents `lengths` over P ranks of n rows (zigzag and document: the zigzag partition's n).
Placement place_documents(PlacementKind kind, const std::vector<int64_t>& lengths, int P, int64_t n);

// placement = auto: what running a batch of documents `lengths` on placement `p` costs (the cost
// model's seconds of its attention: modes/train.cpp); make_batch runs the cheaper placement.
using PlacementPrice = std::function<double(const Placement& p, const std::vector<int64_t>& lengths)>;

}  // namespace ctxpar
