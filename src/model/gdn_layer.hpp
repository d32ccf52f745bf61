// The Gated DeltaNet token mixer of a hybrid model's 'D' layers (Yang, Kautz, Hatamizadeh, "Gated
// Delta Networks", ICLR 2025; the layer as in flash-linear-attention and Qwen3-Next), forward and
// hand-written backward, on this rank's rows of one packed sequence:
//   h = RMSNorm(x)                                     (the layer's attn_norm)
//   q, k, v = silu(conv(h Wq)), silu(conv(h Wk)), silu(conv(h Wv))   short causal depthwise convolutions
//   q, k L2-normalised per head (x / sqrt(sum x^2 + 1e-6))
//   beta = sigmoid(h Wb),   g = -exp(a_log) softplus(h Wa + dt_bias)            [per head]
//   o = GatedDeltaRule(q, k, v, g, beta)               (kernels/ops.hpp gdn_*, scale 1/sqrt(Dk))
//   y = RMSNorm_per_head(o) o_norm * silu(h Wg)        (the gated output norm, weight over Dv)
//   x1 = x + y Wo
// Neither the convolution nor the recurrence crosses a document boundary. Under context
// parallelism the rows are the pieces of a GdnChain (contiguous or zigzag sharding): the
// convolution takes the last conv-1 rows of the previous piece (chain_halo_*), the recurrence its
// state (GdnCp: the `gdn_schedule`). tp = 1 (the mesh check refuses tp > 1 with GDN layers).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/memory.hpp"
#include "cp/gdn_cp.hpp"
#include "model/layer.hpp"

namespace ctxpar {

struct Batch;

// What the backward needs of one layer's forward.
struct GdnActs {
  Buffer<float> h, rstd;      // [n, dim], [n]: the input norm
  Buffer<float> proj;         // [n, C] h Wq | h Wk | h Wv, the convolution's input (C = 2 H Dk + H Dv)
  Buffer<float> pre;          // [n, C] convolution outputs before silu
  Buffer<float> q, k, v;      // [n, H Dk] normalised, [n, H Dk] normalised, [n, H Dv]
  Buffer<float> qinv, kinv;   // [n, H] the L2 norms' inverse
  Buffer<float> ab;           // [n, 2H] h Wa | h Wb
  Buffer<float> g, beta;      // [n, H]
  Buffer<float> o;            // [n, H Dv] the recurrence's output
  Buffer<float> z, on, orstd; // [n, H Dv] gate input, [n, H Dv] normalised o (times o_norm), [n H]
  std::vector<std::vector<float>> halo;  // per piece [conv-1, C]: the previous piece's last projections
  GdnCpContext cp;
};

// The layer's per-row steps, shared by training (GdnMixer) and inference (infer/gdn_infer.*):
// h Wq | h Wk | h Wv into proj [n, C], h Wa | h Wb into ab [n, 2H], h Wg into z [n, H Dv].
void gdn_in_proj(const LayerRun& r, const LayerView& w, int64_t n, const float* h, float* proj, float* ab, float* z);
// out[c] += w[tap, c] in[c] over one row's q | k | v channels: one tap of the short convolution.
void gdn_conv_tap(const ModelDims& d, const LayerView& w, int64_t tap, const float* in, float* out);
// From the convolution outputs pre [n, C] and ab: q, k (silu, then L2-normalised; their inverse
// norms), v (silu), g and beta.
void gdn_activate(const ModelDims& d, const LayerView& w, int64_t n, const float* pre, const float* ab, float* q,
                  float* k, float* v, float* qinv, float* kinv, float* g, float* beta);
// on = RMSNorm per head (o) * o_norm (orstd kept), then gdn_out_proj.
void gdn_out(const LayerRun& r, const LayerView& w, int64_t n, const float* o, const float* z, float* on, float* orstd,
             float* y, const float* x, float* x1);
// y = on * silu(z) (scratch [n, H Dv]), x1 = x + y Wo.
void gdn_out_proj(const LayerRun& r, const LayerView& w, int64_t n, const float* on, const float* z, float* y,
                  const float* x, float* x1);

class GdnMixer {
 public:
  // `pos`: the global positions of this rank's rows; `chain`: the pieces of the partition
  // (this rank's pieces split its rows equally, in order).
  GdnMixer(const ModelDims& d, Comm& cp, GdnChain chain, const std::string& schedule, int64_t n_rows);

  void alloc(GdnActs& a) const;
  // x1 = x + mixer(x); `b` gives the rows' document ids and the sequence's document lengths.
  void forward(const LayerRun& r, const LayerView& w, const Batch& b, const float* x, GdnActs& a, float* x1);
  // Recomputes x1 = x + y Wo from kept activations (remat = full recomputes the MLP input).
  void output(const LayerRun& r, const LayerView& w, const float* x, GdnActs& a, float* x1);
  // dx holds d(loss)/d(x1) on entry; on exit d(loss)/d(x) (the residual's share plus the mixer's).
  // gw receives (accumulates) the layer's parameter gradients.
  void backward(const LayerRun& r, const LayerView& w, LayerView& gw, const Batch& b, const float* x, GdnActs& a,
                float* dx);

  // Bytes of one GdnActs and of the scratch a GdnMixer holds, for n rows (the dry-run plan).
  static double acts_bytes(const ModelDims& d, int64_t n);
  static double scratch_bytes(const ModelDims& d, int64_t n);

 private:
  std::vector<GdnParams> pieces(const Batch& b, GdnActs& a, bool backward);
  void conv_fwd(const LayerView& w, const Batch& b, GdnActs& a);
  void conv_bwd(const LayerView& w, LayerView& gw, const Batch& b, GdnActs& a, const ExactSums* ex);

  ModelDims d_;
  Comm& comm_;
  GdnChain chain_;
  std::unique_ptr<GdnCp> sched_;
  int64_t n_;
  std::vector<int64_t> piece_begin_;  // this rank's pieces: rows [piece_begin_[j], piece_begin_[j+1])
  size_t piece_of(int64_t row) const {
    return size_t(std::upper_bound(piece_begin_.begin(), piece_begin_.end(), row) - piece_begin_.begin()) - 1;
  }
  int64_t C_;
  std::vector<int> mine_;  // this rank's chain positions
  // scratch
  Buffer<float> dproj_, dh_, dq_, dk_, dv_, dg_, dbeta_, dab_, dy_, do_, dz_, tmp_;
  std::vector<int32_t> doc_;  // per row, and reset flags per piece (set per call)
  std::vector<std::vector<int32_t>> halo_doc_;
  std::vector<char> reset_;
};

}  // namespace ctxpar
