// Every CUDA op (kernels/cuda/ops_cuda.hpp) against the readable reference (kernels/ref).
//
// Built twice (tests/gpu/CMakeLists.txt):
//  - test_cuda_ops: the real kernels; every test SKIPS with a message when no CUDA device is
//    present (cudaGetDeviceCount fails or returns 0), so CI machines without a GPU pass it.
//  - test_cuda_ops_emu: the same sources compiled for the CPU emulator (kernels/cuda/emu/emu.hpp);
//    runs everywhere, smaller shapes; cuBLASLt is not emulated (the GEMM tests skip there).
//
// Tolerance (issue 8, the tests/README.md policy applied to bf16): inputs are drawn in fp32; the
// reference is kernels/ref in fp64 on those fp32 inputs; the "naive bf16 computation" is
// kernels/ref in fp32 on the inputs rounded to bf16. A CUDA result passes when its max error
// against the fp64 reference is at most 2x the naive one's, plus the floor of tolerance.hpp.
// fp32 model ops use the fp32 policy unchanged (fp32 inputs, naive = ref<float>). GEMMs use a
// rigorous accumulation bound instead (see GemmCase).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn_problem.hpp"
#include "cuda/ops_cuda.hpp"
#include "ops.hpp"
#include "ref/attn_ref.hpp"
#include "ref/model_ref.hpp"
#include "tolerance.hpp"

namespace ctxpar::test {
namespace {

using cuda::bf16;

#if defined(CTXPAR_CUDA_EMU)
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// Every test starts with this: skip cleanly when there is no device.
#define REQUIRE_CUDA_DEVICE()                                                                      \
  do {                                                                                             \
    if (cuda::device_count() == 0)                                                                 \
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0): GPU test skipped"; \
  } while (0)

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Device array owning its memory; copies from/to host vectors.
template <class T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    check(cudaMalloc(&p_, (n ? n : 1) * sizeof(T)), "cudaMalloc");
    check(cudaMemset(p_, 0, (n ? n : 1) * sizeof(T)), "cudaMemset");
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { upload(h); }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void upload(const std::vector<T>& h) {
    check(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  std::vector<T> download() const {
    check(cudaDeviceSynchronize(), "kernel execution");
    std::vector<T> h(n_);
    check(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  size_t n_;
};

float round_bf16(float x) { return cuda::round_bf16_host(x); }
std::vector<float> rounded(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = round_bf16(x[i]);
  return r;
}
// bf16 storage of already-rounded floats (the upper 16 bits).
std::vector<bf16> to_bf16(const std::vector<float>& x_rounded) {
  std::vector<bf16> r(x_rounded.size());
  for (size_t i = 0; i < x_rounded.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &x_rounded[i], 4);
    r[i] = bf16(__nv_bfloat16_raw{uint16_t(u >> 16)});
  }
  return r;
}
std::vector<float> from_bf16(const std::vector<bf16>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t u = uint32_t(__nv_bfloat16_raw(x[i]).x) << 16;
    std::memcpy(&r[i], &u, 4);
  }
  return r;
}

// fast vs naive vs fp64 reference (tests/README.md policy).
void expect_policy(const std::string& what, const std::vector<float>& fast, const std::vector<float>& naive,
                   const std::vector<double>& ref, double floor_factor = 1.0) {
  ASSERT_EQ(fast.size(), ref.size()) << what;
  const double e_fast = max_abs_err(fast, ref), e_naive = max_abs_err(naive, ref);
  ASSERT_TRUE(std::isfinite(e_naive)) << what << ": the naive reference itself disagrees on -inf/NaN";
  EXPECT_LE(e_fast, tolerance(e_naive, ref, floor_factor))
      << what << ": CUDA err " << e_fast << ", naive err " << e_naive;
}

std::vector<float> normal(size_t n, uint64_t seed, float sd = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> x(n);
  for (auto& e : x) e = d(rng);
  return x;
}

// ------------------------------------------------------------------------------------------------
// tensor-core fragment helpers: exact small-integer products

TEST(CudaMma, FragmentHelpersMatchHostGemm) {
  REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> d(-2, 2);
  auto ints = [&](size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = float(d(rng));
    return x;
  };
  // A [16][32], Bt [16][32], At = A^T stored [32][16], Bk [32][16], Bk2 [16][16]
  const std::vector<float> A = ints(16 * 32), Bt = ints(16 * 32), Bk = ints(32 * 16), Bk2 = ints(16 * 16);
  std::vector<float> At(32 * 16);
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < 32; ++k) At[k * 16 + m] = A[m * 32 + k];
  Dev<bf16> dA(to_bf16(A)), dBt(to_bf16(Bt)), dAt(to_bf16(At)), dBk(to_bf16(Bk)), dBk2(to_bf16(Bk2));
  Dev<float> dC(3 * 256);
  cuda::mma_selftest(dA.get(), dBt.get(), dAt.get(), dBk.get(), dBk2.get(), dC.get());
  const std::vector<float> c = dC.download();
  std::vector<double> c0(256, 0), c1(256, 0), c2(256, 0);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n)
      for (int k = 0; k < 32; ++k) {
        c0[m * 16 + n] += double(A[m * 32 + k]) * Bt[n * 32 + k];
        c1[m * 16 + n] += double(A[m * 32 + k]) * Bk[k * 16 + n];
      }
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n)
      for (int k = 0; k < 16; ++k) c2[m * 16 + n] += c0[m * 16 + k] * Bk2[k * 16 + n];
  int bad0 = 0, bad1 = 0, bad2 = 0;
  for (int i = 0; i < 256; ++i) {
    bad0 += c[i] != c0[i];
    bad1 += c[256 + i] != c1[i];
    bad2 += c[512 + i] != c2[i];
  }
  EXPECT_EQ(bad0, 0) << "A B^T path (load_a, load_b_nk) wrong in " << bad0 << " of 256 entries";
  EXPECT_EQ(bad1, 0) << "A^T B path (load_a_trans, load_b_kn_x2n) wrong in " << bad1 << " of 256 entries";
  EXPECT_EQ(bad2, 0) << "accumulator-as-A path (acc_to_a) wrong in " << bad2 << " of 256 entries";
}

