#include "infer/schedule.hpp"

#include <sstream>

#include "core/config.hpp"
#include "shard/partition.hpp"

namespace ctxpar::infer {

std::string parse_schedule(const std::string& text, int N, std::vector<SchedulePhase>& out) {
  out.clear();
  const std::string valid = "valid: a comma list of prefill:T and decode:N starting with a prefill, e.g. "
                            "prefill:32K,decode:64,prefill:2K,decode:64";
  std::vector<std::string> items;
  const std::string err = split_list(text, ',', items);
  if (!err.empty()) return "config: schedule = '" + text + "': " + err + "; " + valid;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    const std::string kind = item.substr(0, colon);
    int64_t n = 0;
    if (colon == std::string::npos || !parse_size(item.substr(colon + 1), n) || n < 1)
      return "config: schedule = '" + text + "': item '" + item + "' needs a count >= 1; " + valid;
    if (kind == "prefill") {
      out.push_back({PhaseKind::prefill, n});
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

int64_t cache_capacity_tokens(const std::vector<SchedulePhase>& s, int N) {
  int64_t cap = 0;
  for (const SchedulePhase& p : s)  // a prefill's rows on each rank: its padded zigzag share
    cap += p.kind == PhaseKind::prefill ? Partition::padded_length(PartitionKind::zigzag, p.count, N) / N
                                        : (p.count + N - 1) / N + 1;
  return cap;
}

}  // namespace ctxpar::infer
