// Backend-neutral op signatures. kernels/ref/ is the readable fp64 spec of each op;
// kernels/cpu/ is the fast CPU path (OpenMP, SIMD, a measured GEMM library), kernels/cuda/ the
// GPU path. The attention ops dispatch on the descriptor's device (ops.cpp, library ctxpar_ops);
// tests judge every backend against the reference.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "attn_params.hpp"

namespace ctxpar {

// O and LSE of softmax(scale * Q K^T + mask) V. Rows that see no key: O = 0, LSE = -inf.
// Tiles with no visible pair are skipped (work proportional to visible pairs). Runs on
// p.device (Device::cuda asynchronously on p.stream); invalid arguments throw
// std::invalid_argument, as does Device::cuda in a build without the CUDA backend.
void attn_fwd(const AttnParams& p);

// dQ += , dK += , dV += from dout, O and LSE (probabilities recomputed from LSE, as in
// FlashAttention-2). Under GQA dK/dV sum over the query heads of a group. dk_fixed and dv_fixed
// must be null (they are attn_bwd_exact's).
void attn_bwd(const AttnParams& p);
// The exact-sums backward (CPU): dQ += as attn_bwd; dK and dV as integers added to
// AttnParams::dk_fixed and dv_fixed (dk, dv unused), per aligned block of queries (fixed_rows)
// and part of a K/V group's heads (fixed_heads), the same on any split of the queries.
// Each contribution is rounded to the grid 2^-kFixedShift (about 1.5e-11) on entry, so a sum of n
// contributions is off by at most n * 2^-(kFixedShift+1) absolute (plus the final rounding to
// fp32); attn_bwd_exact refuses a contribution of magnitude 2^10 or more (the sums of up to 2^16
// query tiles then stay inside int64).
void attn_bwd_exact(const AttnParams& p);
inline constexpr int kFixedShift = 36;
// The rows of the CPU kernel's query tile with exact dK/dV sums (128 for D <= 128, 64 above): the
// grain of the blocks of positions an exact sum groups by (AttnParams::fixed_rows is a multiple;
// a layout for exact numerics pads each rank's chunks to whole blocks).
int64_t attn_query_block(int32_t D);
// x[i] = fixed[i] * 2^-kFixedShift, rounded to fp32 (int64 -> double -> float: one function of the
// integer, the same bits wherever it runs).
void fixed_to_float(const int64_t* fixed, float* x, int64_t n);

// Merges a partial result (o_b, lse_b) over a disjoint key set into (o, lse), in place:
//   lse = m + log(exp(lse - m) + exp(lse_b - m)),  o = exp(lse_a - lse) o + exp(lse_b - lse) o_b
// with m = max(lse, lse_b); exact for -inf rows (never NaN). o, o_b [rows, H, D]; lse [rows, H];
// fp32 on `device` (Device::cuda: ordered on `stream`).
void lse_merge(float* o, float* lse, const float* o_b, const float* lse_b, int64_t rows, int32_t H,
               int32_t D, Device device = Device::cpu, Stream stream = nullptr);

// THE visible-pair counter (the attention FLOP count's basis, model/flops.hpp): the number of
// (q, k) pairs of a call that pair_visible() admits, exactly, for any order of positions and any
// document labelling, in O((S_q + S_k) log S_k): keys sorted by (document, position) make the
// keys one query sees a contiguous range. Host arrays (positions and document ids).
int64_t visible_pairs(const AttnParams& p);

// ---- memory of a call's device (the CP strategies' messages and scratch) ----
// The same operations on either backend, so that one strategy serves both: Device::cpu is host
// memory (synchronous); Device::cuda is device memory, every operation ordered on `stream`
// (allocation and release too: cudaMallocAsync / cudaFreeAsync, no host synchronization) and
// asynchronous, except copy_to_host, which returns when the host may read `host_dst`.
// device_alloc(0) returns null; device_free(null) does nothing.
void* device_alloc(size_t bytes, Device device, Stream stream = nullptr);
// A stream of `device` that does not synchronize with the legacy default stream (Device::cpu:
// null); destroyed after the work on it; synchronize: the host waits for its work.
Stream stream_create(Device device);
void stream_destroy(Stream stream, Device device);
void stream_synchronize(Stream stream, Device device);
// A timing event recorded on `stream` now (Device::cuda; null on the CPU); the seconds between two
// of them once both are complete (event_seconds synchronizes on `end`); destroy when done.
Event event_record(Stream stream, Device device);
double event_seconds(Event start, Event end, Device device);
void event_destroy(Event e, Device device);
// Work issued to `stream` after this call waits until `e` (recorded on another stream) is reached;
// the host does not wait (Device::cpu: nothing).
void stream_wait_event(Stream stream, Event e, Device device);
// Work issued to `waiter` after this call waits for everything issued to `stream` before it.
void stream_wait_stream(Stream waiter, Stream stream, Device device);
// An NVTX range named `name` on `device` (Device::cuda: nvtxRangePushA / nvtxRangePop, what Nsight
// Systems shows beside the kernels; nothing on the CPU), and its end.
void range_push(const char* name, Device device);
void range_pop(Device device);
void device_free(void* p, Device device, Stream stream = nullptr);
// Page-locked host memory that `device` copies to and from asynchronously (Device::cuda:
// cudaHostAlloc; the CPU: plain memory), for host offload; pinned_alloc(0) returns null.
void* pinned_alloc(size_t bytes, Device device);
void pinned_free(void* p, Device device);
// dst (on `device`) = pinned_src and pinned_dst = src (on `device`), asynchronous on `stream`: the
// host memory must stay untouched until the stream has passed the copy (CPU: memcpy, done).
void copy_in_async(void* dst, const void* pinned_src, size_t bytes, Device device, Stream stream);
void copy_out_async(void* pinned_dst, const void* src, size_t bytes, Device device, Stream stream);
// dst = src, both on `device` (may not overlap).
void device_copy(void* dst, const void* src, size_t bytes, Device device, Stream stream = nullptr);
// dst (on `device`) = host_src; the caller may reuse or release host_src when the call returns.
void copy_to_device(void* dst, const void* host_src, size_t bytes, Device device, Stream stream = nullptr);
// host_dst = src (on `device`), complete on return.
void copy_to_host(void* host_dst, const void* src, size_t bytes, Device device, Stream stream = nullptr);
void device_zero(void* p, size_t bytes, Device device, Stream stream = nullptr);
// `rows` rows of `width` bytes: row i from src + i * src_pitch to dst + i * dst_pitch (bytes), both
// on `device` (a head slice of token-major tensors: the ulysses all-to-all's packing).
void device_copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                    Device device, Stream stream = nullptr);
// x[i] = value for i < n, fp32 on `device`.
void fill_f32(float* x, float value, int64_t n, Device device, Stream stream = nullptr);
// dst[i] += src[i] for i < n, fp32 on `device`.
void add_f32(float* dst, const float* src, int64_t n, Device device, Stream stream = nullptr);
// The same over `rows` rows of `width` elements: dst[r * dst_ld + c] += src[r * src_ld + c].
void add_f32_2d(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t width, int64_t rows,
                Device device, Stream stream = nullptr);

