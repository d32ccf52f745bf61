// The numerics policy: how a step's sums are taken. Chosen once, where a run is configured
// (modes/train.cpp, modes/infer.cpp: make_numerics), and passed in; the layer code, the model, the
// optimizer step and the inference engine call it without asking which one it is.
//   plain  every sum in the libraries' order (BLIS or cuBLAS GEMMs, OpenMP reductions, fp32
//          all-reduces): the fastest; the bits depend on the mesh, the strategy and the threads.
//   exact  (CPU; the config's deterministic=true) every sum over tokens, tp ranks, CP and dp ranks
//          or threads taken in parts that the model fixes, never the mesh, each part's value added
//          exactly as integers (kernels/ops.hpp exact_add): the same bits on any mesh, strategy
//          and thread count. Its attention is the CP strategy's exact schedule
//          (cp/exact.hpp), which the configuration selects beside it.
// Exact, in detail: a GEMM of token rows runs sgemm_rows_fixed, or calls of `block` rows where the
// library has no such path; a weight gradient (op(A) = A^T, the token rows summed) is one product
// per block of rows, each added exactly (gemm_tn_exact); the norms', the embedding's and the
// loss's sums over rows are exact; a tp-summed product splits its contraction into
// exact_tp_units(d) parts over the whole tp group (every tp size divides it) and adds each
// part's product exactly; the gradients and the loss travel between ranks as integers.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "core/memory.hpp"
#include "model/model.hpp"

namespace ctxpar {

class AdamW;
class Comm;
struct StateShard;
struct LayerRun;

// One term of a tp-summed product: A [n, K] (leading dimension lda) times op(B) (B [K, N] with
// ldb, or with tb B [N, K]), K this rank's share of the contraction.
struct TpTerm {
  const float* A;
  int64_t lda;
  const float* B;
  int64_t ldb;
  bool tb;
  int64_t K;
  // a K/V projection's term (K = this rank's K/V heads x D): in the exact parts each head goes
  // whole to the part of its group's first query head, and a head replicated over tp is added by
  // the rank holding that part only (its gradient is whole on every copy)
  bool kv = false;
};

// The exact policy's integers, parallel to the flat fp32 gradient buffer [grads, grads + n):
// element i of a weight gradient is (hi[i], lo[i]); then the loss sum; then (hi only) the count of
// values out of the exact range. For the code whose exact algorithm is its own (the Gated
// DeltaNet layer's convolution and gates, MLA's latent gradient, the GDN prompt in inference).
struct ExactSums {
  const float* grads = nullptr;
  int64_t n = 0;
  int64_t *hi = nullptr, *lo = nullptr;
  int64_t block = 0;  // rows of a block: a product over token rows is one call per block
  int64_t* bad = nullptr;  // values out of range so far
  // The tp sums: `units` parts over the whole tp group, each part's product (rows x dim, in
  // `part`) added exactly into sum_hi/sum_lo (one more element: the count out of range).
  int64_t units = 1;
  int64_t *sum_hi = nullptr, *sum_lo = nullptr;
  float* part = nullptr;
  int64_t sum_cap = 0;  // elements of part: the largest rows x N
  // The place of gradient element `g` (a pointer into [grads, grads + n)).
  int64_t offset(const float* g) const;
};

// The groups over which a step's gradients and loss are summed (null: one rank).
struct GradGroups {
  Comm* cp = nullptr;
  Comm* dp = nullptr;
  Comm* tp = nullptr;  // K/V heads replicated over tp ranks (plain: their copies' sum)
  // plain: the gradients were reduce-scattered over cp x dp already (shard=grads, params; the
  // model's UnitFeed) into this rank's pieces: only the loss is summed here, and the K/V copies'
  // gradients over tp on the pieces (null: the whole gradients)
  const StateShard* pieces = nullptr;
};

class Numerics {
 public:
  virtual ~Numerics() = default;
  // Rows a product over token rows takes as one (1: any): a rank holds whole blocks.
  virtual int64_t block() const = 0;
  // C (=|+=) op(A) op(B), fp32 on the CPU (layer_gemm times and traces it; the GPU's bf16 GEMMs
  // are plain). Exact: a weight gradient (trans_a, beta = 1, C in the gradient buffer) goes to the
  // exact sums instead of C.
  virtual void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, float beta, float* C, int64_t ldc) = 0;
  // rmsnorm_bwd over `rows` rows (dx +=, dw +=; exact: dw's sum over the rows to the exact sums).
  virtual void rmsnorm_bwd(const LayerRun& r, const float* dy, const float* x, const float* w, const float* rstd,
                           float* dx, float* dw, int64_t rows, int64_t dim) = 0;
  // out [n, N] = the terms' products summed over the whole tp group (the row-parallel products).
  // Plain: the terms' GEMMs in order, then the tp all-reduce. Exact: per part of the contraction
  // the terms' product, added exactly; the integers all-reduced over tp and rounded once.
  virtual void tp_sum(const LayerRun& r, int64_t n, int64_t N, std::initializer_list<TpTerm> terms, float* out) = 0;
  // Cross entropy of `rows` rows of logits [rows, V] (overwritten by d(scale * loss)/d(logits));
  // *loss (where the logits are) = the rows' loss sum. Exact: each row's loss also added exactly.
  virtual void cross_entropy(const LayerRun& r, float* logits, const int32_t* labels, int64_t rows, int64_t V,
                             float scale, double* loss) = 0;
  // demb += the rows of dx [rows, dim] at their tokens (exact: to the exact sums).
  virtual void embedding_bwd(const LayerRun& r, const float* dx, const int32_t* tokens, int64_t rows, int64_t dim,
                             float* demb) = 0;
  // A step's gradients start: `grads` (zeroed by the caller) is where sum_over_ranks leaves them.
  virtual void begin_step(float* grads) = 0;
  // The tp sums' scratch for products of up to `elems` elements (plain: none).
  virtual void reserve_tp_sums(int64_t elems) = 0;
  // Bytes sum_over_ranks moves per gradient element (the trace's count).
  virtual double bytes_per_grad() const = 0;
  // The gradients (fp32, `grads`) and the loss sum summed over the ranks that share the
  // parameters. Exact: the integers summed (any order gives one result) and rounded once; a value
  // out of range on any rank makes every gradient and the loss NaN.
  virtual void sum_over_ranks(const ParamLayout& layout, float* grads, double& loss, const GradGroups& g, Device dev,
                              Stream stream) = 0;
  // The global L2 norm of the gradients (AdamW::grad_norm, or grad_norm_exact in fixed parts).
  virtual double grad_norm(const AdamW& opt, const float* grads, Comm* tp) = 0;
  // The exact sums (null: plain).
  virtual ExactSums* exact() { return nullptr; }
};

