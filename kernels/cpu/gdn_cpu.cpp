// Gated DeltaNet, chunked (WY) form on the CPU: see kernels/ops.hpp for the contract and
// kernels/ref/gdn_ref.hpp for the recurrence it computes. Per head and chunk of n tokens (rows i, j
// of the chunk; G the cumulative log decay within the chunk, gamma = exp(G), w_j = exp(G_last - G_j)):
//   prepare (independent of the state):
//     A  = strict_lower(exp(G_i - G_j) b_j k_i.k_j)          (I + A) [Uv | Wk] = [V | diag(gamma) K]
//     Pb = lower(scale exp(G_i - G_j) b_j q_i.k_j)           E = scale diag(gamma) Q - Pb Wk
//     O  = Pb Uv
//   finish (the state S [Dv, Dk] at the chunk's start):
//     O += E S^T     U = Uv - Wk S^T     S <- gamma_last S + (diag(b w) U)^T K
// The backward differentiates exactly these steps, chunk by chunk in reverse, after a forward pass
// that keeps each chunk's starting state. GEMMs go through ctxpar::sgemm (single-threaded inside
// the per-head parallel loop).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/tile_ops.hpp"
#include "ops.hpp"

namespace ctxpar {

namespace {

int gdn_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

void check(const GdnParams& p, bool backward) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("gdn: " + what); };
  if (p.T < 0) bad("T = " + std::to_string(p.T) + " (must be >= 0)");
  if (p.H < 1 || p.Dk < 1 || p.Dv < 1)
    bad("H, Dk, Dv = " + std::to_string(p.H) + ", " + std::to_string(p.Dk) + ", " + std::to_string(p.Dv) +
        " (each must be >= 1)");
  if (p.chunk < 1) bad("chunk = " + std::to_string(p.chunk) + " (must be >= 1)");
  if (p.head_begin < 0 || (p.head_end != 0 && (p.head_end <= p.head_begin || p.head_end > p.H)))
    bad("heads [" + std::to_string(p.head_begin) + ", " + std::to_string(p.head_end) + ") of H = " + std::to_string(p.H) +
        " (0 <= head_begin < head_end <= H; head_end 0 = H)");
  if (p.T > 0 && (!p.q || !p.k || !p.v || !p.g || !p.beta)) bad("q, k, v, g and beta are required");
  if (!backward && p.T > 0 && !p.o) bad("o is required");
  if (backward && p.T > 0 && (!p.dq || !p.dk || !p.dv || !p.dg || !p.dbeta))
    bad("the backward needs dq, dk, dv, dg and dbeta");
}

int head_begin(const GdnParams& p) { return p.head_begin; }
int head_end(const GdnParams& p) { return p.head_end > 0 ? p.head_end : p.H; }

float scale_of(const GdnParams& p) { return p.scale != 0 ? p.scale : 1.0f / std::sqrt(float(p.Dk)); }

// The scratch of one chunk of n rows: views into floats that its owner provides (Chunk::floats).
struct Chunk {
  int64_t t0 = 0;
  int32_t n = 0;
  // [n, n]: D_ij = exp(G_i - G_j) for j <= i (the decay from j to i); Tinv = (I + A)^-1
  float *KK, *QK, *A, *Pb, *D, *Tinv;
  float *Uv, *Wk, *E, *Rk;    // [n, Dv], [n, Dk], [n, Dk], [n, Dk] (diag(gamma) K)
  float *G, *gam, *bw, *w, *b;  // [n]
  float gam_last = 1;
  double* rowd = nullptr;  // [n]: one row of D in double while it is built (the owner's)
  static int64_t floats(const GdnParams& p, int64_t n) { return 6 * n * n + n * (p.Dv + 3 * p.Dk) + 5 * n; }
  // The views of a chunk of up to `rows` rows at x (Chunk::floats(p, rows) of them).
  void place(const GdnParams& p, float* x, int64_t rows) {
    for (float** v : {&KK, &QK, &A, &Pb, &D, &Tinv}) *v = x, x += rows * rows;
    Uv = x, x += rows * p.Dv;
    Wk = x, x += rows * p.Dk;
    E = x, x += rows * p.Dk;
    Rk = x, x += rows * p.Dk;
    for (float** v : {&G, &gam, &bw, &w, &b}) *v = x, x += rows;
  }
};

// One thread's Chunk for chunks of up to `rows` rows, with its own storage (the forward passes).
struct OwnedChunk {
  std::vector<float> buf;
  std::vector<double> rowd;
  Chunk c;
  OwnedChunk(const GdnParams& p, int64_t rows) : buf(size_t(Chunk::floats(p, rows)), 0.0f), rowd(size_t(rows), 0.0) {
    c.place(p, buf.data(), rows);
    c.rowd = rowd.data();
  }
};

