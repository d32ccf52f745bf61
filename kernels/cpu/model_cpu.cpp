// Fast CPU path of the model ops (kernels/ops.hpp, "model ops (training)"): rows split over
// OpenMP threads, inner loops over the row written for the compiler's vectorizer (omp simd).
// Weight gradients (RMSNorm dw) are summed per thread and then added in thread order, so the
// result depends on the thread count but not on scheduling (runs are reproducible).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/ops_cpu.hpp"
#include "cpu/tile_ops.hpp"
#include "ops.hpp"

namespace ctxpar {

namespace {
// Inside a caller's parallel region the ops run on the calling thread only.
int op_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }
}  // namespace

void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) num_threads(op_threads())
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    const float rs = 1.0f / std::sqrt(ss / float(dim) + eps);
    rstd[r] = rs;
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * rs * w[j];
  }
}

namespace {
// One row of the RMSNorm backward: dx += rstd (dy w - xh mean(dy w xh)), and the row's dw terms
// dy xh added to (kAdd) or written into dw_row.
template <bool kAdd>
inline void rmsnorm_bwd_row(const float* dyr, const float* xr, const float* w, float rs, float* dxr, float* dw_row,
                            int64_t dim) {
  float dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < dim; ++j) dot += dyr[j] * w[j] * xr[j];
  dot *= rs;
  const float c = dot / float(dim);
#pragma omp simd
  for (int64_t j = 0; j < dim; ++j) {
    const float xh = xr[j] * rs;
    dxr[j] += rs * (dyr[j] * w[j] - xh * c);
    if constexpr (kAdd) dw_row[j] += dyr[j] * xh;
    else dw_row[j] = dyr[j] * xh;
  }
}
}  // namespace

void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                 int64_t rows, int64_t dim) {
  const int nt = int(std::min<int64_t>(op_threads(), std::max<int64_t>(rows, 1)));
  std::vector<float> part(size_t(nt) * size_t(dim), 0.0f);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    float* dwt = part.data() + size_t(t) * size_t(dim);
    // Static contiguous row blocks: thread t always gets the same rows.
    const int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
    for (int64_t r = r0; r < r1; ++r)
      rmsnorm_bwd_row<true>(dy + r * dim, x + r * dim, w, rstd[r], dx + r * dim, dwt, dim);
  }
  for (int t = 0; t < nt; ++t) {
    const float* dwt = part.data() + size_t(t) * size_t(dim);
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) dw[j] += dwt[j];
  }
}

void rope_inv_freq(int32_t D, double theta, double factor, double low_freq_factor, double high_freq_factor,
                   double original_max_pos, double* inv_freq) {
  const double kPi = 3.14159265358979323846;
  const double low_wavelen = original_max_pos / low_freq_factor;    // longer: fully scaled
  const double high_wavelen = original_max_pos / high_freq_factor;  // shorter: unchanged
  for (int32_t i = 0; i < D / 2; ++i) {
    const double f = std::pow(theta, -2.0 * double(i) / double(D));
    const double wavelen = 2 * kPi / f;
    double out = f;
    if (wavelen > low_wavelen) {
      out = f / factor;
    } else if (wavelen >= high_wavelen && high_freq_factor != low_freq_factor) {
      const double smooth = (original_max_pos / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      out = (1 - smooth) * f / factor + smooth * f;
    }
    inv_freq[i] = out;
  }
}

void rope_table(const int64_t* pos, int64_t rows, int32_t D, const double* inv_freq, float* cos_t, float* sin_t) {
  const int32_t half = D / 2;
#pragma omp parallel for schedule(static) num_threads(op_threads())
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t i = 0; i < half; ++i) {
      const double a = double(pos[r]) * inv_freq[i];
      cos_t[r * half + i] = float(std::cos(a));
      sin_t[r * half + i] = float(std::sin(a));
    }
}