// ------------------------------------------------------------------------------------------------
// attention

struct AttnCase {
  Shape shape;
  const char* what;
};

std::string case_name(const ::testing::TestParamInfo<AttnCase>& info) { return shape_name(info.param.shape); }
void PrintTo(const AttnCase& c, std::ostream* os) { *os << shape_name(c.shape) << " (" << c.what << ")"; }

class CudaAttn : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttn, ForwardBackwardWithinPolicy) {
  REQUIRE_CUDA_DEVICE();
  const Shape sh = GetParam().shape;
  const Problem pr(sh, 1234 + uint64_t(sh.S_q) * 7 + uint64_t(sh.D));
  const AttnParams p = pr.params();  // host positions / documents, for the references
  if (sh.docs) {  // a document case must really split the rows, or it tests nothing
    int64_t boundaries = 0;
    for (int64_t i = 1; i < sh.S_q; ++i) boundaries += pr.q_doc[size_t(i)] != pr.q_doc[size_t(i - 1)];
    ASSERT_GE(boundaries, 2) << "document case with fewer than 3 documents among its query rows";
  }
  const size_t nq = pr.q.size(), nk = pr.k.size(), nl = size_t(sh.S_q * sh.H_q);

  // references: fp64 on the fp32 inputs; naive fp32 on the bf16-rounded inputs
  const auto q64 = convert<double>(pr.q), k64 = convert<double>(pr.k), v64 = convert<double>(pr.v),
             do64 = convert<double>(pr.dout);
  const auto qr = rounded(pr.q), kr = rounded(pr.k), vr = rounded(pr.v), dor = rounded(pr.dout);
  std::vector<double> o64(nq), lse64(nl);
  ref::attn_fwd<double>(p, q64.data(), k64.data(), v64.data(), o64.data(), lse64.data());
  std::vector<float> o32(nq), lse32(nl);
  ref::attn_fwd<float>(p, qr.data(), kr.data(), vr.data(), o32.data(), lse32.data());

  // device
  Dev<bf16> q(to_bf16(qr)), k(to_bf16(kr)), v(to_bf16(vr)), dout(to_bf16(dor));
  Dev<float> o(nq), lse(nl);
  Dev<int64_t> q_pos(pr.q_pos), k_pos(pr.k_pos);
  Dev<int32_t> q_doc(sh.docs ? pr.q_doc : std::vector<int32_t>{}), k_doc(sh.docs ? pr.k_doc : std::vector<int32_t>{});
  AttnParams a = p;  // the same call on device buffers
  a.device = Device::cuda;
  a.dtype = DType::bf16;
  a.q = q.get();
  a.k = k.get();
  a.v = v.get();
  a.o = o.get();
  a.lse = lse.get();
  a.q_pos = q_pos.get();
  a.k_pos = k_pos.get();
  if (sh.docs) {
    a.q_doc = q_doc.get();
    a.k_doc = k_doc.get();
  }
  AttnStats st;
  a.stats = &st;
  cuda::attn_fwd(a);
  const std::vector<float> o_dev = o.download(), lse_dev = lse.download();
  expect_policy("O", o_dev, o32, o64);
  expect_policy("LSE", lse_dev, lse32, lse64);

  // work: every visible pair computed, nothing when nothing is visible
  const int64_t visible = visible_pairs(p) * sh.H_q;
  EXPECT_GE(st.pairs_computed, visible);
  EXPECT_LE(st.pairs_computed, sh.S_q * sh.S_k * sh.H_q);
  if (visible == 0) {
    EXPECT_EQ(st.pairs_computed, 0);
    EXPECT_EQ(st.tiles_skipped, st.tiles_total);
  }

