// AttnParams: the one descriptor of an attention call, from the strategies down to every kernel
// (CPU, CUDA, the CUDA emulator, the reference), as flash-attention's params struct. Forward
// extends to backward. Masks are data: the call carries the global positions and document ids of
// its rows and columns, so one call serves the diagonal block, a past block, a zigzag half, a
// packed batch or a KV cache.
//
// Dimension vocabulary (declared once, here and in src/core/config.hpp):
//   S_q query rows in this call, S_k key rows in this call, H_q query heads, H_kv key/value heads
//   (H_q % H_kv == 0; GQA when H_kv < H_q, MQA when H_kv == 1), D head dimension.
// Layout: token-major, the heads of a row contiguous (head h of row i at i * ld + h * D):
//   q, dout [S_q, H_q, D] and k, v [S_k, H_kv, D] with row strides q_stride, k_stride, v_stride,
//   dout_stride (elements between consecutive rows; 0 = packed, H * D), so q, k and v may be
//   views into one fused QKV projection [S, (H_q + 2 H_kv) D]; the outputs are always packed:
//   o, dq [S_q, H_q, D];  dk, dv [S_k, H_kv, D];  lse [S_q, H_q].
//
// Element types: q, k, v and dout are `dtype` (f32 on the CPU; bf16 on CUDA, whose tensor cores
// then accumulate in fp32); o, lse, dq, dk, dv are always fp32, so a ring's lse_merge of partial
// results and the gradient sums stay fp32. `device` says where every pointer lives (positions and
// document ids included) and where the call runs; `stream` orders a CUDA call.
//
// A CP strategy's argument (CpCall, src/cp/strategy.hpp) extends it with what only the strategies
// read (a KV cache's layout, MLA's latent, derivable key positions); with null pointers it
// describes a problem's shape only (validation, planning).
#pragma once
#include <cmath>
#include <cstdint>

#include "dtype.hpp"

// __host__ __device__ under nvcc: the mask rule and the tile classification below are compiled
// into the CUDA kernels as they are; everywhere else (the CPU, the emulator) plain functions.
#if defined(__CUDACC__)
#define CTXPAR_HD __host__ __device__
#else
#define CTXPAR_HD
#endif

namespace ctxpar {

enum class MaskKind : int32_t {
  none = 0,    // every pair visible (subject to documents)
  causal = 1,  // key visible when k_pos <= q_pos
  window = 2,  // causal and q_pos - k_pos < window
};

// THE visibility rule, the single definition every backend and counter uses: a key at distance
// d = q_pos - k_pos is visible to the query when both are in one document and the mask allows d
// (none: any d; causal: d >= 0; window: 0 <= d < window). d is ignored under MaskKind::none.
// Branch-free, so the CPU kernel's per-row masking loop vectorizes.
CTXPAR_HD inline bool pair_visible(MaskKind mask, int64_t window, bool same_doc, int64_t d) {
  const bool pos_ok = (mask == MaskKind::none) | ((d >= 0) & ((mask == MaskKind::causal) | (d < window)));
  return same_doc & pos_ok;
}

// Work counters of one call (optional, for tests and benches): query-tile x key-tile blocks in
// the call, how many were skipped as provably empty, how many needed a per-element mask, and the
// (query, key) pairs actually computed (tile area, so >= visible pairs).
struct AttnStats {
  int64_t tiles_total = 0;
  int64_t tiles_skipped = 0;
  int64_t tiles_partial = 0;
  int64_t pairs_computed = 0;
};

// Where a CPU kernel call's time went (`ctxpar bench attn`'s breakdown), in thread-seconds summed
// over the call's threads, measured by the kernel itself (a steady-clock read at each boundary,
// a few per tile). rest = total - the parts: task set-up, the epilogues (O /= l, the dK/dV/dQ
// write-backs), allocation and scheduling.
struct AttnProfile {
  double total = 0;      // sum over threads of the time in the call's parallel region
  double pack = 0;       // packing operands (K/V panels, Q/dO rows; backward: lse2 and D_i)
  double gemm = 0;       // tile GEMMs (QK^T, PV; backward: S, dP, dV, dK, dQ)
  double softmax = 0;    // online softmax and the O rescale; backward: P and dS from LSE
  double mask = 0;       // per-element masks of partial tiles, padding columns
  double transpose = 0;  // backward: P^T and dS^T for dV and dK
  double dq_order = 0;   // backward: dQ contributions added in key-tile order (adds, waits for a turn)
  double idle = 0;       // waiting for the other threads at the end (load imbalance)
  double rest() const { return total - pack - gemm - softmax - mask - transpose - dq_order - idle; }
};

struct AttnParams {
  // forward inputs (element type `dtype`)
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  // forward outputs (overwritten by attn_fwd); backward inputs (O and LSE of the *full* attention)
  float* o = nullptr;
  float* lse = nullptr;  // natural log; -inf for a row that sees no key (then O = 0)
  // backward: dout input (element type `dtype`); a kernel ACCUMULATES dq, dk, dv (+=), so a ring
  // can add per step (a CP strategy's backward overwrites them: src/cp/strategy.hpp)
  const void* dout = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  // Exact dK/dV (ops.hpp attn_bwd_exact; CPU): its output. It adds each contribution of one
  // query tile (attn_query_block(D) rows, a whole aligned block of positions; the K/V group's query
  // heads summed in fp32 in head order first) to dK and dV as fixed-point integers,
  // value * 2^kFixedShift rounded (ops.hpp), into these
  // [S_k, H_kv, D] sums instead of accumulating fp32 into dk and dv (left untouched). Integer sums
  // do not depend on their order, so dK/dV summed over any split of the queries (ranks, threads,
  // strategies) have the same bits. Needs every query tile to be one aligned block of consecutive
  // positions (the caller pads the layout: shard/partition.hpp's block).
  int64_t* dk_fixed = nullptr;
  int64_t* dv_fixed = nullptr;
  // Exact sums: the query rows whose contributions are summed in fp32 (in tile, then head order)
  // before one conversion, a multiple of attn_query_block(D); each such block of rows must be one
  // aligned block of consecutive positions. 0: one query tile. Fewer, larger conversions.
  int64_t fixed_rows = 0;
  // Exact sums: the query heads of a K/V group whose contributions are summed in fp32 before one
  // conversion (consecutive heads, dividing the group); 0: the whole group. Parts smaller than the
  // group let a group's heads be split over ranks (K/V heads replicated over ulysses or tp ranks)
  // while the integer sums over the parts keep the bits of one rank.
  int32_t fixed_heads = 0;

