// The visible-pair counter of kernels/ops.hpp (backend independent; host arrays).
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "ops.hpp"

namespace ctxpar {

int64_t visible_pairs(const AttnParams& p) {
  if (p.S_q == 0 || p.S_k == 0) return 0;
  if (p.device != Device::cpu) {  // counted on the host copies of positions and document ids
    const bool by_pos = p.mask != MaskKind::none;
    if ((by_pos && (!p.q_pos_host || !p.k_pos_host)) || (p.q_doc && !p.q_doc_host) || (p.k_doc && !p.k_doc_host))
      throw std::invalid_argument("visible_pairs: a device call needs the host copies of its positions and document "
                                  "ids (AttnParams::q_pos_host, k_pos_host, q_doc_host, k_doc_host)");
    return visible_pairs(p.host_rows());
  }
  // A document id only matters when both sides carry one; positions only under a mask.
  const bool docs = p.docs(), by_pos = p.mask != MaskKind::none;
  struct Key { int32_t doc; int64_t pos; };
  std::vector<Key> keys(static_cast<size_t>(p.S_k));
  for (int64_t j = 0; j < p.S_k; ++j) keys[size_t(j)] = {docs ? p.k_doc[j] : 0, by_pos ? p.k_pos[j] : 0};
  auto less = [](const Key& a, const Key& b) { return a.doc != b.doc ? a.doc < b.doc : a.pos < b.pos; };
  std::sort(keys.begin(), keys.end(), less);
  int64_t pairs = 0;
  for (int64_t i = 0; i < p.S_q; ++i) {
    // pair_visible(): same document, and q_pos - k_pos in [0, window) (causal: [0, inf); none: any).
    const int32_t d = docs ? p.q_doc[i] : 0;
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    if (by_pos) {
      hi = p.q_pos[i];
      if (p.mask == MaskKind::window) lo = p.q_pos[i] - p.window + 1;
    }
    if (lo > hi) continue;
    auto b = std::lower_bound(keys.begin(), keys.end(), Key{d, lo}, less);
    auto e = std::upper_bound(keys.begin(), keys.end(), Key{d, hi}, less);
    pairs += int64_t(e - b);
  }
  return pairs;
}

}  // namespace ctxpar
