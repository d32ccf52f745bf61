#include "model/flops.hpp"

#include <algorithm>
#include <chrono>
#include <span>
#include <thread>

#include "core/memory.hpp"
#include "dist/comm.hpp"
#include "model/model.hpp"
#include "ops.hpp"

namespace ctxpar {

double causal_visible_pairs(const std::vector<int64_t>& doc_lengths) {
  double p = 0;
  for (int64_t L : doc_lengths) p += 0.5 * double(L) * double(L + 1);
  return p;
}

double partial_prefill_pairs(int64_t T, int64_t cached) { return double(T) * double(cached) + 0.5 * double(T) * double(T + 1); }

namespace {
// Visible pairs of the first n positions of a document under a window W.
double window_prefix_pairs(int64_t n, int64_t W) {
  if (n <= W) return 0.5 * double(n) * double(n + 1);
  return 0.5 * double(W) * double(W + 1) + double(n - W) * double(W);
}
}  // namespace

double window_visible_pairs(const std::vector<int64_t>& doc_lengths, int64_t W) {
  double p = 0;
  for (int64_t L : doc_lengths) p += window_prefix_pairs(L, W);
  return p;
}

double window_prefill_pairs(int64_t T, int64_t cached, int64_t W) {
  return window_prefix_pairs(cached + T, W) - window_prefix_pairs(cached, W);
}

namespace {
// Projection FLOPs per token of one attention layer (forward): Q, K, V, O, or MLA's latent ones.
double attn_proj_flops(const ModelDims& d) {
  const double qw = double(d.H_q) * d.D, kw = double(d.H_kv) * d.D, dim = double(d.dim);
  if (!d.mla) return 2 * dim * (qw + 2 * kw) + 2 * qw * dim;
  const double H = d.H_q, q = d.q_lora > 0 ? 2 * dim * d.q_lora + 2 * double(d.q_lora) * qw : 2 * dim * qw;
  return q + 2 * dim * (d.kv_lora + d.rope) + 2 * double(d.kv_lora) * H * (d.nope + d.v_dim) + 2 * H * d.v_dim * dim;
}
// The head dim of the FLOP convention's 4 H D per pair: MLA's products are Q K^T over D = nope +
// rope and P V over v_dim (the kernel's zero padding of V to D is work, not model FLOPs).
double attn_conv_dim(const ModelDims& d) { return d.mla ? 0.5 * (double(d.D) + d.v_dim) : double(d.D); }
}  // namespace

double train_matmul_flops(const ModelDims& d, int64_t S) {
  const double dim = double(d.dim);
  const double mlp = 3 * 2 * dim * double(d.ffn);
  const double attn_layer = attn_proj_flops(d) + mlp;
  const double gq = double(d.gdn_qk_width()), gv = double(d.gdn_v_width()), H = d.gdn_H;
  const double gdn_layer = 2 * dim * (2 * gq + 2 * gv + 2 * H) + 2 * gv * dim + mlp;  // q k v g, a b; o
  const double G = double(d.gdn_layers());
  const double fwd = double(S) * ((double(d.layers) - G) * attn_layer + G * gdn_layer + 2 * dim * double(d.vocab));
  return 3 * fwd;  // backward: two products of the forward's size (dX and dW)
}

double train_attn_flops(const ModelDims& d, double causal_pairs, double window_pairs) {
  const double local = double(std::count(d.kinds.begin(), d.kinds.end(), 'L'));
  const double global = double(d.layers - d.gdn_layers()) - local;
  const double D = attn_conv_dim(d);
  return attn_train_flops(causal_pairs, d.H_q, D) * global + attn_train_flops(window_pairs, d.H_q, D) * local;
}

double train_gdn_flops(const ModelDims& d, int64_t S) {
  const double per_layer = 3 * gdn_fwd_flops(double(S), d.gdn_H, d.gdn_Dk, d.gdn_Dv, d.gdn_chunk) +
                           3 * 2 * double(d.gdn_conv) * double(d.gdn_conv_width()) * double(S);
  return per_layer * double(d.gdn_layers());
}

double prefill_flops(const ModelDims& d, int64_t T, int64_t cached) {
  const double dim = double(d.dim), F = double(d.ffn);
  const double mlp = 3 * matmul_flops(1, dim, F);
  const double per_token = attn_proj_flops(d) + mlp;
  const double G = double(d.gdn_layers()), W = double(std::count(d.kinds.begin(), d.kinds.end(), 'L'));
  const double L = double(d.layers) - G - W;
  const double gq = double(d.gdn_qk_width()), gv = double(d.gdn_v_width()), H = d.gdn_H;
  // A GDN layer: its projections (q k v g, a b; o), the recurrence, the short convolution.
  const double gdn = double(T) * (matmul_flops(1, dim, 2 * gq + 2 * gv + 2 * H) + matmul_flops(1, gv, dim) + mlp +
                                  2 * double(d.gdn_conv) * double(d.gdn_conv_width())) +
                     gdn_fwd_flops(double(T), H, d.gdn_Dk, d.gdn_Dv, d.gdn_chunk);
  const double local = W > 0 ? W * (double(T) * per_token +
                                     attn_fwd_flops(window_prefill_pairs(T, cached, d.window), d.H_q, attn_conv_dim(d)))
                             : 0;
  return L * (double(T) * per_token + attn_fwd_flops(partial_prefill_pairs(T, cached), d.H_q, attn_conv_dim(d))) + local + G * gdn +
         matmul_flops(1, dim, double(d.vocab));
}

double measure_sgemm_peak_flops(Comm& world) {
  const int64_t n = 1024;
  Buffer<float> a(size_t(n * n), false), b(size_t(n * n), false), c(size_t(n * n));
  for (int64_t i = 0; i < n * n; ++i) {
    a[size_t(i)] = float(i % 7) * 0.1f;
    b[size_t(i)] = float(i % 5) * 0.1f;
  }
  // Warm-up of at least 0.1 s (one call of ~20 ms left the cores below their sustained clock:
  // MFU read 103 % against a peak measured 16 % low), then the best call over at least 0.2 s.
  using clock = std::chrono::steady_clock;
  const auto seconds = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  const auto warm0 = clock::now();
  do sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  while (seconds(warm0) < 0.1);
  world.barrier();
  double best = 1e30;
  const auto timed0 = clock::now();
  for (int rep = 0; rep < 4 || seconds(timed0) < 0.2; ++rep) {
    const auto t0 = clock::now();
    sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::min(best, seconds(t0));
  }
  double flops = matmul_flops(double(n), double(n), double(n)) / best;
  world.all_reduce(std::span<double>(&flops, 1), ReduceOp::max);
  return flops;
}

double measure_core_peak_flops(Comm& world) {
  double core = 0;
  if (world.rank() == 0) {
    core = fma_peak(1).gflops * 1e9;
    std::vector<Request> sent;
    for (int r = 1; r < world.size(); ++r)
      sent.push_back(world.send_recv_async(std::span<const double>(&core, 1), r, std::span<double>(), Comm::kNone));
    for (Request& q : sent) world.wait(q);
  } else {  // asleep between polls: a rank spinning in a receive would take rank 0's core
    Request q = world.send_recv_async(std::span<const double>(), Comm::kNone, std::span<double>(&core, 1), 0);
    while (!world.test(q)) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return core;
}

}  // namespace ctxpar