// The chunks of a call: each document (a run of equal p.doc ids; the whole sequence without
// p.doc) cut at its borders and at the call's multiples of p.chunk (counted from token 0), so a
// chunk never crosses either; `reset`: the chunk starts a document after the first (or the first,
// with p.reset_at_0), so the state restarts from zero there. Cutting at the multiples rather than
// every p.chunk tokens from a document's start makes the chunks of a call that is cut at a
// multiple of p.chunk those of the whole: the same bits on any such split (exact numerics).
struct Span {
  int64_t t0;
  int n;
  bool reset;
  int64_t ws_off = 0;  // where its state-pass inputs start in a head's workspace (chunk_ws_floats)
};
// What the state pass of a chunk of n rows needs, as kept in the workspace: Uv [n, Dv], Wk and E
// [n, Dk], bw [n], gam_last. Packed by the chunk's own rows, not p.chunk: a call of short
// documents, or a chunk length beyond the call's, costs what its rows need.
int64_t chunk_ws_floats(const GdnParams& p, int64_t n) { return n * (p.Dv + 2 * p.Dk + 1) + 1; }

struct ChunkTable {
  std::vector<Span> spans;
  int64_t ws_per_head = 0;  // the workspace of one head: every chunk's, packed
  int cmax = 1;             // the longest chunk (at most p.chunk): the size of the per-thread scratch
  // Scratch of a backward pass over one head: every chunk's prepared state (Chunk::floats each).
  int64_t prepared_floats = 0;
  // The state at each chunk's start, kept by the backward only where it is not zero (a document's
  // first chunk restarts from zero): the chunk's slot among the kept ones, or -1. At most one per
  // p.chunk rows and the call's first, whatever the documents.
  std::vector<int64_t> state_slot;
  int64_t kept_states = 0;
};
ChunkTable chunk_table(const GdnParams& p) {
  ChunkTable tab;
  std::vector<Span>& v = tab.spans;
  int64_t a = 0;
  while (a < p.T) {
    int64_t b = a + 1;
    if (p.doc)
      while (b < p.T && p.doc[b] == p.doc[a]) ++b;
    else
      b = p.T;
    for (int64_t t = a; t < b;) {
      const int64_t e = std::min(b, (t / p.chunk + 1) * p.chunk);
      v.push_back({t, int(e - t), t == a && (a > 0 || p.reset_at_0)});
      t = e;
    }
    a = b;
  }
  for (Span& sp : v) {
    sp.ws_off = tab.ws_per_head;
    tab.ws_per_head += chunk_ws_floats(p, sp.n);
    tab.cmax = std::max(tab.cmax, sp.n);
    tab.prepared_floats += Chunk::floats(p, sp.n);
    tab.state_slot.push_back(sp.reset ? -1 : tab.kept_states++);
  }
  return tab;
}

// The loops outside the GEMMs, compiled for AVX-512, AVX2 and baseline x86-64 and chosen at load
// time (GCC function multiversioning), so the portable binary vectorizes them at full width.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GDN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GDN_CLONES
#endif

// Tinv = (I + A)^-1 for A strictly lower triangular [n, n], by substitution row by row.
GDN_CLONES void unit_lower_inverse(const float* A, int n, float* Tinv) {
  for (int i = 0; i < n; ++i) {
    float* ri = Tinv + int64_t(i) * n;
    for (int c = 0; c < n; ++c) ri[c] = c == i ? 1.0f : 0.0f;
    for (int j = 0; j < i; ++j) {
      const float a = A[int64_t(i) * n + j];
      const float* rj = Tinv + int64_t(j) * n;
#pragma omp simd
      for (int c = 0; c <= j; ++c) ri[c] -= a * rj[c];
    }
  }
}

// A_ij = D_ij b_j KK_ij (j < i), Pb_ij = sc D_ij b_j QK_ij (j <= i); zero elsewhere.
GDN_CLONES void decay_mats(int n, const float* D, const float* b, const float* KK, const float* QK, float sc, float* A,
                           float* Pb) {
  for (int i = 0; i < n; ++i) {
    const int64_t o = int64_t(i) * n;
#pragma omp simd
    for (int j = 0; j < n; ++j) {
      const float e = D[o + j] * b[j];
      A[o + j] = j < i ? e * KK[o + j] : 0.0f;
      Pb[o + j] = sc * e * QK[o + j];
    }
  }
}

