// Multi-turn chat schedule of `ctxpar chat`: a list of phases "prefill:T" (T new prompt tokens of
// every sequence; "prefill:T1/T2/...": T_b for sequence b, one per sequence of the batch) and
// "decode:N" (N decode steps, one token per sequence each), e.g.
// "prefill:32K,decode:64,prefill:2K,decode:64" or "prefill:512/1K/2K/4K,decode:16" (batch = 4). A turn starts at each prefill; the first prefill
// is a full prefill (empty KV cache), later ones are partial prefills over the cache.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/settings.hpp"
#include "shard/placement.hpp"

namespace ctxpar {
struct Config;
}

namespace ctxpar::infer {

enum class PhaseKind { prefill, decode };

struct SchedulePhase {
  PhaseKind kind;
  int64_t count;  // prefill: new tokens T (the longest, with lengths); decode: steps
  // prefill only: new tokens per sequence ("prefill:512/1K/2K/4K", one length per sequence of
  // the batch); empty: `count` for every sequence.
  std::vector<int64_t> lengths = {};
  int64_t length(int64_t b) const { return lengths.empty() ? count : lengths[size_t(b)]; }
  std::vector<int64_t> lengths_of(int64_t batch) const {  // length(b) of every sequence of the batch
    std::vector<int64_t> out(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) out[size_t(b)] = length(b);
    return out;
  }
};

// Parses `text`; throws nothing: returns "" and fills `out`, or a message naming the bad item and
// what would be valid. Any prefill length shards on any CP size `N` (shard/partition.hpp pads).
std::string parse_schedule(const std::string& text, int N, std::vector<SchedulePhase>& out);

// placement = balanced: where a full prefill's sequences of `lengths` (a packed batch, each
// sequence its own document, in batch order) live over N ranks: shard/placement.hpp's balanced
// placement with the rows per rank of their zigzag shards together (the sum of each sequence's
// padded share), so a rank holds as many rows as with zigzag. The same on every rank.
Placement prefill_placement(const std::vector<int64_t>& lengths, int N);
// Each sequence's rows on each rank in that placement, [sequence][rank]: their indices within the
// sequence, ascending (the padding rows, past every sequence, are none of them).
std::vector<std::vector<std::vector<int64_t>>> sequence_rows(const Placement& p, const std::vector<int64_t>& lengths);
// KV cache capacity of each of the `batch` sequences on each of N ranks, [rank][sequence] in
// tokens (KvCache), that a schedule needs: per prefill the padded zigzag share of that sequence's
// length (the padding rows are written, then dropped), or with placement = balanced for the first
// (the full) prefill the rows its placement puts of that sequence on that rank, plus a round-robin
// share of every decode token (the rounding of the round-robin may put one extra token on a rank
// per phase).
std::vector<std::vector<int64_t>> cache_capacity(const std::vector<SchedulePhase>& s, int N, int64_t batch = 1,
                                                 PlacementKind placement = PlacementKind::zigzag);
// A cache that serves calls of each of `placements` (bench infer's one engine per batch): the
// largest of their capacities of each sequence on each rank.
std::vector<std::vector<int64_t>> cache_capacity(const std::vector<SchedulePhase>& s, int N, int64_t batch,
                                                 const std::vector<PlacementKind>& placements);
// The same capacity `tokens` for each of `batch` sequences on each of N ranks.
std::vector<std::vector<int64_t>> uniform_capacity(int N, int64_t batch, int64_t tokens);
// The most tokens a rank holds of that capacity (every sequence's).
int64_t most_rank_tokens(const std::vector<std::vector<int64_t>>& capacity);

// bench infer's batched prefill and TTFT-vs-length sweep at context `seq`: seq/8, seq/4, seq/2,
// seq tokens (at least 1 each).
std::vector<int64_t> bench_infer_lengths(int64_t seq);
// bench infer's long-tail batch (its placement comparison): one prompt of seq/2 and 16 of seq/32
// (at least 1 each), about seq tokens in all.
std::vector<int64_t> bench_infer_tail_lengths(int64_t seq);
// Whether bench infer's batched-prefill table adds its frugal and placed rows (zigzag with the
// visible-keys row, and placement = balanced): the strategy has a visible-keys row and the model
// runs it (the CPU, no MLA latent, no Gated DeltaNet layer).
bool bench_infer_places(const Config& cfg);

}  // namespace ctxpar::infer
