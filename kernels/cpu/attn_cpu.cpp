// CPU flash attention (FlashAttention-2 on a CPU): forward with an online softmax over key tiles,
// backward recomputing the probabilities from LSE, both skipping tiles that have no visible
// pair. GEMM tiles run on our own AVX2/FMA micro-kernels (cpu/tile_ops_*.cpp) over operands
// packed once per call; kernels/README.md "GEMM library choice" says why (library calls on 96x64x128 tiles were
// slower) and the measurements.
//
// Work decomposition
//   forward:  one task per (query head h, query tile); it owns its O rows and LSE, so no races
//             and the result does not depend on the thread count.
//   backward: one task per (kv head g, key tile); it owns dK/dV of its keys (summed over the
//             query heads of group g, GQA) and adds its dQ contribution of each query tile into
//             a packed fp32 dQ accumulator, which is added to the caller's dq at the end. The
//             contributions to one (head, query tile) are added in increasing key-tile order,
//             whatever the schedule: a contribution goes in when the visible key tile before its
//             own has added (a per-accumulator turn), so dQ has the same bits for any thread
//             count. A contribution not yet at its turn waits in the thread's small reorder
//             buffer while the thread computes on; the lowest task not yet all in always has its
//             turns, so nothing deadlocks.
//
// Softmax in base 2: scores are multiplied by c = scale * log2(e) and exponentiated with 2^x;
// LSE = ln 2 * (m + log2 l).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu/ops_cpu.hpp"
#include "ops.hpp"
#include "cpu/tile_ops.hpp"
#include "tiles.hpp"

namespace ctxpar::cpu {

namespace {

// Tile sizes (docs/measurements.md has the measurements). Key tiles are multiples of 16 (the
// micro-kernel's column width), query tiles multiples of its 6 rows. Forward: 128 keys, so the
// O += P V micro-kernel runs 128-long inner loops (vs 64: about +10 %). Backward: 128 keys for
// D <= 128 (2026-12-05, AMD Zen 4, bench attn's headline row: 177.7-182.4 GFLOP/s against
// 166.3-175.9 with 64, the AVX-512 and the AVX2 tiles alike; its dK/dV accumulators are 64 KiB
// each), 64 above (not measured there; it keeps them at 64 KiB). Query tiles are halved for
// D > 128 so that the Q, O and score tiles plus one K and one V tile stay within a 512 KiB L2.
constexpr int64_t kBkFwd = 128;
int64_t key_tile_bwd(int32_t D) { return D <= 128 ? 128 : 64; }
int64_t query_tile_rows(int32_t D) { return D <= 128 ? 96 : 48; }
// With exact dK/dV sums the backward's query tiles are aligned blocks of positions, and a power
// of two, so that layouts of power-of-two sequences split into whole tiles without padding
// (96 would pad 8K tokens on 2 ranks to 8448 rows). 128 rows run ten 12-row micro-tiles and one
// of 8 (AVX-512); bench train's exact rows measure the whole schedule (docs/measurements.md).
int64_t exact_tile_rows(int32_t D) { return D <= 128 ? 128 : 64; }
// Exact sums: one block's contribution (fixed_rows queries, at least a tile) at most 2^10 in
// magnitude, so that the 2^16 of them a key can receive (8.4M queries at 128-row tiles) stay
// below 2^62.
constexpr float kFixedTileLimit = 1024.f;
static_assert(kFixedShift + 10 + 16 <= 62, "the exact sums' headroom");

// Exact dK/dV (AttnParams::dk_fixed): out[r, d] += src[r, d] * 2^kFixedShift rounded to the
// nearest integer, for nk rows of D; multiversioned so the conversion runs in 512-bit lanes where
// the CPU has them. Returns the largest |src| seen (NaN when one is NaN), which the caller checks
// against the fixed-point range before any sum could have overflowed.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
float add_fixed_rows(const float* src, int64_t ld_src, int64_t nk, int32_t D, int64_t* out, int64_t ld_out) {
  const float unit = std::ldexp(1.0f, kFixedShift), limit = std::ldexp(1.0f, 62 - kFixedShift - 10);
  float big = 0.f;
  int nan = 0;
  for (int64_t r = 0; r < nk; ++r) {
    const float* a = src + r * ld_src;
    int64_t* o = out + r * ld_out;
    for (int32_t d = 0; d < D; ++d) {
      const float x = a[d];
      big = std::max(big, std::abs(x));
      nan |= x != x;
      // clamped (and NaN made 0) before the conversion, so the cast is always defined; the caller
      // fails the call when a value was out of range
      const float y = x != x ? 0.f : std::clamp(x, -limit, limit);
      o[d] += static_cast<int64_t>(std::nearbyint(y * unit));
    }
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : big;
}
int64_t round16(int64_t x) { return (x + 15) / 16 * 16; }
constexpr double kLn2 = 0.69314718055994530942;

// 64-byte aligned scratch (packed operands, accumulators).
struct Scratch {
  float* p = nullptr;
  explicit Scratch(int64_t n, bool zero = false) {
    const size_t bytes = (static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float) + 63) / 64 * 64;
    p = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!p) throw std::bad_alloc();
    if (zero) std::memset(p, 0, bytes);
  }
  ~Scratch() { std::free(p); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* get() const { return p; }
};

int thread_count(const AttnParams& p) { return p.threads > 0 ? p.threads : omp_get_max_threads(); }

void check_params(const AttnParams& p, bool backward) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("attention: " + what); };
  if (p.S_q < 0 || p.S_k < 0) fail("negative S_q or S_k");
  if (p.H_q <= 0 || p.H_kv <= 0 || p.H_q % p.H_kv != 0)
    fail("H_q (" + std::to_string(p.H_q) + ") must be a positive multiple of H_kv (" +
         std::to_string(p.H_kv) + ")");
  if (p.D <= 0) fail("D must be positive");
  if (p.dtype != DType::f32) fail("the CPU kernels take fp32 q, k, v, dout (dtype f32)");
  if (p.mask != MaskKind::none && (!p.q_pos || !p.k_pos)) fail("causal/window masks need q_pos and k_pos");
  if (!p.q || !p.k || !p.v || !p.o || !p.lse) fail("q, k, v, o, lse must be set");
  if (backward && (!p.dout || !p.dq || !((p.dk && p.dv) || (p.dk_fixed && p.dv_fixed))))
    fail("backward needs dout, dq, and dk, dv (or dk_fixed, dv_fixed)");
  if (*p.stride_error()) fail(p.stride_error());
}