// y[i] = a * x[i] over n (strided source rows copied into contiguous ones).
GDN_CLONES void scale_copy(float* y, const float* x, float a, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = a * x[i];
}

GDN_CLONES void scale_inplace(float* y, float a, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

GDN_CLONES double dot(const float* x, const float* y, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(y[i]);
  return s;
}

// One row i of a decay-weighted product's backward: for j in [0, jn), with t_j = d_j M_j:
// dG_i += sum t, dG_j -= t_j, dbeta_j += d_j e_j R_j (e_j = D_ij, R the raw product), and d_j
// becomes d_j f e_j b_j (the raw product's gradient). jn = i + 1 for Pb, i for A; f = sc or 1.
GDN_CLONES void decay_row_bwd(int jn, float* d, const float* M, const float* e, const float* R, const float* b, float f,
                              double* dGi, double* dG, double* dbeta) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int j = 0; j < jn; ++j) {
    const double t = double(d[j]) * M[j];
    acc += t;
    dG[j] -= t;
    dbeta[j] += double(d[j]) * f * e[j] * R[j];
    d[j] = d[j] * f * e[j] * b[j];
  }
  *dGi += acc;
}

// C = alpha op(A) op(B) + beta C for the chunk-sized products (alpha = +-1, beta = 0 or 1): the
// attention tiles' micro-kernel (cpu/tile_ops.hpp, no packing) where N is a multiple of 16, else
// sgemm. On one AVX-512 core, for 64..128 x 128 products, BLIS ran at 86-147 GFLOP/s and the
// micro-kernel at 181-202 (packing dominates BLIS at these sizes). op(B) = B^T is transposed into
// per-thread scratch first.
void gemm_small(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (N % 16 != 0 || K == 0 || (alpha != 1.0f && alpha != -1.0f) || (beta != 0.0f && beta != 1.0f))
    return sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const cpu::TileOps& to = cpu::tile_ops();
  thread_local std::vector<float> bt, ct;
  const float* Bp = B;
  int64_t b_rs = ldb;
  if (tb) {
    if (bt.size() < size_t(K * N)) bt.resize(size_t(K * N));
    to.transpose(B, ldb, N, K, bt.data(), N);
    Bp = bt.data();
    b_rs = N;
  }
  const int64_t a_rs = ta ? 1 : lda, a_cs = ta ? lda : 1;
  if (alpha == 1.0f) {
    to.gemm(M, N, K, A, a_rs, a_cs, Bp, b_rs, 16, C, ldc, beta != 0.0f);
    return;
  }
  if (ct.size() < size_t(M * N)) ct.resize(size_t(M * N));
  to.gemm(M, N, K, A, a_rs, a_cs, Bp, b_rs, 16, ct.data(), N, false);
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    const float* t = ct.data() + i * N;
    if (beta != 0.0f) {
      for (int64_t j = 0; j < N; ++j) c[j] -= t[j];
    } else {
      for (int64_t j = 0; j < N; ++j) c[j] = -t[j];
    }
  }
}

// Row pointers of head h at token t.
const float* row(const float* x, const GdnParams& p, int64_t t, int h, int D) { return x + (t * p.H + h) * int64_t(D); }
float* row(float* x, const GdnParams& p, int64_t t, int h, int D) { return x + (t * p.H + h) * int64_t(D); }