void rope_apply(float* x, int64_t rows, int32_t H, int32_t D, const float* cos_t, const float* sin_t, bool inverse) {
  const int32_t half = D / 2;
  const float sgn = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) num_threads(op_threads())
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos_t + r * half;
    const float* s = sin_t + r * half;
    for (int32_t h = 0; h < H; ++h) {
      float* a = x + (r * H + h) * D;
      float* b = a + half;
#pragma omp simd
      for (int32_t i = 0; i < half; ++i) {
        const float ai = a[i], bi = b[i], si = sgn * s[i];
        a[i] = ai * c[i] - bi * si;
        b[i] = ai * si + bi * c[i];
      }
    }
  }
}

void swiglu_fwd(const float* g, const float* u, float* h, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(op_threads())
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i]));
    h[i] = g[i] * s * u[i];
  }
}

void swiglu_bwd(const float* dh, const float* g, const float* u, float* dg, float* du, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(op_threads())
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i]));
    const float gi = g[i], d = dh[i];
    dg[i] = d * u[i] * (s * (1.0f + gi * (1.0f - s)));
    du[i] = d * gi * s;
  }
}

double cross_entropy_fwd_bwd(const float* logits, const int32_t* labels, int64_t rows, int64_t V,
                             float grad_scale, float* dlogits) {
  double loss = 0;
#pragma omp parallel for schedule(static) reduction(+ : loss) num_threads(op_threads())
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * V;
    float* dz = dlogits + r * V;
    const int32_t y = labels[r];
    if (y < 0) {
      std::fill(dz, dz + V, 0.0f);
      continue;
    }
    float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < V; ++j) m = std::max(m, z[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - m);
    const float lse = m + std::log(sum);
    const float zy = z[y];  // read before dz (may alias z) is written
    loss += double(lse) - double(zy);
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) dz[j] = grad_scale * std::exp(z[j] - lse);
    dz[y] -= grad_scale;
  }
  return loss;
}

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& hp) {
  const float b1 = float(hp.beta1), b2 = float(hp.beta2);
  const float bc1 = float(1 - std::pow(hp.beta1, double(hp.step)));
  const float bc2_sqrt = std::sqrt(float(1 - std::pow(hp.beta2, double(hp.step))));
  const float decay = 1.0f - float(hp.lr) * float(hp.weight_decay);
  const float step_size = float(hp.lr) / bc1;
  const float eps = float(hp.eps), gs = float(hp.grad_scale);
#pragma omp parallel for simd schedule(static) num_threads(op_threads())
  for (int64_t i = 0; i < n; ++i) {
    const float gi = gs * g[i];
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * m[i] / denom;
  }
}

double sum_squares(const float* x, int64_t n) {
  // Fixed blocks whose partial sums are added in block order: any thread count, the same bits.
  constexpr int64_t kBlock = 4096;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  std::vector<double> part(size_t(std::max<int64_t>(nb, 0)));
#pragma omp parallel for schedule(static) num_threads(op_threads())
  for (int64_t b = 0; b < nb; ++b) {
    double s = 0;
    const int64_t i1 = std::min(n, (b + 1) * kBlock);
#pragma omp simd reduction(+ : s)
    for (int64_t i = b * kBlock; i < i1; ++i) s += double(x[i]) * double(x[i]);
    part[size_t(b)] = s;
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

void embedding_fwd(const float* emb, const int32_t* tokens, int64_t rows, int64_t dim, float* x) {
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(x + i * dim, emb + int64_t(tokens[i]) * dim, size_t(dim) * sizeof(float));
}

void embedding_bwd(const float* dx, const int32_t* tokens, int64_t rows, int64_t dim, float* demb) {
  // Serial over rows: a token may repeat, and the order of additions stays fixed.
  for (int64_t i = 0; i < rows; ++i) {
    float* g = demb + int64_t(tokens[i]) * dim;
    const float* d = dx + i * dim;
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) g[j] += d[j];
  }
}

// ---- exact sums (ops.hpp: kExactHi, kExactLo) ----
namespace {
constexpr double kHiUnit = 0x1p24, kHiStep = 0x1p-24, kLoUnit = 0x1p64, kRangeLimit = 0x1p38;
static_assert(kExactHi == 24 && kExactLo == 64 && kExactRange == 38, "the constants below");
// The split of x (ops.hpp); out of range or non-finite: false, and 0 added. Every step is exact
// but lo's truncation: hd 2^-kExactHi is x cut to the hi grid, so r is x's remaining low bits.
inline bool split_exact(double x, int64_t& h, int64_t& l) {
  const bool ok = std::abs(x) < kRangeLimit;  // false for NaN
  const double xs = ok ? x : 0.0;
  const double hd = std::trunc(xs * kHiUnit);
  h = int64_t(hd);
  l = int64_t((xs - hd * kHiStep) * kLoUnit);
  return ok;
}
}  // namespace

namespace {
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
int64_t exact_add_rows(const float* x, int64_t rows, int64_t cols, int64_t ldx, int64_t* hi, int64_t* lo, int64_t ld) {
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = x + r * ldx;
    int64_t* h = hi + r * ld;
    int64_t* l = lo + r * ld;
    for (int64_t j = 0; j < cols; ++j) {
      int64_t dh, dl;
      bad += split_exact(double(a[j]), dh, dl) ? 0 : 1;
      h[j] += dh;
      l[j] += dl;
    }
  }
  return bad;
}
}  // namespace