  // backward: gradients ACCUMULATE into non-zero buffers; compare the increments
  std::vector<double> dq64(nq), dk64(nk), dv64(nk);
  ref::attn_bwd<double>(p, q64.data(), k64.data(), v64.data(), o64.data(), lse64.data(), do64.data(), dq64.data(),
                        dk64.data(), dv64.data());
  std::vector<float> dq32(nq), dk32(nk), dv32(nk);
  ref::attn_bwd<float>(p, qr.data(), kr.data(), vr.data(), o32.data(), lse32.data(), dor.data(), dq32.data(),
                       dk32.data(), dv32.data());
  const std::vector<float> dq0 = normal(nq, 11, 0.5f), dk0 = normal(nk, 12, 0.5f), dv0 = normal(nk, 13, 0.5f);
  Dev<float> dq(dq0), dk(dk0), dv(dv0);
  a.dout = dout.get();
  a.dq = dq.get();
  a.dk = dk.get();
  a.dv = dv.get();
  AttnStats st_b;
  a.stats = &st_b;
  cuda::attn_bwd(a);
  auto increment = [](const std::vector<float>& after, const std::vector<float>& before) {
    std::vector<double> d(after.size());
    for (size_t i = 0; i < d.size(); ++i) d[i] = double(after[i]) - double(before[i]);
    return d;
  };
  // The increments are exact differences of fp32 numbers near the start values; as floats they
  // carry one extra rounding of ulp(0.5 + |g|) ~ 1e-7, far below the bf16 errors compared here.
  auto as_float = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  expect_policy("dQ", as_float(increment(dq.download(), dq0)), dq32, dq64, kBwdCancellation);
  expect_policy("dK", as_float(increment(dk.download(), dk0)), dk32, dk64, kBwdCancellation);
  expect_policy("dV", as_float(increment(dv.download(), dv0)), dv32, dv64);
  EXPECT_GE(st_b.pairs_computed, visible);
  if (visible == 0) {
    EXPECT_EQ(st_b.tiles_skipped, st_b.tiles_total);
  }
}

const AttnCase kAttnCases[] = {
    {{64, 64, 2, 2, 64, MaskKind::causal, Layout::diagonal}, "one tile, causal"},
    {{100, 100, 4, 1, 64, MaskKind::causal, Layout::diagonal}, "S not a multiple of the tiles, MQA"},
    {{72, 130, 8, 2, 32, MaskKind::causal, Layout::straddle}, "GQA 4:1, S_q != S_k, keys straddle the queries"},
    {{80, 150, 2, 2, 64, MaskKind::causal, Layout::past}, "key block entirely in the past"},
    {{70, 90, 2, 2, 64, MaskKind::causal, Layout::future}, "key block in the future: no row sees a key"},
    {{96, 96, 2, 2, 64, MaskKind::window, Layout::diagonal, 17}, "sliding window"},
    {{120, 150, 2, 2, 64, MaskKind::causal, Layout::straddle, 0, true}, "packed documents, causal"},
    {{100, 100, 2, 1, 64, MaskKind::none, Layout::past, 0, true}, "packed documents as the only mask"},
    {{100, 200, 2, 2, 64, MaskKind::window, Layout::straddle, 5, true}, "window 5 with documents"},
    {{64, 90, 2, 2, 64, MaskKind::window, Layout::past, 30}, "window 30 past a gap: later rows see no key"},
    {{40, 40, 2, 2, 64, MaskKind::window, Layout::diagonal, 1}, "window 1: each row sees itself only"},
    {{128, 128, 2, 1, 128, MaskKind::causal, Layout::zigzag}, "zigzag query shard, D = 128"},
    {{65, 65, 2, 1, 256, MaskKind::causal, Layout::diagonal}, "D = 256 (shared-memory dK/dV path)"},
    {{50, 70, 2, 2, 80, MaskKind::none, Layout::diagonal}, "no mask, D = 80 padded to 128"},
    {{1, 100, 2, 2, 64, MaskKind::causal, Layout::past}, "one query row"},
    {{100, 1, 2, 2, 64, MaskKind::causal, Layout::diagonal}, "one key"},
#if !defined(CTXPAR_CUDA_EMU)
    // larger shapes on a real device only (the emulator runs ~10^5 warp instructions per second)
    {{600, 600, 8, 2, 128, MaskKind::causal, Layout::diagonal}, "GQA 4:1, D = 128, many tiles"},
    {{700, 1300, 4, 4, 64, MaskKind::causal, Layout::straddle, 0, true}, "documents, straddle, many tiles"},
    {{513, 513, 4, 1, 256, MaskKind::window, Layout::diagonal, 100}, "window, MQA, D = 256"},
#endif
};

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttn, ::testing::ValuesIn(kAttnCases), case_name);

