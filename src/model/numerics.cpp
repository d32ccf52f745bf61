#include "model/numerics.hpp"

#include <algorithm>
#include <limits>
#include <span>
#include <utility>

#include "core/clock.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "dist/comm.hpp"
#include "dist/topology.hpp"
#include "model/layer.hpp"
#include "model/optimizer.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

int64_t ExactSums::offset(const float* g) const {
  CTXPAR_CHECK(g >= grads && g < grads + n, "exact numerics: a weight gradient outside the gradient buffer");
  return g - grads;
}

namespace {

// The terms' GEMMs in order into out, then the sum over tp (both policies' one-part sum).
void tp_sum_in_order(const LayerRun& r, int64_t n, int64_t N, std::initializer_list<TpTerm> terms, float* out) {
  bool first = true;
  for (const TpTerm& t : terms) {
    layer_gemm(r, false, t.tb, n, N, t.K, t.A, t.lda, t.B, t.ldb, first ? 0.f : 1.f, out, N);
    first = false;
  }
  layer_tp_all_reduce(r, out, n * N);
}

class PlainNumerics final : public Numerics {
 public:
  int64_t block() const override { return 1; }
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
            int64_t ldb, float beta, float* C, int64_t ldc) override {
    sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  }
  void rmsnorm_bwd(const LayerRun& r, const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                   float* dw, int64_t rows, int64_t dim) override {
    ctxpar::rmsnorm_bwd(dy, x, w, rstd, dx, dw, rows, dim, r.dev, r.stream);
  }
  void tp_sum(const LayerRun& r, int64_t n, int64_t N, std::initializer_list<TpTerm> terms, float* out) override {
    tp_sum_in_order(r, n, N, terms, out);
  }
  void cross_entropy(const LayerRun& r, float* logits, const int32_t* labels, int64_t rows, int64_t V, float scale,
                     double* loss) override {
    cross_entropy_fwd_bwd(logits, labels, rows, V, scale, logits, loss, r.dev, r.stream);
  }
  void embedding_bwd(const LayerRun& r, const float* dx, const int32_t* tokens, int64_t rows, int64_t dim,
                     float* demb) override {
    ctxpar::embedding_bwd(dx, tokens, rows, dim, demb, r.dev, r.stream);
  }
  void begin_step(float*) override {}
  void reserve_tp_sums(int64_t) override {}
  double bytes_per_grad() const override { return 4; }
  void sum_over_ranks(const ParamLayout& layout, float* grads, double& loss, const GradGroups& g, Device dev,
                      Stream stream) override {
    if (!g.pieces) {
      const Buf b = buf_at(grads, size_t(layout.local_elems()), dev);
      if (g.cp && g.cp->size() > 1) g.cp->all_reduce(b);
      if (g.dp && g.dp->size() > 1) g.dp->all_reduce(b);
    }
    if (g.tp && g.tp->size() > 1) reduce_replicated_kv_grads(layout, grads, *g.tp, dev, stream, g.pieces);
    if (g.cp && g.cp->size() > 1) g.cp->all_reduce(std::span<double>(&loss, 1));
    if (g.dp && g.dp->size() > 1) g.dp->all_reduce(std::span<double>(&loss, 1));
  }
  double grad_norm(const AdamW& opt, const float* grads, Comm* tp) override { return opt.grad_norm(grads, tp); }
};

}  // namespace

Numerics& plain_numerics() {
  static PlainNumerics plain;
  return plain;
}

std::unique_ptr<Numerics> make_numerics(bool exact, const ModelDims& d, int64_t grad_elems, int64_t block) {
  if (exact) return std::make_unique<ExactNumerics>(d, grad_elems, block);
  return std::make_unique<PlainNumerics>();
}

