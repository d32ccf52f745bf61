// sgemm (the BLAS library, all threads) and the tile micro-kernels (AVX2 and scalar) against a
// double-precision loop.
#include <cpuid.h>

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

#include "cpu/tile_ops.hpp"
#include "ops.hpp"

namespace ctxpar::test {
namespace {

TEST(Sgemm, AllTransposesMatchDoubleLoop) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int64_t M = 67, N = 45, K = 131;
      const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 5;
      std::vector<float> A((ta ? K : M) * lda), B((tb ? N : K) * ldb), C(M * ldc);
      for (auto* x : {&A, &B, &C})
        for (auto& e : *x) e = u(rng);
      const auto C0 = C;
      const float alpha = 0.75f, beta = -0.5f;
      sgemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double a = ta ? A[k * lda + i] : A[i * lda + k];
            const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
            acc += a * b;
          }
          const double expect = alpha * acc + beta * C0[i * ldc + j];
          // K products of magnitude <= 1: fp32 error well under K * eps
          ASSERT_NEAR(C[i * ldc + j], expect, 1e-4) << ta << tb << " " << i << "," << j;
        }
      }
    }
  }
  EXPECT_FALSE(std::string(blas_name()).empty());
}

void check_tile_gemm(const cpu::TileOps& ops) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  // C[M, N] (+)= A B with A plain or transposed (a_rs = 1), B as row-major rows or as 16-column
  // panels (K x 16 each, one after another), row counts around every micro-kernel height (6 for
  // AVX2, 12 for AVX-512) and panel counts odd and even.
  for (bool transposed_a : {false, true})
    for (bool panels : {false, true})
      for (bool accumulate : {true, false})
        for (int64_t N : {16, 48, 64})
          for (int64_t M : {1, 5, 6, 11, 12, 13, 25, 96}) {
            const int64_t K = 37, ld = 64;
            std::vector<float> A(128 * ld), B(K * N), C(M * N);
            for (auto* x : {&A, &B, &C})
              for (auto& e : *x) e = u(rng);
            const auto C0 = C;
            const int64_t a_rs = transposed_a ? 1 : ld, a_cs = transposed_a ? ld : 1;
            const int64_t b_rs = panels ? 16 : N, b_cs16 = panels ? K * 16 : 16;
            auto b_at = [&](int64_t k, int64_t c) { return B[k * b_rs + (c / 16) * b_cs16 + c % 16]; };
            ops.gemm(M, N, K, A.data(), a_rs, a_cs, B.data(), b_rs, b_cs16, C.data(), N, accumulate);
            for (int64_t r = 0; r < M; ++r)
              for (int64_t c = 0; c < N; ++c) {
                double acc = accumulate ? C0[r * N + c] : 0.0;
                for (int64_t k = 0; k < K; ++k) acc += double(A[r * a_rs + k * a_cs]) * b_at(k, c);
                ASSERT_NEAR(C[r * N + c], acc, 1e-5) << ops.isa << " M=" << M << " N=" << N << " panels=" << panels
                                                     << " acc=" << accumulate << " at " << r << "," << c;
              }
          }
}

void check_transpose(const cpu::TileOps& ops) {
  for (int64_t rows : {1, 7, 8, 19, 96})
    for (int64_t cols : {1, 8, 13, 64}) {
      const int64_t ld_src = cols + 3, ld_dst = rows + 5;
      std::vector<float> src(rows * ld_src), dst(cols * ld_dst, -1.f);
      for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
      ops.transpose(src.data(), ld_src, rows, cols, dst.data(), ld_dst);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(dst[c * ld_dst + r], src[r * ld_src + c]) << ops.isa << " " << rows << "x" << cols;
    }
}