// The state-independent part of chunk c of head h (see the file comment). With o != nullptr the
// chunk's rows of o receive Pb Uv.
void prepare(const GdnParams& p, int h, const Span& sp, Chunk& w, float* o) {
  const int64_t t0 = sp.t0;
  const int n = sp.n;
  const int Dk = p.Dk, Dv = p.Dv;
  const int64_t ldk = int64_t(p.H) * Dk, ldv = int64_t(p.H) * Dv;
  const float sc = scale_of(p);
  w.t0 = t0;
  w.n = n;
  const float* Q = row(p.q, p, t0, h, Dk);
  const float* K = row(p.k, p, t0, h, Dk);
  const float* V = row(p.v, p, t0, h, Dv);
  double acc = 0;
  for (int i = 0; i < n; ++i) {
    acc += double(p.g[(t0 + i) * p.H + h]);
    w.G[i] = float(acc);
    w.gam[i] = std::exp(w.G[i]);
  }
  w.gam_last = w.gam[n - 1];
  for (int j = 0; j < n; ++j) {
    w.w[j] = std::exp(w.G[n - 1] - w.G[j]);
    w.bw[j] = p.beta[(t0 + j) * p.H + h] * w.w[j];
  }
  for (int j = 0; j < n; ++j) w.b[j] = p.beta[(t0 + j) * p.H + h];
  gemm_small(false, true, n, n, Dk, 1.0f, K, ldk, K, ldk, 0.0f, w.KK, n);
  gemm_small(false, true, n, n, Dk, 1.0f, Q, ldk, K, ldk, 0.0f, w.QK, n);
  // D row by row: D_ij = D_(i-1)j a_i (one exp per token, products in double), which is
  // exp(G_i - G_j) up to the rounding of the products.
  for (int i = 0; i < n; ++i) {
    const double a = std::exp(double(p.g[(t0 + i) * p.H + h]));
    for (int j = 0; j < i; ++j) w.rowd[size_t(j)] *= a;
    w.rowd[size_t(i)] = 1.0;
    for (int j = 0; j <= i; ++j) w.D[i * n + j] = float(w.rowd[size_t(j)]);
    for (int j = i + 1; j < n; ++j) w.D[i * n + j] = 0.0f;
  }
  decay_mats(n, w.D, w.b, w.KK, w.QK, sc, w.A, w.Pb);
  // [Uv | Wk] = (I + A)^-1 [V | diag(gamma) K]: the unit lower-triangular inverse, then GEMMs
  unit_lower_inverse(w.A, n, w.Tinv);
  for (int i = 0; i < n; ++i) {
    scale_copy(w.Rk + int64_t(i) * Dk, K + i * ldk, w.gam[i], Dk);
    scale_copy(w.E + int64_t(i) * Dk, Q + i * ldk, sc * w.gam[i], Dk);
  }
  gemm_small(false, false, n, Dv, n, 1.0f, w.Tinv, n, V, ldv, 0.0f, w.Uv, Dv);
  gemm_small(false, false, n, Dk, n, 1.0f, w.Tinv, n, w.Rk, Dk, 0.0f, w.Wk, Dk);
  gemm_small(false, false, n, Dk, n, -1.0f, w.Pb, n, w.Wk, Dk, 1.0f, w.E, Dk);
  if (o) gemm_small(false, false, n, Dv, n, 1.0f, w.Pb, n, w.Uv, Dv, 0.0f, row(o, p, t0, h, Dv), ldv);
}

// The state pass of one chunk: o (if given) += E S^T; S <- gamma_last S + (diag(bw) (Uv - Wk S^T))^T K.
// S has m rows (Dv for the state; any m for the homogeneous map, where Uv == nullptr stands for
// zero). U is scratch [n, m].
void finish(const GdnParams& p, int h, int64_t t0, int n, const float* Uv, const float* Wk, const float* E,
            const float* bw, float gam_last, float* S, int m, float* U, float* o) {
  const int Dk = p.Dk, Dv = p.Dv;
  const int64_t ldk = int64_t(p.H) * Dk, ldv = int64_t(p.H) * Dv;
  if (o) gemm_small(false, true, n, Dv, Dk, 1.0f, E, Dk, S, Dk, 1.0f, row(o, p, t0, h, Dv), ldv);
  if (Uv) std::memcpy(U, Uv, sizeof(float) * n * m);
  gemm_small(false, true, n, m, Dk, -1.0f, Wk, Dk, S, Dk, Uv ? 1.0f : 0.0f, U, m);
  for (int i = 0; i < n; ++i) scale_inplace(U + int64_t(i) * m, bw[i], m);
  scale_inplace(S, gam_last, int64_t(m) * Dk);
  gemm_small(true, false, m, Dk, n, 1.0f, U, m, row(p.k, p, t0, h, Dk), ldk, 1.0f, S, Dk);
}

void load_state(const GdnParams& p, int h, const float* s, float* S) {
  const int64_t SS = int64_t(p.Dv) * p.Dk;
  if (s)
    std::memcpy(S, s + h * SS, sizeof(float) * SS);
  else
    std::fill(S, S + SS, 0.0f);
}

}  // namespace

namespace {
// The backward's per-thread scratch beside the prepared chunks and the kept states: S, dS, dS0 and
// the zero state; the [C, Dv|Dk] and [C, C] products; dG, dgam, dbeta and D's row in double;
// gemm_small's transposed operand and result.
int64_t bwd_fixed_floats(int64_t C, int64_t Dk, int64_t Dv) {
  return 4 * Dk * Dv + C * (5 * Dv + 5 * Dk) + 3 * C * C + 8 * C + 2 * C * std::max({C, Dk, Dv});
}
// A forward's: one chunk (Chunk::floats) and D's row in double, S and U, gemm_small's scratch.
int64_t fwd_floats(const GdnParams& p, int64_t C) {
  return Chunk::floats(p, C) + 2 * C + int64_t(p.Dk) * p.Dv + C * p.Dv + 2 * C * std::max<int64_t>({C, p.Dk, p.Dv});
}
}  // namespace