ExactNumerics::ExactNumerics(const ModelDims& d, int64_t grad_elems, int64_t block)
    : hi_(size_t(grad_elems + 2), true), lo_(size_t(grad_elems + 2), true) {
  const int64_t units = exact_tp_units(d);
  CTXPAR_CHECK(units % d.tp == 0 && block > 0,
               "exact numerics: a tp dividing " << units << " (tp:" << d.tp << "), blocks of " << block << " rows");
  s_.n = grad_elems;
  s_.hi = hi_.data();
  s_.lo = lo_.data();
  s_.block = block;
  s_.bad = &bad_;
  s_.units = units;
}

void ExactNumerics::reserve_tp_sums(int64_t elems) {
  if (s_.units == 1 || elems <= s_.sum_cap) return;  // one part: the plain product is its exact sum
  tp_hi_ = Buffer<int64_t>(size_t(elems + 1), false);
  tp_lo_ = Buffer<int64_t>(size_t(elems + 1), false);
  part_ = Buffer<float>(size_t(elems), false);
  s_.sum_hi = tp_hi_.data();
  s_.sum_lo = tp_lo_.data();
  s_.part = part_.data();
  s_.sum_cap = elems;
}

void ExactNumerics::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                         const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t G = s_.block;
  if (!ta) {  // rows of C are rows of A: a path whose rows do not depend on M, or G rows per call
    if (sgemm_rows_fixed(false, tb, M, N, K, A, lda, B, ldb, beta, C, ldc)) return;
    CTXPAR_CHECK(M % G == 0, "exact numerics: a GEMM of " << M << " rows, not whole blocks of " << G);
    for (int64_t i = 0; i < M; i += G) sgemm(false, tb, G, N, K, 1.0f, A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc);
    return;
  }
  // a weight gradient C += A^T B summed over K token rows: each block's product, added exactly
  CTXPAR_CHECK(!tb && beta == 1.0f && K % G == 0,
               "exact numerics: a weight gradient of " << M << " x " << N << " over " << K << " rows (block " << G
                                                       << ", beta " << beta << ")");
  const int64_t off = s_.offset(C);
  bad_ += gemm_tn_exact(M, N, K, G, A, lda, B, ldb, s_.hi + off, s_.lo + off, ldc);
}

void ExactNumerics::rmsnorm_bwd(const LayerRun&, const float* dy, const float* x, const float* w, const float* rstd,
                                float* dx, float* dw, int64_t rows, int64_t dim) {
  const int64_t off = s_.offset(dw);
  bad_ += rmsnorm_bwd_exact(dy, x, w, rstd, dx, s_.hi + off, s_.lo + off, rows, dim);
}

