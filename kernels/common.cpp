// Backend-independent pieces of kernels/ops.hpp: the softmax scale and the visible-pair count.
#include <cmath>
#include <vector>

#include "ops.hpp"
#include "tiles.hpp"

namespace ctxpar {

float AttnParams::softmax_scale() const {
  return scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(D));
}

// Counted per 64x64 block with the same classifier the kernels use, so a causal 128K x 128K
// count costs a few milliseconds instead of 10^10 pair tests; only partial blocks are counted
// pair by pair.
int64_t visible_pairs(const AttnParams& p) {
  constexpr int64_t kBlock = 64;
  std::vector<tiles::Range> k_ranges;
  for (int64_t j0 = 0; j0 < p.S_k; j0 += kBlock)
    k_ranges.push_back(tiles::range_of(p.k_pos, p.k_doc, j0, std::min(p.S_k, j0 + kBlock)));
  int64_t total = 0;
  for (int64_t i0 = 0; i0 < p.S_q; i0 += kBlock) {
    const int64_t i1 = std::min(p.S_q, i0 + kBlock);
    const tiles::Range qr = tiles::range_of(p.q_pos, p.q_doc, i0, i1);
    for (int64_t j0 = 0; j0 < p.S_k; j0 += kBlock) {
      const int64_t j1 = std::min(p.S_k, j0 + kBlock);
      switch (tiles::classify(p, qr, k_ranges[j0 / kBlock])) {
        case tiles::Vis::empty: break;
        case tiles::Vis::full: total += (i1 - i0) * (j1 - j0); break;
        case tiles::Vis::partial:
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = j0; j < j1; ++j) total += p.visible(i, j) ? 1 : 0;
          break;
      }
    }
  }
  return total;
}

}  // namespace ctxpar