// Row-major single-precision GEMM: C = alpha * op(A) op(B) + beta * C, op = transpose when
// trans_*; A is [M,K] (or [K,M]), B is [K,N] (or [N,K]); leading dimensions in elements.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// sgemm whose row i of C has the same bits for any M and any thread count (exact numerics):
// returns false where the library gives no such path (nothing computed; the caller then runs
// blocks of a fixed number of rows). BLIS: its blocked path, never the small-matrix ("sup") one,
// whose choice depends on M; the blocked path sums each element over K in the same kc blocks
// whatever M, and threads split rows and columns, never K.
bool sgemm_rows_fixed(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Name and version of the GEMM library linked (for provenance).
const char* blas_name();

// Single-precision FMA peak of this CPU on `threads` threads (0 = OpenMP default), in GFLOP/s,
// measured with a register-only FMA loop (~0.5 s) of the widest FMA the CPU has, chosen at run
// time: the clock the cores really run at times their FLOP per cycle (32 per core with two
// 256-bit FMA pipes: Zen 3, Zen 4, Haswell and later clients; 64 with two 512-bit pipes: Intel
// server cores, Zen 5). `isa` picks a narrower loop (for comparison); asking for one the CPU
// lacks throws std::invalid_argument.
enum class FmaIsa : int { sse2 = 0, avx2 = 1, avx512 = 2 };
struct FmaPeak {
  double gflops = 0;
  FmaIsa isa = FmaIsa::sse2;
  const char* isa_name = "";  // "avx512f", "avx2+fma", "sse2 (mul+add)"
  int vector_bits = 0;        // 512, 256, 128
};
FmaIsa fma_isa_available();  // the widest this CPU (and OS) supports
const char* fma_isa_name(FmaIsa isa);
FmaPeak fma_peak(int threads);
FmaPeak fma_peak(int threads, FmaIsa isa);
double fma_peak_gflops(int threads);  // fma_peak(threads).gflops
// The instruction set of the CPU kernels' own tiles (attention, Gated DeltaNet) and of the GEMM
// library's kernels: the widest this CPU runs (CPUID, read once), or the one the environment
// variable CTXPAR_ISA names (scalar, avx2, avx512), so that every path can be checked on one
// machine (tests/README.md). Never chosen from a timing: the ISA fixes the order of the sums.
enum class KernelIsa : int { scalar = 0, avx2 = 1, avx512 = 2 };
KernelIsa kernel_isa_widest();      // AVX-512 F/DQ/BW/VL, else AVX2+FMA, else scalar
KernelIsa kernel_isa();             // CTXPAR_ISA, else kernel_isa_widest(); a bad CTXPAR_ISA throws
bool kernel_isa_forced();           // CTXPAR_ISA is set (and valid)
std::string kernel_isa_error();     // "" or what is wrong with CTXPAR_ISA (unknown, or beyond this CPU)
const char* kernel_isa_name(KernelIsa isa);

}  // namespace ctxpar