int64_t exact_add(const float* x, int64_t rows, int64_t cols, int64_t ldx, int64_t* hi, int64_t* lo, int64_t ld) {
  // rows over the threads: each element's integers are its own, so any split gives the same sums
  const int nt = int(std::min<int64_t>(op_threads(), std::max<int64_t>(rows, 1)));
  if (nt == 1) return exact_add_rows(x, rows, cols, ldx, hi, lo, ld);
  int64_t bad = 0;
#pragma omp parallel num_threads(nt) reduction(+ : bad)
  {
    const int t = omp_get_thread_num();
    const int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
    bad += exact_add_rows(x + r0 * ldx, r1 - r0, cols, ldx, hi + r0 * ld, lo + r0 * ld, ld);
  }
  return bad;
}

int64_t exact_add(double x, int64_t* hi, int64_t* lo) {
  int64_t dh, dl;
  const bool ok = split_exact(x, dh, dl);
  *hi += dh;
  *lo += dl;
  return ok ? 0 : 1;
}

double exact_value(int64_t hi, int64_t lo) {
  // carry lo's multiples of 2^(kExactLo - kExactHi) into hi (floor: lo ends in [0, 2^40))
  constexpr int kShift = kExactLo - kExactHi;
  const int64_t carry = lo >> kShift;
  const int64_t h = hi + carry, l = lo - carry * (int64_t(1) << kShift);
  return double(h) * kHiStep + double(l) * (1.0 / kLoUnit);
}

void exact_to_float(const int64_t* hi, const int64_t* lo, float* x, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(op_threads())
  for (int64_t i = 0; i < n; ++i) x[i] = float(exact_value(hi[i], lo[i]));
}

int64_t gemm_tn_exact(int64_t M, int64_t N, int64_t K, int64_t G, const float* A, int64_t lda, const float* B,
                      int64_t ldb, int64_t* hi, int64_t* lo, int64_t ld) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  if (G >= kExactLibraryBlock) {  // long blocks: the library's whole product per block (faster there)
    const std::unique_ptr<float[]> prod(new float[size_t(M * N)]);  // written whole by each sgemm
    int64_t bad = 0;
    for (int64_t k0 = 0; k0 < K; k0 += G) {
      sgemm(true, false, M, N, G, 1.0f, A + k0 * lda, lda, B + k0 * ldb, ldb, 0.0f, prod.get(), N);
      bad += exact_add(prod.get(), M, N, N, hi, lo, ld);
    }
    return bad;
  }
  // Shorter blocks: tiles of C of kMC x kNC (their fp32 block product, and their integers, stay in
  // L2), over the threads; per block, the tile kernel on the columns of whole 16-wide panels and a
  // multiply-add chain on the rest, then the tile's exact add (kernels/README.md "Exact weight
  // gradients": BLIS per 96-row block is no faster, and writes the whole product each time).
  constexpr int64_t kMC = 192, kNC = 256;
  const cpu::TileOps& ops = cpu::tile_ops();
  const int64_t N16 = N / 16 * 16, tm = (M + kMC - 1) / kMC, tn = (N + kNC - 1) / kNC;
  int64_t bad = 0;