  int64_t S_q = 0, S_k = 0;
  int32_t H_q = 0, H_kv = 0, D = 0;

  // global token positions (required for causal/window masks; may be null for MaskKind::none)
  const int64_t* q_pos = nullptr;
  const int64_t* k_pos = nullptr;
  // document ids (optional: null = one document); a pair is visible only within one document
  const int32_t* q_doc = nullptr;
  const int32_t* k_doc = nullptr;
  // Host copies of the four arrays above, for a call whose device is not the CPU: a CP strategy
  // plans and counts visible pairs (visible_pairs, ops.hpp) on the host, the kernels read the
  // device arrays. Null where the device array is null; ignored by Device::cpu calls.
  const int64_t* q_pos_host = nullptr;
  const int64_t* k_pos_host = nullptr;
  const int32_t* q_doc_host = nullptr;
  const int32_t* k_doc_host = nullptr;

  // input row strides in elements (0 = packed: H_q * D for q and dout, H_kv * D for k and v)
  int64_t q_stride = 0, k_stride = 0, v_stride = 0, dout_stride = 0;

  MaskKind mask = MaskKind::causal;
  int64_t window = 0;   // for MaskKind::window: visible when 0 <= q_pos - k_pos < window
  float scale = 0.f;    // softmax scale; 0 = 1/sqrt(D)

  DType dtype = DType::f32;       // of q, k, v, dout
  Device device = Device::cpu;
  Stream stream = nullptr;        // Device::cuda: the stream the call is ordered on
  int32_t threads = 0;            // CPU: OpenMP threads for this call; 0 = omp_get_max_threads()
  // When set (a host pointer), the call fills it (overwrites); on CUDA this synchronizes the
  // stream, so leave it null when timing.
  AttnStats* stats = nullptr;
  // CPU only, when set: the call overwrites it with its time breakdown (costs ~0.5 % of the call).
  AttnProfile* profile = nullptr;

