// AttnParams: the one struct every attention call takes (forward extends to backward), as in
// flash-attention's params struct. Masks are data: the kernel gets the global positions and the
// document ids of its rows and columns, so one call serves the diagonal block, a past block, a
// zigzag half or a packed batch.
//
// Dimension vocabulary (declared once here and in src/core/config.hpp):
//   S_q query rows in this call, S_k key rows in this call, H_q query heads, H_kv key/value heads
//   (H_q % H_kv == 0; GQA when H_kv < H_q, MQA when H_kv == 1), D head dimension.
// Layout: token-major, contiguous: q/o/dout/dq [S_q, H_q, D], k/v/dk/dv [S_k, H_kv, D], lse [S_q, H_q].
#pragma once
#include <cstdint>

namespace ctxpar {

enum class MaskKind : int32_t {
  none = 0,    // every pair visible (subject to documents)
  causal = 1,  // key visible when k_pos <= q_pos
  window = 2,  // causal and q_pos - k_pos < window
};

// Work counters of one call (optional, for tests and benches): query-tile x key-tile blocks in
// the call, how many were skipped as provably empty, how many needed a per-element mask, and the
// (query, key) pairs actually computed (tile area, so >= visible pairs).
struct AttnStats {
  int64_t tiles_total = 0;
  int64_t tiles_skipped = 0;
  int64_t tiles_partial = 0;
  int64_t pairs_computed = 0;
};

struct AttnParams {
  // forward inputs
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  // forward outputs (overwritten by attn_fwd); backward inputs (O and LSE of the *full* attention)
  float* o = nullptr;
  float* lse = nullptr;  // natural log; -inf for a row that sees no key (then O = 0)
  // backward: dout input; dq, dk, dv are ACCUMULATED into (+=), so a ring can add per step
  const float* dout = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;

  int64_t S_q = 0, S_k = 0;
  int32_t H_q = 0, H_kv = 0, D = 0;

  // global token positions (required for causal/window masks; may be null for MaskKind::none)
  const int64_t* q_pos = nullptr;
  const int64_t* k_pos = nullptr;
  // document ids (optional: null = one document); a pair is visible only within one document
  const int32_t* q_doc = nullptr;
  const int32_t* k_doc = nullptr;

  MaskKind mask = MaskKind::causal;
  int64_t window = 0;   // for MaskKind::window: visible when 0 <= q_pos - k_pos < window
  float scale = 0.f;    // softmax scale; 0 = 1/sqrt(D)
  int32_t threads = 0;  // OpenMP threads for this call; 0 = the OpenMP default (omp_get_max_threads)
  AttnStats* stats = nullptr;  // when set, the fast path fills it (overwrites)

  float softmax_scale() const;
  // Is the pair (query row i, key row j) visible?  The single definition every backend uses.
  bool visible(int64_t i, int64_t j) const {
    if (q_doc && k_doc && q_doc[i] != k_doc[j]) return false;
    if (mask == MaskKind::none) return true;
    const int64_t d = q_pos[i] - k_pos[j];
    if (d < 0) return false;
    return mask == MaskKind::causal || d < window;
  }
};

}  // namespace ctxpar