// ---- model ops (training) ----
// The Llama-style layer ops of src/model (fast fp32 path, kernels/cpu/model_cpu.cpp); the
// readable fp64 spec of each is in kernels/ref/model_ref.hpp. Rows are tokens; every op is
// independent per row except the weight gradients, which sum over rows.
namespace ctxpar {

// RMSNorm: y = x * rstd * w with rstd = 1 / sqrt(mean_j x_j^2 + eps); x, y [rows, dim], w [dim];
// rstd [rows] is saved for the backward.
void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps);
// With xh = x * rstd: dx += rstd * (dy*w - xh * mean_j(dy_j w_j xh_j)), dw += sum_rows dy * xh.
// Both ACCUMULATE (dx is the residual stream's gradient, dw the parameter gradient).
void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                 int64_t rows, int64_t dim);

// RoPE frequencies inv_freq[i] = theta^(-2i/D), i < D/2, with Llama 3's frequency scaling
// (factor, low_freq_factor, high_freq_factor, original_max_pos): wavelengths longer than
// original_max_pos / low_freq_factor are divided by `factor`, shorter than
// original_max_pos / high_freq_factor kept, and the band between interpolated smoothly.
// factor = 1 leaves every frequency unchanged.
void rope_inv_freq(int32_t D, double theta, double factor, double low_freq_factor, double high_freq_factor,
                   double original_max_pos, double* inv_freq);
// cos/sin tables [rows, D/2] of the angles pos[r] * inv_freq[i], computed in double (angles reach
// 10^6 rad at long context, beyond what fp32 sin/cos of an fp32 product resolves).
void rope_table(const int64_t* pos, int64_t rows, int32_t D, const double* inv_freq, float* cos_t, float* sin_t);
// Rotates x [rows, H, D] in place, pairing element i with i + D/2 ("rotate half"):
//   (a, b) -> (a cos - b sin, a sin + b cos); inverse = true rotates by -angle, which is the
// backward (the rotation is orthogonal).
void rope_apply(float* x, int64_t rows, int32_t H, int32_t D, const float* cos_t, const float* sin_t, bool inverse);

// SwiGLU: h = silu(g) * u, silu(g) = g * sigmoid(g); n elements.
void swiglu_fwd(const float* g, const float* u, float* h, int64_t n);
// dg = dh * u * sigmoid(g) * (1 + g (1 - sigmoid(g))), du = dh * silu(g) (overwritten).
void swiglu_bwd(const float* dh, const float* g, const float* u, float* dg, float* du, int64_t n);

// Cross-entropy of logits [rows, V] against labels [rows] (label < 0 = ignored row). Returns the
// SUM over counted rows of (logsumexp - logit[label]) in double, and writes
// dlogits = grad_scale * (softmax - onehot(label)) (0 for ignored rows); dlogits may alias
// logits (the logits are then overwritten by their gradient).
double cross_entropy_fwd_bwd(const float* logits, const int32_t* labels, int64_t rows, int64_t V,
                             float grad_scale, float* dlogits);