void ExactNumerics::tp_sum(const LayerRun& r, int64_t n, int64_t N, std::initializer_list<TpTerm> terms, float* out) {
  if (s_.units == 1) return tp_sum_in_order(r, n, N, terms, out);  // one part (tp = 1): the product itself
  CTXPAR_CHECK(s_.units % r.d.tp == 0 && s_.sum_hi && s_.sum_lo && s_.part,
               "exact numerics: tp:" << r.d.tp << " does not divide the " << s_.units << " parts of the tp sums");
  const int64_t parts = s_.units / r.d.tp, elems = n * N;
  CTXPAR_CHECK(elems <= s_.sum_cap, "exact numerics: a tp sum of " << n << " x " << N << " beyond its scratch of "
                                                                   << s_.sum_cap);
  for (const TpTerm& t : terms)
    CTXPAR_CHECK(t.kv || t.K % parts == 0, "exact numerics: a tp share of " << t.K << " in " << parts << " parts");
  // A K/V term's heads go whole to the part that holds their group's first query head: this
  // rank's K/V heads [a, b) (local) in global part `gp`, none (a == b) on the other copies of a
  // replicated head and in the parts after a group's first.
  const int64_t G = r.d.H_q / r.d.H_kv, per = r.d.H_q / s_.units;  // query heads of a group, of a part
  auto kv_heads_in = [&](int64_t gp) {
    int64_t a = 0, b = 0;
    for (int64_t i = 0; i < r.d.H_kv_loc(); ++i)
      if ((r.d.kv_head0() + i) * G / per == gp) {
        if (a == b) a = i;
        b = i + 1;
      }
    return std::pair<int64_t, int64_t>(a, b);
  };
  std::fill_n(s_.sum_hi, size_t(elems + 1), int64_t(0));
  std::fill_n(s_.sum_lo, size_t(elems + 1), int64_t(0));
  int64_t bad = 0;
  for (int64_t u = 0; u < parts; ++u) {
    bool first = true;
    for (const TpTerm& t : terms) {
      int64_t k0 = u * (t.K / parts), Kc = t.K / parts;
      if (t.kv) {
        const auto [a, b] = kv_heads_in(r.d.tp_rank * parts + u);
        k0 = a * r.d.D;
        Kc = (b - a) * r.d.D;
        if (Kc == 0) continue;
      }
      const float* B = t.tb ? t.B + k0 : t.B + k0 * t.ldb;
      layer_gemm(r, false, t.tb, n, N, Kc, t.A + k0, t.lda, B, t.ldb, first ? 0.f : 1.f, s_.part, N);
      first = false;
    }
    bad += exact_add(s_.part, n, N, N, s_.sum_hi, s_.sum_lo, N);
  }
  s_.sum_hi[elems] = bad;  // summed over tp with the rest: every tp rank sees every part's range
  if (r.d.tp > 1) {
    const double t0 = now_s();
    {
      Tracer::Scope sc(r.tr, Phase::all_reduce, int32_t(r.layer), -1, 0, double(elems) * 16);
      r.topo.axis(Axis::tp).all_reduce(std::span<int64_t>(s_.sum_hi, size_t(elems + 1)));
      r.topo.axis(Axis::tp).all_reduce(std::span<int64_t>(s_.sum_lo, size_t(elems)));
    }
    const double dt = now_s() - t0;
    r.times.tp_comm_s += dt;
    r.st.exposed_comm_s += dt;
  }
  bad_ += s_.sum_hi[elems];
  exact_to_float(s_.sum_hi, s_.sum_lo, out, elems);
}

void ExactNumerics::cross_entropy(const LayerRun&, float* logits, const int32_t* labels, int64_t rows, int64_t V,
                                  float scale, double* loss) {
  row_loss_.resize(size_t(rows));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)  // one row per call: its sum is the row's loss alone
    row_loss_[size_t(r)] = cross_entropy_fwd_bwd(logits + r * V, labels + r, 1, V, scale, logits + r * V);
  const int64_t n = s_.n;
  double sum = 0;
  for (double x : row_loss_) {
    bad_ += exact_add(x, s_.hi + n, s_.lo + n);
    sum += x;
  }
  *loss = sum;
}

void ExactNumerics::embedding_bwd(const LayerRun&, const float* dx, const int32_t* tokens, int64_t rows, int64_t dim,
                                  float* demb) {
  const int64_t off = s_.offset(demb);
  bad_ += embedding_bwd_exact(dx, tokens, rows, dim, s_.hi + off, s_.lo + off);
}

void ExactNumerics::begin_step(float* grads) {
  s_.grads = grads;
  std::fill_n(hi_.data(), hi_.size(), int64_t(0));
  std::fill_n(lo_.data(), lo_.size(), int64_t(0));
  bad_ = 0;
}