int64_t gdn_thread_scratch_floats(const GdnParams& p, bool backward) {
  if (p.T < 0 || p.chunk < 1 || p.Dk < 1 || p.Dv < 1)
    throw std::invalid_argument("gdn_thread_scratch_floats: T >= 0, chunk, Dk and Dv >= 1");
  const ChunkTable tab = chunk_table(p);
  if (!backward) return fwd_floats(p, tab.cmax);
  return tab.prepared_floats + tab.kept_states * int64_t(p.Dk) * p.Dv + bwd_fixed_floats(tab.cmax, p.Dk, p.Dv);
}

int64_t gdn_thread_scratch_bound(int64_t T, int32_t Dk, int32_t Dv, int32_t chunk, bool backward) {
  // No chunk is longer than c, so the sum of n_c^2 over the chunks is at most c T; a kept state
  // starts at row 0 or at a multiple of chunk: at most ceil(T / chunk) of them.
  const int64_t c = std::max<int64_t>(1, std::min<int64_t>(chunk, T)), kept = (T + chunk - 1) / chunk;
  GdnParams shape;
  shape.Dk = Dk, shape.Dv = Dv;
  if (!backward) return fwd_floats(shape, c);
  return T * (6 * c + Dv + 3 * int64_t(Dk) + 5) + kept * int64_t(Dk) * Dv + bwd_fixed_floats(c, Dk, Dv);
}

int64_t gdn_workspace_floats(const GdnParams& p) {
  check(p, false);
  return int64_t(p.H) * chunk_table(p).ws_per_head;
}

void gdn_fwd_prepare(const GdnParams& p, float* ws) {
  check(p, false);
  const ChunkTable tab = chunk_table(p);
  const std::vector<Span>& spans = tab.spans;
  const int64_t nc = int64_t(spans.size());
  const int h0 = head_begin(p);
  const int64_t jobs = int64_t(head_end(p) - h0) * nc;
#pragma omp parallel num_threads(gdn_threads())
  {
    OwnedChunk own(p, tab.cmax);
    Chunk& w = own.c;
#pragma omp for schedule(static)
    for (int64_t job = 0; job < jobs; ++job) {
      const int h = h0 + int(job / nc);
      const Span& sp = spans[size_t(job % nc)];
      prepare(p, h, sp, w, p.o);
      float* x = ws + h * tab.ws_per_head + sp.ws_off;
      const int64_t n = w.n;
      std::memcpy(x, w.Uv, sizeof(float) * n * p.Dv);
      std::memcpy(x + n * p.Dv, w.Wk, sizeof(float) * n * p.Dk);
      std::memcpy(x + n * (p.Dv + p.Dk), w.E, sizeof(float) * n * p.Dk);
      std::memcpy(x + n * (p.Dv + 2 * p.Dk), w.bw, sizeof(float) * n);
      x[chunk_ws_floats(p, n) - 1] = w.gam_last;
    }
  }
}

void gdn_fwd_finish(const GdnParams& p, const float* ws) {
  check(p, false);
  const ChunkTable tab = chunk_table(p);
  const int64_t SS = int64_t(p.Dv) * p.Dk;
#pragma omp parallel num_threads(gdn_threads())
  {
    std::vector<float> S(SS), U(int64_t(tab.cmax) * p.Dv);
#pragma omp for schedule(static)
    for (int h = head_begin(p); h < head_end(p); ++h) {
      load_state(p, h, p.s0, S.data());
      for (const Span& sp : tab.spans) {
        const float* x = ws + h * tab.ws_per_head + sp.ws_off;
        const int64_t n = sp.n;
        if (sp.reset) std::fill(S.begin(), S.end(), 0.0f);
        finish(p, h, sp.t0, sp.n, x, x + n * p.Dv, x + n * (p.Dv + p.Dk), x + n * (p.Dv + 2 * p.Dk),
               x[chunk_ws_floats(p, n) - 1], S.data(), p.Dv, U.data(), p.o);
      }
      if (p.s_out) std::memcpy(p.s_out + h * SS, S.data(), sizeof(float) * SS);
    }
  }
}