// Row strides: q, k, v as views into one fused bf16 QKV row [S, (H_q + 2 H_kv) D + 8], dout in a
// padded row. The kernels load whole head rows, so the strided call equals the packed one: forward
// bit for bit; backward dK, dV bit for bit (H_q = H_kv: added in a fixed order) and dQ to the
// rounding of its atomic additions.
TEST(CudaAttnStrides, FusedQkvViewsMatchPacked) {
  REQUIRE_CUDA_DEVICE();
  const Shape sh{100, 100, 2, 2, 64, MaskKind::causal, Layout::diagonal, 0, true};
  const Problem pr(sh, 77);
  const int64_t S = sh.S_q, qw = int64_t(sh.H_q) * sh.D, kw = int64_t(sh.H_kv) * sh.D, ld = qw + 2 * kw + 8,
                dld = qw + 8;
  const auto qb = to_bf16(rounded(pr.q)), kb = to_bf16(rounded(pr.k)), vb = to_bf16(rounded(pr.v)),
             db = to_bf16(rounded(pr.dout));
  std::vector<bf16> fused(size_t(S * ld)), dpad(size_t(S * dld));
  for (int64_t i = 0; i < S; ++i) {
    std::copy_n(qb.begin() + i * qw, qw, fused.begin() + i * ld);
    std::copy_n(kb.begin() + i * kw, kw, fused.begin() + i * ld + qw);
    std::copy_n(vb.begin() + i * kw, kw, fused.begin() + i * ld + qw + kw);
    std::copy_n(db.begin() + i * qw, qw, dpad.begin() + i * dld);
  }
  Dev<bf16> q(qb), k(kb), v(vb), dout(db), f(fused), dp(dpad);
  Dev<int64_t> q_pos(pr.q_pos), k_pos(pr.k_pos);
  Dev<int32_t> q_doc(pr.q_doc), k_doc(pr.k_doc);
  auto run = [&](bool strided) {
    const size_t nq = pr.q.size(), nk = pr.k.size(), nl = size_t(S * sh.H_q);
    Dev<float> o(nq), lse(nl), dq(nq), dk(nk), dv(nk);
    AttnParams a = pr.params();
    a.device = Device::cuda;
    a.dtype = DType::bf16;
    a.q = strided ? f.get() : q.get();
    a.k = strided ? f.get() + qw : k.get();
    a.v = strided ? f.get() + qw + kw : v.get();
    a.dout = strided ? dp.get() : dout.get();
    if (strided) {
      a.q_stride = a.k_stride = a.v_stride = ld;
      a.dout_stride = dld;
    }
    a.q_pos = q_pos.get();
    a.k_pos = k_pos.get();
    a.q_doc = q_doc.get();
    a.k_doc = k_doc.get();
    a.o = o.get();
    a.lse = lse.get();
    a.dq = dq.get();
    a.dk = dk.get();
    a.dv = dv.get();
    cuda::attn_fwd(a);
    cuda::attn_bwd(a);
    return std::vector<std::vector<float>>{o.download(), lse.download(), dq.download(), dk.download(), dv.download()};
  };
  const auto a = run(false), b = run(true);
  EXPECT_EQ(a[0], b[0]) << "O";
  EXPECT_EQ(a[1], b[1]) << "LSE";
  EXPECT_EQ(a[3], b[3]) << "dK";
  EXPECT_EQ(a[4], b[4]) << "dV";
  double diff = 0, mag = 0;
  for (size_t i = 0; i < a[2].size(); ++i) {
    diff = std::max(diff, std::abs(double(a[2][i]) - b[2][i]));
    mag = std::max(mag, std::abs(double(a[2][i])));
  }
  EXPECT_LE(diff, 1e-5 * std::max(1.0, mag)) << "dQ";
}

TEST(CudaAttnMerge, LseMergeMatchesReference) {
  REQUIRE_CUDA_DEVICE();
  const int64_t rows = 37;
  const int32_t H = 3, D = 40;
  const size_t n = size_t(rows * H * D), nl = size_t(rows * H);
  std::vector<float> o = normal(n, 1), ob = normal(n, 2), lse = normal(nl, 3, 3.f), lseb = normal(nl, 4, 3.f);
  // -inf on one side, on the other side, on both
  for (size_t r = 0; r < nl; r += 5) lse[r] = -INFINITY;
  for (size_t r = 1; r < nl; r += 7) lseb[r] = -INFINITY;
  lse[2] = lseb[2] = -INFINITY;
  lse[9] = 80.f;  // large LSE: no overflow
  std::vector<double> o64 = convert<double>(o), lse64 = convert<double>(lse);
  const std::vector<double> ob64 = convert<double>(ob), lseb64 = convert<double>(lseb);
  ref::lse_merge<double>(o64.data(), lse64.data(), ob64.data(), lseb64.data(), rows, H, D);
  std::vector<float> o32 = o, lse32 = lse;
  ref::lse_merge<float>(o32.data(), lse32.data(), ob.data(), lseb.data(), rows, H, D);
  Dev<float> d_o(o), d_lse(lse), d_ob(ob), d_lseb(lseb);
  cuda::lse_merge(d_o.get(), d_lse.get(), d_ob.get(), d_lseb.get(), rows, H, D);
  expect_policy("O", d_o.download(), o32, o64);
  expect_policy("LSE", d_lse.download(), lse32, lse64);
}