void ExactNumerics::sum_over_ranks(const ParamLayout&, float* grads, double& loss, const GradGroups& g, Device,
                                   Stream) {
  // The integers of every rank summed (K/V heads replicated over tp were summed over their
  // copies in the step, as integers), the count out of range with them.
  const int64_t n = s_.n;
  hi_[size_t(n + 1)] = bad_;
  for (std::span<int64_t> x : {hi_.span(), lo_.span()}) {
    if (g.cp && g.cp->size() > 1) g.cp->all_reduce(x);
    if (g.dp && g.dp->size() > 1) g.dp->all_reduce(x);
  }
  if (hi_[size_t(n + 1)] != 0) {
    std::fill_n(grads, size_t(n), std::numeric_limits<float>::quiet_NaN());
    loss = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  exact_to_float(hi_.data(), lo_.data(), grads, n);
  loss = exact_value(hi_[size_t(n)], lo_[size_t(n)]);
}

double ExactNumerics::grad_norm(const AdamW& opt, const float* grads, Comm* tp) {
  return opt.grad_norm_exact(grads, tp, s_.units);
}

std::string check_exact_model(const Config& c, int tp, int64_t block) {
  if (c.layer_pattern.find('D') != std::string::npos) {
    const std::string pre = "config: deterministic = true with layer_pattern = '" + c.layer_pattern + "': ";
    if (block > 0 && c.gdn_schedule != "ring")  // inference runs a prompt's recurrence as one call
      return pre + "gdn_schedule = " + c.gdn_schedule + " corrects each piece's output once the state is known, a sum "
             "that no single rank computes; valid: gdn_schedule=ring, or deterministic=false";
    if (block > 0 && block % c.gdn_chunk != 0)
      return pre + "the exact sums' blocks of " + std::to_string(block) + " rows are not whole chunks of the Gated "
             "DeltaNet recurrence (gdn_chunk = " + std::to_string(c.gdn_chunk) + "), so meshes would cut it at other "
             "chunk borders; valid: a deterministic_block that gdn_chunk divides, or a gdn_chunk dividing " +
             std::to_string(block);
  }
  const ModelDims d = model_dims(c, 1, 0);
  const int64_t units = exact_tp_units(d);
  if (units % tp == 0) return "";
  // the largest part of a K/V group's heads that would serve this tp
  const int32_t G = d.H_q / d.H_kv;
  std::string fix;
  for (int32_t f = G; f >= 1 && fix.empty(); --f) {
    ModelDims e = d;
    e.exact_heads = f;
    if (G % f == 0 && exact_tp_units(e) % tp == 0) fix = ", or deterministic_heads=" + std::to_string(f);
  }
  const int32_t f = d.exact_heads > 0 ? d.exact_heads : G;
  return "config: deterministic = true with tp:" + std::to_string(tp) + ": the exact tp sums split into " +
         std::to_string(units) + " parts, the gcd of heads/" + std::to_string(f) + " = " + std::to_string(d.H_q / f) +
         " (" + std::to_string(f) + " query heads per exact part: deterministic_heads" +
         (d.exact_heads > 0 ? "" : ", 0 for a K/V group") + ") and ffn_dim = " + std::to_string(c.ffn_dim) +
         ", which tp must divide; valid: tp:1, a tp dividing " + std::to_string(units) + fix +
         " (the same on the runs compared)";
}

double exact_state_bytes(const ParamLayout& layout, int64_t S_loc, int64_t block) {
  const ModelDims& d = layout.dims();
  // the gradients' exact sums (two int64 each) and the loss's
  double b = 16.0 * double(layout.local_elems() + 2);
  if (exact_tp_units(d) > 1)  // the tp sums' integers and part (Numerics::tp_sum)
    b += 20.0 * double(S_loc) * double(exact_tp_sum_cols(d));
  if (d.mla)  // MlaExpander::exact_dlat's product over the heads
    b += 4.0 * double(S_loc) * d.H_q_loc() * (d.nope + d.v_dim + d.rope);
  if (d.tp > d.H_kv)  // K/V heads replicated over tp: a copy's dK/dV integers, and every head's for the sum
    b += 16.0 * double(S_loc) * d.D * (d.H_kv_loc() + d.H_kv);
  if (block >= kExactLibraryBlock) {  // one weight's product at a time (kernels/ops.hpp gemm_tn_exact)
    int64_t widest = 0;
    for (const ParamInfo& t : layout.tensors()) widest = std::max(widest, t.loc_elems());
    b += 4.0 * double(widest);
  }
  return b;
}

}  // namespace ctxpar