void gdn_state_apply(const GdnParams& p, const float* ws, float* X, int32_t m, bool add_to_o) {
  check(p, false);
  if (m < 1 || (add_to_o && m != p.Dv))
    throw std::invalid_argument("gdn_state_apply: m = " + std::to_string(m) + " (>= 1, and = Dv = " +
                                std::to_string(p.Dv) + " when adding to o)");
  const ChunkTable tab = chunk_table(p);
#pragma omp parallel num_threads(gdn_threads())
  {
    std::vector<float> U(int64_t(tab.cmax) * m);
#pragma omp for schedule(static)
    for (int h = head_begin(p); h < head_end(p); ++h) {
      float* Xh = X + int64_t(h) * m * p.Dk;
      for (const Span& sp : tab.spans) {
        const float* x = ws + h * tab.ws_per_head + sp.ws_off;
        const int64_t n = sp.n;
        if (sp.reset) {  // the start state reaches no further than the first document
          std::fill(Xh, Xh + int64_t(m) * p.Dk, 0.0f);
          break;
        }
        finish(p, h, sp.t0, sp.n, nullptr, x + n * p.Dv, x + n * (p.Dv + p.Dk), x + n * (p.Dv + 2 * p.Dk),
               x[chunk_ws_floats(p, n) - 1], Xh, m, U.data(), add_to_o ? p.o : nullptr);
      }
    }
  }
}

void gdn_fwd(const GdnParams& p) {
  check(p, false);
  const ChunkTable tab = chunk_table(p);
  const int64_t SS = int64_t(p.Dv) * p.Dk;
#pragma omp parallel num_threads(gdn_threads())
  {
    OwnedChunk own(p, tab.cmax);
    Chunk& w = own.c;
    std::vector<float> S(SS), U(int64_t(tab.cmax) * p.Dv);
#pragma omp for schedule(static)
    for (int h = head_begin(p); h < head_end(p); ++h) {
      load_state(p, h, p.s0, S.data());
      for (const Span& sp : tab.spans) {
        if (sp.reset) std::fill(S.begin(), S.end(), 0.0f);
        prepare(p, h, sp, w, p.o);
        finish(p, h, w.t0, w.n, w.Uv, w.Wk, w.E, w.bw, w.gam_last, S.data(), p.Dv, U.data(), p.o);
      }
      if (p.s_out) std::memcpy(p.s_out + h * SS, S.data(), sizeof(float) * SS);
    }
  }
}