#pragma omp parallel num_threads(int(std::min<int64_t>(op_threads(), tm * tn))) reduction(+ : bad)
  {
    std::vector<float> tile(size_t(kMC * kNC));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tm * tn; ++t) {
      const int64_t i0 = t / tn * kMC, j0 = t % tn * kNC;
      const int64_t mc = std::min(kMC, M - i0), nc = std::min(kNC, N - j0);
      const int64_t nc16 = std::clamp<int64_t>(N16 - j0, 0, nc);  // columns of whole panels
      for (int64_t k0 = 0; k0 < K; k0 += G) {
        const float* a = A + k0 * lda + i0;
        const float* b = B + k0 * ldb + j0;
        if (nc16 > 0) ops.gemm(mc, nc16, G, a, 1, lda, b, ldb, 16, tile.data(), nc, false);
        for (int64_t i = 0; i < mc; ++i)
          for (int64_t j = nc16; j < nc; ++j) {
            float acc = 0.f;
            for (int64_t k = 0; k < G; ++k) acc = std::fma(a[k * lda + i], b[k * ldb + j], acc);
            tile[size_t(i * nc + j)] = acc;
          }
        bad += exact_add_rows(tile.data(), mc, nc, nc, hi + i0 * ld + j0, lo + i0 * ld + j0, ld);
      }
    }
  }
  return bad;
}

int64_t rmsnorm_bwd_exact(const float* dy, const float* x, const float* w, const float* rstd, float* dx, int64_t* dw_hi,
                          int64_t* dw_lo, int64_t rows, int64_t dim) {
  const int nt = int(std::min<int64_t>(op_threads(), std::max<int64_t>(rows, 1)));
  // per thread: its rows' dw as integers (added below in any order: integers), and one row's products
  std::vector<int64_t> part(size_t(nt) * size_t(2 * dim), 0);
  std::vector<float> prod(size_t(nt) * size_t(dim));
  int64_t bad = 0;
#pragma omp parallel num_threads(nt) reduction(+ : bad)
  {
    const int t = omp_get_thread_num();
    int64_t* ph = part.data() + size_t(t) * size_t(2 * dim);
    float* pr = prod.data() + size_t(t) * size_t(dim);
    const int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
    for (int64_t r = r0; r < r1; ++r) {
      rmsnorm_bwd_row<false>(dy + r * dim, x + r * dim, w, rstd[r], dx + r * dim, pr, dim);
      bad += exact_add(pr, 1, dim, dim, ph, ph + dim, dim);
    }
  }
  for (int t = 0; t < nt; ++t) {
    const int64_t* ph = part.data() + size_t(t) * size_t(2 * dim);
    for (int64_t j = 0; j < dim; ++j) {
      dw_hi[j] += ph[j];
      dw_lo[j] += ph[dim + j];
    }
  }
  return bad;
}

int64_t embedding_bwd_exact(const float* dx, const int32_t* tokens, int64_t rows, int64_t dim, int64_t* hi, int64_t* lo) {
  int64_t bad = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t row = int64_t(tokens[i]) * dim;
    bad += exact_add(dx + i * dim, 1, dim, dim, hi + row, lo + row, dim);
  }
  return bad;
}