  CTXPAR_HD bool docs() const { return q_doc != nullptr && k_doc != nullptr; }
  // Row strides in elements as used (the packed width when the field is 0).
  CTXPAR_HD int64_t q_ld() const { return q_stride ? q_stride : int64_t(H_q) * D; }
  CTXPAR_HD int64_t k_ld() const { return k_stride ? k_stride : int64_t(H_kv) * D; }
  CTXPAR_HD int64_t v_ld() const { return v_stride ? v_stride : int64_t(H_kv) * D; }
  CTXPAR_HD int64_t dout_ld() const { return dout_stride ? dout_stride : int64_t(H_q) * D; }
  // Every input packed (what the CP strategies take; the kernels take any valid stride).
  bool packed() const {
    return q_ld() == int64_t(H_q) * D && k_ld() == int64_t(H_kv) * D && v_ld() == int64_t(H_kv) * D &&
           dout_ld() == int64_t(H_q) * D;
  }
  // "" when every stride is 0 or at least its packed width, else what is wrong.
  const char* stride_error() const {
    if (q_stride < 0 || k_stride < 0 || v_stride < 0 || dout_stride < 0) return "row strides must be >= 0";
    if (q_ld() < int64_t(H_q) * D || dout_ld() < int64_t(H_q) * D)
      return "q_stride and dout_stride must be 0 or at least H_q * D (rows must not overlap)";
    if (k_ld() < int64_t(H_kv) * D || v_ld() < int64_t(H_kv) * D)
      return "k_stride and v_stride must be 0 or at least H_kv * D (rows must not overlap)";
    return "";
  }
  // The same call with the host copies of positions and document ids in the arrays' places (a
  // Device::cpu call: itself), for host-side counting and planning; tensors keep their pointers.
  AttnParams host_rows() const {
    if (device == Device::cpu) return *this;
    AttnParams c = *this;
    c.q_pos = q_pos_host;
    c.k_pos = k_pos_host;
    c.q_doc = q_doc_host;
    c.k_doc = k_doc_host;
    c.device = Device::cpu;
    return c;
  }
  // Is the pair (query row i, key row j) visible? (host-side arrays)
  bool visible(int64_t i, int64_t j) const {
    return pair_visible(mask, window, !docs() || q_doc[i] == k_doc[j],
                        mask == MaskKind::none ? 0 : q_pos[i] - k_pos[j]);
  }
  // Softmax scale of the call: `scale`, or 1/sqrt(D) when 0.
  float softmax_scale() const { return scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(D)); }
  // The sub-call on query rows [a, a + n): q, o, lse, dout, dq, q_pos, q_doc offset; keys unchanged.
  AttnParams query_rows(int64_t a, int64_t n) const {
    AttnParams c = *this;
    const int64_t row = int64_t(H_q) * D, e = int64_t(dtype_bytes(dtype));
    c.S_q = n;
    if (q) c.q = static_cast<const char*>(q) + a * q_ld() * e;
    if (dout) c.dout = static_cast<const char*>(dout) + a * dout_ld() * e;
    if (o) c.o = o + a * row;
    if (dq) c.dq = dq + a * row;
    if (lse) c.lse = lse + a * H_q;
    if (q_pos) c.q_pos = q_pos + a;
    if (q_doc) c.q_doc = q_doc + a;
    if (q_pos_host) c.q_pos_host = q_pos_host + a;
    if (q_doc_host) c.q_doc_host = q_doc_host + a;
    return c;
  }
  // The sub-call on key rows [a, a + n): k, v, dk, dv, k_pos, k_doc offset; queries unchanged.
  AttnParams key_rows(int64_t a, int64_t n) const {
    AttnParams c = *this;
    const int64_t row = int64_t(H_kv) * D, e = int64_t(dtype_bytes(dtype));
    c.S_k = n;
    if (k) c.k = static_cast<const char*>(k) + a * k_ld() * e;
    if (v) c.v = static_cast<const char*>(v) + a * v_ld() * e;
    if (dk) c.dk = dk + a * row;
    if (dv) c.dv = dv + a * row;
    if (k_pos) c.k_pos = k_pos + a;
    if (k_doc) c.k_doc = k_doc + a;
    if (k_pos_host) c.k_pos_host = k_pos_host + a;
    if (k_doc_host) c.k_doc_host = k_doc_host + a;
    return c;
  }
  template <class T> CTXPAR_HD const T* q_as() const { return static_cast<const T*>(q); }
  template <class T> CTXPAR_HD const T* k_as() const { return static_cast<const T*>(k); }
  template <class T> CTXPAR_HD const T* v_as() const { return static_cast<const T*>(v); }
  template <class T> CTXPAR_HD const T* dout_as() const { return static_cast<const T*>(dout); }
};

}  // namespace ctxpar
