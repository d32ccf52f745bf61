// Row-major GEMM on cuBLASLt (ops_cuda.hpp). cuBLASLt is column-major; a row-major C[M,N] is the
// column-major C^T[N,M], and C^T = op(B)^T op(A)^T, so every call is issued as the column-major
// product (m, n, k) = (N, M, K) with the B buffer as cuBLASLt's first operand and the A buffer as
// its second, each with its own transpose flag unchanged:
//   first operand  = B memory, op = trans_b, stored (trans_b ? K x N : N x K), ld = ldb
//   second operand = A memory, op = trans_a, stored (trans_a ? M x K : K x M), ld = lda
//   result         = C memory, N x M, ld = ldc.
// Per device: one handle; per (device, stream): one 32 MiB workspace (cuBLASLt forbids sharing a
// workspace between concurrently running streams); per distinct call shape: one plan (operation
// descriptor, three layouts, the heuristic's first algorithm), created on first use and kept.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/ops_cuda.hpp"

namespace ctxpar::cuda {

using namespace detail;

namespace {

[[noreturn]] void throw_lt(cublasStatus_t st, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("cuBLASLt error: ") + what + " -> " + cublasLtGetStatusName(st) + " (" +
                           cublasLtGetStatusString(st) + ") at " + file + ":" + std::to_string(line));
}
#define CTXPAR_LT_CHECK(expr)                                                          \
  do {                                                                                 \
    const cublasStatus_t ctxpar_lt_st_ = (expr);                                       \
    if (ctxpar_lt_st_ != CUBLAS_STATUS_SUCCESS) throw_lt(ctxpar_lt_st_, #expr, __FILE__, __LINE__); \
  } while (0)

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // NVIDIA's recommendation for Hopper

cudaDataType_t lt_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

using PlanKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int>;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, result = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct State {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;
  std::map<std::pair<int, cudaStream_t>, void*> workspaces;
  std::map<PlanKey, Plan> plans;
};

State& state() {
  static State* s = new State;  // never destroyed: no teardown order issue with the CUDA runtime at exit
  return *s;
}

// C = beta * C for K = 0 (cuBLASLt requires k >= 1; BLAS semantics say op(A) op(B) is then 0).
template <class T>
__global__ void scale_matrix_kernel(T* C, int64_t M, int64_t N, int64_t ldc, float beta) {
  const int64_t n = M * N;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    T* c = C + (e / N) * ldc + e % N;
    if constexpr (std::is_same_v<T, float>) {
      *c = beta == 0.f ? 0.f : beta * *c;  // beta = 0 ignores C's old contents (NaN included)
    } else {
      *c = __float2bfloat16_rn(beta == 0.f ? 0.f : beta * __bfloat162float(*c));
    }
  }
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, DType a_type,
          int64_t lda, const void* B, DType b_type, int64_t ldb, float beta, void* C, DType c_type, int64_t ldc,
          cudaStream_t stream) {
  if (M < 0 || N < 0 || K < 0) throw_arg("gemm: negative size");
  const bool types_ok = (a_type == DType::f32 && b_type == DType::f32 && c_type == DType::f32) ||
                        (a_type == DType::bf16 && b_type == DType::bf16);
  if (!types_ok) throw_arg("gemm: supported (A, B, C) types are (f32, f32, f32), (bf16, bf16, bf16), (bf16, bf16, f32)");
  if (lda < (trans_a ? M : K) || ldb < (trans_b ? K : N) || ldc < N || lda < 1 || ldb < 1 || ldc < 1)
    throw_arg("gemm: a leading dimension is smaller than its row length");
  if (M == 0 || N == 0) return;
  if (K == 0) {
    const int64_t blocks = ceil_div(M * N, 256) < 65535 ? ceil_div(M * N, 256) : 65535;
    if (c_type == DType::f32) {
      auto kern = scale_matrix_kernel<float>;
      CTXPAR_LAUNCH(kern, unsigned(blocks), 256u, 0, stream, static_cast<float*>(C), M, N, ldc, beta);
    } else {
      auto kern = scale_matrix_kernel<bf16>;
      CTXPAR_LAUNCH(kern, unsigned(blocks), 256u, 0, stream, static_cast<bf16*>(C), M, N, ldc, beta);
    }
    CTXPAR_CUDA_LAUNCH_CHECK();
    return;
  }

  int dev = 0;
  CTXPAR_CUDA_CHECK(cudaGetDevice(&dev));
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);