// Per-tile (min, max) of positions and documents, for tile classification.
std::vector<tiles::Range> tile_ranges(const int64_t* pos, const int32_t* doc, int64_t S, int64_t B) {
  std::vector<tiles::Range> r;
  for (int64_t i0 = 0; i0 < S; i0 += B) r.push_back(tiles::range_of(pos, doc, i0, std::min(S, i0 + B)));
  return r;
}

// x [S, H, D] token-major (row stride ld) -> 16-column panels of x^T per head: element (head g,
//   row j, dim d) at out[((g * n_panels + j / 16) * D + d) * 16 + j % 16], rows >= S zero
//   (n_panels * 16 >= S).
void pack_panels(const float* x, int64_t ld, int64_t S, int32_t H, int32_t D, int64_t n_panels, float* out) {
#pragma omp for schedule(static)
  for (int64_t t = 0; t < H * n_panels; ++t) {
    const int64_t g = t / n_panels, pn = t % n_panels;
    float* dst = out + t * D * 16;
    for (int64_t jj = 0; jj < 16; ++jj) {
      const int64_t j = pn * 16 + jj;
      if (j < S) {
        const float* src = x + j * ld + g * D;
        for (int32_t d = 0; d < D; ++d) dst[d * 16 + jj] = src[d];
      } else {
        for (int32_t d = 0; d < D; ++d) dst[d * 16 + jj] = 0.f;
      }
    }
  }
}

// x [S, H, D] -> head-major rows out[(g * S_pad + j) * Dp + d], zero for j >= S or d >= D.
// Head-major rows avoid the large power-of-two stride of token-major rows inside a tile
// (H * D * 4 bytes, e.g. 4 KiB, which maps every row of a tile to the same L1 sets).
void pack_rows(const float* x, int64_t ld, int64_t S, int32_t H, int32_t D, int64_t S_pad, int64_t Dp, float* out) {
#pragma omp for schedule(static)
  for (int64_t t = 0; t < H * S_pad; ++t) {
    const int64_t g = t / S_pad, j = t % S_pad;
    float* dst = out + t * Dp;
    if (j < S) {
      std::memcpy(dst, x + j * ld + g * D, sizeof(float) * D);
      std::fill(dst + D, dst + Dp, 0.f);
    } else {
      std::fill(dst, dst + Dp, 0.f);
    }
  }
}

// Scores of a tile: -inf for invisible pairs (partial tiles only) and for the padding columns
// [nk, nk16) beyond the last key. The per-element test is pair_visible() (attn_params.hpp),
// branch-free over a row, so the compiler vectorizes it (packed documents make many tiles
// partial; a call per pair through AttnParams::visible cost ~25 % of such a tile).
void mask_tile(const AttnParams& p, float* S, int64_t ld, int64_t q0, int64_t nq, int64_t j0,
               int64_t nk, int64_t nk16, bool partial) {
  const bool docs = p.docs();
  const bool by_pos = p.mask != MaskKind::none;
  const int64_t* kp = p.k_pos ? p.k_pos + j0 : nullptr;
  const int32_t* kd = docs ? p.k_doc + j0 : nullptr;
  for (int64_t r = 0; r < nq; ++r) {
    float* s = S + r * ld;
    if (partial) {
      const int32_t qd = docs ? p.q_doc[q0 + r] : 0;
      const int64_t qp = by_pos ? p.q_pos[q0 + r] : 0;
      if (docs && by_pos) {
        for (int64_t c = 0; c < nk; ++c) s[c] = pair_visible(p.mask, p.window, kd[c] == qd, qp - kp[c]) ? s[c] : -INFINITY;
      } else if (docs) {
        for (int64_t c = 0; c < nk; ++c) s[c] = pair_visible(p.mask, p.window, kd[c] == qd, 0) ? s[c] : -INFINITY;
      } else if (by_pos) {
        for (int64_t c = 0; c < nk; ++c) s[c] = pair_visible(p.mask, p.window, true, qp - kp[c]) ? s[c] : -INFINITY;
      }
    }
    for (int64_t c = nk; c < nk16; ++c) s[c] = -INFINITY;
  }
}