TEST(CudaAttnParams, InvalidArgumentsThrow) {
  REQUIRE_CUDA_DEVICE();
  AttnParams a;
  a.device = Device::cuda;
  a.dtype = DType::bf16;
  a.S_q = a.S_k = 4;
  a.H_q = 2;
  a.H_kv = 2;
  a.D = 12;  // not a multiple of 8
  EXPECT_THROW(cuda::attn_fwd(a), std::invalid_argument);
  a.D = 64;
  a.H_kv = 3;  // H_q % H_kv != 0
  EXPECT_THROW(cuda::attn_fwd(a), std::invalid_argument);
  a.H_kv = 2;
  auto message = [&] {
    try {
      cuda::attn_fwd(a);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  a.k_stride = 2 * 64 - 8;  // rows of k would overlap
  EXPECT_NE(message().find("k_stride"), std::string::npos) << message();
  a.k_stride = 2 * 64 + 4;  // not a multiple of 8 elements (cp.async moves 16-byte chunks)
  EXPECT_NE(message().find("multiples of 8"), std::string::npos) << message();
}

// ------------------------------------------------------------------------------------------------
// GEMM (cuBLASLt; not emulated)

#if !defined(CTXPAR_CUDA_EMU)
struct GemmCase {
  bool ta, tb;
};

// Host reference on the (bf16-exact) inputs in double, and the bound: any fp32 summation of K
// products (exact for bf16 inputs; fp32 products for fp32 inputs) in any order errs by at most
// ~K u sum|a b| with u = 2^-24 (doubled for a possibly truncating tensor-core accumulator), and a
// bf16 output adds one rounding of 2^-9 |c|. Wrong transposes or leading dimensions give O(1)
// errors, far above this bound.
void run_gemm(bool ta, bool tb, DType in, DType out) {
  const int64_t M = 67, N = 45, K = 131, lda = (ta ? M : K) + 5, ldb = (tb ? K : N) + 3, ldc = N + 7;
  const float alpha = 0.75f, beta = 0.5f;
  const int64_t a_rows = ta ? K : M, b_rows = tb ? N : K;
  std::vector<float> A = normal(size_t(a_rows * lda), 21), B = normal(size_t(b_rows * ldb), 22),
                     C = normal(size_t(M * ldc), 23);
  const bool bf = in == DType::bf16;
  if (bf) {
    A = rounded(A);
    B = rounded(B);
  }
  if (out == DType::bf16) C = rounded(C);
  auto a_at = [&](int64_t m, int64_t k) { return double(ta ? A[k * lda + m] : A[m * lda + k]); };
  auto b_at = [&](int64_t k, int64_t n) { return double(tb ? B[n * ldb + k] : B[k * ldb + n]); };
  std::vector<double> ref(size_t(M * N)), bound(size_t(M * N));
  const double u = std::ldexp(1.0, -24);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, sa = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += a_at(m, k) * b_at(k, n);
        sa += std::abs(a_at(m, k) * b_at(k, n));
      }
      const double c = alpha * s + beta * C[m * ldc + n];
      ref[m * N + n] = c;
      bound[m * N + n] = 2.0 * (K + 2) * u * (std::abs(alpha) * sa + std::abs(beta * C[m * ldc + n])) +
                         (out == DType::bf16 ? std::ldexp(std::abs(c), -8) : 0.0) + 1e-30;
    }
  std::vector<float> got(size_t(M * ldc));
  if (bf) {
    Dev<bf16> dA(to_bf16(A)), dB(to_bf16(B));
    if (out == DType::bf16) {
      Dev<bf16> dC(to_bf16(C));
      cuda::gemm_bf16(ta, tb, M, N, K, alpha, dA.get(), lda, dB.get(), ldb, beta, dC.get(), ldc);
      got = from_bf16(dC.download());
    } else {
      Dev<float> dC(C);
      cuda::gemm_bf16_f32(ta, tb, M, N, K, alpha, dA.get(), lda, dB.get(), ldb, beta, dC.get(), ldc);
      got = dC.download();
    }
  } else {
    Dev<float> dA(A), dB(B), dC(C);
    cuda::sgemm(ta, tb, M, N, K, alpha, dA.get(), lda, dB.get(), ldb, beta, dC.get(), ldc);
    got = dC.download();
  }
  int bad = 0;
  double worst = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const double e = std::abs(double(got[m * ldc + n]) - ref[m * N + n]);
      worst = std::max(worst, e / bound[m * N + n]);
      bad += !(e <= bound[m * N + n]);
    }
  // the padding columns of C beyond N are untouched
  int touched = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = N; n < ldc; ++n) touched += got[m * ldc + n] != C[m * ldc + n];
  EXPECT_EQ(bad, 0) << "ta=" << ta << " tb=" << tb << ": " << bad << " entries beyond the bound (worst "
                    << worst << "x the bound)";
  EXPECT_EQ(touched, 0) << "GEMM wrote outside the N columns of C";
}

