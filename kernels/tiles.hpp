// Tile classification shared by every backend and by visible_pairs(): a block of query rows
// against a block of key rows is empty (skip), full (no per-element mask needed) or partial.
// The test is on the ranges (min/max) of positions and document ids inside each block, so it is
// conservative: "empty" and "full" are only returned when they hold for every pair, whatever the
// order of positions or ids inside the block (zigzag shards, packed documents, arbitrary data).
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

#include "attn_params.hpp"

namespace ctxpar::tiles {

struct Range {
  int64_t pos_min = 0, pos_max = 0;
  int32_t doc_min = 0, doc_max = 0;
};

// Range of rows [begin, end) (end > begin). Null arrays give a zero range.
inline Range range_of(const int64_t* pos, const int32_t* doc, int64_t begin, int64_t end) {
  Range r;
  if (pos) {
    r.pos_min = std::numeric_limits<int64_t>::max();
    r.pos_max = std::numeric_limits<int64_t>::min();
    for (int64_t i = begin; i < end; ++i) {
      r.pos_min = std::min(r.pos_min, pos[i]);
      r.pos_max = std::max(r.pos_max, pos[i]);
    }
  }
  if (doc) {
    r.doc_min = std::numeric_limits<int32_t>::max();
    r.doc_max = std::numeric_limits<int32_t>::min();
    for (int64_t i = begin; i < end; ++i) {
      r.doc_min = std::min(r.doc_min, doc[i]);
      r.doc_max = std::max(r.doc_max, doc[i]);
    }
  }
  return r;
}

enum class Vis : int32_t { empty, full, partial };

// The tile classification, one definition for every backend (the CUDA kernels call it on device,
// the CPU kernels and the emulator on the host); must agree with pair_visible(): empty => no visible pair in the block;
// full => every pair visible.
CTXPAR_HD inline Vis classify(MaskKind mask, int64_t window, bool docs, const Range& q, const Range& k) {
  bool docs_uniform = true;
  if (docs) {
    if (q.doc_max < k.doc_min || k.doc_max < q.doc_min) return Vis::empty;
    docs_uniform = q.doc_min == q.doc_max && k.doc_min == k.doc_max && q.doc_min == k.doc_min;
  }
  bool pos_all = true;
  if (mask != MaskKind::none) {
    // d = q_pos - k_pos ranges over [d_min, d_max] at most.
    const int64_t d_max = q.pos_max - k.pos_min;
    const int64_t d_min = q.pos_min - k.pos_max;
    if (d_max < 0) return Vis::empty;
    if (mask == MaskKind::window) {
      if (d_min >= window) return Vis::empty;
      pos_all = d_min >= 0 && d_max < window;
    } else {
      pos_all = d_min >= 0;
    }
  }
  return pos_all && docs_uniform ? Vis::full : Vis::partial;
}
inline Vis classify(const AttnParams& p, const Range& q, const Range& k) {
  return classify(p.mask, p.window, p.docs(), q, k);
}

}  // namespace ctxpar::tiles