struct Counters {
  int64_t total = 0, skipped = 0, partial = 0, pairs = 0;
  void add_to(AttnStats* st) const {
    if (!st) return;
#pragma omp atomic
    st->tiles_total += total;
#pragma omp atomic
    st->tiles_skipped += skipped;
#pragma omp atomic
    st->tiles_partial += partial;
#pragma omp atomic
    st->pairs_computed += pairs;
  }
};

// Per-thread part timer for AttnParams::profile: lap(&AttnProfile::part) adds the time since the
// previous lap to that part, rest() lets it go to the remainder; finish() adds the thread's
// parts to the call's profile. Nothing is read from the clock when the call is not profiled.
class Laps {
 public:
  explicit Laps(bool on) : on_(on), t0_(on ? now() : 0), t_(t0_) {}
  void operator()(double AttnProfile::*part) {
    if (!on_) return;
    const double t = now();
    mine_.*part += t - t_;
    t_ = t;
  }
  void rest() {
    if (on_) t_ = now();
  }
  void finish(AttnProfile* out) {
    if (!on_ || !out) return;
    mine_.total = now() - t0_;
#pragma omp critical(ctxpar_attn_profile)
    for (double AttnProfile::*f : {&AttnProfile::total, &AttnProfile::pack, &AttnProfile::gemm, &AttnProfile::softmax,
                                   &AttnProfile::mask, &AttnProfile::transpose, &AttnProfile::dq_order,
                                   &AttnProfile::idle})
      out->*f += mine_.*f;
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  bool on_;
  double t0_, t_;
  AttnProfile mine_;
};

}  // namespace