TEST(CudaGemm, AllTransposesAllTypes) {
  REQUIRE_CUDA_DEVICE();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run_gemm(ta, tb, DType::f32, DType::f32);
      run_gemm(ta, tb, DType::bf16, DType::bf16);
      run_gemm(ta, tb, DType::bf16, DType::f32);
    }
}

TEST(CudaGemm, KZeroScalesC) {
  REQUIRE_CUDA_DEVICE();
  std::vector<float> C = normal(12, 5);
  Dev<float> dA(1), dB(1), dC(C);
  cuda::sgemm(false, false, 3, 4, 0, 1.f, dA.get(), 1, dB.get(), 4, 0.5f, dC.get(), 4);
  const std::vector<float> got = dC.download();
  for (size_t i = 0; i < C.size(); ++i) EXPECT_EQ(got[i], 0.5f * C[i]);
}
#else
TEST(CudaGemm, AllTransposesAllTypes) { GTEST_SKIP() << "cuBLASLt is not emulated; runs on a device only"; }
#endif

// ------------------------------------------------------------------------------------------------
// model ops: fp32 policy against ref<double> / ref<float>, and the same semantics as the CPU op

// CUDA result within policy of the reference, and close to the CPU op (same accumulate /
// overwrite semantics: a semantic mismatch is an O(1) difference).
void expect_model(const std::string& what, const std::vector<float>& gpu, const std::vector<float>& cpu,
                  const std::vector<float>& naive, const std::vector<double>& ref) {
  expect_policy(what + " vs ref", gpu, naive, ref);
  const double e_naive = max_abs_err(naive, ref);
  std::vector<double> cpu64(cpu.begin(), cpu.end());
  EXPECT_LE(max_abs_err(gpu, cpu64), 2.0 * tolerance(e_naive, ref)) << what << " vs the CPU op";
}

TEST(CudaModelOps, RmsNorm) {
  REQUIRE_CUDA_DEVICE();
  const int64_t rows = 37, dim = 300;
  const float eps = 1e-5f;
  const auto x = normal(size_t(rows * dim), 1), w = normal(size_t(dim), 2), dy = normal(size_t(rows * dim), 3);
  const auto dx0 = normal(size_t(rows * dim), 4), dw0 = normal(size_t(dim), 5);  // accumulate into these
  // fp64 and fp32 references
  std::vector<double> y64(x.size()), r64(rows), dx64(dx0.begin(), dx0.end()), dw64(dw0.begin(), dw0.end());
  const auto x64 = convert<double>(x), w64 = convert<double>(w), dy64 = convert<double>(dy);
  ref::rmsnorm_fwd<double>(x64.data(), w64.data(), y64.data(), r64.data(), rows, dim, eps);
  ref::rmsnorm_bwd<double>(dy64.data(), x64.data(), w64.data(), r64.data(), dx64.data(), dw64.data(), rows, dim);
  std::vector<float> y32(x.size()), r32(rows), dx32 = dx0, dw32 = dw0;
  ref::rmsnorm_fwd<float>(x.data(), w.data(), y32.data(), r32.data(), rows, dim, eps);
  ref::rmsnorm_bwd<float>(dy.data(), x.data(), w.data(), r32.data(), dx32.data(), dw32.data(), rows, dim);
  std::vector<float> yc(x.size()), rc(rows), dxc = dx0, dwc = dw0;
  rmsnorm_fwd(x.data(), w.data(), yc.data(), rc.data(), rows, dim, eps);
  rmsnorm_bwd(dy.data(), x.data(), w.data(), rc.data(), dxc.data(), dwc.data(), rows, dim);
  Dev<float> dX(x), dW(w), dY(x.size()), dR{size_t(rows)}, dDY(dy), dDX(dx0), dDW(dw0);
  cuda::rmsnorm_fwd(dX.get(), dW.get(), dY.get(), dR.get(), rows, dim, eps);
  cuda::rmsnorm_bwd(dDY.get(), dX.get(), dW.get(), dR.get(), dDX.get(), dDW.get(), rows, dim);
  expect_model("rmsnorm y", dY.download(), yc, y32, y64);
  expect_model("rmsnorm rstd", dR.download(), rc, r32, r64);
  expect_model("rmsnorm dx (accumulated)", dDX.download(), dxc, dx32, dx64);
  expect_model("rmsnorm dw (accumulated)", dDW.download(), dwc, dw32, dw64);
}