// ---- exact attention (ops.hpp attn_exact_*) ----
namespace {
void check_exact_attn(const AttnParams& p) {
  if (!(p.device == Device::cpu && p.dtype == DType::f32 && p.H_kv > 0 && p.H_q % p.H_kv == 0 &&
        (p.mask == MaskKind::none || (p.q_pos && p.k_pos))))
    throw std::invalid_argument("attn_exact: CPU fp32 calls, H_kv dividing H_q (" + std::to_string(p.H_q) + " / " +
                                std::to_string(p.H_kv) + "), and positions for the mask");
}
// t = c (q . k): sixteen lanes (d mod 16) added in a fixed tree, so the same bits for a pair in
// every call.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
float exact_score(const float* q, const float* k, int32_t D, float c) {
  float lane[16] = {};
  int32_t d = 0;
  for (; d + 16 <= D; d += 16)
    for (int l = 0; l < 16; ++l) lane[l] += q[d + l] * k[d + l];
  for (int l = 0; d < D; ++d, ++l) lane[l] += q[d] * k[d];
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  return c * lane[0];
}
// hi/lo[d] += w v[d] for d < D (each product exact in double), and hi/lo[D] += w.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
int64_t exact_add_weighted(float w, const float* v, int32_t D, int64_t* hi, int64_t* lo) {
  int64_t bad = 0;
  for (int32_t d = 0; d < D; ++d) {
    int64_t dh, dl;
    bad += split_exact(double(w) * double(v[d]), dh, dl) ? 0 : 1;
    hi[d] += dh;
    lo[d] += dl;
  }
  int64_t dh, dl;
  bad += split_exact(double(w), dh, dl) ? 0 : 1;
  hi[D] += dh;
  lo[D] += dl;
  return bad;
}
}  // namespace

void attn_exact_max(const AttnParams& p, float* mx) {
  check_exact_attn(p);
  const int32_t D = p.D, group = p.H_q / p.H_kv;
  const float c = p.softmax_scale() * cpu::kLog2e;
  const float* q = p.q_as<float>();
  const float* k = p.k_as<float>();
#pragma omp parallel for schedule(static) num_threads(op_threads())
  for (int64_t t = 0; t < p.S_q * p.H_q; ++t) {
    const int64_t i = t / p.H_q;
    const int32_t h = int32_t(t % p.H_q);
    float m = -INFINITY;
    for (int64_t j = 0; j < p.S_k; ++j)
      if (p.visible(i, j)) m = std::max(m, exact_score(q + i * p.q_ld() + h * D, k + j * p.k_ld() + (h / group) * D, D, c));
    mx[t] = m;
  }
}

int64_t attn_exact_sums(const AttnParams& p, const float* M, int64_t* hi, int64_t* lo) {
  check_exact_attn(p);
  const int32_t D = p.D, group = p.H_q / p.H_kv;
  const float c = p.softmax_scale() * cpu::kLog2e;
  const float* q = p.q_as<float>();
  const float* k = p.k_as<float>();
  const float* v = p.v_as<float>();
  int64_t bad = 0;
#pragma omp parallel for schedule(static) num_threads(op_threads()) reduction(+ : bad)
  for (int64_t t = 0; t < p.S_q * p.H_q; ++t) {
    const int64_t i = t / p.H_q;
    const int32_t h = int32_t(t % p.H_q), g = h / group;
    if (M[t] == -INFINITY) continue;  // no visible key in any split
    int64_t* th = hi + t * (D + 1);
    int64_t* tl = lo + t * (D + 1);
    for (int64_t j = 0; j < p.S_k; ++j) {
      if (!p.visible(i, j)) continue;
      const float w = std::exp2(exact_score(q + i * p.q_ld() + h * D, k + j * p.k_ld() + g * D, D, c) - M[t]);
      bad += exact_add_weighted(w, v + j * p.v_ld() + g * D, D, th, tl);
    }
  }
  return bad;
}

void attn_exact_finish(const AttnParams& p, const float* M, const int64_t* hi, const int64_t* lo) {
  const int32_t D = p.D;
#pragma omp parallel for schedule(static) num_threads(op_threads())
  for (int64_t t = 0; t < p.S_q * p.H_q; ++t) {
    const int64_t* th = hi + t * (D + 1);
    const int64_t* tl = lo + t * (D + 1);
    float* o = p.o + t * D;
    const double den = M[t] == -INFINITY ? 0.0 : exact_value(th[D], tl[D]);
    if (!(den > 0)) {
      std::fill_n(o, D, 0.f);
      p.lse[t] = -INFINITY;
      continue;
    }
    for (int32_t d = 0; d < D; ++d) o[d] = float(exact_value(th[d], tl[d]) / den);
    p.lse[t] = float((double(M[t]) + std::log2(den)) * 0.69314718055994531);
  }
}

}  // namespace ctxpar
