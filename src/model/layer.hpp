// One decoder layer of the Llama-3-style model, forward, in the three parts around the CP
// attention, on n local rows: the training step (model/transformer.cpp) and the inference engine
// (infer/engine.cpp) run exactly this code.
//   attn_in   h = RMSNorm(x) (rstd saved); q = h Wq, k = h Wk, v = h Wv; RoPE on q and k
//   (the CP strategy: o, lse = attention(q, k, v))
//   attn_out  x1 = x + o Wo                (row-split product summed over tp)
//   mlp       h2 = RMSNorm(x1) (rstd2 saved); g = h2 W1, u = h2 W3, m = silu(g) u;
//             x_out = x1 + m W2            (summed over tp); x_out null: stop after m (recompute)
// Every GEMM is timed into StepTimes::gemm_s and traced as a gemm span of the layer; every tp
// all-reduce into tp_comm_s and, as a blocking collective, into the exposed communication.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "cp/strategy.hpp"
#include "model/model.hpp"
#include "model/numerics.hpp"

namespace ctxpar {

class Topology;
class Tracer;

// Wall time by kind of work, this rank, one forward_backward or inference call (seconds).
struct StepTimes {
  double gemm_s = 0, attn_s = 0, tp_comm_s = 0, other_s = 0, total_s = 0;
};

// The bf16 copy of a flat fp32 parameter buffer on the GPU (the GEMMs' weight operands): element
// i of `bf16` is fp32 element i of [base, base + n) rounded to bf16, refreshed after every update.
struct Bf16Mirror {
  const float* base = nullptr;
  int64_t n = 0;
  const uint16_t* bf16 = nullptr;
  // The bf16 copy of fp32 `p` when p lies in the buffer, else null.
  const uint16_t* of(const float* p) const {
    return base && p >= base && p < base + n ? bf16 + (p - base) : nullptr;
  }
};

// What every part of a layer needs: the dimensions, the mesh (tp all-reduces), the tracer, the
// counters, and the layer index (-1 outside the layers: the LM head); and where the tensors are:
// Device::cpu (fp32 throughout), or Device::cuda (every pointer device memory, every op ordered on
// `stream`; GEMMs take bf16 operands with fp32 accumulation and fp32 results: the weights' bf16
// copy from `weights`, activations rounded to bf16 per GEMM).
struct LayerRun {
  const ModelDims& d;
  Topology& topo;
  Tracer* tr;
  StepTimes& times;
  CpStats& st;
  int64_t layer;
  Device dev = Device::cpu;
  Stream stream = nullptr;
  const Bf16Mirror* weights = nullptr;
  Numerics* num = &plain_numerics();  // how the sums are taken (model/numerics.hpp)
};

// C (=|+=) op(A) op(B), row-major, timed and traced (model/flops.hpp: 2 m n k): on the CPU by
// r.num (exact: a weight gradient goes to the exact sums instead of C). On a GPU the StepTimes
// entry is host time of an asynchronous call; the span is timed on the device
// (Tracer::time_on_device), and train takes its GEMM and attention shares from the spans there.
void layer_gemm(const LayerRun& r, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// rmsnorm_bwd over `rows` rows (dx +=, dw +=), by r.num.
void layer_rmsnorm_bwd(const LayerRun& r, const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                       float* dw, int64_t rows, int64_t dim);
// Sum over the tp axis, in place (a no-op at tp = 1).
void layer_tp_all_reduce(const LayerRun& r, float* x, int64_t n);
// out [n, N] = sum of the terms' products over the whole tp group (the row-parallel products:
// attention output, MLP down projection, and the input gradients of the column-parallel ones), by
// r.num (model/numerics.hpp Numerics::tp_sum).
void layer_tp_sum(const LayerRun& r, int64_t n, int64_t N, std::initializer_list<TpTerm> terms, float* out);
// The residual connection: y += x over n elements.
void layer_add_residual(const LayerRun& r, float* y, const float* x, int64_t n);

void attn_in_fwd(const LayerRun& r, const LayerView& w, int64_t n, const float* x, const float* cos_t,
                 const float* sin_t, float* h, float* rstd, float* q, float* k, float* v);
void attn_out_fwd(const LayerRun& r, const LayerView& w, int64_t n, const float* x, const float* o, float* x1);
void mlp_fwd(const LayerRun& r, const LayerView& w, int64_t n, const float* x1, float* h2, float* rstd2, float* g,
             float* u, float* m, float* x_out);

}  // namespace ctxpar