void attn_fwd(const AttnParams& p) {
  check_params(p, false);
  if (p.stats) *p.stats = AttnStats{};
  if (p.profile) *p.profile = AttnProfile{};
  const int32_t D = p.D, group = p.H_q / p.H_kv;
  if (p.S_q == 0) return;
  if (p.S_k == 0) {  // no keys at all: every row sees nothing
    std::fill(p.o, p.o + p.S_q * p.H_q * D, 0.f);
    std::fill(p.lse, p.lse + p.S_q * p.H_q, -INFINITY);
    return;
  }
  const cpu::TileOps& ops = cpu::tile_ops();
  const int64_t Bq = query_tile_rows(D), Dp = round16(D);
  const int64_t n_qt = (p.S_q + Bq - 1) / Bq, n_kt = (p.S_k + kBkFwd - 1) / kBkFwd;
  const int64_t S_k_pad = n_kt * kBkFwd, n_panels = S_k_pad / 16;
  const float c = p.softmax_scale() * kLog2e;
  const auto q_ranges = tile_ranges(p.q_pos, p.q_doc, p.S_q, Bq);
  const auto k_ranges = tile_ranges(p.k_pos, p.k_doc, p.S_k, kBkFwd);

  Scratch kt(p.H_kv * n_panels * 16 * D), vr(p.H_kv * S_k_pad * Dp);
#pragma omp parallel num_threads(thread_count(p))
  {
    Laps lap(p.profile != nullptr);
    pack_panels(p.k_as<float>(), p.k_ld(), p.S_k, p.H_kv, D, n_panels, kt.get());
    pack_rows(p.v_as<float>(), p.v_ld(), p.S_k, p.H_kv, D, S_k_pad, Dp, vr.get());  // omp for: implicit barrier
    lap(&AttnProfile::pack);

    Scratch qt(Bq * Dp, true), ot(Bq * Dp), st(Bq * kBkFwd);
    std::vector<float> m(Bq), l(Bq), alpha(Bq);
    Counters cnt;
    // Task order: kv head outermost, then query tiles from the last (under a causal mask the
    // last query tiles see the most keys: largest first balances the dynamic schedule), then
    // the query heads of the group. Threads working on neighbouring tasks then stream the same
    // K/V tiles, and the working set is one kv head's K/V (H_kv times smaller than cycling over
    // all heads; measured 78 -> 138 GFLOP/s at S=4K, H_q=32, H_kv=8 where all heads' K/V
    // exceed the L3).
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t task = 0; task < n_qt * p.H_q; ++task) {
      lap.rest();
      const int32_t g = static_cast<int32_t>(task / (n_qt * group));
      const int64_t qi = n_qt - 1 - (task / group) % n_qt;
      const int32_t h = g * group + static_cast<int32_t>(task % group);
      const int64_t q0 = qi * Bq, nq = std::min(Bq, p.S_q - q0);
      for (int64_t r = 0; r < nq; ++r)
        std::memcpy(qt.get() + r * Dp, p.q_as<float>() + (q0 + r) * p.q_ld() + h * D, sizeof(float) * D);
      std::fill(ot.get(), ot.get() + nq * Dp, 0.f);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.f);
      lap(&AttnProfile::pack);
      for (int64_t ki = 0; ki < n_kt; ++ki) {
        ++cnt.total;
        const tiles::Vis vis = tiles::classify(p, q_ranges[qi], k_ranges[ki]);
        if (vis == tiles::Vis::empty) { ++cnt.skipped; continue; }
        const int64_t j0 = ki * kBkFwd, nk = std::min(kBkFwd, p.S_k - j0), nk16 = round16(nk);
        cnt.partial += vis == tiles::Vis::partial;
        cnt.pairs += nq * nk;
        // S = Q K^T over the 16-key panels of this tile
        lap.rest();
        ops.gemm(nq, nk16, D, qt.get(), Dp, 1, kt.get() + (g * n_panels + j0 / 16) * D * 16, 16,
                 D * 16, st.get(), kBkFwd, false);
        lap(&AttnProfile::gemm);
        mask_tile(p, st.get(), kBkFwd, q0, nq, j0, nk, nk16, vis == tiles::Vis::partial);
        lap(&AttnProfile::mask);
        ops.softmax_tile(st.get(), nq, nk16, kBkFwd, c, m.data(), l.data(), alpha.data());
        ops.scale_rows(ot.get(), nq, Dp, Dp, alpha.data());
        lap(&AttnProfile::softmax);
        // O += P V
        ops.gemm(nq, Dp, nk16, st.get(), kBkFwd, 1, vr.get() + (g * S_k_pad + j0) * Dp, Dp, 16,
                 ot.get(), Dp, true);
        lap(&AttnProfile::gemm);
      }
      for (int64_t r = 0; r < nq; ++r) {
        float* o = p.o + ((q0 + r) * p.H_q + h) * D;
        float* lse = p.lse + (q0 + r) * p.H_q + h;
        if (l[r] == 0.f) {  // saw no key
          std::fill(o, o + D, 0.f);
          *lse = -INFINITY;
          continue;
        }
        const float inv = 1.f / l[r];
        for (int32_t d = 0; d < D; ++d) o[d] = ot.get()[r * Dp + d] * inv;
        *lse = static_cast<float>(kLn2 * (static_cast<double>(m[r]) + std::log2(static_cast<double>(l[r]))));
      }
    }
    lap.rest();
#pragma omp barrier
    lap(&AttnProfile::idle);
    cnt.add_to(p.stats);
    lap.finish(p.profile);
  }
}

int64_t attn_query_block(int32_t D) { return exact_tile_rows(D); }

