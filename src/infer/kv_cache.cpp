#include "infer/kv_cache.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "ops.hpp"

namespace ctxpar::infer {

KvCache::KvCache(const std::vector<std::vector<int64_t>>& capacity, int64_t layers, int32_t H_kv, int32_t D, int rank,
                 const std::string& kinds, bool shared_kv, Device device, Stream stream)
    : B_(capacity.empty() ? 0 : int64_t(capacity[0].size())), L_(layers), shared_(shared_kv), H_kv_(H_kv), D_(D),
      N_(int(capacity.size())), rank_(rank), device_(device), stream_(stream), capacity_(capacity),
      first_(size_t(B_) + 1, 0), len_(size_t(B_ * N_), 0), decoded_(size_t(B_), 0), pending_(size_t(B_), 0) {
  CTXPAR_CHECK(rank_ >= 0 && rank_ < N_, "KV cache of rank " << rank_ << " with capacities of " << N_ << " ranks");
  for (const std::vector<int64_t>& row : capacity_) {
    CTXPAR_CHECK(int64_t(row.size()) == B_, "KV cache capacities: " << row.size() << " sequences on a rank, " << B_
                                                                      << " on rank 0");
    for (int64_t c : row) CTXPAR_CHECK(c >= 0, "KV cache capacity " << c << " (must be >= 0)");
  }
  for (int64_t b = 0; b < B_; ++b) first_[size_t(b + 1)] = first_[size_t(b)] + this->capacity(b);
  const size_t bytes = size_t(rows()) * row_bytes();
  k_.resize(size_t(L_));
  v_.resize(size_t(L_));
  for (int64_t l = 0; l < L_; ++l) {  // zeros: padded rows stay finite
    if (!kinds.empty() && kinds[size_t(l)] == 'D') continue;  // a GDN layer keeps a state instead
    ++attn_layers_;
    k_[size_t(l)] = Buffer<std::byte>(bytes, true, device_, stream_);
    if (!shared_) v_[size_t(l)] = Buffer<std::byte>(bytes, true, device_, stream_);
  }
  pos_.resize(size_t(rows()), false);
  std::fill_n(pos_.data(), rows(), kNoPos);
  if (device_ != Device::cpu) {
    pos_dev_ = Buffer<int64_t>(size_t(rows()), false, device_, stream_);
    sync_positions();
  }
}

void KvCache::sync_positions() {
  if (device_ != Device::cpu)
    copy_to_device(pos_dev_.data(), pos_.data(), size_t(rows()) * sizeof(int64_t), device_, stream_);
}

int64_t KvCache::seq_len(int64_t b) const {
  int64_t s = 0;
  for (int r = 0; r < N_; ++r) s += len(b, r);
  return s;
}

int64_t KvCache::reserve(int64_t b, int64_t n, const int64_t* positions) {
  const int64_t first = len(b) + pending_[size_t(b)];
  CTXPAR_CHECK(first + n <= capacity(b), "KV cache of sequence " << b << " full: " << first << " + " << n
                                                                  << " tokens > capacity " << capacity(b));
  std::copy_n(positions, n, pos_.data() + first_row(b) + first);
  pending_[size_t(b)] += n;
  return first;
}

void KvCache::commit(int64_t b, const std::vector<int64_t>& added, bool decode) {
  CTXPAR_CHECK(int64_t(added.size()) == N_, "commit needs one count per rank");
  CTXPAR_CHECK(added[size_t(rank_)] >= 0 && added[size_t(rank_)] <= pending_[size_t(b)],
               "commit of " << added[size_t(rank_)] << " tokens, " << pending_[size_t(b)] << " reserved");
  const int64_t kept_end = len(b) + added[size_t(rank_)], reserved_end = len(b) + pending_[size_t(b)];
  std::fill(pos_.data() + first_row(b) + kept_end, pos_.data() + first_row(b) + reserved_end, kNoPos);
  for (int r = 0; r < N_; ++r) len_[size_t(b * N_ + r)] += added[size_t(r)];
  pending_[size_t(b)] = 0;
  if (decode) decoded_[size_t(b)] += 1;
}

void KvCache::clear() {
  std::fill(len_.begin(), len_.end(), 0);
  std::fill(decoded_.begin(), decoded_.end(), 0);
  std::fill(pending_.begin(), pending_.end(), 0);
  // Positions back to kNoPos: padded pass-KV blocks read slots past a rank's length. Stale K/V
  // there stay finite and are never visible.
  std::fill_n(pos_.data(), rows(), kNoPos);
}

void KvCache::restore(const Snapshot& s) {
  len_ = s.len;
  decoded_ = s.decoded;
  std::fill(pending_.begin(), pending_.end(), 0);
  for (int64_t b = 0; b < B_; ++b) std::fill(pos_.data() + first_row(b) + len(b), pos_.data() + first_row(b + 1), kNoPos);
}

double KvCache::used_bytes() const {
  double tokens = 0;
  for (int64_t b = 0; b < B_; ++b) tokens += double(len(b));
  return tokens * token_bytes();
}

double KvCache::allocated_bytes() const { return double(rows()) * token_bytes(); }

double KvCache::token_bytes() const {
  return (shared_ ? 1.0 : 2.0) * double(attn_layers_) * double(row_elems()) * double(elem_bytes()) + sizeof(int64_t);
}

}  // namespace ctxpar::infer