// AdamW (decoupled weight decay), in PyTorch's order of operations:
//   g' = grad_scale * g;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2;
//   p *= 1 - lr wd;  p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// with t = step (1-based). grad_scale carries the gradient-norm clipping factor.
struct AdamWStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
  double grad_scale = 1;
  int64_t step = 1;
};
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& hp);

// Sum of squares in double (gradient-norm clipping): partial sums of fixed blocks of 4096
// elements added in block order, so the result does not depend on the thread count.
double sum_squares(const float* x, int64_t n);

// The embedding: x[r] = emb[tokens[r]] for r < rows (rows x dim); the backward demb[tokens[r]] +=
// dx[r], rows added in order (a token may repeat; the order of additions is fixed).
void embedding_fwd(const float* emb, const int32_t* tokens, int64_t rows, int64_t dim, float* x);
void embedding_bwd(const float* dx, const int32_t* tokens, int64_t rows, int64_t dim, float* demb);

// ---- exact sums (exact numerics in training: parameter gradients and the loss) ----
// A sum held as two int64 per element with one result in any order of its additions: a value x
// is split into hi = trunc(x 2^kExactHi) and lo = trunc((x - hi 2^-kExactHi) 2^kExactLo), both
// exact except lo's truncation below 2^-kExactLo (5.4e-20 absolute per addition). hi holds
// |x| < 2^kExactRange; lo, below 2^(kExactLo - kExactHi) per addition, sums 2^22 additions in
// int64. Two such sums add elementwise as integers (an all-reduce of int64, in any order).
inline constexpr int kExactHi = 24, kExactLo = 64, kExactRange = 38;
// hi[i ld + j] += , lo[i ld + j] += the split of x[i ldx + j] for i < rows, j < cols. Returns the
// number of values that were non-finite or of magnitude 2^kExactRange or more (added as 0).
int64_t exact_add(const float* x, int64_t rows, int64_t cols, int64_t ldx, int64_t* hi, int64_t* lo, int64_t ld);
int64_t exact_add(double x, int64_t* hi, int64_t* lo);
// The sum hi 2^-kExactHi + lo 2^-kExactLo, rounded to double (one rounding of the carried pair,
// the same bits wherever it runs), and to fp32 for n elements.
double exact_value(int64_t hi, int64_t lo);
void exact_to_float(const int64_t* hi, const int64_t* lo, float* x, int64_t n);
// exact numerics' weight gradients: for every block of G rows of K (K a multiple of G), the
// block's product sum_k A[k, i] B[k, j] (A [K, M] with leading dimension lda, B [K, N] with ldb)
// added exactly to hi/lo[i ld + j] (exact_add). Each block's element is a function of the
// block's rows alone, whatever the threads: G < kExactLibraryBlock, the CPU's tile kernel (one
// multiply-add per k in order from 0, in tiles of C of a fixed shape that stay in cache, each
// converted after every block); longer blocks, one sgemm per block (its threads split rows and
// columns, never K). Returns exact_add's count of values out of range.
constexpr int64_t kExactLibraryBlock = 256;  // measured: docs/measurements.md "Exact weight gradients"
int64_t gemm_tn_exact(int64_t M, int64_t N, int64_t K, int64_t G, const float* A, int64_t lda, const float* B,
                      int64_t ldb, int64_t* hi, int64_t* lo, int64_t ld);
// rmsnorm_bwd with dw's sum over rows exact (each row's dy * xh split into dw_hi, dw_lo; dx as
// rmsnorm_bwd's, += ); embedding_bwd with demb exact (each row's dx split into its token's row).
// Both return exact_add's count of values out of range.
int64_t rmsnorm_bwd_exact(const float* dy, const float* x, const float* w, const float* rstd, float* dx, int64_t* dw_hi,
                          int64_t* dw_lo, int64_t rows, int64_t dim);