namespace {

// The exact entry's layout (AttnParams::dk_fixed): every block of `group_rows` queries one aligned
// block of consecutive positions (the same on any split of the queries), fixed_heads dividing a
// K/V group. Throws std::invalid_argument naming the value otherwise.
void check_exact_blocks(const AttnParams& p, int64_t Bq, int64_t group_rows, int32_t group) {
  if (!p.dk_fixed || !p.dv_fixed || !p.q_pos)
    throw std::invalid_argument("attn_bwd_exact: needs dk_fixed, dv_fixed and q_pos");
  if (group_rows % Bq != 0)
    throw std::invalid_argument("attn_bwd: fixed_rows = " + std::to_string(p.fixed_rows) +
                                " is not a multiple of the exact query tile (" + std::to_string(Bq) + " rows)");
  for (int64_t q0 = 0; q0 < p.S_q; q0 += group_rows) {
    const int64_t nq = std::min(group_rows, p.S_q - q0);
    bool ok = p.q_pos[q0] % group_rows == 0 && nq == group_rows;
    for (int64_t i = 1; i < nq && ok; ++i) ok = p.q_pos[q0 + i] == p.q_pos[q0] + i;
    if (!ok)
      throw std::invalid_argument("attn_bwd: exact dK/dV sums need every " + std::to_string(group_rows) +
                                  "-row block of queries to hold one aligned block of consecutive positions (block at row " +
                                  std::to_string(q0) + ", position " + std::to_string(p.q_pos[q0]) +
                                  "); pad the layout to whole blocks");
  }
  if (p.fixed_heads < 0 || (p.fixed_heads > 0 && group % p.fixed_heads != 0))
    throw std::invalid_argument("attn_bwd: fixed_heads = " + std::to_string(p.fixed_heads) +
                                " does not divide the " + std::to_string(group) + " query heads of a K/V group");
}

// One (query tile, head of the group) step of a key tile's task; `end` closes an exact part.
struct BwdStep {
  int64_t qi;
  int32_t h;  // within the group
  bool end;
};
// The steps of one key tile's task, in order. Plain: heads outer (measured faster: each head's Q
// and dO rows stream in order). Exact: per block of `per_group` query tiles (fixed_rows), per
// part of `part` heads of the group (fixed_heads), tiles then heads; a step with `end` closes a
// part, whose fp32 sum is then added as integers. The order and the parts are the same on every
// mesh, whose ranks hold whole blocks and whole parts.
std::vector<BwdStep> bwd_steps(bool exact, int64_t n_qt, int32_t group, int64_t per_group, int32_t part) {
  std::vector<BwdStep> steps;
  steps.reserve(size_t(n_qt * group));
  if (!exact) {
    for (int32_t h = 0; h < group; ++h)
      for (int64_t qi = 0; qi < n_qt; ++qi) steps.push_back({qi, h, false});
    return steps;
  }
  for (int64_t b0 = 0; b0 < n_qt; b0 += per_group) {
    const int64_t b1 = std::min(n_qt, b0 + per_group);
    for (int32_t h0 = 0; h0 < group; h0 += part)
      for (int64_t qi = b0; qi < b1; ++qi)
        for (int32_t h = h0; h < h0 + part; ++h) steps.push_back({qi, h, qi + 1 == b1 && h + 1 == h0 + part});
  }
  return steps;
}

// The backward's packed operands: Q and dO head-major rows (B operands of dK and dV, A of S and
// dP), K^T and V^T panels (B of S and dP), K rows (B of dQ); per-row lse in base 2 and
// D_i = dO_i . O_i; dQ's accumulators (zeroed).
struct BwdOperands {
  Scratch qr, dor, kt, vt, kr, lse2, di, dq_acc;
  BwdOperands(const AttnParams& p, int64_t Dp, int64_t n_panels, int64_t S_k_pad)
      : qr(p.H_q * p.S_q * Dp), dor(p.H_q * p.S_q * Dp), kt(p.H_kv * n_panels * 16 * p.D),
        vt(p.H_kv * n_panels * 16 * p.D), kr(p.H_kv * S_k_pad * Dp), lse2(p.H_q * p.S_q), di(p.H_q * p.S_q),
        dq_acc(p.H_q * p.S_q * Dp, true) {}
  // Called by every thread of the parallel region (its loops are worksharing); ends in a barrier.
  void pack(const AttnParams& p, int64_t Dp, int64_t n_panels, int64_t S_k_pad) {
    const int32_t D = p.D;
    pack_rows(p.q_as<float>(), p.q_ld(), p.S_q, p.H_q, D, p.S_q, Dp, qr.get());
    pack_rows(p.dout_as<float>(), p.dout_ld(), p.S_q, p.H_q, D, p.S_q, Dp, dor.get());
    pack_panels(p.k_as<float>(), p.k_ld(), p.S_k, p.H_kv, D, n_panels, kt.get());
    pack_panels(p.v_as<float>(), p.v_ld(), p.S_k, p.H_kv, D, n_panels, vt.get());
    pack_rows(p.k_as<float>(), p.k_ld(), p.S_k, p.H_kv, D, S_k_pad, Dp, kr.get());
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.H_q * p.S_q; ++t) {
      const int64_t h = t / p.S_q, i = t % p.S_q;
      const float lse = p.lse[i * p.H_q + h];
      lse2.get()[t] = lse == -INFINITY ? INFINITY : lse * kLog2e;  // +inf: P = 0 on that row
      const float* o = p.o + (i * p.H_q + h) * D;
      const float* d_o = p.dout_as<float>() + i * p.dout_ld() + h * D;
      float acc = 0.f;
      for (int32_t d = 0; d < D; ++d) acc += o[d] * d_o[d];
      di.get()[t] = acc;
    }  // implicit barrier: packing done
  }
};