  cublasLtHandle_t& handle = st.handles[dev];
  if (!handle) CTXPAR_LT_CHECK(cublasLtCreate(&handle));
  void*& ws = st.workspaces[{dev, stream}];
  if (!ws) CTXPAR_CUDA_CHECK(cudaMalloc(&ws, kWorkspaceBytes));

  const PlanKey key{dev, trans_a, trans_b, M, N, K, lda, ldb, ldc, int(a_type), int(b_type), int(c_type)};
  auto it = st.plans.find(key);
  if (it == st.plans.end()) {
    Plan p;
    CTXPAR_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CTXPAR_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
    CTXPAR_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
    CTXPAR_LT_CHECK(cublasLtMatrixLayoutCreate(&p.first, lt_type(b_type), uint64_t(trans_b ? K : N),
                                               uint64_t(trans_b ? N : K), ldb));
    CTXPAR_LT_CHECK(cublasLtMatrixLayoutCreate(&p.second, lt_type(a_type), uint64_t(trans_a ? M : K),
                                               uint64_t(trans_a ? K : M), lda));
    CTXPAR_LT_CHECK(cublasLtMatrixLayoutCreate(&p.result, lt_type(c_type), uint64_t(N), uint64_t(M), ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    CTXPAR_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws_bytes = kWorkspaceBytes;
    CTXPAR_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                         sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t hst =
        cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.first, p.second, p.result, p.result, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hst != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatrixLayoutDestroy(p.first);
      cublasLtMatrixLayoutDestroy(p.second);
      cublasLtMatrixLayoutDestroy(p.result);
      cublasLtMatmulDescDestroy(p.desc);
      if (hst != CUBLAS_STATUS_SUCCESS) throw_lt(hst, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
      throw std::runtime_error("cuBLASLt: no algorithm for this GEMM (M=" + std::to_string(M) + " N=" +
                               std::to_string(N) + " K=" + std::to_string(K) + ")");
    }
    p.algo = res.algo;
    it = st.plans.emplace(key, p).first;
  }
  const Plan& p = it->second;
  CTXPAR_LT_CHECK(cublasLtMatmul(handle, p.desc, &alpha, B, p.first, A, p.second, &beta, C, p.result, C, p.result,
                                 &p.algo, ws, kWorkspaceBytes, stream));
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc, cudaStream_t stream) {
  gemm(trans_a, trans_b, M, N, K, alpha, A, DType::f32, lda, B, DType::f32, ldb, beta, C, DType::f32, ldc, stream);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, bf16* C, int64_t ldc, cudaStream_t stream) {
  gemm(trans_a, trans_b, M, N, K, alpha, A, DType::bf16, lda, B, DType::bf16, ldb, beta, C, DType::bf16, ldc, stream);
}

void gemm_bf16_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                   int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc, cudaStream_t stream) {
  gemm(trans_a, trans_b, M, N, K, alpha, A, DType::bf16, lda, B, DType::bf16, ldb, beta, C, DType::f32, ldc, stream);
}

const char* gemm_library_name() {
  static const std::string name = [] {
    const size_t v = cublasLtGetVersion();  // major * 10000 + minor * 100 + patch
    return "cuBLASLt " + std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." +
           std::to_string(v % 100);
  }();
  return name.c_str();
}

void gemm_release() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  for (auto& [key, p] : st.plans) {
    cublasLtMatrixLayoutDestroy(p.first);
    cublasLtMatrixLayoutDestroy(p.second);
    cublasLtMatrixLayoutDestroy(p.result);
    cublasLtMatmulDescDestroy(p.desc);
  }
  st.plans.clear();
  for (auto& [key, ws] : st.workspaces) cudaFree(ws);
  st.workspaces.clear();
  for (auto& [dev, h] : st.handles) cublasLtDestroy(h);
  st.handles.clear();
}

}  // namespace ctxpar::cuda