void gdn_bwd(const GdnParams& p) {
  check(p, true);
  const ChunkTable tab = chunk_table(p);
  const std::vector<Span>& spans = tab.spans;
  const int64_t nc = int64_t(spans.size()), SS = int64_t(p.Dv) * p.Dk;
  const int Dk = p.Dk, Dv = p.Dv;
  const int64_t C = tab.cmax, ldk = int64_t(p.H) * Dk, ldv = int64_t(p.H) * Dv;
  const float sc = scale_of(p);
#pragma omp parallel num_threads(gdn_threads())
  {
    // One head at a time per thread: every chunk's prepared state kept from the forward pass,
    // packed by its own rows (tab.prepared_floats). Kept per thread across calls (grow-only): a
    // training step calls the backward once per GDN layer, and fresh pages cost more than the
    // chunks' work at long T.
    thread_local std::vector<float> prepared, states;
    thread_local std::vector<double> rowd;
    if (int64_t(prepared.size()) < tab.prepared_floats) prepared.resize(size_t(tab.prepared_floats));
    if (int64_t(rowd.size()) < C) rowd.resize(size_t(C));
    std::vector<Chunk> chunks(static_cast<size_t>(nc));
    for (int64_t c = 0, off = 0; c < nc; off += Chunk::floats(p, spans[size_t(c)].n), ++c) {
      chunks[size_t(c)].place(p, prepared.data() + off, spans[size_t(c)].n);
      chunks[size_t(c)].rowd = rowd.data();
    }
    const std::vector<int64_t>& slot = tab.state_slot;
    if (int64_t(states.size()) < tab.kept_states * SS) states.resize(size_t(tab.kept_states * SS));
    const std::vector<float> zero_state(size_t(SS), 0.0f);
    std::vector<float> S(SS), U(C * Dv), dS(SS), dS0(SS);
    std::vector<float> Ub(C * Dv), dUb(C * Dv), dU(C * Dv), dWk(C * Dk), dE(C * Dk), dPb(C * C), dA(C * C),
        dKK(C * C), dQl(C * Dk), dKl(C * Dk), dRv(C * Dv), dRk(C * Dk);
    std::vector<double> dG(C), dgam(C), dbeta(C);
#pragma omp for schedule(static)
    for (int h = head_begin(p); h < head_end(p); ++h) {
      // Forward: every chunk prepared, and the state at its start.
      load_state(p, h, p.s0, S.data());
      for (int64_t c = 0; c < nc; ++c) {
        if (spans[size_t(c)].reset) std::fill(S.begin(), S.end(), 0.0f);
        if (slot[size_t(c)] >= 0) std::memcpy(states.data() + slot[size_t(c)] * SS, S.data(), sizeof(float) * SS);
        Chunk& w = chunks[size_t(c)];
        prepare(p, h, spans[size_t(c)], w, nullptr);
        finish(p, h, w.t0, w.n, w.Uv, w.Wk, w.E, w.bw, w.gam_last, S.data(), p.Dv, U.data(), nullptr);
      }
      load_state(p, h, p.ds_out, dS.data());
      for (int64_t c = nc - 1; c >= 0; --c) {
        const Chunk& w = chunks[size_t(c)];
        const int n = w.n;
        const int64_t t0 = w.t0;
        const float* S0 = slot[size_t(c)] >= 0 ? states.data() + slot[size_t(c)] * SS : zero_state.data();
        const float* Q = row(p.q, p, t0, h, Dk);
        const float* K = row(p.k, p, t0, h, Dk);
        const float* dO = p.d_o ? row(p.d_o, p, t0, h, Dv) : nullptr;
        std::fill(dG.begin(), dG.end(), 0.0);
        std::fill(dgam.begin(), dgam.end(), 0.0);
        std::fill(dbeta.begin(), dbeta.end(), 0.0);
        // U = Uv - Wk S0^T, Ub = diag(bw) U
        std::memcpy(U.data(), w.Uv, sizeof(float) * n * Dv);
        gemm_small(false, true, n, Dv, Dk, -1.0f, w.Wk, Dk, S0, Dk, 1.0f, U.data(), Dv);
        for (int i = 0; i < n; ++i) scale_copy(Ub.data() + int64_t(i) * Dv, U.data() + int64_t(i) * Dv, w.bw[i], Dv);
        // (state update) S' = gam_last S0 + Ub^T K
        gemm_small(false, true, n, Dv, Dk, 1.0f, K, ldk, dS.data(), Dk, 0.0f, dUb.data(), Dv);
        gemm_small(false, false, n, Dk, Dv, 1.0f, Ub.data(), Dv, dS.data(), Dk, 0.0f, dKl.data(), Dk);
        const double dgam_last = dot(dS.data(), S0, SS);
        scale_copy(dS0.data(), dS.data(), w.gam_last, SS);
        for (int j = 0; j < n; ++j) {
          const double x = dot(U.data() + int64_t(j) * Dv, dUb.data() + int64_t(j) * Dv, Dv);
          dbeta[j] += w.w[j] * x;
          dG[n - 1] += w.bw[j] * x;
          dG[j] -= w.bw[j] * x;
          scale_copy(dU.data() + int64_t(j) * Dv, dUb.data() + int64_t(j) * Dv, w.bw[j], Dv);
        }
        // (U = Uv - Wk S0^T): dUv = dU (kept in dU), dWk = -dU S0, dS0 -= dU^T Wk
        gemm_small(false, false, n, Dk, Dv, -1.0f, dU.data(), Dv, S0, Dk, 0.0f, dWk.data(), Dk);
        gemm_small(true, false, Dv, Dk, n, -1.0f, dU.data(), Dv, w.Wk, Dk, 1.0f, dS0.data(), Dk);
        // (O = Pb Uv + E S0^T); d_o == nullptr: o's gradient is zero (a schedule's correction pass)
        if (dO) {
          gemm_small(false, true, n, n, Dv, 1.0f, dO, ldv, w.Uv, Dv, 0.0f, dPb.data(), n);
          gemm_small(true, false, n, Dv, n, 1.0f, w.Pb, n, dO, ldv, 1.0f, dU.data(), Dv);
          gemm_small(false, false, n, Dk, Dv, 1.0f, dO, ldv, S0, Dk, 0.0f, dE.data(), Dk);
          gemm_small(true, false, Dv, Dk, n, 1.0f, dO, ldv, w.E, Dk, 1.0f, dS0.data(), Dk);
          // (E = sc diag(gam) Q - Pb Wk)
          for (int i = 0; i < n; ++i) {
            dgam[i] += sc * dot(Q + i * ldk, dE.data() + int64_t(i) * Dk, Dk);
            scale_copy(dQl.data() + int64_t(i) * Dk, dE.data() + int64_t(i) * Dk, sc * w.gam[i], Dk);
          }
          gemm_small(false, true, n, n, Dk, -1.0f, dE.data(), Dk, w.Wk, Dk, 1.0f, dPb.data(), n);
          gemm_small(true, false, n, Dk, n, -1.0f, w.Pb, n, dE.data(), Dk, 1.0f, dWk.data(), Dk);
          // (Pb_ij = sc e_ij b_j QK_ij, j <= i): dQK overwrites dPb
          for (int i = 0; i < n; ++i) {
            float* d = dPb.data() + int64_t(i) * n;
            decay_row_bwd(i + 1, d, w.Pb + int64_t(i) * n, w.D + int64_t(i) * n, w.QK + int64_t(i) * n, w.b, sc,
                          &dG[i], dG.data(), dbeta.data());
            std::fill(d + i + 1, d + n, 0.0f);
          }
          gemm_small(false, false, n, Dk, n, 1.0f, dPb.data(), n, K, ldk, 1.0f, dQl.data(), Dk);
          gemm_small(true, false, n, Dk, n, 1.0f, dPb.data(), n, Q, ldk, 1.0f, dKl.data(), Dk);
        } else {
          std::fill(dQl.begin(), dQl.end(), 0.0f);
        }
        // ([Uv | Wk] = Tinv [V | diag(gam) K]): the right-hand side's gradient Tinv^T [dUv | dWk]
        gemm_small(true, false, n, Dv, n, 1.0f, w.Tinv, n, dU.data(), Dv, 0.0f, dRv.data(), Dv);
        gemm_small(true, false, n, Dk, n, 1.0f, w.Tinv, n, dWk.data(), Dk, 0.0f, dRk.data(), Dk);
        // dA = -(dRhs X^T) (its strict lower part is used)
        gemm_small(false, true, n, n, Dv, -1.0f, dRv.data(), Dv, w.Uv, Dv, 0.0f, dA.data(), n);
        gemm_small(false, true, n, n, Dk, -1.0f, dRk.data(), Dk, w.Wk, Dk, 1.0f, dA.data(), n);
        for (int i = 0; i < n; ++i) {
          std::memcpy(row(p.dv, p, t0 + i, h, Dv), dRv.data() + int64_t(i) * Dv, sizeof(float) * Dv);
          dgam[i] += dot(K + i * ldk, dRk.data() + int64_t(i) * Dk, Dk);
          scale_inplace(dRk.data() + int64_t(i) * Dk, w.gam[i], Dk);
        }
        // (A_ij = e_ij b_j KK_ij, j < i): dKK, symmetric use of K
        for (int i = 0; i < n; ++i) {
          float* d = dKK.data() + int64_t(i) * n;
          std::memcpy(d, dA.data() + int64_t(i) * n, sizeof(float) * size_t(i));
          decay_row_bwd(i, d, w.A + int64_t(i) * n, w.D + int64_t(i) * n, w.KK + int64_t(i) * n, w.b, 1.0f, &dG[i],
                        dG.data(), dbeta.data());
          std::fill(d + i, d + n, 0.0f);
        }
        gemm_small(false, false, n, Dk, n, 1.0f, dKK.data(), n, K, ldk, 1.0f, dKl.data(), Dk);
        gemm_small(true, false, n, Dk, n, 1.0f, dKK.data(), n, K, ldk, 1.0f, dKl.data(), Dk);
        // gamma = exp(G); G = cumsum(g) within the chunk
        for (int i = 0; i < n; ++i) dG[i] += w.gam[i] * dgam[i];
        dG[n - 1] += w.gam_last * dgam_last;
        double run = 0;
        for (int i = n - 1; i >= 0; --i) {
          run += dG[i];
          p.dg[(t0 + i) * p.H + h] = float(run);
          p.dbeta[(t0 + i) * p.H + h] = float(dbeta[i]);
          std::memcpy(row(p.dq, p, t0 + i, h, Dk), dQl.data() + int64_t(i) * Dk, sizeof(float) * Dk);
          float* dk_row = row(p.dk, p, t0 + i, h, Dk);
          const float* a1 = dKl.data() + int64_t(i) * Dk;
          const float* a2 = dRk.data() + int64_t(i) * Dk;
          for (int e = 0; e < Dk; ++e) dk_row[e] = a1[e] + a2[e];
        }
        std::swap(dS, dS0);
        if (spans[size_t(c)].reset) std::fill(dS.begin(), dS.end(), 0.0f);  // the state before a reset is unused
      }
      if (p.ds0) std::memcpy(p.ds0 + h * SS, dS.data(), sizeof(float) * SS);
    }
  }
}

}  // namespace ctxpar
