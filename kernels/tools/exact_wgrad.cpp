// Where exact numerics' weight-gradient time goes (docs/measurements.md "Exact weight
// gradients"): one weight gradient dW[M, N] = X^T dY over S token rows, timed for blocks of 128,
// 256 and 512 rows on this process's OpenMP threads, median of 3, and how many elements the two exact ways round apart.
//   cmake --build BUILD --target ctxpar_exact_wgrad
//   OMP_NUM_THREADS=1 BUILD/kernels/ctxpar_exact_wgrad [M N S]   (default: bench-train's dW1)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ops.hpp"

using namespace ctxpar;

namespace {
template <class F> double median3(F f) {
  double t[3];
  for (double& x : t) {
    const auto a = std::chrono::steady_clock::now();
    f();
    x = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  }
  std::sort(t, t + 3);
  return t[1];
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t M = argc > 3 ? std::atoll(argv[1]) : 1024, N = argc > 3 ? std::atoll(argv[2]) : 3584;
  const int64_t S = argc > 3 ? std::atoll(argv[3]) : 4096;
  std::vector<float> X(size_t(S * M)), dY(size_t(S * N)), dW(size_t(M * N)), prod(size_t(M * N));
  for (size_t i = 0; i < X.size(); ++i) X[i] = float(int(i % 97) - 48) * 1e-3f;
  for (size_t i = 0; i < dY.size(); ++i) dY[i] = float(int(i % 89) - 44) * 1e-3f;
  std::vector<int64_t> h1(size_t(M * N)), l1(h1.size()), h2(h1.size()), l2(h1.size());
  const double flops = 2.0 * double(M) * double(N) * double(S);
  std::printf("# dW[%lld, %lld] = X^T dY over %lld rows; seconds (median of 3), GFLOP/s (2 M N S)\n", (long long)M,
              (long long)N, (long long)S);
  auto row = [&](const char* what, double s) { std::printf("%-58s %8.3f %8.1f\n", what, s, flops / s / 1e9); };
  row("BLIS, one call (plain training)",
      median3([&] { sgemm(true, false, M, N, S, 1.f, X.data(), M, dY.data(), N, 0.f, dW.data(), N); }));
  for (int64_t G : {128, 256, 512}) {
    const int64_t K = S / G * G;
    char what[96];
    std::snprintf(what, sizeof what, "BLIS per %lld-row block + exact_add", (long long)G);
    row(what, median3([&] {
          std::fill(h1.begin(), h1.end(), 0);
          std::fill(l1.begin(), l1.end(), 0);
          for (int64_t k = 0; k < K; k += G) {
            sgemm(true, false, M, N, G, 1.f, X.data() + k * M, M, dY.data() + k * N, N, 0.f, prod.data(), N);
            exact_add(prod.data(), M, N, N, h1.data(), l1.data(), N);
          }
        }));
    std::snprintf(what, sizeof what, "gemm_tn_exact, %lld-row blocks", (long long)G);
    row(what, median3([&] {
          std::fill(h2.begin(), h2.end(), 0);
          std::fill(l2.begin(), l2.end(), 0);
          gemm_tn_exact(M, N, K, G, X.data(), M, dY.data(), N, h2.data(), l2.data(), N);
        }));
    // both are exact sums of per-block fp32 products: they differ only where BLIS and the tile
    // kernel round a block's product differently, so report how many elements do
    int64_t differ = 0;
    for (size_t i = 0; i < h1.size(); ++i) differ += exact_value(h1[i], l1[i]) != exact_value(h2[i], l2[i]);
    std::printf("#   %lld of %lld elements differ between the two (block products rounded by different kernels)\n",
                (long long)differ, (long long)h1.size());
  }
  return 0;
}
