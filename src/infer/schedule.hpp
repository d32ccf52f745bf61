// Multi-turn chat schedule of `ctxpar chat`: a list of phases "prefill:T" (T new prompt tokens of
// every sequence; "prefill:T1/T2/...": T_b for sequence b, one per sequence of the batch) and
// "decode:N" (N decode steps, one token per sequence each), e.g.
// "prefill:32K,decode:64,prefill:2K,decode:64" or "prefill:512/1K/2K/4K,decode:16" (batch = 4). A turn starts at each prefill; the first prefill
// is a full prefill (empty KV cache), later ones are partial prefills over the cache.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ctxpar::infer {

enum class PhaseKind { prefill, decode };

struct SchedulePhase {
  PhaseKind kind;
  int64_t count;  // prefill: new tokens T (the longest, with lengths); decode: steps
  // prefill only: new tokens per sequence ("prefill:512/1K/2K/4K", one length per sequence of
  // the batch); empty: `count` for every sequence.
  std::vector<int64_t> lengths = {};
  int64_t length(int64_t b) const { return lengths.empty() ? count : lengths[size_t(b)]; }
};

// Parses `text`; throws nothing: returns "" and fills `out`, or a message naming the bad item and
// what would be valid. Any prefill length shards on any CP size `N` (shard/partition.hpp pads).
std::string parse_schedule(const std::string& text, int N, std::vector<SchedulePhase>& out);

// KV cache capacity per sequence and rank (tokens) that a schedule needs on N ranks: the padded
// zigzag shares of every prefill (its longest sequence's; the padding rows are written, then
// dropped) plus a round-robin share of every decode token (the rounding of the
// round-robin may put one extra token on a rank per phase).
int64_t cache_capacity_tokens(const std::vector<SchedulePhase>& s, int N);

// bench infer's batched prefill and TTFT-vs-length sweep at context `seq`: seq/8, seq/4, seq/2,
// seq tokens (at least 1 each).
std::vector<int64_t> bench_infer_lengths(int64_t seq);

}  // namespace ctxpar::infer