int64_t embedding_bwd_exact(const float* dx, const int32_t* tokens, int64_t rows, int64_t dim, int64_t* hi, int64_t* lo);
// Attention whose result has the same bits however its keys are split over calls (ranks, KV-cache
// slices), for inference with exact numerics (CPU, fp32; the pairs as attn_fwd's: mask and
// window by position, documents). Every quantity is a function of one (query row, key row) pair:
// t = c (q . k), c = softmax_scale log2(e), the dot product in a fixed order. In three steps:
//   attn_exact_max    mx[i, h] = the largest t over the call's visible keys (-inf: none);
//   attn_exact_sums   given M[i, h] >= every visible t (the maximum of every split's mx, which is
//                     exact: a max has one result in any order), w = 2^(t - M) and w v[d] (a
//                     product exact in double) for d < D, then w, added to hi/lo [i, h, D + 1]
//                     (exact_add's integers, zeroed by the caller; summed over splits in any
//                     order). Returns the count of values out of range;
//   attn_exact_finish o = sum(w v) / sum(w) and lse = (M + log2 sum(w)) ln 2 from the summed
//                     integers into p.o and p.lse (o = 0, lse = -inf for a row that saw nothing).
// Costs one pass of exact adds per (query, key, head) pair: a correctness schedule, far slower
// than attn_fwd on long key sets.
void attn_exact_max(const AttnParams& p, float* mx);
int64_t attn_exact_sums(const AttnParams& p, const float* M, int64_t* hi, int64_t* lo);
void attn_exact_finish(const AttnParams& p, const float* M, const int64_t* hi, const int64_t* lo);

// ---- the same ops on a call's device ----
// Every pointer on `device` (Device::cuda: asynchronous, ordered on `stream`); Device::cpu is
// exactly the op above. The model (src/model) calls these, so one layer code serves both backends.
void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps,
                 Device device, Stream stream);
void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                 int64_t rows, int64_t dim, Device device, Stream stream);
void rope_apply(float* x, int64_t rows, int32_t H, int32_t D, const float* cos_t, const float* sin_t, bool inverse,
                Device device, Stream stream);
void swiglu_fwd(const float* g, const float* u, float* h, int64_t n, Device device, Stream stream);
void swiglu_bwd(const float* dh, const float* g, const float* u, float* dg, float* du, int64_t n, Device device,
                Stream stream);
// The loss sum is written to *loss_sum, one double on `device` (overwritten), so that the call
// stays asynchronous; labels on `device`.
void cross_entropy_fwd_bwd(const float* logits, const int32_t* labels, int64_t rows, int64_t V, float grad_scale,
                           float* dlogits, double* loss_sum, Device device, Stream stream);
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& hp, Device device,
                  Stream stream);
// Returns to the host (Device::cuda: synchronizes `stream`).
double sum_squares(const float* x, int64_t n, Device device, Stream stream);
void embedding_fwd(const float* emb, const int32_t* tokens, int64_t rows, int64_t dim, float* x, Device device,
                   Stream stream);
void embedding_bwd(const float* dx, const int32_t* tokens, int64_t rows, int64_t dim, float* demb, Device device,
                   Stream stream);
// y[i] = x[i] rounded to bf16 (nearest, ties to even; bf16 as its 16 bits), n elements on `device`.
void f32_to_bf16(const float* x, uint16_t* y, int64_t n, Device device, Stream stream);
// Row-major C = alpha op(A) op(B) + beta C (as sgemm) with element types: (f32, f32, f32) on either
// device, (bf16, bf16, f32 or bf16) on Device::cuda (cuBLASLt, fp32 accumulation).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, DType a_type,
          int64_t lda, const void* B, DType b_type, int64_t ldb, float beta, void* C, DType c_type, int64_t ldc,
          Device device, Stream stream);

}  // namespace ctxpar