// One thread's dQ contributions in their turn: the contribution of key tile ki to accumulator
// (h, query tile) goes in when every earlier visible key tile's has (the same sum order on any
// thread count). Those not yet at their turn wait here (a reorder buffer of this thread), so the
// thread goes on computing instead of waiting; committed in turn, each to its accumulator.
class DqTurns {
 public:
  // turn[h * n_qt + qi]: the key tile whose contribution is next; next_visible[qi * n_kt + ki]
  // the visible key tile after ki (n_kt: none).
  DqTurns(float* dq_acc, std::atomic<int64_t>* turn, const std::vector<int64_t>& next_visible, int64_t S_q,
          int64_t n_qt, int64_t n_kt, int64_t Bq, int64_t Dp)
      : dq_acc_(dq_acc), turn_(turn), next_(next_visible), S_q_(S_q), n_qt_(n_qt), n_kt_(n_kt), Bq_(Bq), Dp_(Dp) {}
  // A buffer of Bq x Dp for the contribution of (acc = h * n_qt + qi, ki), `elems` of it used.
  float* take(int64_t acc, int64_t qi, int64_t ki, int64_t elems) {
    if (spare_.empty()) spare_.push_back(std::make_unique<Scratch>(Bq_ * Dp_));
    taken_ = {acc, qi, ki, elems, std::move(spare_.back())};
    spare_.pop_back();
    return taken_.buf->get();
  }
  // The taken buffer, filled: committed now or kept until its turn (at most kMaxPending kept).
  void put() {
    flush(false);
    if (ready(taken_)) commit(taken_);
    else pending_.push_back(std::move(taken_));
    while (pending_.size() >= kMaxPending) {  // a bounded buffer: wait for the oldest turns
      std::this_thread::yield();
      flush(false);
    }
  }
  // Commits every pending contribution whose turn has come; with `all`, waits for the rest too.
  void flush(bool all) {
    while (!pending_.empty()) {
      size_t kept = 0;
      for (size_t i = 0; i < pending_.size(); ++i)
        if (ready(pending_[i])) commit(pending_[i]);
        else pending_[kept++] = std::move(pending_[i]);
      pending_.resize(kept);
      if (!all || pending_.empty()) return;
      std::this_thread::yield();
    }
  }

 private:
  struct Pending {
    int64_t acc, qi, ki, elems;  // accumulator h * n_qt + qi, its key tile, Bq-row tile size
    std::unique_ptr<Scratch> buf;
  };
  static constexpr size_t kMaxPending = 32;
  bool ready(const Pending& e) const { return turn_[size_t(e.acc)].load(std::memory_order_acquire) == e.ki; }
  void commit(Pending& e) {
    float* out = dq_acc_ + (e.acc / n_qt_ * S_q_ + e.qi * Bq_) * Dp_;
    for (int64_t x = 0; x < e.elems; ++x) out[x] += e.buf->get()[x];
    turn_[size_t(e.acc)].store(next_[size_t(e.qi * n_kt_ + e.ki)], std::memory_order_release);
    spare_.push_back(std::move(e.buf));
  }
  float* dq_acc_;
  std::atomic<int64_t>* turn_;
  const std::vector<int64_t>& next_;
  int64_t S_q_, n_qt_, n_kt_, Bq_, Dp_;
  Pending taken_{};
  std::vector<Pending> pending_;
  std::vector<std::unique_ptr<Scratch>> spare_;
};