// The plain policy (stateless: one instance serves every caller).
Numerics& plain_numerics();

// The exact policy's state: the gradients' and the loss's integers (`grad_elems`: this rank's
// parameter elements, 0 for inference) in blocks of `block` rows, and the tp sums' scratch.
class ExactNumerics final : public Numerics {
 public:
  ExactNumerics(const ModelDims& d, int64_t grad_elems, int64_t block);
  int64_t block() const override { return s_.block; }
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
            int64_t ldb, float beta, float* C, int64_t ldc) override;
  void rmsnorm_bwd(const LayerRun& r, const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                   float* dw, int64_t rows, int64_t dim) override;
  void tp_sum(const LayerRun& r, int64_t n, int64_t N, std::initializer_list<TpTerm> terms, float* out) override;
  void cross_entropy(const LayerRun& r, float* logits, const int32_t* labels, int64_t rows, int64_t V, float scale,
                     double* loss) override;
  void embedding_bwd(const LayerRun& r, const float* dx, const int32_t* tokens, int64_t rows, int64_t dim,
                     float* demb) override;
  void begin_step(float* grads) override;
  void reserve_tp_sums(int64_t elems) override;
  double bytes_per_grad() const override { return 16; }
  void sum_over_ranks(const ParamLayout& layout, float* grads, double& loss, const GradGroups& g, Device dev,
                      Stream stream) override;
  double grad_norm(const AdamW& opt, const float* grads, Comm* tp) override;
  ExactSums* exact() override { return &s_; }

 private:
  Buffer<int64_t> hi_, lo_, tp_hi_, tp_lo_;
  Buffer<float> part_;
  std::vector<double> row_loss_;
  int64_t bad_ = 0;
  ExactSums s_;
};

// "" when exact numerics serve this config's model on tp ranks, else the config error:
// a tp dividing exact_tp_units; in training (`block` > 0: the exact sums' block of rows)
// Gated DeltaNet layers with gdn_schedule=ring and a GDN chunk dividing the block, so that every
// mesh's pieces cut the recurrence at the same chunk borders (block = 0: inference, which runs a
// prompt's recurrence as one call on every rank, infer/gdn_infer.hpp).
std::string check_exact_model(const Config& cfg, int tp, int64_t block);
// Host bytes the exact policy holds in a training step beyond the plain one (the --dry-run plan):
// this rank's gradients' integers, the tp sums' integers and part, MLA's latent product, the
// dK/dV integers of K/V heads replicated over tp, and with library blocks the widest weight's product.
double exact_state_bytes(const ParamLayout& layout, int64_t S_loc, int64_t block);

// exact: ExactNumerics(d, grad_elems, block); else the plain policy (a new instance).
std::unique_ptr<Numerics> make_numerics(bool exact, const ModelDims& d, int64_t grad_elems, int64_t block);

}  // namespace ctxpar
