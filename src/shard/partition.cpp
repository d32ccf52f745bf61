// Partition arithmetic. Everything here is closed-form integer index math, so owner(),
// local_index() and positions() are exact inverses of each other (tested in test_shard).
#include "shard/partition.hpp"

#include <algorithm>
#include <sstream>

#include "core/error.hpp"

namespace ctxpar {

PartitionKind partition_kind(const std::string& name) {
  PartitionKind k;
  if (!parse_in(kPartitionNames, name, k))
    throw UsageError("unknown partition '" + name + "'; valid: contiguous, zigzag, striped");
  return k;
}

const char* partition_name(PartitionKind k) { return name_of(k); }

// The unit of the layout: zigzag cuts it into 2P equal chunks, the others into P equal shards
// (striped: every rank gets S_padded/P tokens, so kernels see equal S_loc everywhere).
static int64_t granule(PartitionKind kind, int P) {
  return kind == PartitionKind::zigzag ? 2 * int64_t(P) : int64_t(P);
}

std::string Partition::check(PartitionKind kind, int64_t S, int P) {
  std::ostringstream os;
  if (P < 1) {
    os << "P = " << P << " ranks for partition " << partition_name(kind) << "; valid: P >= 1";
    return os.str();
  }
  if (S < 1) {
    os << "seq = " << S << " tokens; valid: seq >= 1 (" << partition_name(kind) << " over P = " << P << " ranks)";
    return os.str();
  }
  return "";
}

int64_t Partition::padded_length(PartitionKind kind, int64_t S, int P, int64_t block) {
  const int64_t g = granule(kind, P) * std::max<int64_t>(block, 1);
  return (S + g - 1) / g * g;
}

Partition::Partition(PartitionKind kind, int64_t S, int P, int64_t block)
    : kind_(kind), S_(S), S_pad_(0), P_(P), block_(std::max<int64_t>(block, 1)) {
  // The same S and P reach every rank, so a bad value throws on all of them alike; config
  // validation normally reports it earlier through check().
  const std::string err = check(kind, S, P);
  if (!err.empty()) throw UsageError(err);
  S_pad_ = padded_length(kind, S, P, block_);
}

std::string Partition::padding_note() const {
  if (padding() == 0) return "";
  std::ostringstream os;
  os << "seq = " << S_ << " runs as " << S_pad_ << " rows over " << P_ << " rank" << (P_ > 1 ? "s" : "") << " ("
     << partition_name(kind_) << ": " << granule(kind_, P_) << " equal " << (kind_ == PartitionKind::zigzag ? "chunks" : "shards")
     << (block_ > 1 ? " of whole " + std::to_string(block_) + "-position blocks" : std::string())
     << "): " << padding()
     << " padding row" << (padding() > 1 ? "s" : "") << " after the last token, which no query sees and no result shows";
  return os.str();
}

int64_t Partition::local_size(int r) const {
  CTXPAR_CHECK(r >= 0 && r < P_, "rank " << r << " outside [0, " << P_ << ")");
  return S_pad_ / P_;  // the padded layout gives every kind equal shards
}

int64_t Partition::real_size(int r) const {
  int64_t n = 0;
  for (const auto& [b, e] : ranges(r)) n += e - b;
  return n;
}

std::vector<std::pair<int64_t, int64_t>> Partition::layout_ranges(int r) const {
  CTXPAR_CHECK(r >= 0 && r < P_, "rank " << r << " outside [0, " << P_ << ")");
  std::vector<std::pair<int64_t, int64_t>> pieces;
  switch (kind_) {
    case PartitionKind::contiguous: {
      const int64_t n = S_pad_ / P_;
      pieces.emplace_back(r * n, (r + 1) * n);
      break;
    }
    case PartitionKind::zigzag: {
      const int64_t c = S_pad_ / (2 * int64_t(P_));
      const int64_t hi = 2 * int64_t(P_) - 1 - r;
      pieces.emplace_back(r * c, (r + 1) * c);
      pieces.emplace_back(hi * c, (hi + 1) * c);
      break;
    }
    case PartitionKind::striped:
      for (int64_t t = r; t < S_pad_; t += P_) pieces.emplace_back(t, t + 1);
      break;
  }
  // Merge pieces that touch (zigzag rank P-1's two chunks; striped over P = 1), so every range
  // boundary is a real shard boundary: the next token lives elsewhere.
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& piece : pieces) {
    if (!out.empty() && out.back().second == piece.first)
      out.back().second = piece.second;
    else
      out.push_back(piece);
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> Partition::ranges(int r) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& [b, e] : layout_ranges(r))
    if (b < S_) out.emplace_back(b, std::min(e, S_));
  return out;
}

std::vector<int64_t> Partition::positions(int r) const {
  std::vector<int64_t> pos;
  pos.reserve(size_t(local_size(r)));
  for (const auto& [b, e] : layout_ranges(r))
    for (int64_t t = b; t < e; ++t) pos.push_back(t);
  return pos;
}

int Partition::owner(int64_t g) const {
  CTXPAR_CHECK(g >= 0 && g < S_pad_, "position " << g << " outside [0, " << S_pad_ << ")");
  switch (kind_) {
    case PartitionKind::contiguous: return int(g / (S_pad_ / P_));
    case PartitionKind::zigzag: {
      const int64_t chunk = g / (S_pad_ / (2 * int64_t(P_)));
      return int(chunk < P_ ? chunk : 2 * int64_t(P_) - 1 - chunk);
    }
    case PartitionKind::striped: return int(g % P_);
  }
  return -1;
}

int64_t Partition::local_index(int64_t g) const {
  CTXPAR_CHECK(g >= 0 && g < S_pad_, "position " << g << " outside [0, " << S_pad_ << ")");
  switch (kind_) {
    case PartitionKind::contiguous: return g % (S_pad_ / P_);
    case PartitionKind::zigzag: {
      const int64_t c = S_pad_ / (2 * int64_t(P_));
      const int64_t chunk = g / c;
      // Low chunk first, then the high chunk (local order is ascending global order).
      return chunk < P_ ? g - chunk * c : c + (g - chunk * c);
    }
    case PartitionKind::striped: return g / P_;
  }
  return -1;
}

}  // namespace ctxpar