namespace ctxpar {

// ---- Gated DeltaNet (linear attention; kernels/cpu/gdn_cpu.cpp, CPU only) ----
// Per head h, a state S [Dv, Dk] runs along the sequence (S_0 = s0, or 0):
//   S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T,   o_t = scale S_t q_t,   a_t = exp(g_t)
// computed in the chunked (WY) form: within a chunk of `chunk` tokens the delta rule's
// unit-lower-triangular system (I + A) [U | W] = [V | diag(gamma) K] is solved by substitution
// (A_ij = exp(G_i - G_j) b_j k_i.k_j, G the chunk's cumulative log decay), the chunk's output is
// an intra-chunk product plus E S^T, and the state is carried to the next chunk by GEMMs. The
// plain recurrence (kernels/ref/gdn_ref.hpp) is the spec. q and k are L2-normalised by the layer
// (not here); any T >= 0 and any chunk >= 1 (T need not be a multiple). Heads run in parallel on
// the rank's OpenMP threads.
struct GdnParams {
  int64_t T = 0;
  int32_t H = 0, Dk = 0, Dv = 0;
  int32_t chunk = 64;  // chunks end at documents' ends and at multiples of `chunk` from token 0
  float scale = 0;  // 0: 1 / sqrt(Dk)
  // Only heads [head_begin, head_end) are computed (head_end 0: H); tensors keep their full
  // layout and the others are left as they are (a schedule that pipelines heads across ranks).
  int32_t head_begin = 0, head_end = 0;
  const float* q = nullptr;     // [T, H, Dk]
  const float* k = nullptr;     // [T, H, Dk]
  const float* v = nullptr;     // [T, H, Dv]
  const float* g = nullptr;     // [T, H] log decay (<= 0 in the layer; any finite value here)
  const float* beta = nullptr;  // [T, H]
  const int32_t* doc = nullptr; // [T] document ids (packed documents): the state restarts from zero where
                                // the id changes (s0 reaches only the first); nullptr: one document
  bool reset_at_0 = false;      // token 0 starts a document: s0 is not used (ds0 = 0); a piece of a
                                // packed sequence whose first token begins a new document
  const float* s0 = nullptr;    // [H, Dv, Dk] state before token 0; nullptr: zero
  float* o = nullptr;           // [T, H, Dv]
  float* s_out = nullptr;       // [H, Dv, Dk] state after token T-1; nullptr: not wanted
  // backward: gradients of L = sum(d_o * o) + sum(ds_out * s_out)
  const float* d_o = nullptr;     // [T, H, Dv]; nullptr: zero
  const float* ds_out = nullptr;  // [H, Dv, Dk]; nullptr: zero
  float* dq = nullptr;            // OVERWRITTEN, like dk, dv, dg, dbeta
  float* dk = nullptr;
  float* dv = nullptr;
  float* dg = nullptr;
  float* dbeta = nullptr;
  float* ds0 = nullptr;  // [H, Dv, Dk] dL/ds0; nullptr: not wanted
};
// Writes o (and s_out). Invalid shapes or missing tensors throw std::invalid_argument.
void gdn_fwd(const GdnParams& p);
// Writes dq, dk, dv, dg, dbeta (and ds0), recomputing the chunk states forward first.
void gdn_bwd(const GdnParams& p);

// The forward in two parts, for a schedule that waits for s0 (context parallelism: the state
// arrives from the previous rank): gdn_fwd_prepare does everything that does not depend on s0
// (the intra-chunk products, the triangular solves; o receives its intra-chunk part) and keeps
// what the state pass needs in `ws` (gdn_workspace_floats(p) floats); gdn_fwd_finish then adds
// the state's part to o and writes s_out, at 3 GEMMs of chunk x Dk x Dv per chunk and head.
// prepare + finish = gdn_fwd, to the last bit.
int64_t gdn_workspace_floats(const GdnParams& p);
void gdn_fwd_prepare(const GdnParams& p, float* ws);
void gdn_fwd_finish(const GdnParams& p, const float* ws);
// The state's part alone (the zero-input map S -> S T of the whole sequence, T = prod_t a_t (I -
// b_t k_t k_t^T)), from a prepared `ws`: X [H, m, Dk] becomes X T, in place; with add_to_o (m =
// Dv) o also receives the part of the output that a start state X contributes. For a schedule
// that finishes with a zero start state and corrects once the real one is known (finish is linear
// in the start state), and for T itself (X = I, m = Dk).
void gdn_state_apply(const GdnParams& p, const float* ws, float* X, int32_t m, bool add_to_o);
// The scratch each OpenMP thread of gdn_bwd (backward) or of the forwards holds, in floats: exact
// for one call, and a bound for any call of T rows whatever its documents. The backward keeps
// every chunk's prepared products for one head (about 6 min(chunk, T) + Dk + Dv floats a row);
// a forward one chunk's. A rank's memory plan counts threads x the bound of its longest call.
int64_t gdn_thread_scratch_floats(const GdnParams& p, bool backward);
int64_t gdn_thread_scratch_bound(int64_t T, int32_t Dk, int32_t Dv, int32_t chunk, bool backward);

}  // namespace ctxpar