// The backward of both entries: kExact (attn_bwd_exact) adds each part's dK/dV as integers to
// dk_fixed/dv_fixed; plain (attn_bwd) adds them in fp32 to dk/dv. The same tiles and GEMMs.
template <bool kExact>
void attn_bwd_tiles(const AttnParams& p) {
  check_params(p, true);
  if (p.stats) *p.stats = AttnStats{};
  if (p.profile) *p.profile = AttnProfile{};
  const int32_t D = p.D, group = p.H_q / p.H_kv;
  if (p.S_q == 0 || p.S_k == 0) return;
  const cpu::TileOps& ops = cpu::tile_ops();
  const int64_t Bq = kExact ? exact_tile_rows(D) : query_tile_rows(D), Dp = round16(D);
  const int64_t kBkBwd = key_tile_bwd(D);
  const int64_t n_qt = (p.S_q + Bq - 1) / Bq, n_kt = (p.S_k + kBkBwd - 1) / kBkBwd;
  const int64_t S_k_pad = n_kt * kBkBwd, n_panels = S_k_pad / 16;
  const float scale = p.softmax_scale(), c = scale * kLog2e;
  const auto q_ranges = tile_ranges(p.q_pos, p.q_doc, p.S_q, Bq);
  const auto k_ranges = tile_ranges(p.k_pos, p.k_doc, p.S_k, kBkBwd);
  // Exact sums: each group of `per_group` query tiles (AttnParams::fixed_rows) is one aligned
  // block of consecutive positions, the same on any split of the queries.
  const int64_t group_rows = p.fixed_rows > 0 ? p.fixed_rows : Bq, per_group = group_rows / Bq;
  if constexpr (kExact) check_exact_blocks(p, Bq, group_rows, group);
  const std::vector<BwdStep> steps =
      bwd_steps(kExact, n_qt, group, per_group, p.fixed_heads > 0 ? p.fixed_heads : group);

  BwdOperands in(p, Dp, n_panels, S_k_pad);
  Scratch &qr = in.qr, &dor = in.dor, &kt = in.kt, &vt = in.vt, &kr = in.kr, &lse2 = in.lse2, &di = in.di;
  // The turn of each dQ accumulator (h, query tile): the key tile whose contribution is next.
  // Visibility does not depend on the head: first_visible[qi] and next_visible[qi * n_kt + ki]
  // (n_kt = none after ki) come from the tile classification.
  std::vector<int64_t> next_visible(size_t(n_qt * n_kt), n_kt), first_visible(size_t(n_qt), n_kt);
  for (int64_t qi = 0; qi < n_qt; ++qi)
    for (int64_t ki = n_kt - 1; ki >= 0; --ki) {
      next_visible[size_t(qi * n_kt + ki)] = first_visible[size_t(qi)];
      if (tiles::classify(p, q_ranges[qi], k_ranges[ki]) != tiles::Vis::empty) first_visible[size_t(qi)] = ki;
    }
  std::unique_ptr<std::atomic<int64_t>[]> turn(new std::atomic<int64_t>[size_t(p.H_q * n_qt)]);
  for (int64_t h = 0; h < p.H_q; ++h)
    for (int64_t qi = 0; qi < n_qt; ++qi) turn[size_t(h * n_qt + qi)].store(first_visible[size_t(qi)]);

  // Exact sums: a tile value beyond the fixed-point range (or NaN) fails the call below.
  std::atomic<bool> fixed_overflow{false};
#pragma omp parallel num_threads(thread_count(p))
  {
    Laps lap(p.profile != nullptr);
    in.pack(p, Dp, n_panels, S_k_pad);
    lap(&AttnProfile::pack);

    Scratch st(Bq * kBkBwd), dpt(Bq * kBkBwd), dka(kBkBwd * Dp), dva(kBkBwd * Dp), pt(kBkBwd * Bq),
        dst(kBkBwd * Bq);
    Counters cnt;
    DqTurns dq(in.dq_acc.get(), turn.get(), next_visible, p.S_q, n_qt, n_kt, Bq, Dp);
    // Task order: kv head outermost, then key tiles from the first (under a causal mask the
    // first key tiles are seen by the most queries: largest first). Threads on neighbouring
    // tasks then stream the same group's Q and dO tiles in the same order (shared through the
    // L3) instead of one group each.
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t task = 0; task < n_kt * p.H_kv; ++task) {
      const int32_t g = static_cast<int32_t>(task / n_kt);
      const int64_t ki = task % n_kt;
      const int64_t j0 = ki * kBkBwd, nk = std::min(kBkBwd, p.S_k - j0), nk16 = round16(nk);
      std::fill(dka.get(), dka.get() + kBkBwd * Dp, 0.f);
      std::fill(dva.get(), dva.get() + kBkBwd * Dp, 0.f);
      const float* k_panel = kt.get() + (g * n_panels + j0 / 16) * D * 16;
      const float* v_panel = vt.get() + (g * n_panels + j0 / 16) * D * 16;
      bool dirty = false;  // exact: dka/dva hold part of the current part's sum
      for (const BwdStep& step : steps) {
        const int64_t qi = step.qi;
        const int32_t h = g * group + step.h;
        const bool block_end = step.end;
        ++cnt.total;
        const tiles::Vis vis = tiles::classify(p, q_ranges[qi], k_ranges[ki]);
        if (vis == tiles::Vis::empty) ++cnt.skipped;
        const int64_t q0 = qi * Bq, nq = std::min(Bq, p.S_q - q0);
        if (kExact && !dirty && vis != tiles::Vis::empty) {
          std::fill(dka.get(), dka.get() + nk * Dp, 0.f);
          std::fill(dva.get(), dva.get() + nk * Dp, 0.f);
          dirty = true;
        }
        if (vis != tiles::Vis::empty) {
          cnt.partial += vis == tiles::Vis::partial;
          cnt.pairs += nq * nk;
          const float* qt = qr.get() + (h * p.S_q + q0) * Dp;
          const float* dot = dor.get() + (h * p.S_q + q0) * Dp;
          lap.rest();
          ops.gemm(nq, nk16, D, qt, Dp, 1, k_panel, 16, D * 16, st.get(), kBkBwd, false);    // S
          ops.gemm(nq, nk16, D, dot, Dp, 1, v_panel, 16, D * 16, dpt.get(), kBkBwd, false);  // dP
          lap(&AttnProfile::gemm);
          mask_tile(p, st.get(), kBkBwd, q0, nq, j0, nk, nk16, vis == tiles::Vis::partial);
          lap(&AttnProfile::mask);
          ops.bwd_p_ds(st.get(), dpt.get(), nq, nk16, kBkBwd, c, lse2.get() + h * p.S_q + q0,
                       di.get() + h * p.S_q + q0, scale);
          lap(&AttnProfile::softmax);
          // dV += P^T dO, dK += dS^T Q, on explicitly transposed P and dS: the micro-kernel
          // then reads its A operand along rows (reading P down its columns instead was
          // measured ~10 % slower at 64 keys and ~30 % at 128; the transposes cost ~2 %).
          ops.transpose(st.get(), kBkBwd, nq, nk, pt.get(), Bq);
          ops.transpose(dpt.get(), kBkBwd, nq, nk, dst.get(), Bq);
          lap(&AttnProfile::transpose);
          ops.gemm(nk, Dp, nq, pt.get(), Bq, 1, dot, Dp, 16, dva.get(), Dp, true);
          ops.gemm(nk, Dp, nq, dst.get(), Bq, 1, qt, Dp, 16, dka.get(), Dp, true);
          lap(&AttnProfile::gemm);
          // dQ (this tile's share) = dS K, added at this key tile's turn of (h, query tile)
          float* dq_part = dq.take(h * n_qt + qi, qi, ki, nq * Dp);
          lap.rest();
          ops.gemm(nq, Dp, nk16, dpt.get(), kBkBwd, 1, kr.get() + (g * S_k_pad + j0) * Dp, Dp, 16, dq_part, Dp, false);
          lap(&AttnProfile::gemm);
          dq.put();
          lap(&AttnProfile::dq_order);
        }
        if (kExact && block_end && dirty) {  // this part's contribution (a block, fixed_heads heads), as integers
          dirty = false;
          const float big =
              std::max(add_fixed_rows(dka.get(), Dp, nk, D, p.dk_fixed + (j0 * p.H_kv + g) * D, int64_t(p.H_kv) * D),
                       add_fixed_rows(dva.get(), Dp, nk, D, p.dv_fixed + (j0 * p.H_kv + g) * D, int64_t(p.H_kv) * D));
          if (!(big < kFixedTileLimit)) fixed_overflow.store(true, std::memory_order_relaxed);
          lap.rest();  // the conversion counts as rest
        }
      }
      for (int64_t r = 0; r < nk && !kExact; ++r) {
        float* dk = p.dk + ((j0 + r) * p.H_kv + g) * D;
        float* dv = p.dv + ((j0 + r) * p.H_kv + g) * D;
        for (int32_t d = 0; d < D; ++d) {
          dk[d] += dka.get()[r * Dp + d];
          dv[d] += dva.get()[r * Dp + d];
        }
      }
    }
    // Contributions still pending (their turns belong to tasks other threads finish) go in before
    // dQ is read. No deadlock: the lowest task not yet all in has every turn it needs.
    lap.rest();
    dq.flush(true);
    lap(&AttnProfile::dq_order);
#pragma omp barrier
    lap(&AttnProfile::idle);
    cnt.add_to(p.stats);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.S_q * p.H_q; ++t) {
      const int64_t i = t / p.H_q, h = t % p.H_q;
      const float* src = in.dq_acc.get() + (h * p.S_q + i) * Dp;
      float* dst = p.dq + t * D;
      for (int32_t d = 0; d < D; ++d) dst[d] += src[d];
    }
    lap.finish(p.profile);
  }
  if (fixed_overflow.load())
    throw std::invalid_argument("attn_bwd: a dK/dV contribution beyond the exact sums' range (|x| >= " +
                                std::to_string(kFixedTileLimit) + ", or NaN): the exact sums cannot represent it");
}

}  // namespace