// A BLIS older than the CPU falls back to its portable C kernels (5x slower than the CPU's own
// on a Zen 5 core, kernels/cpu/gemm.cpp): ctxpar must have picked the ISA's kernels instead, from
// CPUID alone; CTXPAR_ISA picks the family of the ISA it names.
TEST(Sgemm, BlisRunsTheKernelsOfTheIsa) {
  const std::string name = blas_name();
  if (name.rfind("BLIS", 0) != 0) GTEST_SKIP() << "not BLIS: " << name;
  if (name.find("chosen by BLIS_ARCH_TYPE") != std::string::npos) GTEST_SKIP() << "the user chose: " << name;
  if (kernel_isa_forced()) {
    const char* family[] = {"generic", "haswell", "skx"};
    EXPECT_NE(name.find(std::string("(OpenMP; ") + family[int(kernel_isa())] + " kernels chosen by CTXPAR_ISA)"),
              std::string::npos) << name << " under CTXPAR_ISA=" << kernel_isa_name(kernel_isa());
    return;
  }
  if (kernel_isa_widest() == KernelIsa::scalar) GTEST_SKIP() << "this CPU has no AVX2+FMA, so generic kernels are right: " << name;
  EXPECT_EQ(name.find("generic"), std::string::npos) << name;
  // On Intel BLIS's own choice reads the FMA units from the brand string, which virtual machines
  // mask, and then runs the AVX2 kernels at about 60 % of the speed (kernels/cpu/gemm.cpp).
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool intel = __get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;
  if (intel && kernel_isa_widest() == KernelIsa::avx512) {  // "GenuineIntel"
    EXPECT_NE(name.find("skx"), std::string::npos) << name;
  }
}

// The FMA-loop peak uses the widest FMA the CPU has; each narrower loop runs too, and one the CPU
// lacks is refused. (Speeds are for `ctxpar bench peak`, not for a test.)
TEST(FmaPeak, WidestIsaChosenAndEachLoopRuns) {
  __builtin_cpu_init();
  const FmaIsa want = __builtin_cpu_supports("avx512f")                                   ? FmaIsa::avx512
                      : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? FmaIsa::avx2
                                                                                          : FmaIsa::sse2;
  EXPECT_EQ(int(fma_isa_available()), int(want));
  for (FmaIsa isa : {FmaIsa::sse2, FmaIsa::avx2, FmaIsa::avx512}) {
    if (int(isa) > int(want)) {
      EXPECT_THROW(fma_peak(1, isa), std::invalid_argument) << fma_isa_name(isa);
      continue;
    }
    const FmaPeak p = fma_peak(1, isa);
    EXPECT_GT(p.gflops, 0.0) << p.isa_name;
    EXPECT_EQ(p.vector_bits, isa == FmaIsa::avx512 ? 512 : isa == FmaIsa::avx2 ? 256 : 128);
  }
  EXPECT_EQ(int(fma_peak(1).isa), int(want));
  if (want != FmaIsa::avx512) GTEST_SKIP() << "this CPU has no AVX-512F: the 512-bit loop was not run";
}

TEST(TileOps, GemmAndTransposeScalar) {
  check_tile_gemm(cpu::tile_ops_scalar());
  check_transpose(cpu::tile_ops_scalar());
}

TEST(TileOps, GemmAndTransposeAvx2) {
  if (!cpu::avx2_supported()) GTEST_SKIP() << "this CPU has no AVX2+FMA";
  check_tile_gemm(cpu::tile_ops_avx2());
  check_transpose(cpu::tile_ops_avx2());
}

TEST(TileOps, GemmAndTransposeAvx512) {
  if (!cpu::avx512_supported()) GTEST_SKIP() << "this CPU has no AVX-512 F/DQ/BW/VL";
  check_tile_gemm(cpu::tile_ops_avx512());
  check_transpose(cpu::tile_ops_avx512());
}

// The kernels' set is the widest the CPU runs, or the one CTXPAR_ISA names.
TEST(TileOps, SetOfTheKernelIsa) {
  const char* names[] = {"scalar", "avx2+fma", "avx512"};
  const KernelIsa want = kernel_isa_forced() ? kernel_isa()
                         : cpu::avx512_supported() ? KernelIsa::avx512
                         : cpu::avx2_supported()   ? KernelIsa::avx2
                                                   : KernelIsa::scalar;
  EXPECT_EQ(std::string(cpu::tile_ops().isa), names[int(want)]);
}

}  // namespace
}  // namespace ctxpar::test