TEST(CudaModelOps, Rope) {
  REQUIRE_CUDA_DEVICE();
  const int64_t rows = 29;
  const int32_t H = 3, D = 64;
  std::vector<int64_t> pos(rows);
  for (int64_t r = 0; r < rows; ++r) pos[r] = 1000003 * r + 17;  // large angles (long context)
  std::vector<double> inv(D / 2);
  rope_inv_freq(D, 500000.0, 8.0, 1.0, 4.0, 8192.0, inv.data());
  const auto x = normal(size_t(rows * H * D), 9);
  Dev<int64_t> dpos(pos);
  Dev<double> dinv(inv);
  Dev<float> cos_t(size_t(rows * D / 2)), sin_t(size_t(rows * D / 2));
  cuda::rope_table(dpos.get(), rows, D, dinv.get(), cos_t.get(), sin_t.get());
  std::vector<float> hc(size_t(rows * D / 2)), hs(size_t(rows * D / 2));
  rope_table(pos.data(), rows, D, inv.data(), hc.data(), hs.data());
  // tables: both computed in double and rounded once: equal up to one fp32 rounding of cos/sin
  const auto gc = cos_t.download(), gs = sin_t.download();
  for (size_t i = 0; i < hc.size(); ++i) {
    ASSERT_NEAR(gc[i], hc[i], 1.2e-7) << "cos table " << i;
    ASSERT_NEAR(gs[i], hs[i], 1.2e-7) << "sin table " << i;
  }
  for (bool inverse : {false, true}) {
    std::vector<double> x64 = convert<double>(x);
    ref::rope_apply<double>(x64.data(), rows, H, D, pos.data(), inv.data(), inverse);
    std::vector<float> x32 = x, xc = x;
    ref::rope_apply<float>(x32.data(), rows, H, D, pos.data(), inv.data(), inverse);
    rope_apply(xc.data(), rows, H, D, hc.data(), hs.data(), inverse);
    Dev<float> dx(x);
    cuda::rope_apply(dx.get(), rows, H, D, cos_t.get(), sin_t.get(), inverse);
    expect_model(inverse ? "rope inverse" : "rope", dx.download(), xc, x32, x64);
    // bf16 overload: naive = fp32 rotation of the bf16 input, rounded to bf16 once
    const auto xr = rounded(x);
    std::vector<double> xr64 = convert<double>(xr);
    ref::rope_apply<double>(xr64.data(), rows, H, D, pos.data(), inv.data(), inverse);
    std::vector<float> xr32 = xr;
    ref::rope_apply<float>(xr32.data(), rows, H, D, pos.data(), inv.data(), inverse);
    Dev<bf16> db(to_bf16(xr));
    cuda::rope_apply(db.get(), rows, H, D, cos_t.get(), sin_t.get(), inverse);
    expect_policy(inverse ? "rope bf16 inverse" : "rope bf16", from_bf16(db.download()), rounded(xr32), xr64);
  }
}

TEST(CudaModelOps, SwiGlu) {
  REQUIRE_CUDA_DEVICE();
  const int64_t n = 5000;
  const auto g = normal(n, 1, 3.f), u = normal(n, 2), dh = normal(n, 3);
  const auto g64 = convert<double>(g), u64 = convert<double>(u), dh64 = convert<double>(dh);
  std::vector<double> h64(n), dg64(n), du64(n);
  ref::swiglu_fwd<double>(g64.data(), u64.data(), h64.data(), n);
  ref::swiglu_bwd<double>(dh64.data(), g64.data(), u64.data(), dg64.data(), du64.data(), n);
  std::vector<float> h32(n), dg32(n), du32(n), hc(n), dgc(n), duc(n);
  ref::swiglu_fwd<float>(g.data(), u.data(), h32.data(), n);
  ref::swiglu_bwd<float>(dh.data(), g.data(), u.data(), dg32.data(), du32.data(), n);
  swiglu_fwd(g.data(), u.data(), hc.data(), n);
  swiglu_bwd(dh.data(), g.data(), u.data(), dgc.data(), duc.data(), n);
  Dev<float> dG(g), dU(u), dH(n), dDH(dh), dDG(n), dDU(n);
  cuda::swiglu_fwd(dG.get(), dU.get(), dH.get(), n);
  cuda::swiglu_bwd(dDH.get(), dG.get(), dU.get(), dDG.get(), dDU.get(), n);
  expect_model("swiglu h", dH.download(), hc, h32, h64);
  expect_model("swiglu dg", dDG.download(), dgc, dg32, dg64);
  expect_model("swiglu du", dDU.download(), duc, du32, du64);
}

