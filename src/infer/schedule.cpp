#include "infer/schedule.hpp"

#include <algorithm>
#include <sstream>

#include "core/config.hpp"
#include "cp/strategy.hpp"
#include "shard/partition.hpp"

namespace ctxpar::infer {

std::string parse_schedule(const std::string& text, int N, std::vector<SchedulePhase>& out) {
  out.clear();
  const std::string valid = "valid: a comma list of prefill:T (or prefill:T1/T2/..., one length per sequence) and "
                            "decode:N starting with a prefill, e.g. prefill:32K,decode:64,prefill:2K,decode:64";
  std::vector<std::string> items;
  const std::string err = split_list(text, ',', items);
  if (!err.empty()) return "config: schedule = '" + text + "': " + err + "; " + valid;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    const std::string kind = item.substr(0, colon);
    int64_t n = 0;
    std::vector<int64_t> lengths;
    if (kind == "prefill" && colon != std::string::npos && item.find('/') != std::string::npos) {
      std::vector<std::string> parts;
      const std::string perr = split_list(item.substr(colon + 1), '/', parts);
      for (const std::string& part : parts) {
        int64_t t = 0;
        if (!perr.empty() || !parse_size(part, t) || t < 1)
          return "config: schedule = '" + text + "': item '" + item + "' needs lengths >= 1 separated by '/'; " + valid;
        lengths.push_back(t);
        n = std::max(n, t);
      }
    } else if (colon == std::string::npos || !parse_size(item.substr(colon + 1), n) || n < 1) {
      // Another separator than ',' (prefill:64;decode:2) reads as one item with a bad count: say so.
      for (const char sep : std::string(";| \t"))
        if (item.find(sep) != std::string::npos)
          return "config: schedule = '" + text + "': item '" + item + "' holds '" + std::string(1, sep) +
                 "'; the items are separated by ','; " + valid;
      return "config: schedule = '" + text + "': item '" + item + "' needs a count >= 1; " + valid;
    }
    if (kind == "prefill") {
      out.push_back({PhaseKind::prefill, n, lengths});
    } else if (kind == "decode") {
      out.push_back({PhaseKind::decode, n});
    } else {
      return "config: schedule = '" + text + "': unknown phase '" + kind + "'; " + valid;
    }
  }
  if (out.empty() || out.front().kind != PhaseKind::prefill)
    return "config: schedule = '" + text + "' must start with a prefill; " + valid;
  return "";
}

std::vector<int64_t> bench_infer_lengths(int64_t seq) {
  return {std::max<int64_t>(1, seq / 8), std::max<int64_t>(1, seq / 4), std::max<int64_t>(1, seq / 2), seq};
}

std::vector<int64_t> bench_infer_tail_lengths(int64_t seq) {
  std::vector<int64_t> lens(17, std::max<int64_t>(1, seq / 32));
  lens[0] = std::max<int64_t>(1, seq / 2);
  return lens;
}

bool bench_infer_places(const Config& cfg) {
  return cfg.device == Device::cpu && cfg.attention != "mla" && cfg.layer_pattern.find('D') == std::string::npos &&
         has_schedule(cfg.strategy, CpSchedule::visible);
}

Placement prefill_placement(const std::vector<int64_t>& lengths, int N) {
  int64_t n = 0;
  for (int64_t T : lengths) n += Partition::padded_length(PartitionKind::zigzag, T, N) / N;
  return balanced_placement(lengths, N, n);
}

std::vector<std::vector<std::vector<int64_t>>> sequence_rows(const Placement& p, const std::vector<int64_t>& lengths) {
  std::vector<std::vector<std::vector<int64_t>>> at(lengths.size(), std::vector<std::vector<int64_t>>(p.rows.size()));
  for (size_t r = 0; r < p.rows.size(); ++r) {
    size_t j = 0;
    int64_t start = 0;  // sequence j's tokens are positions [start, start + lengths[j])
    for (int64_t g : p.rows[r]) {  // ascending: each sequence's rows a run, the padding last
      while (j < lengths.size() && g >= start + lengths[j]) start += lengths[j++];
      if (j == lengths.size()) break;
      at[j][r].push_back(g - start);
    }
  }
  return at;
}

std::vector<std::vector<int64_t>> cache_capacity(const std::vector<SchedulePhase>& s, int N, int64_t batch,
                                                 PlacementKind placement) {
  std::vector<std::vector<int64_t>> cap = uniform_capacity(N, batch, 0);
  for (size_t i = 0; i < s.size(); ++i) {
    const SchedulePhase& p = s[i];
    const std::vector<int64_t> lengths = p.lengths_of(batch);
    const bool placed = i == 0 && p.kind == PhaseKind::prefill && placement == PlacementKind::balanced;
    const std::vector<std::vector<std::vector<int64_t>>> at =  // every sequence's first prefill: placed
        placed ? sequence_rows(prefill_placement(lengths, N), lengths) : std::vector<std::vector<std::vector<int64_t>>>{};
    for (int r = 0; r < N; ++r)
      for (size_t b = 0; b < size_t(batch); ++b)
        cap[size_t(r)][b] += p.kind == PhaseKind::decode ? (p.count + N - 1) / N + 1
                             : placed ? int64_t(at[b][size_t(r)].size())
                                      : Partition::padded_length(PartitionKind::zigzag, lengths[b], N) / N;
  }
  return cap;
}

std::vector<std::vector<int64_t>> cache_capacity(const std::vector<SchedulePhase>& s, int N, int64_t batch,
                                                 const std::vector<PlacementKind>& placements) {
  std::vector<std::vector<int64_t>> cap = uniform_capacity(N, batch, 0);
  for (PlacementKind placement : placements) {
    const std::vector<std::vector<int64_t>> need = cache_capacity(s, N, batch, placement);
    for (size_t r = 0; r < cap.size(); ++r)
      for (size_t j = 0; j < cap[r].size(); ++j) cap[r][j] = std::max(cap[r][j], need[r][j]);
  }
  return cap;
}

std::vector<std::vector<int64_t>> uniform_capacity(int N, int64_t batch, int64_t tokens) {
  return std::vector<std::vector<int64_t>>(size_t(N), std::vector<int64_t>(size_t(batch), tokens));
}

int64_t most_rank_tokens(const std::vector<std::vector<int64_t>>& capacity) {
  int64_t most = 0;
  for (const std::vector<int64_t>& row : capacity) {
    int64_t sum = 0;
    for (int64_t c : row) sum += c;
    most = std::max(most, sum);
  }
  return most;
}

}  // namespace ctxpar::infer