void attn_bwd(const AttnParams& p) {
  if (p.dk_fixed || p.dv_fixed) throw std::invalid_argument("attn_bwd: dk_fixed and dv_fixed are attn_bwd_exact's");
  attn_bwd_tiles<false>(p);
}

void attn_bwd_exact(const AttnParams& p) { attn_bwd_tiles<true>(p); }

// The identity of kernels/ops.hpp, per (row, head), in fp32. The weights are formed from the
// difference of the two LSEs only: with t = e^-(|lse_a - lse_b|) (the difference is exact in
// fp32 when the LSEs are within a factor of 2), the larger side weighs 1 / (1 + t) and the other
// t / (1 + t). Going through the rounded merged LSE instead (e^(lse_a - lse)) would add an error
// of one ulp of |lse| to every weight (3e-5 relative at lse ~ 200). Exponentials of raw LSEs are
// never taken, so nothing overflows.
void lse_merge(float* o, float* lse, const float* o_b, const float* lse_b, int64_t rows, int32_t H,
               int32_t D) {
#pragma omp parallel for schedule(static) if (rows * H * D > (1 << 16))
  for (int64_t r = 0; r < rows * H; ++r) {
    const float la = lse[r], lb = lse_b[r];
    if (lb == -INFINITY) continue;  // b saw nothing: (o, lse) unchanged, exactly
    float* oa = o + r * D;
    const float* ob = o_b + r * D;
    if (la == -INFINITY) {  // a saw nothing: take b exactly
      std::memcpy(oa, ob, sizeof(float) * D);
      lse[r] = lb;
      continue;
    }
    const float t = std::exp(-std::abs(la - lb));
    const float w_big = 1.f / (1.f + t), w_small = t * w_big;
    const float wa = la >= lb ? w_big : w_small, wb = la >= lb ? w_small : w_big;
    for (int32_t d = 0; d < D; ++d) oa[d] = wa * oa[d] + wb * ob[d];
    lse[r] = std::max(la, lb) + std::log1p(t);
  }
}

}  // namespace ctxpar::cpu