TEST(CudaModelOps, CrossEntropy) {
  REQUIRE_CUDA_DEVICE();
  const int64_t rows = 23, V = 3001;
  const auto z = normal(size_t(rows * V), 1, 4.f);
  std::vector<int32_t> labels(rows);
  for (int64_t r = 0; r < rows; ++r) labels[r] = r % 5 == 3 ? -1 : int32_t((r * 977) % V);  // some ignored
  const float gs = 1.f / 19.f;
  const auto z64 = convert<double>(z);
  std::vector<double> dz64(z.size());
  const double loss64 = ref::cross_entropy_fwd_bwd<double>(z64.data(), labels.data(), rows, V, double(gs), dz64.data());
  std::vector<float> dz32(z.size()), dzc(z.size());
  const double loss32 = ref::cross_entropy_fwd_bwd<float>(z.data(), labels.data(), rows, V, gs, dz32.data());
  cross_entropy_fwd_bwd(z.data(), labels.data(), rows, V, gs, dzc.data());
  for (bool alias : {false, true}) {
    Dev<float> dZ(z), dDZ(z.size());
    Dev<int32_t> dL(labels);
    Dev<double> dLoss(1);
    float* out = alias ? dZ.get() : dDZ.get();
    cuda::cross_entropy_fwd_bwd(dZ.get(), dL.get(), rows, V, gs, out, dLoss.get());
    const std::vector<float> dz = alias ? dZ.download() : dDZ.download();
    expect_model(alias ? "dlogits (aliased)" : "dlogits", dz, dzc, dz32, dz64);
    const double loss = dLoss.download()[0];
    EXPECT_LE(std::abs(loss - loss64), 2.0 * std::abs(loss32 - loss64) + 1e-6 * std::abs(loss64))
        << "loss " << loss << " vs " << loss64 << " (naive " << loss32 << ")";
  }
}

TEST(CudaModelOps, AdamW) {
  REQUIRE_CUDA_DEVICE();
  const int64_t n = 4099;
  const auto p0 = normal(n, 1), g = normal(n, 2), m0 = normal(n, 3, 0.1f);
  std::vector<float> v0 = normal(n, 4, 0.1f);
  for (auto& e : v0) e = e * e;  // second moments are >= 0
  AdamWStep hp;
  hp.lr = 3e-4;
  hp.weight_decay = 0.1;
  hp.grad_scale = 0.7;
  hp.step = 5;
  std::vector<double> p64 = convert<double>(p0), m64 = convert<double>(m0), v64 = convert<double>(v0);
  const auto g64 = convert<double>(g);
  ref::adamw_update<double>(p64.data(), g64.data(), m64.data(), v64.data(), n, hp.lr, hp.beta1, hp.beta2, hp.eps,
                            hp.weight_decay, hp.grad_scale, hp.step);
  std::vector<float> p32 = p0, m32 = m0, v32 = v0, pc = p0, mc = m0, vc = v0;
  ref::adamw_update<float>(p32.data(), g.data(), m32.data(), v32.data(), n, hp.lr, hp.beta1, hp.beta2, hp.eps,
                           hp.weight_decay, hp.grad_scale, hp.step);
  adamw_update(pc.data(), g.data(), mc.data(), vc.data(), n, hp);
  Dev<float> dP(p0), dG(g), dM(m0), dV(v0);
  cuda::adamw_update(dP.get(), dG.get(), dM.get(), dV.get(), n, hp);
  expect_model("adamw p", dP.download(), pc, p32, p64);
  expect_model("adamw m", dM.download(), mc, m32, m64);
  expect_model("adamw v", dV.download(), vc, v32, v64);
}

TEST(CudaModelOps, SumSquaresAndConversions) {
  REQUIRE_CUDA_DEVICE();
  const int64_t n = 100003;
  const auto x = normal(n, 1);
  double want = 0;
  for (float e : x) want += double(e) * double(e);
  Dev<float> dx(x);
  Dev<double> out(1);
  cuda::sum_squares(dx.get(), n, out.get());
  EXPECT_NEAR(out.download()[0], want, 1e-12 * want);  // double sums of 1e5 terms
  Dev<bf16> b{size_t(n)};
  Dev<float> back{size_t(n)};
  cuda::f32_to_bf16(dx.get(), b.get(), n);
  cuda::bf16_to_f32(b.get(), back.get(), n);
  const auto r = rounded(x), got = back.download();
  int diff = 0;
  for (int64_t i = 0; i < n; ++i) diff += got[i] != r[i];
  EXPECT_EQ(diff, 0) << "f32 -> bf16 -> f32 is not round-to-nearest-even";
}

}  // namespace
}  // namespace ctxpar::test
